// Where a hung worker was: the stacks of each of its threads, taken just
// before the agent signals it (a file timer that expired, or the grace
// after SIGTERM running out). Tools attach with ptrace for a moment and
// detach, one at a time (a process has one tracer): elfutils' eu-stack for
// native frames, then for a Python worker gdb with CPython's extension
// reading each Python thread's frames from the interpreter's memory. The
// worker's environment, signal dispositions and the signal it then dies of
// are untouched. A worker with a thread that stays in D state (half a
// second of looks) is not attached (the tool would hang with it); what the
// kernel says it waits in is given.
#ifndef MUSTER_AGENT_STACK_CAPTURE_H_
#define MUSTER_AGENT_STACK_CAPTURE_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muster {

// One way of taking a stack: a command line in which "{pid}" stands for the
// process, and the heading its output goes under.
struct StackTool {
  std::string heading;  // e.g. "native frames (eu-stack)"
  std::vector<std::string> argv;
  // Output that means the tool has nothing to show, and why: "TEXT=WHY"
  // says WHY when TEXT appears; "TEXT=" says what follows TEXT on its line.
  std::vector<std::string> says_unavailable;
  // Output before the first line that starts with `keep_from` is a
  // debugger's banner, and from the first that starts with `drop_from` its
  // last words: both are left out. Empty: all is kept.
  std::string keep_from, drop_from;
};

// A /proc file's text, at most 4 KiB of it; "" when it cannot be read.
std::string ReadProcFile(const std::string& path);

// The fields of a /proc/<pid>/stat (or task stat) text after "pid (comm)",
// the process' name, which may hold spaces and parentheses: [0] its state,
// [1] its parent's pid, ... Empty when the text is not one.
std::vector<absl::string_view> ProcStatFields(absl::string_view stat);
std::vector<absl::string_view> ProcStatFields(std::string&& stat) = delete;  // would dangle

// The gdb script that prints each Python thread's frames (CPython 3.11),
// which StackToolsFor's gdb runs from `script`.
const char* PythonStacksScript();
// Writes PythonStacksScript() to `path` (mode 0600).
absl::Status WritePythonStacksScript(const std::string& path);
// Writes `text`, a script a tool runs, to `path` (mode 0600).
absl::Status WriteScript(const std::string& path, absl::string_view text);

// The tools muster uses on `pid`: eu-stack, then for a Python process (its
// executable is python*) gdb running `python_script` (see above).
std::vector<StackTool> StackToolsFor(pid_t pid, const std::string& python_script);

// Runs each pid's tools (one after the other; different pids' at once) and
// waits for all of them, at most `limit` in all: a tool still running then
// is killed (and the pid sent SIGCONT, in case it was left stopped), and the
// text says so. Each pid's text holds each tool's heading and output, cut
// to `max_bytes`, or why that tool gave none. Call from the agent's loop
// thread: the tools are its children and are reaped here.
std::map<pid_t, std::string> CaptureStacks(
    const std::vector<std::pair<pid_t, std::vector<StackTool>>>& targets, absl::Duration limit,
    size_t max_bytes);

}  // namespace muster

#endif  // MUSTER_AGENT_STACK_CAPTURE_H_
