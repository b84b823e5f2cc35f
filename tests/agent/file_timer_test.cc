#include "agent/file_timer.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'750'000'000);

// A line as torch's FileTimerClient writes it (json.dumps of its request).
std::string Line(int pid, const std::string& scope, double expiration, int signal) {
  return absl::StrCat(R"({"version": 1, "pid": )", pid, R"(, "scope_id": ")", scope,
                      R"(", "expiration_time": )", absl::StrFormat("%.6f", expiration),
                      R"(, "signal": )", signal, "}");
}

double In(double seconds) { return absl::ToUnixSeconds(kNow) + seconds; }

bool AnyPid(pid_t) { return true; }

TEST(ParseFileTimerRequestTest, ReadsWhatTorchsClientWrites) {
  absl::StatusOr<FileTimerRequest> request =
      ParseFileTimerRequest(R"({"version": 1, "pid": 4242, "scope_id": "train_step", )"
                            R"("expiration_time": 1750000001.25, "signal": 9})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->pid, 4242);
  EXPECT_EQ(request->scope_id, "train_step");
  EXPECT_DOUBLE_EQ(request->expiration_time, 1750000001.25);
  EXPECT_EQ(request->signal, 9);
  // A release: expiration -1, signal 0.
  request = ParseFileTimerRequest(Line(4242, "train_step", -1, 0));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_LT(request->expiration_time, 0);
}

TEST(ParseFileTimerRequestTest, EachBadLineSaysWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {R"({"pid": "x", "scope_id": "a", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": 0, "scope_id": "a", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": 1.5, "scope_id": "a", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": 12, "scope_id": 3, "expiration_time": 1, "signal": 9})", "\"scope_id\""},
      {R"({"pid": 12, "scope_id": "a", "signal": 9})", "\"expiration_time\""},
      {R"({"pid": 12, "scope_id": "a", "expiration_time": 1})", "\"signal\""},
      {R"({"pid": 12, "scope_id": "a", "expiration_time": 1, "signal": 99})", "\"signal\""},
      {R"({"version": 2, "pid": 12, "scope_id": "a", "expiration_time": 1, "signal": 9})",
       "\"version\""},
  };
  for (const auto& [line, named] : cases) {
    absl::StatusOr<FileTimerRequest> request = ParseFileTimerRequest(line);
    ASSERT_FALSE(request.ok()) << line;
    EXPECT_TRUE(absl::IsInvalidArgument(request.status())) << line;
    EXPECT_NE(request.status().message().find(named), absl::string_view::npos)
        << line << ": " << request.status();
  }
}

TEST(FileTimersTest, AnExpiredTimerIsActedOnOnceWithItsSignal) {
  FileTimers timers;
  EXPECT_EQ(timers.Take(Line(10, "step", In(1), 9), AnyPid), FileTimers::Outcome::kSet);
  EXPECT_EQ(timers.NextExpiry(), kNow + absl::Seconds(1));
  EXPECT_TRUE(timers.Expire(kNow + absl::Milliseconds(999)).empty());
  std::vector<TimerExpiry> expired = timers.Expire(kNow + absl::Seconds(1));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].pid, 10);
  EXPECT_EQ(expired[0].scope_id, "step");
  EXPECT_EQ(expired[0].signal, 9);
  EXPECT_EQ(expired[0].expired_at, kNow + absl::Seconds(1));
  EXPECT_TRUE(timers.Expire(kNow + absl::Seconds(5)).empty()) << "cleared once acted on";
  EXPECT_EQ(timers.NextExpiry(), std::nullopt);
}

TEST(FileTimersTest, AReleasedScopeIsNeverActedOn) {
  FileTimers timers;
  timers.Take(Line(10, "step", In(1), 9), AnyPid);
  EXPECT_EQ(timers.Take(Line(10, "step", -1, 0), AnyPid), FileTimers::Outcome::kReleased);
  EXPECT_TRUE(timers.Expire(kNow + absl::Hours(1)).empty());
  // Releasing what was never set changes nothing.
  EXPECT_EQ(timers.Take(Line(10, "other", -1, 0), AnyPid), FileTimers::Outcome::kReleased);
  EXPECT_EQ(timers.size(), 0u);
}

TEST(FileTimersTest, ALaterAcquireOfTheSameScopeReplacesTheEarlier) {
  FileTimers timers;
  timers.Take(Line(10, "step", In(1), 9), AnyPid);
  timers.Take(Line(10, "step", In(10), 15), AnyPid);
  EXPECT_TRUE(timers.Expire(kNow + absl::Seconds(5)).empty());
  std::vector<TimerExpiry> expired = timers.Expire(kNow + absl::Seconds(10));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].signal, 15);
}

TEST(FileTimersTest, TheEarliestExpiredTimerWithASignalWinsAndClearsThePid) {
  FileTimers timers;
  timers.Take(Line(10, "no_signal", In(1), 0), AnyPid);  // earliest, but no signal
  timers.Take(Line(10, "late", In(3), 15), AnyPid);      // expired, later
  timers.Take(Line(10, "early", In(2), 9), AnyPid);      // the one
  timers.Take(Line(10, "not_yet", In(100), 9), AnyPid);  // cleared with the rest, as torch does
  timers.Take(Line(11, "other_pid", In(100), 9), AnyPid);
  std::vector<TimerExpiry> expired = timers.Expire(kNow + absl::Seconds(3));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].scope_id, "early");
  EXPECT_EQ(expired[0].signal, 9);
  EXPECT_EQ(timers.size(), 1u) << "only pid 11's timer is left";
}

TEST(FileTimersTest, ExpiredTimersWithoutASignalAreReportedAsSuchAndCleared) {
  FileTimers timers;
  timers.Take(Line(10, "watch_only", In(1), 0), AnyPid);
  timers.Take(Line(10, "negative", In(2), -9), AnyPid);
  std::vector<TimerExpiry> expired = timers.Expire(kNow + absl::Seconds(2));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].scope_id, "watch_only");
  EXPECT_EQ(expired[0].signal, 0);
  EXPECT_EQ(timers.size(), 0u);
}

TEST(FileTimersTest, DueBySaysWhoseSignalledTimersRunOutByThenWithoutClearingThem) {
  FileTimers timers;
  timers.Take(Line(10, "a", In(1), 9), AnyPid);
  timers.Take(Line(10, "b", In(2), 9), AnyPid);
  timers.Take(Line(11, "no_signal", In(1), 0), AnyPid);
  timers.Take(Line(12, "later", In(5), 9), AnyPid);
  EXPECT_EQ(timers.DueBy(kNow), std::vector<pid_t>{});
  EXPECT_EQ(timers.DueBy(kNow + absl::Seconds(2)), std::vector<pid_t>{10})
      << "each pid once; a timer without a signal is not acted on";
  EXPECT_EQ(timers.DueBy(kNow + absl::Seconds(5)), (std::vector<pid_t>{10, 12}));
  EXPECT_EQ(timers.size(), 4u);
}

TEST(FileTimersTest, ATimerForAPidNotOursChangesNothingAndIsCounted) {
  FileTimers timers;
  auto only_10 = [](pid_t pid) { return pid == 10; };
  EXPECT_EQ(timers.Take(Line(1, "init", In(0), 9), only_10), FileTimers::Outcome::kForeignPid);
  EXPECT_EQ(timers.Take(Line(1, "init", -1, 0), only_10), FileTimers::Outcome::kForeignPid);
  EXPECT_EQ(timers.Take("garbage", only_10), FileTimers::Outcome::kBadLine);
  EXPECT_EQ(timers.Take("", only_10), FileTimers::Outcome::kBadLine);
  EXPECT_EQ(timers.size(), 0u);
  EXPECT_TRUE(timers.Expire(kNow + absl::Hours(1)).empty());
  EXPECT_EQ(timers.foreign_lines(), 2);
  EXPECT_EQ(timers.bad_lines(), 2);
}

TEST(FileTimersTest, AnExitedWorkersTimersAreForgotten) {
  FileTimers timers;
  timers.Take(Line(10, "a", In(1), 9), AnyPid);
  timers.Take(Line(10, "b", In(2), 9), AnyPid);
  timers.Take(Line(11, "a", In(3), 9), AnyPid);
  timers.Forget(10);
  EXPECT_EQ(timers.size(), 1u);
  EXPECT_EQ(timers.NextExpiry(), kNow + absl::Seconds(3));
}

class TimerPipeTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv("TMPDIR", dir_.c_str(), 1); }
  void TearDown() override { unsetenv("TMPDIR"); }

  // Writes as torch's client does: open non-blocking, write, close.
  static void Write(const std::string& path, const std::string& bytes) {
    const int fd = open(path.c_str(), O_WRONLY | O_NONBLOCK);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    close(fd);
  }

  static std::vector<std::string> ReadAll(TimerPipe& pipe) {
    std::vector<std::string> lines;
    pipe.Read([&](std::string_view line) { lines.emplace_back(line); });
    return lines;
  }

  support::TempDir temp_{"timer-pipe-test"};
  const std::string dir_ = temp_.path();
};

TEST_F(TimerPipeTest, OwnPipeIsPrivateAndGoesAwayWithIt) {
  std::string path, parent;
  {
    absl::StatusOr<TimerPipe> pipe = TimerPipe::Create("");
    ASSERT_TRUE(pipe.ok()) << pipe.status();
    path = pipe->path();
    parent = path.substr(0, path.rfind('/'));
    EXPECT_EQ(parent.rfind(dir_ + "/muster-timer-", 0), 0u) << path;
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(stat(parent.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  EXPECT_NE(access(parent.c_str(), F_OK), 0);
}

TEST_F(TimerPipeTest, LinesFromManyClientsArriveWholeAndNeverAsAnEnd) {
  absl::StatusOr<TimerPipe> pipe = TimerPipe::Create("");
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  EXPECT_TRUE(ReadAll(*pipe).empty()) << "no client yet: nothing, not an end";
  Write(pipe->path(), "first\n");
  Write(pipe->path(), "sec");
  Write(pipe->path(), "ond\nthird\n");
  EXPECT_EQ(ReadAll(*pipe), (std::vector<std::string>{"first", "second", "third"}));
  EXPECT_TRUE(ReadAll(*pipe).empty()) << "every client closed: still no end";
}

TEST_F(TimerPipeTest, ALineLongerThanOneAtomicWriteIsDroppedWholeAsABadLine) {
  absl::StatusOr<TimerPipe> pipe = TimerPipe::Create("");
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  Write(pipe->path(), std::string(PIPE_BUF + 100, 'x') + "\nafter\n");
  EXPECT_EQ(ReadAll(*pipe), (std::vector<std::string>{"", "after"}));
}

TEST_F(TimerPipeTest, AGivenPathIsUsedAndAnOldPipeThereReplaced) {
  const std::string path = dir_ + "/given";
  ASSERT_EQ(mkfifo(path.c_str(), 0666), 0);
  {
    absl::StatusOr<TimerPipe> pipe = TimerPipe::Create(path);
    ASSERT_TRUE(pipe.ok()) << pipe.status();
    EXPECT_EQ(pipe->path(), path);
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    Write(path, "hello\n");
    EXPECT_EQ(ReadAll(*pipe), (std::vector<std::string>{"hello"}));
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  EXPECT_EQ(access(dir_.c_str(), F_OK), 0) << "a directory it did not make stays";
}

TEST_F(TimerPipeTest, AGivenPathHoldingAnythingButAPipeIsRefusedAndKept) {
  const std::string path = dir_ + "/data";
  close(open(path.c_str(), O_CREAT | O_WRONLY, 0600));
  absl::StatusOr<TimerPipe> pipe = TimerPipe::Create(path);
  ASSERT_FALSE(pipe.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(pipe.status()));
  EXPECT_NE(pipe.status().message().find("is not a named pipe"), absl::string_view::npos);
  EXPECT_EQ(access(path.c_str(), F_OK), 0) << "the user's file is untouched";
}

}  // namespace
}  // namespace muster
