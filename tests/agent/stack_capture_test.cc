#include "agent/stack_capture.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A process to take stacks of: `sleep 30`, killed and reaped at the end.
class Target {
 public:
  // Returns once the child has exec'd sleep: the pipe's write end closes on
  // exec (O_CLOEXEC), and the read sees its end.
  Target() {
    int execd[2];
    if (pipe2(execd, O_CLOEXEC) != 0) abort();
    pid_ = fork();
    if (pid_ == 0) {
      close(execd[0]);
      execlp("sleep", "sleep", "30", nullptr);
      _exit(127);
    }
    close(execd[1]);
    char byte;
    while (read(execd[0], &byte, 1) < 0 && errno == EINTR) {
    }
    close(execd[0]);
  }
  // Returns once the exec'd sleep sleeps (its start-up, the loader's work
  // included, is over), or after 5 s.
  void WaitAsleep() const {
    const std::string wchan = absl::StrCat("/proc/", pid_, "/wchan");
    for (int i = 0; i < 5'000; ++i) {
      if (absl::StrContains(support::ReadFile(wchan), "nanosleep")) return;
      usleep(1'000);
    }
  }
  ~Target() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// A process in D state for `d_for` (forever when unset): a vfork parent
// waits in the kernel, uninterruptibly, until its child execs or exits;
// this child does neither until then. Ready once the child runs; the whole
// group is killed at the end.
class InDState {
 public:
  explicit InDState(std::optional<absl::Duration> d_for) {
    int ready[2];
    if (pipe(ready) != 0) abort();
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      // Gone with the test, should it die first; and never holding its
      // output open (ctest would wait for it).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null = open("/dev/null", O_RDWR);
      for (int fd = 0; fd <= 2; ++fd) dup2(null, fd);
      static char stack[64 * 1024];
      static std::optional<absl::Duration> child_d_for;
      static int child_ready;
      child_d_for = d_for;
      child_ready = ready[1];
      // Raw syscalls only: the child shares the parent's memory, TLS included.
      clone(
          [](void*) -> int {
            syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL);
            syscall(SYS_write, child_ready, "r", 1);
            if (!child_d_for) {
              for (;;) syscall(SYS_pause);
            }
            const timespec t = absl::ToTimespec(*child_d_for);
            syscall(SYS_nanosleep, &t, nullptr);
            syscall(SYS_exit, 0);
            return 0;
          },
          stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, nullptr);
      for (;;) pause();
    }
    setpgid(pid_, pid_);
    close(ready[1]);
    char byte;
    if (read(ready[0], &byte, 1) != 1) abort();
    close(ready[0]);
  }
  ~InDState() {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  // Its state letter in /proc/<pid>/stat, now.
  std::string State() const {
    const std::string stat = ReadProcFile("/proc/" + std::to_string(pid_) + "/stat");
    const std::vector<absl::string_view> fields = ProcStatFields(stat);
    return fields.empty() ? "" : std::string(fields[0]);
  }

 private:
  pid_t pid_;
};

StackTool Shell(const std::string& heading, const std::string& script) {
  return StackTool{heading, {"sh", "-c", script, "sh", "{pid}"}, {}, "", ""};
}

TEST(ProcStatFieldsTest, FieldsFollowTheLastParenthesisWhateverTheNameHolds) {
  const std::string stat = "4242 (a) b (c) D 17 4242 4242 0 -1\n";
  EXPECT_THAT(ProcStatFields(stat), ::testing::ElementsAre("D", "17", "4242", "4242", "0", "-1"));
  for (const std::string not_stat : {"no name here", ""}) {
    EXPECT_THAT(ProcStatFields(not_stat), ::testing::IsEmpty()) << not_stat;
  }
}

TEST(CaptureStacksTest, EachToolsOutputComesUnderItsHeadingInOrder) {
  Target target;
  std::vector<StackTool> tools = {Shell("first", "echo one $1"), Shell("second", "echo two")};
  std::map<pid_t, std::string> stacks =
      CaptureStacks({{target.pid(), tools}}, absl::Seconds(10), 1 << 20);
  EXPECT_EQ(stacks[target.pid()],
            "first:\none " + std::to_string(target.pid()) + "\nsecond:\ntwo\n");
}

TEST(CaptureStacksTest, OneTargetsToolsRunOneAfterTheOther) {
  Target target;
  // The second would see the first's mark if they overlapped.
  const std::string mark = "/tmp/stack-capture-test-" + std::to_string(getpid());
  std::vector<StackTool> tools = {
      Shell("first", "touch " + mark + "; sleep 0.3; rm " + mark + "; echo done"),
      Shell("second", "test -e " + mark + " && echo overlapped || echo alone")};
  std::map<pid_t, std::string> stacks =
      CaptureStacks({{target.pid(), tools}}, absl::Seconds(10), 1 << 20);
  EXPECT_THAT(stacks[target.pid()], HasSubstr("second:\nalone\n"));
}

TEST(CaptureStacksTest, ATimeLimitStopsSlowToolsSaysSoAndKeepsTheTargetRunning) {
  Target target;
  std::vector<StackTool> tools = {Shell("slow", "echo partial; sleep 30"),
                                  Shell("never started", "echo no")};
  const absl::Time start = absl::Now();
  std::map<pid_t, std::string> stacks =
      CaptureStacks({{target.pid(), tools}}, absl::Milliseconds(300), 1 << 20);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_THAT(stacks[target.pid()], HasSubstr("slow:\npartial\n  [not finished in time"));
  EXPECT_THAT(stacks[target.pid()], HasSubstr("never started:\n  not taken: out of time"));
  EXPECT_EQ(kill(target.pid(), 0), 0) << "the target lives on";
}

TEST(CaptureStacksTest, ToolsThatCannotRunOrSayWhyNotAreReportedAsSuch) {
  Target target;
  StackTool missing{"missing", {"no-such-stack-tool-here", "{pid}"}, {}, "", ""};
  StackTool refuses = Shell("refuses", "echo 'banner'; echo 'MARK: no symbols for it'");
  refuses.says_unavailable = {"MARK: ="};
  StackTool silent = Shell("silent", "exit 3");
  std::map<pid_t, std::string> stacks =
      CaptureStacks({{target.pid(), {missing, refuses, silent}}}, absl::Seconds(10), 1 << 20);
  EXPECT_THAT(stacks[target.pid()],
              HasSubstr("missing:\n  not available: no-such-stack-tool-here is not installed\n"));
  EXPECT_THAT(stacks[target.pid()], HasSubstr("refuses:\n  not available: no symbols for it\n"));
  EXPECT_THAT(stacks[target.pid()],
              HasSubstr("silent:\n  not available: sh printed nothing and exited with 3\n"));
}

TEST(CaptureStacksTest, BannerAndLastWordsAreLeftOutAndOutputIsCut) {
  Target target;
  StackTool noisy = Shell("noisy", "echo banner; echo 'Thread 1'; echo frame; echo 'END ok'");
  noisy.keep_from = "Thread ";
  noisy.drop_from = "END";
  StackTool long_one = Shell("long", "yes frame | head -c 100000");
  std::map<pid_t, std::string> stacks =
      CaptureStacks({{target.pid(), {noisy, long_one}}}, absl::Seconds(10), 1000);
  EXPECT_THAT(stacks[target.pid()], HasSubstr("noisy:\nThread 1\nframe\nlong:\n"));
  EXPECT_THAT(stacks[target.pid()], Not(HasSubstr("banner")));
  EXPECT_THAT(stacks[target.pid()], HasSubstr("[cut: more than 1000 bytes]"));
}

TEST(CaptureStacksTest, AProcessStuckInDStateIsNotAttachedAndTheReportSaysWhy) {
  InDState target(std::nullopt);
  const absl::Time start = absl::Now();
  std::map<pid_t, std::string> stacks =
      CaptureStacks({{target.pid(), {Shell("tool", "echo attached")}}}, absl::Seconds(10), 1 << 20);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "it looks for half a second, then gives up";
  EXPECT_THAT(stacks[target.pid()],
              HasSubstr("not attached: thread(s) " + std::to_string(target.pid())));
  EXPECT_THAT(stacks[target.pid()], HasSubstr("stayed in D state (waiting in the kernel) for "));
  EXPECT_THAT(stacks[target.pid()], Not(HasSubstr("attached\n")));
  EXPECT_EQ(target.State(), "D") << "still waiting: it was never attached";
}

TEST(CaptureStacksTest, AProcessInDStateForAMomentIsAttachedOnceItIsOut) {
  // A page-in or a short read: 100 ms in D, well within the half second of
  // looks. Caught in D at the first look (tried again if the test itself
  // was too slow to see it there).
  for (int attempt = 0; attempt < 5; ++attempt) {
    InDState target(absl::Milliseconds(100));
    if (target.State() != "D") continue;
    std::map<pid_t, std::string> stacks = CaptureStacks(
        {{target.pid(), {Shell("tool", "echo attached")}}}, absl::Seconds(10), 1 << 20);
    EXPECT_EQ(stacks[target.pid()], "tool:\nattached\n");
    return;
  }
  FAIL() << "the target was never seen in D state";
}

TEST(CaptureStacksTest, RealToolsShowWhereASleepingProcessIs) {
  if (system("command -v eu-stack > /dev/null") != 0) GTEST_SKIP() << "no eu-stack (elfutils)";
  Target target;  // exec'd
  target.WaitAsleep();
  std::map<pid_t, std::string> stacks = CaptureStacks(
      {{target.pid(), StackToolsFor(target.pid(), "/nonexistent")}}, absl::Seconds(5), 1 << 20);
  EXPECT_THAT(stacks[target.pid()], HasSubstr("native frames (eu-stack):\nPID "));
  EXPECT_THAT(stacks[target.pid()], HasSubstr("nanosleep"));
  EXPECT_THAT(stacks[target.pid()], Not(HasSubstr("Python frames"))) << "sleep is no Python";
}

}  // namespace
}  // namespace muster
