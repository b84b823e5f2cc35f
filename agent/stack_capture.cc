#include "agent/stack_capture.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/unique_handle.h"

extern char** environ;

namespace muster {
namespace {

// One tool running on one pid.
struct Run {
  pid_t target = 0;
  const StackTool* tool = nullptr;
  pid_t pid = -1;
  UniqueFd out;
  std::string text;
  bool cut = false;
  std::string failed;  // why it could not start
  int wait_status = 0;
  bool reaped = false;
};

// Where a symbolic link points; "" when it cannot be read.
std::string ReadLink(const std::string& path) {
  char target[4096];
  const ssize_t length = readlink(path.c_str(), target, sizeof target - 1);
  return length > 0 ? std::string(target, static_cast<size_t>(length)) : "";
}

// The agent's environment without what would make a tool reach the network
// (debuginfod downloads debug symbols) or read the user's gdb settings.
std::vector<std::string> ToolEnvironment() {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (absl::StartsWith(*entry, "DEBUGINFOD_URLS=")) continue;
    env.emplace_back(*entry);
  }
  return env;
}

// Starts `run`'s tool with its output (stdout and stderr) on a pipe.
void Start(Run& run, const std::vector<std::string>& env) {
  std::vector<std::string> argv;
  for (const std::string& arg : run.tool->argv) {
    argv.push_back(absl::StrReplaceAll(arg, {{"{pid}", absl::StrCat(run.target)}}));
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    run.failed = absl::StrCat("pipe: ", std::strerror(errno));
    return;
  }
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);  // the agent blocks the signals it handles
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);  // killed as a group if it overruns
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> c_argv, c_env;
  for (std::string& arg : argv) c_argv.push_back(arg.data());
  c_argv.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  for (std::string& entry : env_copy) c_env.push_back(entry.data());
  c_env.push_back(nullptr);
  const int error = posix_spawnp(&run.pid, c_argv[0], &actions, &attr, c_argv.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (error != 0) {
    run.pid = -1;
    run.failed = error == ENOENT ? absl::StrCat(argv[0], " is not installed")
                                 : absl::StrCat("cannot run ", argv[0], ": ", std::strerror(error));
    return;
  }
  fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
  run.out = std::move(read_end);
}

// Waits for `run`, which closed its output, to exit, until `deadline`.
void Reap(Run& run, absl::Time deadline) {
  for (;;) {
    if (waitpid(run.pid, &run.wait_status, WNOHANG) == run.pid) {
      run.reaped = true;
      return;
    }
    if (absl::Now() >= deadline) return;
    usleep(2'000);
  }
}

// Reads what `run` wrote; false at its end.
bool Drain(Run& run, size_t max_bytes) {
  char buffer[16 * 1024];
  for (;;) {
    const ssize_t n = read(run.out.get(), buffer, sizeof buffer);
    if (n > 0) {
      const size_t room = max_bytes > run.text.size() ? max_bytes - run.text.size() : 0;
      run.text.append(buffer, std::min(room, static_cast<size_t>(n)));
      if (static_cast<size_t>(n) > room) run.cut = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && errno == EAGAIN;
  }
}

// The lines of `text` from the first that starts with `from` (none: "").
std::string From(const std::string& text, const std::string& from) {
  if (absl::StartsWith(text, from)) return text;
  const size_t at = text.find("\n" + from);
  return at == std::string::npos ? "" : text.substr(at + 1);
}

// The lines of `text` before the first that starts with `to`.
std::string Before(const std::string& text, const std::string& to) {
  if (absl::StartsWith(text, to)) return "";
  const size_t at = text.find("\n" + to);
  return at == std::string::npos ? text : text.substr(0, at + 1);
}

std::string Describe(const Run& run, absl::Duration limit) {
  std::string out = absl::StrCat(run.tool->heading, ":\n");
  if (!run.failed.empty()) return absl::StrCat(out, "  not available: ", run.failed, "\n");
  for (const std::string& marker : run.tool->says_unavailable) {
    const size_t equals = marker.find('=');
    const std::string seen = marker.substr(0, equals);
    const size_t at = run.text.find(seen);
    if (at == std::string::npos) continue;
    std::string why = marker.substr(equals + 1);
    if (why.empty()) {
      const size_t line_end = run.text.find('\n', at);
      why = run.text.substr(at + seen.size(), line_end == std::string::npos
                                                  ? std::string::npos
                                                  : line_end - at - seen.size());
    }
    return absl::StrCat(out, "  not available: ", why, "\n");
  }
  std::string text = run.text;
  if (!run.tool->keep_from.empty()) text = From(text, run.tool->keep_from);
  if (!run.tool->drop_from.empty()) text = Before(text, run.tool->drop_from);
  if (!text.empty() && text.back() != '\n') text += '\n';
  absl::StrAppend(&out, text);
  if (run.cut) absl::StrAppend(&out, "  [cut: more than ", run.text.size(), " bytes]\n");
  if (!run.reaped) {
    absl::StrAppend(&out, "  [not finished in time (the signal waits at most ",
                    absl::FormatDuration(limit), " for the stacks): stopped]\n");
  } else if (text.empty()) {
    absl::StrAppend(&out, "  not available: ", run.tool->argv[0], " printed nothing",
                    WIFEXITED(run.wait_status)
                        ? absl::StrCat(" and exited with ", WEXITSTATUS(run.wait_status))
                        : "",
                    "\n");
  }
  return out;
}

// Threads of `pid` in D state (uninterruptible, in the kernel) now, by
// tid, each with what it waits in: "1234 in nfs_wait_bit_killable".
std::map<std::string, std::string> ThreadsInDState(pid_t pid) {
  std::map<std::string, std::string> in_d;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  const UniqueDir dir(opendir(tasks.c_str()));
  if (!dir.valid()) return in_d;
  while (const dirent* entry = readdir(dir.get())) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = absl::StrCat(tasks, "/", entry->d_name);
    const std::string stat = ReadProcFile(task + "/stat");
    const std::vector<absl::string_view> fields = ProcStatFields(stat);
    if (fields.empty() || fields[0] != "D") continue;
    std::string wchan = ReadProcFile(task + "/wchan");
    in_d[entry->d_name] = wchan.empty() || wchan == "0"
                              ? std::string(entry->d_name)
                              : absl::StrCat(entry->d_name, " in ", wchan);
  }
  return in_d;
}

// A thread passes through D for a page-in or a short read and is soon out
// again (a process just forked, or one writing a checkpoint); one that
// stays would hold a tracer with it. Stuck: in D at every look, kDStateLook
// apart, for kDStateWatch.
constexpr absl::Duration kDStateWatch = absl::Milliseconds(500);
constexpr absl::Duration kDStateLook = absl::Milliseconds(25);

// Of `pids`, those with threads stuck in D state, with those threads (at
// most until `deadline`; no wait when none is in D at the first look).
std::map<pid_t, std::vector<std::string>> ThreadsStuckInDState(const std::vector<pid_t>& pids,
                                                               absl::Time deadline) {
  std::map<pid_t, std::map<std::string, std::string>> watched;
  for (pid_t pid : pids) {
    std::map<std::string, std::string> in_d = ThreadsInDState(pid);
    if (!in_d.empty()) watched[pid] = std::move(in_d);
  }
  const absl::Time until = std::min(absl::Now() + kDStateWatch, deadline);
  while (!watched.empty() && absl::Now() < until) {
    absl::SleepFor(kDStateLook);
    for (auto it = watched.begin(); it != watched.end();) {
      const std::map<std::string, std::string> in_d = ThreadsInDState(it->first);
      std::map<std::string, std::string> still;
      for (const auto& seen : it->second) {
        if (auto now = in_d.find(seen.first); now != in_d.end()) still.insert(*now);
      }
      it->second = std::move(still);
      it = it->second.empty() ? watched.erase(it) : std::next(it);
    }
  }
  std::map<pid_t, std::vector<std::string>> stuck;
  for (const auto& [pid, threads] : watched) {
    for (const auto& [tid, what] : threads) stuck[pid].push_back(what);
  }
  return stuck;
}

}  // namespace

std::string ReadProcFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return "";
  char buffer[4096];
  const ssize_t n = read(fd.get(), buffer, sizeof buffer);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
}

std::vector<absl::string_view> ProcStatFields(absl::string_view stat) {
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos) return {};
  return absl::StrSplit(stat.substr(close + 1), absl::ByAnyChar(" \n"), absl::SkipEmpty());
}

const char* PythonStacksScript() {
  return R"py(# Each Python thread's frames, read from the interpreter's memory (CPython
# 3.11: _PyRuntime -> interpreters -> thread states -> frames), with the
# helpers of CPython's gdb extension (PyFramePtr). Nothing in the target is
# called or resumed. The last line is "MUSTER-PYSTACKS-OK ..." or
# "MUSTER-PYSTACKS-UNAVAILABLE: <why>".
import os
import sys

import gdb

MAX_THREADS, MAX_FRAMES, MAX_NAME = 256, 64, 200


def say(line):
    sys.stdout.write(line + "\n")


def unavailable(why):
    say("MUSTER-PYSTACKS-UNAVAILABLE: " + why)


def first_interpreter():
    return gdb.parse_and_eval("&_PyRuntime")["interpreters"]["head"]


def frames(thread):
    cframe = thread["cframe"]
    frame = cframe["current_frame"] if int(cframe) else None
    count = 0
    while frame is not None and int(frame) and count < MAX_FRAMES:
        py = PyFramePtr(frame)  # noqa: F821 (CPython's gdb extension)
        if py.is_optimized_out():
            say("  (frame optimized out)")
        else:
            line = py.current_line_num()
            say('  File "%s", line %s, in %s' % (str(py.filename())[:MAX_NAME],
                                                 "?" if line is None else line,
                                                 str(py.co_name.proxyval(set()))[:MAX_NAME]))
        frame = frame["previous"]
        count += 1
    if count == 0:
        say("  (no Python frame: in C, or not started)")
    elif frame is not None and int(frame):
        say("  ... more than %d frames" % MAX_FRAMES)


def main():
    pid = gdb.selected_inferior().pid
    if pid == 0:
        return unavailable("gdb could not attach (ptrace refused, or the process is gone)")
    try:
        exe = os.readlink("/proc/%d/exe" % pid)
    except OSError as e:
        exe = "?(%s)" % e
    if "PyFramePtr" not in globals():
        return unavailable("gdb has no CPython extension for %s (Debian: install python3-dbg)"
                           % exe)
    try:
        interpreter = first_interpreter()
    except gdb.error:
        try:  # an embedding program: the runtime is in libpython
            gdb.execute("sharedlibrary libpython3", to_string=True)
            interpreter = first_interpreter()
        except gdb.error as e:
            return unavailable("no debug symbols for %s that match it (%s)" % (exe, e))
    count = 0
    while int(interpreter) and count < MAX_THREADS:
        thread = interpreter["threads"]["head"]
        while int(thread) and count < MAX_THREADS:
            count += 1
            say("Python thread %d (TID %d):" % (count, int(thread["native_thread_id"])))
            try:
                frames(thread)
            except (gdb.error, gdb.MemoryError, RuntimeError) as e:
                say("  (cannot read its frames: %s)" % e)
            thread = thread["next"]
        interpreter = interpreter["next"]
    if count == 0:
        return unavailable("the interpreter has no threads (starting, or finishing)")
    say("MUSTER-PYSTACKS-OK threads=%d" % count)


main()
)py";
}

absl::Status WriteScript(const std::string& path, absl::string_view text) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoToStatus(errno, "cannot write " + path);
  if (write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return ErrnoToStatus(errno, "cannot write " + path);
  }
  return absl::OkStatus();
}

absl::Status WritePythonStacksScript(const std::string& path) {
  return WriteScript(path, PythonStacksScript());
}

std::vector<StackTool> StackToolsFor(pid_t pid, const std::string& python_script) {
  const std::string exe = ReadLink(absl::StrCat("/proc/", pid, "/exe"));
  const bool python = absl::StartsWith(exe.substr(exe.rfind('/') + 1), "python");
  const std::string no_ptrace =
      "=it may not trace the worker (Yama's kernel.yama.ptrace_scope 2 or more, or the worker "
      "is not dumpable or not this user's)";
  // First the quick one (a few hundredths of a second): every thread's native
  // frames, the module of each (-m), at most 64 per thread (-n).
  std::vector<StackTool> tools = {
      StackTool{"native frames (eu-stack)",
                {"eu-stack", "-m", "-n", "64", "-p", "{pid}"},
                {"Operation not permitted" + no_ptrace, "Permission denied" + no_ptrace},
                "",
                ""}};
  if (python) {
    // About a second: gdb reads the interpreter's debug symbols (only the
    // interpreter's, no shared library's), and only the auto-load scripts
    // of its default safe path (CPython's own).
    tools.push_back(StackTool{
        "Python frames (gdb)",
        {"gdb", "-nx", "-batch", "-q", "-p", "{pid}", "-iex", "set debuginfod enabled off", "-iex",
         "set auto-solib-add off", "-iex", "set print thread-events off", "-x", python_script},
        {"MUSTER-PYSTACKS-UNAVAILABLE: ="},
        "Python thread ",
        "MUSTER-PYSTACKS-OK"});
  }
  return tools;
}

std::map<pid_t, std::string> CaptureStacks(
    const std::vector<std::pair<pid_t, std::vector<StackTool>>>& targets, absl::Duration limit,
    size_t max_bytes) {
  const absl::Time deadline = absl::Now() + limit;
  const std::vector<std::string> env = ToolEnvironment();
  // A process has one tracer at a time: one pid's tools run one after the
  // other, different pids' at once.
  std::vector<std::vector<Run>> chains;
  for (const auto& [pid, tools] : targets) {
    std::vector<Run>& chain = chains.emplace_back(tools.size());
    for (size_t i = 0; i < tools.size(); ++i) {
      chain[i].target = pid;
      chain[i].tool = &tools[i];
    }
  }
  std::vector<size_t> next(chains.size(), 0);  // per chain, the run under way
  // A thread stuck in D state would hold a tracer (and, once the tracer is
  // killed, leave the worker stopped): such a worker is not attached.
  std::vector<pid_t> pids;
  for (const auto& chain : chains) {
    if (!chain.empty()) pids.push_back(chain.front().target);
  }
  const absl::Time looked = absl::Now();
  const std::map<pid_t, std::vector<std::string>> stuck = ThreadsStuckInDState(pids, deadline);
  const absl::Duration watched = absl::Trunc(absl::Now() - looked, absl::Milliseconds(1));
  std::map<pid_t, std::string> stacks;
  for (size_t c = 0; c < chains.size(); ++c) {
    if (chains[c].empty()) continue;
    const pid_t pid = chains[c].front().target;
    auto it = stuck.find(pid);
    if (it == stuck.end()) continue;
    stacks[pid] = absl::StrCat("not attached: thread(s) ", absl::StrJoin(it->second, ", "),
                               " stayed in D state (waiting in the kernel) for ",
                               absl::FormatDuration(watched), "; a debugger would wait too\n");
    next[c] = chains[c].size();
  }
  auto start_next = [&](size_t c) {
    while (next[c] < chains[c].size()) {
      Run& run = chains[c][next[c]];
      Start(run, env);
      if (run.out.valid()) return;
      ++next[c];  // could not start: on to the next tool
    }
  };
  for (size_t c = 0; c < chains.size(); ++c) start_next(c);
  // Output until every chain is done, or the time is up.
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> polled;
    for (size_t c = 0; c < chains.size(); ++c) {
      if (next[c] >= chains[c].size()) continue;
      fds.push_back(pollfd{chains[c][next[c]].out.get(), POLLIN, 0});
      polled.push_back(c);
    }
    const absl::Duration left = deadline - absl::Now();
    if (fds.empty() || left <= absl::ZeroDuration()) break;
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    if (poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Run& run = chains[polled[i]][next[polled[i]]];
      if (Drain(run, max_bytes)) continue;
      run.out.reset();
      Reap(run, deadline);  // it closed its output: it is exiting, and detached
      ++next[polled[i]];
      start_next(polled[i]);
    }
  }
  // What is still running is killed, and dies at once. Its target may be
  // left stopped by the attach: it is continued (the signal to come must
  // reach it; SIGCONT changes nothing else).
  for (auto& chain : chains) {
    for (Run& run : chain) {
      if (run.pid <= 0 || run.reaped) continue;
      kill(-run.pid, SIGKILL);
      while (waitpid(run.pid, &run.wait_status, 0) < 0 && errno == EINTR) {
      }
      run.out.reset();
      kill(run.target, SIGCONT);
    }
  }
  for (size_t c = 0; c < chains.size(); ++c) {
    if (stacks.count(chains[c].empty() ? 0 : chains[c].front().target) > 0) continue;
    for (const Run& run : chains[c]) {
      if (run.pid > 0 || !run.failed.empty()) {
        stacks[run.target] += Describe(run, limit);
      } else {
        stacks[run.target] +=
            absl::StrCat(run.tool->heading, ":\n  not taken: out of time (the kill waits at most ",
                         absl::FormatDuration(limit), " for the stacks)\n");
      }
    }
  }
  return stacks;
}

}  // namespace muster
