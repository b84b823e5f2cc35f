#include "worker/watchdog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace muster::worker {
namespace {

TEST(WatchdogTest, ADisarmedStepNeverFires) {
  Watchdog watchdog("rank 1", absl::Milliseconds(150));
  for (int i = 0; i < 3; ++i) {
    watchdog.Arm("a quick step");
    absl::SleepFor(absl::Milliseconds(20));
    watchdog.Disarm();
  }
  absl::SleepFor(absl::Milliseconds(400));  // well past the limit, disarmed
}

TEST(WatchdogTest, EachArmStartsTheClockAgain) {
  Watchdog watchdog("rank 1", absl::Milliseconds(800));
  for (int i = 0; i < 4; ++i) {
    watchdog.Arm("a step");
    absl::SleepFor(absl::Milliseconds(300));  // 1.2 s in all, but 300 ms per step
  }
  watchdog.Disarm();
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
}  // namespace muster::worker
