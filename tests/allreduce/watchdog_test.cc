#include "allreduce/watchdog.h"

#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "common/clock.h"

namespace muster::allreduce {
namespace {

// A watchdog that fires ends the process with exit 1 and its message; one
// that does not lets the process reach its own exit 0. So each of these runs
// in a child process (a death test that expects no death) and asserts that
// the child got to the end, saying nothing.
TEST(WatchdogTest, ADisarmedStepNeverFires) {
  EXPECT_EXIT(
      {
        {
          Watchdog watchdog("rank 1", absl::Milliseconds(150));
          for (int i = 0; i < 3; ++i) {
            watchdog.Arm("a quick step");
            absl::SleepFor(absl::Milliseconds(20));
            watchdog.Disarm();
          }
          absl::SleepFor(absl::Milliseconds(400));  // well past the limit, disarmed
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), ::testing::Not(::testing::HasSubstr("did not finish")));
}

TEST(WatchdogTest, EachArmStartsTheClockAgain) {
  EXPECT_EXIT(
      {
        {
          Watchdog watchdog("rank 1", absl::Milliseconds(800));
          for (int i = 0; i < 4; ++i) {
            watchdog.Arm("a step");
            absl::SleepFor(absl::Milliseconds(300));  // 1.2 s in all, but 300 ms per step
          }
          watchdog.Disarm();
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), ::testing::Not(::testing::HasSubstr("did not finish")));
}

// The rule itself, on fake time: overdue once the armed step has taken its
// limit, never while disarmed, and each Arm starts the limit again.
TEST(WatchdogTest, AStepIsOverdueAtItsLimitOnTheClock) {
  FakeClock clock;
  Watchdog watchdog("rank 2", absl::Seconds(40), clock);
  EXPECT_EQ(watchdog.Overdue(), "");
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(watchdog.Overdue(), "") << "nothing is armed";
  watchdog.Arm("joining the NCCL communicator");
  clock.Advance(absl::Seconds(40) - absl::Nanoseconds(1));
  EXPECT_EQ(watchdog.Overdue(), "");
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(watchdog.Overdue(),
            "rank 2: error: joining the NCCL communicator did not finish within 40s; a rank may "
            "have died or hung");
  watchdog.Disarm();
  EXPECT_EQ(watchdog.Overdue(), "");
}

TEST(WatchdogTest, EachArmStartsTheLimitAgainOnTheClock) {
  FakeClock clock;
  Watchdog watchdog("rank 1", absl::Seconds(10), clock);
  for (int i = 0; i < 5; ++i) {
    watchdog.Arm("a step");
    clock.Advance(absl::Seconds(9));  // 45 s in all, 9 s a step
    EXPECT_EQ(watchdog.Overdue(), "") << "step " << i;
  }
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(watchdog.Overdue(), ::testing::HasSubstr("a step did not finish within 10s"));
}

TEST(WatchdogDeathTest, AHungStepEndsTheProcessNamingIt) {
  EXPECT_EXIT(
      {
        Watchdog watchdog("rank 2", absl::Milliseconds(200));
        watchdog.Arm("joining the NCCL communicator");
        absl::SleepFor(absl::Seconds(30));  // the hang
      },
      ::testing::ExitedWithCode(1),
      "rank 2: error: joining the NCCL communicator did not finish within 200ms; a rank may "
      "have died or hung");
}

}  // namespace
}  // namespace muster::allreduce
