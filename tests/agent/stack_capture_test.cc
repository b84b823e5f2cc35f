#include "agent/stack_capture.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace muster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A process to take stacks of: `sleep 30`, killed and reaped at the end.
class Target {
 public:
  Target() {
    pid_ = fork();
    if (pid_ == 0) {
      execlp("sleep", "sleep", "30", nullptr);
      _exit(127);
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

StackTool Shell(const std::string& heading, const std::string& script) {
  return StackTool{heading, {"sh", "-c", script, "sh", "{pid}"}, {}, "", ""};
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

TEST(CaptureStacksTest, RealToolsShowWhereASleepingProcessIs) {
  if (system("command -v eu-stack > /dev/null") != 0) GTEST_SKIP() << "no eu-stack (elfutils)";
  Target target;
  usleep(100'000);  // exec'd
  std::map<pid_t, std::string> stacks = CaptureStacks(
      {{target.pid(), StackToolsFor(target.pid(), "/nonexistent")}}, absl::Seconds(5), 1 << 20);
  EXPECT_THAT(stacks[target.pid()], HasSubstr("native frames (eu-stack):\nPID "));
  EXPECT_THAT(stacks[target.pid()], HasSubstr("nanosleep"));
  EXPECT_THAT(stacks[target.pid()], Not(HasSubstr("Python frames"))) << "sleep is no Python";
}

}  // namespace
}  // namespace muster
