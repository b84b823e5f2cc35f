#include "tests/sim/simulation.h"

#include <string>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster::sim {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Two nodes on musterd, nothing going wrong.
Schedule Calm(Backend backend = Backend::kMusterd) {
  Schedule schedule;
  schedule.seed = 7;
  schedule.shape.backend = backend;
  schedule.shape.nodes = 2;
  schedule.shape.min_nodes = 2;
  schedule.shape.max_nodes = 2;
  schedule.shape.work = absl::Seconds(10);
  return schedule;
}

Fault At(double seconds, FaultKind kind, int host = 0, double length = 0) {
  Fault fault;
  fault.at = absl::Seconds(seconds);
  fault.kind = kind;
  fault.host = host;
  fault.length = absl::Seconds(length);
  return fault;
}

RunOptions Traced(Breakage breakage = Breakage::kNone) {
  RunOptions options;
  options.breakage = breakage;
  options.trace = true;
  return options;
}

std::string Lines(const Outcome& outcome) {
  return absl::StrJoin(outcome.violations, "\n") + "\n" + absl::StrJoin(outcome.trace, "\n");
}

TEST(SimulationTest, CalmJobSucceeds) {
  for (Backend backend : {Backend::kMusterd, Backend::kHost, Backend::kEtcd}) {
    const Outcome outcome = Simulate(Calm(backend), Traced());
    EXPECT_THAT(outcome.violations, IsEmpty()) << Lines(outcome);
    EXPECT_THAT(outcome.ending, HasSubstr("succeeded")) << Lines(outcome);
  }
}

TEST(SimulationTest, SameScheduleSameSteps) {
  for (uint64_t seed : {3, 11, 12345}) {
    const Schedule schedule = DrawSchedule(seed);
    EXPECT_EQ(Simulate(schedule).digest, Simulate(schedule).digest) << seed;
    EXPECT_EQ(Describe(DrawSchedule(seed)), Describe(schedule));
  }
}

TEST(SimulationTest, WorkerFailureSpendsOneRestart) {
  Schedule schedule = Calm();
  schedule.faults.push_back(At(5, FaultKind::kWorkerFails, 1));
  const Outcome outcome = Simulate(schedule, Traced());
  EXPECT_THAT(outcome.violations, IsEmpty()) << Lines(outcome);
  EXPECT_THAT(outcome.ending, HasSubstr("succeeded")) << Lines(outcome);
  EXPECT_THAT(Lines(outcome), HasSubstr("restarts 1")) << Lines(outcome);
}

TEST(SimulationTest, MusterdRestartKeepsTheJob) {
  Schedule schedule = Calm();
  schedule.faults.push_back(At(3, FaultKind::kWorkerFails, 0));
  schedule.faults.push_back(At(8, FaultKind::kServerCrash, 0, 4));
  const Outcome outcome = Simulate(schedule, Traced());
  EXPECT_THAT(outcome.violations, IsEmpty()) << Lines(outcome);
  EXPECT_THAT(outcome.ending, HasSubstr("succeeded")) << Lines(outcome);
}

// Check the checker: a journal that keeps no restart count is caught,
// whether musterd restarts or another etcd leader takes over.
TEST(SimulationTest, CatchesARestartCountNotJournaled) {
  for (Backend backend : {Backend::kMusterd, Backend::kEtcd}) {
    Schedule schedule = Calm(backend);
    schedule.faults.push_back(At(3, FaultKind::kWorkerFails, 0));
    schedule.faults.push_back(
        At(8, backend == Backend::kEtcd ? FaultKind::kAgentKilled : FaultKind::kServerCrash, 0, 4));
    const Outcome sound = Simulate(schedule);
    EXPECT_THAT(sound.violations, IsEmpty());
    const Outcome broken = Simulate(schedule, Traced(Breakage::kRestartCountNotJournaled));
    EXPECT_THAT(Lines(broken), HasSubstr("restored from the journal differs")) << Lines(broken);
  }
}

// The agent that leads is killed (one of the two kills hits it, whichever
// leads): once its lease ends another takes over from the state in etcd,
// drops it, and the job goes on; restarted, it joins again.
TEST(SimulationTest, AnEtcdLeaderLostHandsTheJobOver) {
  Schedule schedule = Calm(Backend::kEtcd);
  schedule.faults.push_back(At(3, FaultKind::kWorkerFails, 1));
  schedule.faults.push_back(At(6, FaultKind::kAgentKilled, 0, 2));
  schedule.faults.push_back(At(25, FaultKind::kAgentKilled, 1, 2));
  const Outcome outcome = Simulate(schedule, Traced());
  EXPECT_THAT(outcome.violations, IsEmpty()) << Lines(outcome);
  EXPECT_THAT(outcome.ending, HasSubstr("succeeded")) << Lines(outcome);
  EXPECT_THAT(Lines(outcome), HasSubstr("is gone")) << Lines(outcome);
  EXPECT_THAT(Lines(outcome), HasSubstr("restarts 1")) << "the restart spent is kept";
}

// etcd away as a whole: every lease holds, nobody is dropped, the workers
// ride it out, and no restart is spent.
TEST(SimulationTest, EtcdAwayKeepsTheJob) {
  Schedule schedule = Calm(Backend::kEtcd);
  schedule.faults.push_back(At(4, FaultKind::kServerCrash, 0, 6));
  const Outcome outcome = Simulate(schedule, Traced());
  EXPECT_THAT(outcome.violations, IsEmpty()) << Lines(outcome);
  EXPECT_THAT(outcome.ending, HasSubstr("succeeded")) << Lines(outcome);
  EXPECT_THAT(Lines(outcome), HasSubstr("etcd is back")) << Lines(outcome);
  EXPECT_THAT(Lines(outcome), Not(HasSubstr("lease of"))) << Lines(outcome);
  EXPECT_THAT(Lines(outcome), Not(HasSubstr("starts round 1"))) << Lines(outcome);
}

}  // namespace
}  // namespace muster::sim
