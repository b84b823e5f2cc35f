// The seam between the agent and the kernel's processes: starting a worker,
// signalling its process group, and reaping it. The real runner starts
// ChildProcesses (clone(CLONE_VM|CLONE_VFORK), PR_SET_PDEATHSIG, own process
// group) and reaps with waitid; tests use a fake that records what it was
// asked, as ninja's CommandRunner has one.
#ifndef MUSTER_AGENT_PROCESS_RUNNER_H_
#define MUSTER_AGENT_PROCESS_RUNNER_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_handle.h"

namespace muster {

struct ExitStatus {
  int exit_code = 0;  // when it exited
  int signal = 0;     // non-zero when a signal ended it
  bool success() const { return exit_code == 0 && signal == 0; }
};

struct SpawnOptions {
  std::string path;  // the program to exec; empty: argv[0] (see ResolveExecutable)
  std::vector<std::string> argv;
  std::vector<std::string> env;  // KEY=VALUE
  bool capture_output = true;    // stdout and stderr to pipes, else inherited
  // Bound before exec, best effort (--numa-binding): the CPUs the child may
  // run on, and the NUMA nodes its memory is preferred from. Empty: as the
  // agent's.
  std::vector<int> cpus{};  // {}: left out of a braced SpawnOptions without a warning
  std::vector<int> memory_nodes{};
  // The user's Python script (argv: the interpreter, its flags, the script
  // or -m module): a preloaded interpreter may fork it (agent/preload.h).
  bool python_script = false;
};

// A started worker: the leader of its own process group.
class Process {
 public:
  // A process still running is killed (its whole group) and reaped.
  virtual ~Process() = default;

  virtual pid_t pid() const = 0;
  virtual bool exited() const = 0;
  // Records the exit the runner's Reap collected.
  virtual void MarkExited(ExitStatus status) = 0;
  // Sends `sig` to the process group; a group already gone is fine.
  virtual void SignalGroup(int sig) const = 0;
  // Gives up on a process that SIGKILL did not end (stuck in the kernel, in
  // D state): it is no longer waited for, not even when dropped. Its exit,
  // if it ever comes, is reaped as an orphan's.
  virtual void Abandon() = 0;
  // Read ends of the output pipes, non-blocking, close-on-exec; invalid once
  // taken, or when the output was not captured.
  virtual UniqueFd TakeStdout() = 0;
  virtual UniqueFd TakeStderr() = 0;
};

// A child that exited and has not been reaped yet.
struct ChildExit {
  pid_t pid = 0;
  ExitStatus status;
};

class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;

  // Starts a worker. REQUIRES: called from the thread that lives as long as
  // the agent (PR_SET_PDEATHSIG fires when the thread that started the child
  // exits). Errors: the exec's errno, e.g. kPermissionDenied.
  virtual absl::StatusOr<std::unique_ptr<Process>> Spawn(const SpawnOptions& options) = 0;

  // A child of this process that has exited, without reaping it: until Reap
  // its pid, and so its process group id, cannot be reused, so the group
  // can still be killed without hitting somebody else's. Never blocks;
  // nullopt when no child has exited. Orphaned grandchildren count too.
  virtual std::optional<ChildExit> NextExit() = 0;
  // Reaps `pid`, a child NextExit named.
  virtual void Reap(pid_t pid) = 0;

  // The real one. Makes this process a child subreaper on first use, so
  // that a worker's orphaned children are reparented to it and reaped.
  static absl::StatusOr<ProcessRunner*> Real();
};

}  // namespace muster

#endif  // MUSTER_AGENT_PROCESS_RUNNER_H_
