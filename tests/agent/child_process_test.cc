#include "agent/child_process.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/open_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

// Reads everything from a non-blocking fd until EOF, for at most 10 s.
std::string ReadAll(int fd) {
  std::string out;
  char buffer[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      out.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return out;
}

ExitStatus Wait(ChildProcess& child) {
  int status = 0;
  EXPECT_EQ(waitpid(child.pid(), &status, 0), child.pid());
  ExitStatus exit = DecodeWaitStatus(status);
  child.MarkExited(exit);
  return exit;
}

TEST(ChildProcessTest, CapturesOutputAndExitCode) {
  auto child = ChildProcess::Spawn(
      {"/bin/sh", {"sh", "-c", "echo out; echo err >&2; echo $FOO; exit 3"}, {"FOO=bar"}});
  ASSERT_TRUE(child.ok()) << child.status();
  UniqueFd out = (*child)->TakeStdout();
  UniqueFd err = (*child)->TakeStderr();
  EXPECT_EQ(ReadAll(out.get()), "out\nbar\n");
  EXPECT_EQ(ReadAll(err.get()), "err\n");
  ExitStatus exit = Wait(**child);
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_FALSE(exit.success());
}

TEST(ChildProcessTest, OwnProcessGroup) {
  // The child prints its own /proc stat line, with shell builtins only:
  // "PID (COMM) STATE PPID PGRP ...".
  auto child = ChildProcess::Spawn(
      {"/bin/sh", {"sh", "-c", "read -r stat < /proc/$$/stat; echo \"$stat\""}, {}});
  ASSERT_TRUE(child.ok()) << child.status();
  UniqueFd out = (*child)->TakeStdout();
  const std::string stat = ReadAll(out.get());
  EXPECT_TRUE(Wait(**child).success());
  const size_t comm_end = stat.rfind(") ");
  ASSERT_NE(comm_end, std::string::npos) << stat;
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(comm_end + 2), ' ', absl::SkipEmpty());
  ASSERT_GE(fields.size(), 3u) << stat;
  pid_t pid = 0, pgrp = 0;
  ASSERT_TRUE(absl::SimpleAtoi(stat.substr(0, stat.find(' ')), &pid)) << stat;
  ASSERT_TRUE(absl::SimpleAtoi(fields[2], &pgrp)) << stat;
  EXPECT_EQ(pid, (*child)->pid());   // the line is the child's own
  EXPECT_EQ(pgrp, (*child)->pid());  // it leads its own group...
  EXPECT_NE(pgrp, getpgrp());        // ...not the test's
}

TEST(ChildProcessTest, SignalReachesTheGroupAndIsDecoded) {
  auto child = ChildProcess::Spawn({"/bin/sleep", {"sleep", "30"}, {}});
  ASSERT_TRUE(child.ok()) << child.status();
  (*child)->SignalGroup(SIGTERM);
  ExitStatus exit = Wait(**child);
  EXPECT_EQ(exit.signal, SIGTERM);
}

TEST(ChildProcessTest, ExecFailureIsAStatusNotAChild) {
  auto missing = ChildProcess::Spawn({"/nonexistent/prog", {"prog"}, {}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/prog"), absl::string_view::npos);

  const std::string script = testing::TempDir() + "/not_executable.sh";
  std::ofstream(script) << "#!/bin/sh\n";
  std::filesystem::permissions(
      script, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto denied = ChildProcess::Spawn({script, {script}, {}});
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(ChildProcessTest, DestructorKillsAndReaps) {
  pid_t pid;
  {
    auto child = ChildProcess::Spawn({"/bin/sleep", {"sleep", "30"}, {}});
    ASSERT_TRUE(child.ok()) << child.status();
    pid = (*child)->pid();
  }
  EXPECT_EQ(kill(pid, 0), -1);  // reaped: the pid is gone, not a zombie
  EXPECT_EQ(errno, ESRCH);
}

TEST(ChildProcessTest, ChildStartsWithNoBlockedSignals) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  auto child = ChildProcess::Spawn({"/bin/sh", {"sh", "-c", "grep SigBlk /proc/self/status"}, {}});
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(child.ok()) << child.status();
  UniqueFd out = (*child)->TakeStdout();
  EXPECT_EQ(ReadAll(out.get()), "SigBlk:\t0000000000000000\n");
  Wait(**child);
}

TEST(ChildProcessTest, DiesWithItsParent) {
  // A middle process spawns a sleeping child, then dies: PR_SET_PDEATHSIG must kill the child.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    auto child = ChildProcess::Spawn({"/bin/sleep", {"sleep", "30"}, {}, false});
    pid_t pid = child.ok() ? (*child)->pid() : -1;
    if (write(pipe_fds[1], &pid, sizeof(pid)) != sizeof(pid)) _exit(2);
    _exit(0);  // no destructor: the child is left to PR_SET_PDEATHSIG
  }
  pid_t grandchild = -1;
  ASSERT_EQ(read(pipe_fds[0], &grandchild, sizeof(grandchild)),
            static_cast<ssize_t>(sizeof(grandchild)));
  ASSERT_GT(grandchild, 0);
  waitpid(middle, nullptr, 0);
  // The grandchild is reparented (to init or a subreaper) and killed; poll until it is gone.
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    const std::string content = support::ReadFile("/proc/" + std::to_string(grandchild) + "/stat");
    gone = content.empty() || content.find(") Z ") != std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

// With no descriptor left, the spawn fails as the agent's lack
// (kResourceExhausted), which the agent does not count as the worker's
// failure.
TEST(ChildProcessTest, OutOfDescriptorsIsResourceExhausted) {
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest_free = dup(0);
  ASSERT_GE(lowest_free, 0);
  close(lowest_free);
  rlimit tight = saved;
  // Room for one pipe, not the three a spawn makes. (UBSan's own check of a
  // new object's type borrows a pipe too, and gives it back.)
  tight.rlim_cur = static_cast<rlim_t>(lowest_free) + 2;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  auto child = ChildProcess::Spawn({"/bin/true", {"true"}, {}});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), absl::StatusCode::kResourceExhausted) << child.status();
  EXPECT_NE(child.status().message().find("Too many open files"), std::string::npos)
      << child.status();
}

// An agent that raised its own open-file limit (it hosts the rendezvous)
// starts its workers with the limit it was given.
TEST(ChildProcessTest, WorkersGetTheOpenFileLimitTheAgentWasGiven) {
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max <= 1000) {
    GTEST_SKIP() << "the hard open-file limit is " << saved.rlim_max << ": no room to raise";
  }
  rlimit low = saved;
  low.rlim_cur = 1000;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  RaiseOpenFileLimit(1, "test");
  rlimit raised;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &raised), 0);
  EXPECT_EQ(raised.rlim_cur, saved.rlim_max);
  auto child = ChildProcess::Spawn({"/bin/sh", {"sh", "-c", "ulimit -n"}, {}});
  ASSERT_TRUE(child.ok()) << child.status();
  UniqueFd out = (*child)->TakeStdout();
  EXPECT_EQ(ReadAll(out.get()), "1000\n");
  EXPECT_TRUE(Wait(**child).success());
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

using ::testing::EndsWith;
using ::testing::Not;
using ::testing::StartsWith;

// --numa-binding: the CPUs and the preferred memory node are set before exec.
TEST(ChildProcessTest, BoundToTheCpusAndNodeAsked) {
  if (!std::filesystem::exists("/proc/self/numa_maps")) {
    GTEST_SKIP() << "this kernel has no NUMA (no /proc/self/numa_maps)";
  }
  cpu_set_t own;
  ASSERT_EQ(sched_getaffinity(0, sizeof(own), &own), 0);
  int last = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &own)) last = cpu;
  }
  SpawnOptions options{"/bin/sh",
                       {"sh", "-c",
                        "grep Cpus_allowed_list /proc/self/status; "
                        "grep -c -E 'prefer( \\(many\\))?:0 ' /proc/self/numa_maps"},
                       {}};
  options.cpus = {last};
  options.memory_nodes = {0};
  auto child = ChildProcess::Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status();
  UniqueFd out = (*child)->TakeStdout();
  const std::string text = ReadAll(out.get());
  EXPECT_THAT(text, StartsWith(absl::StrCat("Cpus_allowed_list:\t", last, "\n"))) << text;
  // grep -c: how many of the shell's mappings prefer node 0; none without the policy.
  EXPECT_THAT(text, Not(EndsWith("\n0\n"))) << text;
  EXPECT_TRUE(Wait(**child).success());
}

TEST(ResolveExecutableTest, SearchesPath) {
  EXPECT_EQ(*ResolveExecutable("sh", "/nonexistent:/bin"), "/bin/sh");
  EXPECT_EQ(*ResolveExecutable("/bin/sh", ""), "/bin/sh");
  auto missing = ResolveExecutable("no-such-program-xyz", "/bin:/usr/bin");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("not found in PATH"), absl::string_view::npos);
  EXPECT_FALSE(ResolveExecutable("/bin", "").ok());  // a directory
}

}  // namespace
}  // namespace muster
