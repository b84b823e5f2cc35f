// The GPU check's rules on a fake NVML and fake time: who is on which GPU,
// the shared-GPU and idle-GPU warnings, said once and cleared, the figures.
#include "agent/gpu_check.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace muster {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);
absl::Time AtSecond(double seconds) { return kStart + absl::Seconds(seconds); }

class FakeGpus final : public GpuSource {
 public:
  explicit FakeGpus(int count) {
    for (int i = 0; i < count; ++i) {
      uuids_.push_back("GPU-" + std::to_string(1000 + i) + "-fake");
      percent[i] = 0;
      memory[i] = {uint64_t{1} << 30, uint64_t{80} << 30};
    }
  }
  const std::vector<std::string>& uuids() const override { return uuids_; }
  absl::StatusOr<Utilization> ReadUtilization(int index, uint64_t since) override {
    ++reads;
    if (broken.contains(index)) return absl::UnavailableError("GPU is lost");
    return Utilization{1, percent[index], static_cast<double>(percent[index]), since + 1};
  }
  absl::StatusOr<Memory> ReadMemory(int index) override { return memory[index]; }
  absl::StatusOr<std::vector<pid_t>> ReadProcesses(int index) override {
    if (broken.contains(index)) return absl::UnavailableError("GPU is lost");
    return processes[index];
  }
  absl::StatusOr<Health> ReadHealth(int index) override { return health[index]; }
  std::vector<Xid> TakeXids() override { return std::exchange(xids, {}); }

  std::map<int, Health> health;
  std::vector<Xid> xids;

  std::map<int, int> percent;
  std::map<int, Memory> memory;
  std::map<int, std::vector<pid_t>> processes;
  std::set<int> broken;
  int reads = 0;

 private:
  std::vector<std::string> uuids_;
};

class GpuCheckTest : public ::testing::Test {
 protected:
  void Make(int gpus, int workers, absl::Duration interval = absl::Seconds(30)) {
    fake_ = std::make_unique<FakeGpus>(gpus);
    GpuCheckOptions options;
    options.interval = interval;
    options.report = true;
    options.gpus = *NodeGpus(std::nullopt, fake_->uuids(), workers);
    check_.emplace(*fake_, options, [this](pid_t pid) {
      auto it = parents_.find(pid);
      return it == parents_.end() ? pid_t{1} : it->second;
    });
    workers_.clear();
    for (int i = 0; i < workers; ++i) workers_.push_back({100 + i, 8 + i, i});
    check_->RoundStarted(workers_, AtSecond(0));
  }
  // Runs every timer due up to `t`; what they said, in order.
  GpuCheckOutput RunUntil(double t) {
    GpuCheckOutput all;
    while (check_->NextDeadline() && *check_->NextDeadline() <= AtSecond(t)) {
      GpuCheckOutput out = check_->OnTimer(*check_->NextDeadline());
      for (auto& w : out.warnings) all.warnings.push_back(w);
      for (auto& c : out.cleared) all.cleared.push_back(c);
      for (auto& e : out.errors) all.errors.push_back(e);
      if (out.report) all.report = out.report;
      if (out.figures) {
        all.figures = out.figures;
        all.figures_line = out.figures_line;
      }
    }
    return all;
  }
  // The faults the timers due up to `t` found.
  std::vector<std::string> RunUntilFaults(double t) {
    std::vector<std::string> faults;
    while (check_->NextDeadline() && *check_->NextDeadline() <= AtSecond(t)) {
      GpuCheckOutput out = check_->OnTimer(*check_->NextDeadline());
      faults.insert(faults.end(), out.faults.begin(), out.faults.end());
    }
    return faults;
  }
  // Each worker i on GPU gpu_of[i], and GPUs busy as given.
  void Place(const std::vector<int>& gpu_of) {
    fake_->processes.clear();
    for (size_t i = 0; i < gpu_of.size(); ++i) fake_->processes[gpu_of[i]].push_back(100 + i);
  }

  std::unique_ptr<FakeGpus> fake_;
  std::optional<GpuCheck> check_;
  std::vector<GpuWorker> workers_;
  std::map<pid_t, pid_t> parents_;
};

TEST(NodeGpusTest, EveryDeviceOrTheVisibleOnesCutToTheWorkers) {
  const std::vector<std::string> uuids = {"GPU-aaaa-1", "GPU-bbbb-2", "GPU-cccc-3", "GPU-dddd-4"};
  EXPECT_THAT(*NodeGpus(std::nullopt, uuids, 8), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(*NodeGpus(std::nullopt, uuids, 2), ElementsAre(0, 1));
  EXPECT_THAT(*NodeGpus("3,1", uuids, 8), ElementsAre(3, 1));
  EXPECT_THAT(*NodeGpus("GPU-cccc,GPU-aaaa-1", uuids, 8), ElementsAre(2, 0));
  EXPECT_THAT(*NodeGpus("", uuids, 8), IsEmpty());
  EXPECT_THAT(NodeGpus("4", uuids, 8).status().message(), HasSubstr("names none of the 4 GPUs"));
  EXPECT_THAT(NodeGpus("GPU-", uuids, 8).status().message(), HasSubstr("more than one"));
  EXPECT_THAT(NodeGpus("MIG-1234", uuids, 8).status().message(), HasSubstr("MIG"));
}

TEST_F(GpuCheckTest, FourWorkersOnGpuZeroOfFourWarnOnceNamingRanksAndIdleGpus) {
  Make(4, 4);
  Place({0, 0, 0, 0});
  fake_->percent[0] = 97;
  GpuCheckOutput first = RunUntil(5);
  EXPECT_THAT(first.warnings, IsEmpty()) << "seen once: looked at again first";
  GpuCheckOutput confirmed = RunUntil(10);
  ASSERT_THAT(confirmed.warnings, SizeIs(1));
  EXPECT_THAT(confirmed.warnings[0],
              AllOf(HasSubstr("local ranks 0-3 (ranks 8-11) share GPU 0 (97% busy)"),
                    HasSubstr("while GPUs 1-3 of this node run none of them (0%, 0%, 0% busy)"),
                    HasSubstr("torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))")));
  GpuCheckOutput later = RunUntil(600);
  EXPECT_THAT(later.warnings, IsEmpty()) << "the same picture is not said again";
  ASSERT_TRUE(later.figures.has_value());
  EXPECT_THAT((*later.figures)[0].local_ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_DOUBLE_EQ((*later.figures)[0].utilization, 97);
}

TEST_F(GpuCheckTest, AtOneSecondTheSharedWarningAloneNamesTheIdleGpus) {
  Make(4, 4, absl::Seconds(1));
  Place({0, 0, 0, 0});
  fake_->percent[0] = 97;
  GpuCheckOutput out = RunUntil(30);
  ASSERT_THAT(out.warnings, SizeIs(1)) << "no idle warning for the GPUs it names";
  EXPECT_THAT(out.warnings[0], HasSubstr("share GPU 0"));
}

TEST_F(GpuCheckTest, OneWorkerPerGpuSaysNothing) {
  Make(4, 4);
  Place({0, 1, 2, 3});
  for (int g = 0; g < 4; ++g) fake_->percent[g] = 90;
  GpuCheckOutput out = RunUntil(300);
  EXPECT_THAT(out.warnings, IsEmpty());
  EXPECT_THAT(out.cleared, IsEmpty());
  ASSERT_TRUE(out.figures.has_value());
  EXPECT_THAT(out.figures_line, HasSubstr("GPU 3 90% busy, 1.0 GiB of 80.0 GiB, local rank 3"));
}

TEST_F(GpuCheckTest, AChildOfAWorkerCountsAsTheWorker) {
  Make(2, 2);
  parents_[5000] = 5001;
  parents_[5001] = 101;  // a grandchild of local rank 1
  fake_->processes[0] = {100, 5000};
  fake_->percent[0] = 50;
  GpuCheckOutput out = RunUntil(10);
  ASSERT_THAT(out.warnings, SizeIs(1));
  EXPECT_THAT(out.warnings[0], HasSubstr("local ranks 0, 1 (ranks 8, 9) share GPU 0"));
}

TEST_F(GpuCheckTest, AnotherUsersProcessIsNotAWorker) {
  Make(2, 2);
  fake_->processes[0] = {100, 7777};  // 7777's parent is init
  fake_->processes[1] = {};
  EXPECT_THAT(RunUntil(100).warnings, IsEmpty());
}

TEST_F(GpuCheckTest, ARankThatMovesToItsGpuWithinTheConfirmationIsNoFault) {
  Make(2, 2);
  Place({0, 0});
  RunUntil(5);
  Place({0, 1});
  EXPECT_THAT(RunUntil(100).warnings, IsEmpty());
}

TEST_F(GpuCheckTest, AnIdleGpuWarnsOnceAndClearsWhenItWorks) {
  Make(4, 4);
  Place({0, 1, 2, 3});
  fake_->percent = {{0, 90}, {1, 91}, {2, 92}, {3, 0}};
  GpuCheckOutput first = RunUntil(5);
  EXPECT_THAT(first.warnings, IsEmpty()) << "5 s is no whole interval";
  GpuCheckOutput idle = RunUntil(35);
  ASSERT_THAT(idle.warnings, SizeIs(1));
  EXPECT_THAT(idle.warnings[0],
              AllOf(HasSubstr("GPU 3 of this node was idle (0% busy) for the last 35 s"),
                    HasSubstr("while GPUs 0-2 worked (90%, 91%, 92% busy)"),
                    HasSubstr("it is the GPU of local rank 3 (rank 11), which uses GPU 3")));
  EXPECT_THAT(RunUntil(125).warnings, IsEmpty()) << "said once";
  fake_->percent[3] = 40;
  GpuCheckOutput works = RunUntil(155);
  EXPECT_THAT(works.warnings, IsEmpty());
  EXPECT_THAT(works.cleared, ElementsAre("GPU check: GPU 3 works now (40% busy)"));
  fake_->percent[3] = 0;
  EXPECT_THAT(RunUntil(185).warnings, SizeIs(1)) << "idle again: a new picture";
}

TEST_F(GpuCheckTest, AnIdleGpuWhileEveryGpuIdlesIsNoWarning) {
  Make(2, 2);
  Place({0, 1});
  EXPECT_THAT(RunUntil(300).warnings, IsEmpty()) << "nothing works yet (data loading, say)";
}

TEST_F(GpuCheckTest, AJobThatUsesNoGpuIsLeftAlone) {
  Make(4, 4);
  fake_->percent[0] = 100;  // another user's work
  fake_->processes[0] = {9999};
  EXPECT_THAT(RunUntil(300).warnings, IsEmpty());
}

TEST_F(GpuCheckTest, TheSharedPictureClearsWhenFixedAndChangesAreSaid) {
  Make(4, 4);
  Place({0, 0, 2, 3});
  ASSERT_THAT(RunUntil(10).warnings, SizeIs(1));
  Place({0, 0, 0, 3});  // worse: a new picture
  GpuCheckOutput changed = RunUntil(45);
  ASSERT_THAT(changed.warnings, SizeIs(1));
  EXPECT_THAT(changed.warnings[0], HasSubstr("local ranks 0-2"));
  Place({0, 1, 2, 3});
  EXPECT_THAT(RunUntil(80).cleared, ElementsAre(HasSubstr("no GPU of this node is shared")));
}

TEST_F(GpuCheckTest, ReportComesAtTheFirstFullCheckThenEveryFiveMinutes) {
  Make(2, 2, absl::Seconds(30));
  Place({0, 1});
  EXPECT_FALSE(RunUntil(5).report) << "the 5 s check is no full one";
  GpuCheckOutput first = RunUntil(35);
  ASSERT_TRUE(first.report);
  EXPECT_THAT(*first.report, HasSubstr("GPU report (last 35 s): GPU 0 0% busy"));
  EXPECT_FALSE(RunUntil(300).report);
  EXPECT_TRUE(RunUntil(340).report);
}

TEST_F(GpuCheckTest, UtilizationIsSampledEveryTenSecondsWithin30) {
  Make(1, 1, absl::Seconds(30));
  RunUntil(35);
  const int before = fake_->reads;
  RunUntil(65);
  EXPECT_EQ(fake_->reads - before, 3) << "NVML keeps 15-20 s of samples";
}

TEST_F(GpuCheckTest, ANewRoundSaysItsPictureAfresh) {
  Make(2, 2);
  Place({0, 0});
  ASSERT_THAT(RunUntil(10).warnings, SizeIs(1));
  check_->RoundEnded();
  check_->RoundStarted(workers_, AtSecond(100));
  EXPECT_THAT(RunUntil(110).warnings, SizeIs(1)) << "the restarted workers share GPU 0 again";
}

TEST_F(GpuCheckTest, NoChecksBetweenRounds) {
  Make(2, 2);
  check_->RoundEnded();
  EXPECT_FALSE(check_->NextDeadline());
  check_->RoundStarted(workers_, AtSecond(100));
  EXPECT_EQ(check_->NextDeadline(), AtSecond(105));
}

TEST_F(GpuCheckTest, AnUnreadableGpuIsSaidOnceAndLeftOut) {
  Make(2, 2);
  Place({0, 0});
  fake_->broken = {1};
  GpuCheckOutput out = RunUntil(300);
  EXPECT_THAT(out.errors, ElementsAre(HasSubstr("GPU 1 cannot be read (GPU is lost)")));
  EXPECT_THAT(out.warnings, IsEmpty()) << "an unknown GPU is not an unused one";
}

// ---- The last round's GPU memory, before the next round starts ----

class GpuReleaseTest : public GpuCheckTest {
 protected:
  static constexpr pid_t kAgent = 50;
  // Runs every timer due up to `t`; the release, once the wait ended.
  std::optional<GpuRelease> ReleaseBy(double t) {
    std::optional<GpuRelease> release;
    while (check_->NextDeadline() && *check_->NextDeadline() <= AtSecond(t)) {
      GpuCheckOutput out = check_->OnTimer(*check_->NextDeadline());
      if (out.release) release = out.release;
    }
    return release;
  }
};

TEST_F(GpuReleaseTest, NothingHeldStartsAtOnce) {
  Make(2, 2);
  check_->RoundEnded();
  check_->AwaitRelease({100, 101}, kAgent, AtSecond(10), absl::Seconds(50));
  EXPECT_EQ(check_->NextDeadline(), AtSecond(10)) << "it looks at once";
  std::optional<GpuRelease> release = ReleaseBy(10);
  ASSERT_TRUE(release);
  EXPECT_EQ(release->waited, absl::ZeroDuration());
  EXPECT_THAT(release->holders, IsEmpty());
  EXPECT_EQ(check_->NextDeadline(), std::nullopt);
}

TEST_F(GpuReleaseTest, AnOldWorkerThatStillHoldsMemoryIsWaitedForUntilItIsGone) {
  Make(2, 2);
  check_->RoundEnded();
  Place({0, 1});  // the old workers' contexts are still there
  check_->AwaitRelease({100, 101}, kAgent, AtSecond(10), absl::Seconds(50));
  EXPECT_FALSE(ReleaseBy(12.9));
  EXPECT_EQ(*check_->NextDeadline(), AtSecond(13)) << "looked again every 100 ms";
  fake_->processes.clear();  // gone 3 s after
  std::optional<GpuRelease> release = ReleaseBy(13.05);
  ASSERT_TRUE(release);
  EXPECT_THAT(release->holders, IsEmpty());
  EXPECT_EQ(release->waited, absl::Seconds(3));
}

TEST_F(GpuReleaseTest, WhatAWorkerStartedCountsAndOthersProcessesDoNot) {
  Make(2, 2);
  check_->RoundEnded();
  parents_[300] = kAgent;                 // a worker's child, reparented to the agent
  parents_[301] = 300;                    // and its own child
  fake_->processes[0] = {300, 301, 999};  // 999: another job's
  check_->AwaitRelease({100, 101}, kAgent, AtSecond(0), absl::Seconds(1));
  std::optional<GpuRelease> release = ReleaseBy(1);
  ASSERT_TRUE(release) << "the bound ran out";
  EXPECT_EQ(release->waited, absl::Seconds(1));
  ASSERT_THAT(release->holders, SizeIs(2));
  EXPECT_EQ(release->holders[0].pid, 300);
  EXPECT_EQ(release->holders[1].pid, 301);
  EXPECT_EQ(release->holders[1].gpu, 0);
}

TEST_F(GpuReleaseTest, AGpuThatCannotBeReadIsSaidAndNotWaitedFor) {
  Make(2, 2);
  check_->RoundEnded();
  fake_->broken.insert(1);
  check_->AwaitRelease({100}, kAgent, AtSecond(0), absl::Seconds(5));
  GpuCheckOutput out = check_->OnTimer(AtSecond(0));
  ASSERT_TRUE(out.release);
  EXPECT_THAT(out.errors, SizeIs(1));
}

// ---- Hardware faults: the node is bad ----

TEST_F(GpuCheckTest, TheHealthCheckBeforeAJoinSaysFaultsAndMissingGpus) {
  Make(2, 2);
  GpuCheckOutput healthy = check_->CheckHealthNow();
  EXPECT_TRUE(healthy.health_checked);
  EXPECT_THAT(healthy.faults, IsEmpty());
  fake_->health[1].row_remap_pending = true;
  EXPECT_THAT(check_->CheckHealthNow().faults,
              ElementsAre(HasSubstr("GPU 1 (GPU-1001-fake): a row remapping is pending")));

  fake_ = std::make_unique<FakeGpus>(3);  // 3 GPUs, --nproc-per-node gpu asked for 4
  GpuCheckOptions options;
  options.gpus = *NodeGpus(std::nullopt, fake_->uuids(), 4);
  options.expected_gpus = 4;
  GpuCheck short_one(*fake_, options, [](pid_t) { return pid_t{1}; });
  EXPECT_THAT(short_one.CheckHealthNow().faults,
              ElementsAre(HasSubstr("NVML shows 3 of this node's GPUs, and 4 were asked for")));
}

TEST(HealthFaultTest, EachFaultSaysWhatItIsAndNoneIsNothing) {
  GpuSource::Health health;
  EXPECT_EQ(HealthFault(health, 0), std::nullopt);
  health.ecc_uncorrected = 3;
  EXPECT_EQ(HealthFault(health, 3), std::nullopt) << "the driver's history before this agent";
  EXPECT_THAT(*HealthFault(health, 1), HasSubstr("2 uncorrectable ECC error(s)"));
  health = {};
  health.retired_pages_pending = true;
  EXPECT_THAT(*HealthFault(health, 0), HasSubstr("retired pages are pending"));
  health = {};
  health.row_remap_failed = true;
  EXPECT_THAT(*HealthFault(health, 0), HasSubstr("row remapping failed"));
  health.lost = true;
  EXPECT_THAT(*HealthFault(health, 0), HasSubstr("fallen off the bus"));
  EXPECT_STREQ(HardwareXidName(79), "the GPU has fallen off the bus");
  EXPECT_EQ(HardwareXidName(13), nullptr) << "a program's fault, not the GPU's";
  EXPECT_EQ(HardwareXidName(31), nullptr);
}

TEST_F(GpuCheckTest, AHardwareXidOnAGpuOfTheNodeIsAFaultSaidOnce) {
  Make(4, 2);                        // GPUs 0 and 1 are this node's
  fake_->xids = {{3, 79}, {1, 13}};  // another node's GPU; a program's error
  EXPECT_THAT(RunUntilFaults(5), IsEmpty());
  fake_->xids = {{1, 79}};
  std::vector<std::string> faults = RunUntilFaults(15);
  ASSERT_THAT(faults, SizeIs(1));
  EXPECT_EQ(faults[0], "GPU 1 (GPU-1001-fake): Xid 79, the GPU has fallen off the bus");
  fake_->xids = {{1, 48}};
  EXPECT_THAT(RunUntilFaults(25), IsEmpty()) << "said once a GPU";
}

TEST_F(GpuCheckTest, EccErrorsSinceTheFirstLookAndPendingRetirementsAreFaults) {
  Make(2, 2);
  fake_->health[0].ecc_uncorrected = 5;  // before this agent: a baseline
  EXPECT_THAT(RunUntilFaults(5), IsEmpty());
  fake_->health[0].ecc_uncorrected = 6;
  fake_->health[1].retired_pages_pending = true;
  std::vector<std::string> faults = RunUntilFaults(15);
  ASSERT_THAT(faults, SizeIs(2));
  EXPECT_THAT(faults[0], HasSubstr("GPU 0 (GPU-1000-fake): 1 uncorrectable ECC error(s)"));
  EXPECT_THAT(faults[1], HasSubstr("GPU 1 (GPU-1001-fake): retired pages are pending"));
}

}  // namespace
}  // namespace muster
