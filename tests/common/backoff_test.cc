#include "common/backoff.h"

#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster {
namespace {

using ::testing::ElementsAre;

std::vector<absl::Duration> Waits(Backoff& backoff, int n) {
  std::vector<absl::Duration> waits;
  for (int i = 0; i < n; ++i) waits.push_back(backoff.Next());
  return waits;
}

TEST(BackoffTest, DoublesUpToItsMaximumAndStaysThere) {
  Backoff backoff(absl::Milliseconds(50), absl::Milliseconds(500));
  EXPECT_THAT(Waits(backoff, 7),
              ElementsAre(absl::Milliseconds(50), absl::Milliseconds(100), absl::Milliseconds(200),
                          absl::Milliseconds(400), absl::Milliseconds(500), absl::Milliseconds(500),
                          absl::Milliseconds(500)));
}

TEST(BackoffTest, ASuccessStartsItAgain) {
  Backoff backoff(absl::Milliseconds(50), absl::Seconds(1));
  Waits(backoff, 10);
  backoff.Reset();
  EXPECT_THAT(Waits(backoff, 2), ElementsAre(absl::Milliseconds(50), absl::Milliseconds(100)));
}

TEST(BackoffTest, AMaximumThatIsNoPowerOfTwoOfTheStartIsReachedExactly) {
  Backoff backoff(absl::Milliseconds(300), absl::Seconds(1));
  EXPECT_THAT(Waits(backoff, 4), ElementsAre(absl::Milliseconds(300), absl::Milliseconds(600),
                                             absl::Seconds(1), absl::Seconds(1)));
}

}  // namespace
}  // namespace muster
