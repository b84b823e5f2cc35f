#include "agent/failure_report.h"

#include <signal.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Time At(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

WorkerFailure Failure(int rank, absl::Time seen,
                      std::optional<absl::Time> error_time = std::nullopt) {
  WorkerFailure failure;
  failure.rank = rank;
  failure.local_rank = rank % 4;
  failure.host = rank < 4 ? "node-a" : "node-b";
  failure.pid = 1000 + rank;
  failure.exit_code = 1;
  failure.time = seen;
  if (error_time.has_value()) {
    failure.error_file = "/logs/attempt_0/" + std::to_string(rank) + "/error.json";
    failure.error = WorkerError{.message = "RuntimeError: rank " + std::to_string(rank),
                                .traceback = "",
                                .timestamp = error_time};
  }
  return failure;
}

TEST(SignalNameTest, NamesSignals) {
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGABRT), "SIGABRT");
  EXPECT_EQ(SignalName(SIGRTMIN), "SIGRTMIN");
  EXPECT_EQ(SignalName(SIGRTMIN + 2), "SIGRTMIN+2");
  EXPECT_EQ(SignalName(99), "signal 99");
  EXPECT_EQ(SignalName(0), "signal 0");
}

TEST(DescribeExitTest, ExitCodeOrSignal) {
  WorkerFailure failure;
  failure.exit_code = 1;
  EXPECT_EQ(DescribeExit(failure), "exit code 1");
  failure.signal = 11;
  EXPECT_EQ(DescribeExit(failure), "Signal 11 (SIGSEGV)");
}

TEST(RootCauseIndexTest, EmptyIsSize) { EXPECT_EQ(RootCauseIndex({}), 0u); }

TEST(RootCauseIndexTest, EarliestSeenWithoutErrorFiles) {
  EXPECT_EQ(RootCauseIndex({Failure(0, At(100.7)), Failure(1, At(100.2)), Failure(2, At(103))}),
            1u);
}

TEST(RootCauseIndexTest, ErrorFileTimestampBeatsLaterAgentTime) {
  // Rank 1 recorded its error at 100 but took 5 s to exit; rank 0 was killed at 102.
  std::vector<WorkerFailure> failures = {Failure(0, At(102)), Failure(1, At(105), At(100))};
  EXPECT_EQ(RootCauseIndex(failures), 1u);
}

TEST(RootCauseIndexTest, EarliestErrorFileTimestampWins) {
  std::vector<WorkerFailure> failures = {Failure(0, At(101), At(99)), Failure(1, At(100), At(98)),
                                         Failure(2, At(99.5), At(99))};
  EXPECT_EQ(RootCauseIndex(failures), 1u);
}

TEST(RootCauseIndexTest, WithinOneSecondTheFirstSeenWins) {
  // PyTorch writes whole seconds: rank 0 crashed at 100.2 (no file); rank 1 failed because of it
  // at 100.6 and wrote "100". The file's truncated time must not make rank 1 the root cause.
  std::vector<WorkerFailure> failures = {Failure(1, At(100.7), At(100)), Failure(0, At(100.2))};
  EXPECT_EQ(RootCauseIndex(failures), 1u);
  // Same second, same agent time: the earlier index.
  EXPECT_EQ(RootCauseIndex({Failure(3, At(50)), Failure(2, At(50))}), 0u);
}

TEST(FormatFailureReportTest, RootCauseFirstWithMessageAndTraceback) {
  WorkerFailure killed = Failure(0, At(1700000005.25));
  killed.signal = SIGTERM;
  WorkerFailure root = Failure(5, At(1700000006.5), At(1700000002));
  root.error->traceback =
      "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
      "RuntimeError: rank 5\n";
  const std::string report = FormatFailureReport("train.py", 4, {killed, root});
  SCOPED_TRACE(report);

  EXPECT_THAT(report, HasSubstr("train.py FAILED after 4 attempts"));
  EXPECT_THAT(report, HasSubstr("Root Cause (first observed failure):"));
  // The root cause row comes first, marked, with rank, local rank, host, pid and exit.
  const size_t root_row = report.find("  * 5 (1)");
  const size_t other_row = report.find("    0 (0)");
  ASSERT_NE(root_row, std::string::npos);
  ASSERT_NE(other_row, std::string::npos);
  EXPECT_LT(root_row, other_row);
  const std::string root_line = report.substr(root_row, report.find('\n', root_row) - root_row);
  EXPECT_THAT(root_line, HasSubstr("node-b"));
  EXPECT_THAT(root_line, HasSubstr("1005"));
  EXPECT_THAT(root_line, HasSubstr("exit code 1"));
  EXPECT_THAT(root_line, HasSubstr("2023-11-14T22:13:26.500Z"));
  EXPECT_THAT(root_line, HasSubstr("RuntimeError: rank 5"));
  const std::string other_line = report.substr(other_row, report.find('\n', other_row) - other_row);
  EXPECT_THAT(other_line, HasSubstr("Signal 15 (SIGTERM)"));
  EXPECT_THAT(other_line, HasSubstr("no error file written (use "
                                    "torch.distributed.elastic.multiprocessing.errors.record)"));
  // Below the table: where the error came from, and the whole traceback.
  EXPECT_THAT(report, HasSubstr("error_file: /logs/attempt_0/5/error.json"));
  EXPECT_THAT(report, HasSubstr("    File \"train.py\", line 3, in <module>\n"));
  EXPECT_EQ(report.back(), '\n');
}

TEST(FormatFailureReportTest, RootCauseWithoutErrorFileSaysHowToGetOne) {
  WorkerFailure segv = Failure(2, At(10));
  segv.signal = SIGSEGV;
  const std::string report = FormatFailureReport("python3 -m trainer", 1, {segv});
  SCOPED_TRACE(report);
  EXPECT_THAT(report, HasSubstr("python3 -m trainer FAILED after 1 attempt\n"));
  EXPECT_THAT(report, HasSubstr("Signal 11 (SIGSEGV)"));
  const size_t root_cause = report.find("Root Cause");
  ASSERT_NE(root_cause, std::string::npos);
  EXPECT_THAT(report.substr(root_cause), HasSubstr("no error file written"));
  EXPECT_THAT(report, Not(HasSubstr("traceback")));
}

TEST(FormatFailureReportTest, AWorkerMusterKilledForHangingSaysWhyAndWhereItHung) {
  WorkerFailure hung = Failure(1, At(10));
  hung.signal = SIGKILL;
  hung.killed_for = "its file timer 'step' expired 0.12 s ago (pid 1001, killed with SIGKILL)";
  hung.stack_file = "/logs/attempt_0/1/stack.txt";
  std::string stack = "native frames (eu-stack):\n";
  for (int i = 0; i < 100; ++i) stack += "#" + std::to_string(i) + " frame\n";
  hung.stack = stack;
  hung.nccl_dump = "/tmp/nccl_trace_rank_1";
  const std::string report = FormatFailureReport("train.py", 1, {hung});
  SCOPED_TRACE(report);
  // In the table, in place of the missing error file's hint.
  EXPECT_THAT(report, HasSubstr("Signal 9 (SIGKILL)  1970-01-01T00:00:10.000Z  its file timer "
                                "'step' expired 0.12 s ago"));
  const std::string root = report.substr(report.find("Root Cause"));
  EXPECT_THAT(root, HasSubstr("muster killed it: its file timer 'step' expired"));
  EXPECT_THAT(root, HasSubstr("stacks    : /logs/attempt_0/1/stack.txt\n"
                              "    native frames (eu-stack):\n    #0 frame\n"));
  EXPECT_THAT(root, HasSubstr("#78 frame\n    ... 21 more lines in the file above\n"))
      << "80 lines shown (a heading and 79 frames), the other 21 in the file";
  EXPECT_THAT(root, Not(HasSubstr("#79 frame")));
  EXPECT_THAT(root, HasSubstr("NCCL flight recorder dump: /tmp/nccl_trace_rank_1\n"));
  EXPECT_THAT(root, Not(HasSubstr("no error file written")));
}

TEST(FormatFailureReportTest, MessageFallsBackToTheTracebacksLastLine) {
  WorkerFailure failure = Failure(1, At(10), At(9));
  failure.error->message = "";
  failure.error->traceback = "Traceback (most recent call last):\n  ...\nKeyError: 'lr'\n";
  const std::string report = FormatFailureReport("train.py", 1, {failure});
  SCOPED_TRACE(report);
  const size_t row = report.find("  * 1 (1)");
  ASSERT_NE(row, std::string::npos);
  EXPECT_THAT(report.substr(row, report.find('\n', row) - row), HasSubstr("KeyError: 'lr'"));
}

TEST(FormatFailureReportTest, OthersInTheOrderTheyFailed) {
  const std::string report =
      FormatFailureReport("t.py", 1, {Failure(7, At(30)), Failure(6, At(20)), Failure(4, At(10))});
  const size_t first = report.find("  * 4 (0)");
  const size_t second = report.find("    6 (2)");
  const size_t third = report.find("    7 (3)");
  ASSERT_NE(first, std::string::npos) << report;
  EXPECT_LT(first, second) << report;
  EXPECT_LT(second, third) << report;
}

TEST(FormatFailureReportTest, NoFailures) {
  EXPECT_THAT(FormatFailureReport("t.py", 1, {}), HasSubstr("t.py FAILED"));
}

}  // namespace
}  // namespace muster
