#include "allreduce/gather.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster::allreduce {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kRootEndpoint[] = "10.0.0.1:29501";

Hello MakeHello(int rank, int world_size, const std::string& host = "host-a") {
  Hello hello;
  hello.set_rank(rank);
  hello.set_world_size(world_size);
  hello.set_host(host);
  hello.set_machine("boot-1 /dev/shm 1:2");
  hello.set_sweep("-b 8 -e 32M");
  hello.set_job("job-a");
  hello.set_ring_port(40000 + rank);
  return hello;
}

std::vector<bool> Arrived(int world_size, std::vector<int> ranks) {
  std::vector<bool> arrived(world_size, false);
  arrived[0] = true;
  for (int r : ranks) arrived[r] = true;
  return arrived;
}

TEST(CheckHelloTest, ANewRankOfThisJobIsTaken) {
  const HelloCheck check =
      CheckHello(MakeHello(0, 4), MakeHello(2, 4), Arrived(4, {1}), kRootEndpoint);
  EXPECT_EQ(check.verdict, HelloVerdict::kTake);
  EXPECT_TRUE(check.reason.ok());
}

TEST(CheckHelloTest, AnotherJobsRankIsTurnedAwayAndToldWhy) {
  Hello theirs = MakeHello(1, 4);
  theirs.set_job("job-b");
  const HelloCheck check = CheckHello(MakeHello(0, 4), theirs, Arrived(4, {}), kRootEndpoint);
  EXPECT_EQ(check.verdict, HelloVerdict::kTurnAway);
  EXPECT_EQ(check.reason.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(check.reason.message(),
              HasSubstr("rank 0 at 10.0.0.1:29501 belongs to job-a, not to job-b; give each job "
                        "its own MASTER_PORT"));
}

TEST(CheckHelloTest, ARankWithNoJobIdIsTurnedAwayByAJobWithOne) {
  Hello theirs = MakeHello(1, 4);
  theirs.set_job("");
  const HelloCheck check = CheckHello(MakeHello(0, 4), theirs, Arrived(4, {}), kRootEndpoint);
  EXPECT_EQ(check.verdict, HelloVerdict::kTurnAway);
  EXPECT_THAT(check.reason.message(), HasSubstr("not to this rank's job, which has no id"));
}

TEST(CheckHelloTest, AnotherWorldSizeStopsTheJob) {
  const HelloCheck check =
      CheckHello(MakeHello(0, 4), MakeHello(1, 3), Arrived(4, {}), kRootEndpoint);
  EXPECT_EQ(check.verdict, HelloVerdict::kStopJob);
  EXPECT_THAT(check.reason.message(),
              AllOf(HasSubstr("rank 0 (WORLD_SIZE 4) cannot take a rank 1 with WORLD_SIZE 3"),
                    Not(HasSubstr("already")), HasSubstr("the same WORLD_SIZE and its own RANK")));
}

TEST(CheckHelloTest, ARankThatArrivedAlreadyStopsTheJob) {
  const HelloCheck check =
      CheckHello(MakeHello(0, 4), MakeHello(2, 4), Arrived(4, {2}), kRootEndpoint);
  EXPECT_EQ(check.verdict, HelloVerdict::kStopJob);
  EXPECT_THAT(check.reason.message(), HasSubstr("(it has that rank already)"));
}

TEST(CheckHelloTest, RankOutOfRangeStopsTheJob) {
  for (int rank : {0, 4, -1}) {
    const HelloCheck check =
        CheckHello(MakeHello(0, 4), MakeHello(rank, 4), Arrived(4, {}), kRootEndpoint);
    EXPECT_EQ(check.verdict, HelloVerdict::kStopJob) << rank;
    EXPECT_THAT(check.reason.message(), Not(HasSubstr("already"))) << rank;
  }
}

TEST(CheckHelloTest, AnotherSweepStopsTheJobNamingBoth) {
  Hello theirs = MakeHello(3, 4, "host-b");
  theirs.set_sweep("-b 8 -e 1G");
  const HelloCheck check = CheckHello(MakeHello(0, 4), theirs, Arrived(4, {}), kRootEndpoint);
  EXPECT_EQ(check.verdict, HelloVerdict::kStopJob);
  EXPECT_THAT(check.reason.message(),
              HasSubstr("rank 3 (host-b) runs '-b 8 -e 1G' but rank 0 runs '-b 8 -e 32M'"));
}

TEST(JobNameTest, AnEmptyIdIsSaidSo) {
  EXPECT_EQ(JobName(""), "a job with no id");
  EXPECT_EQ(JobName("job-a"), "job-a");
}

std::vector<Hello> Ranks(int n) {
  std::vector<Hello> hellos;
  for (int r = 0; r < n; ++r) hellos.push_back(MakeHello(r, n, r < 2 ? "host-a" : "host-b"));
  return hellos;
}
std::vector<std::string> Addrs(int n) {
  std::vector<std::string> addrs;
  for (int r = 0; r < n; ++r) addrs.push_back("10.0.0." + std::to_string(r + 1));
  return addrs;
}

TEST(PlanWelcomeTest, PeersAreEveryRanksHostAddressPortAndGpuByRank) {
  std::vector<Hello> hellos = Ranks(3);
  hellos[1].set_bus_id("0000:3b:00.0");
  absl::StatusOr<Welcome> welcome = PlanWelcome(hellos, Addrs(3), Backend::kTcp);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  ASSERT_EQ(welcome->peers_size(), 3);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(welcome->peers(r).rank(), r);
    EXPECT_EQ(welcome->peers(r).host(), hellos[r].host());
    EXPECT_EQ(welcome->peers(r).addr(), Addrs(3)[r]);
    EXPECT_EQ(welcome->peers(r).ring_port(), 40000 + r);
  }
  EXPECT_EQ(welcome->peers(1).bus_id(), "0000:3b:00.0");
  EXPECT_EQ(welcome->backend(), "tcp");
  EXPECT_TRUE(welcome->error().empty());
}

TEST(PlanWelcomeTest, TwoRanksOnOneGpuStopTheJob) {
  std::vector<Hello> hellos = Ranks(2);  // both on host-a
  hellos[0].set_bus_id("0000:3b:00.0");
  hellos[1].set_bus_id("0000:3b:00.0");
  absl::StatusOr<Welcome> welcome = PlanWelcome(hellos, Addrs(2), Backend::kAuto);
  ASSERT_FALSE(welcome.ok());
  EXPECT_EQ(welcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(welcome.status().message(),
              HasSubstr("ranks 0 and 1 both use the GPU at 0000:3b:00.0"));
}

TEST(PlanWelcomeTest, TheSameBusIdOnTwoHostsIsTwoGpus) {
  std::vector<Hello> hellos = Ranks(3);
  hellos[0].set_bus_id("0000:3b:00.0");
  hellos[2].set_bus_id("0000:3b:00.0");  // host-b
  EXPECT_TRUE(PlanWelcome(hellos, Addrs(3), Backend::kTcp).ok());
}

TEST(PlanWelcomeTest, AutoOnOneMachineWithoutGpusIsSharedMemory) {
  absl::StatusOr<Welcome> welcome = PlanWelcome(Ranks(3), Addrs(3), Backend::kAuto);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->backend(), "shm");
}

TEST(PlanWelcomeTest, ARankOnAnotherMachineMakesAutoTcp) {
  std::vector<Hello> hellos = Ranks(3);
  hellos[2].set_machine("boot-2 /dev/shm 1:2");
  absl::StatusOr<Welcome> welcome = PlanWelcome(hellos, Addrs(3), Backend::kAuto);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->backend(), "tcp");
}

TEST(PlanWelcomeTest, ARankThatKnowsNotItsMachineIsElsewhere) {
  std::vector<Hello> hellos = Ranks(2);
  hellos[1].set_machine("");
  absl::StatusOr<Welcome> welcome = PlanWelcome(hellos, Addrs(2), Backend::kShm);
  ASSERT_FALSE(welcome.ok());
  EXPECT_THAT(welcome.status().message(), HasSubstr("rank(s) 1 run on another machine"));
}

TEST(PlanWelcomeTest, AutoWithEveryRankOnNcclIsNccl) {
  std::vector<Hello> hellos = Ranks(3);
  for (int r = 0; r < 3; ++r) {
    hellos[r].set_can_nccl(true);
    hellos[r].set_bus_id("0000:0" + std::to_string(r) + ":00.0");
  }
  absl::StatusOr<Welcome> welcome = PlanWelcome(hellos, Addrs(3), Backend::kAuto);
  ASSERT_TRUE(welcome.ok()) << welcome.status();
  EXPECT_EQ(welcome->backend(), "nccl");
  EXPECT_TRUE(welcome->nccl_id().empty()) << "the id is the caller's to make";
}

TEST(PlanWelcomeTest, NcclAskedWithoutGpusStopsTheJob) {
  absl::StatusOr<Welcome> welcome = PlanWelcome(Ranks(2), Addrs(2), Backend::kNccl);
  ASSERT_FALSE(welcome.ok());
  EXPECT_THAT(welcome.status().message(), HasSubstr("--backend nccl, but rank(s) 0, 1"));
}

LocalResult Local(double time_us, int64_t wrong, double inplace_time_us, int64_t inplace_wrong) {
  return LocalResult{time_us, wrong, inplace_time_us, inplace_wrong};
}

SizeReport Report(double time_us, int64_t wrong, double inplace_time_us, int64_t inplace_wrong) {
  SizeReport report;
  report.set_time_us(time_us);
  report.set_wrong(wrong);
  report.set_inplace_time_us(inplace_time_us);
  report.set_inplace_wrong(inplace_wrong);
  return report;
}

TEST(RowGatherTest, TimesAreAveragedOverRanksAndWrongValuesSummed) {
  SizeResult row = OwnRow(SweepSize{1024, 256}, DataType::kFloat, Local(10, 0, 20, 1));
  EXPECT_EQ(row.bytes, 1024);
  EXPECT_EQ(row.count, 256);
  EXPECT_EQ(row.type, DataType::kFloat);
  ASSERT_TRUE(AddReport(Report(30, 2, 40, 0), "rank 1 (host-a)", row).ok());
  ASSERT_TRUE(AddReport(Report(20, 0, 30, 3), "rank 2 (host-b)", row).ok());
  AverageTimes(3, row);
  EXPECT_DOUBLE_EQ(row.time_us, 20);
  EXPECT_DOUBLE_EQ(row.inplace_time_us, 30);
  EXPECT_EQ(row.wrong, 2);
  EXPECT_EQ(row.inplace_wrong, 4);
}

TEST(RowGatherTest, AFailedRanksReportIsItsErrorAndAddsNothing) {
  SizeResult row = OwnRow(SweepSize{8, 2}, DataType::kFloat, Local(1, 0, 1, 0));
  SizeReport failed = Report(100, 100, 100, 100);
  failed.set_error("the all-reduce did not finish within 60s");
  const absl::Status added = AddReport(failed, "rank 2 (host-b)", row);
  EXPECT_EQ(added.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(added.message(), "rank 2 (host-b) failed: the all-reduce did not finish within 60s");
  EXPECT_DOUBLE_EQ(row.time_us, 1);
  EXPECT_EQ(row.wrong, 0);
}

TEST(WrongValuesTest, CountsOutOfPlaceAndInPlaceOverEveryRow) {
  EXPECT_EQ(WrongValues({}), 0);
  SizeResult a, b;
  a.wrong = 1;
  a.inplace_wrong = 2;
  b.inplace_wrong = 4;
  EXPECT_EQ(WrongValues({a, b}), 7);
}

}  // namespace
}  // namespace muster::allreduce
