#include "tests/sim/simulation.h"

#include <string>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster::sim {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

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
  for (Backend backend : {Backend::kMusterd, Backend::kHost}) {
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

// Check the checker: a journal that keeps no restart count is caught.
TEST(SimulationTest, CatchesARestartCountNotJournaled) {
  Schedule schedule = Calm();
  schedule.faults.push_back(At(3, FaultKind::kWorkerFails, 0));
  schedule.faults.push_back(At(8, FaultKind::kServerCrash, 0, 4));
  const Outcome sound = Simulate(schedule);
  EXPECT_THAT(sound.violations, IsEmpty());
  const Outcome broken = Simulate(schedule, Traced(Breakage::kRestartCountNotJournaled));
  EXPECT_THAT(Lines(broken), HasSubstr("restored from the journal differs")) << Lines(broken);
}

}  // namespace
}  // namespace muster::sim
