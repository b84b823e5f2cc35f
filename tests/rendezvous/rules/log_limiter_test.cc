// Log lines that echo clients: at most so many a second per kind, the rest
// counted; on fake time.
#include "rendezvous/rules/log_limiter.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::rdzv {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

TEST(LogLimiterTest, AtMostTenLinesASecondPerKindThenOneSayingHowManyWereLeftOut) {
  LogLimiter limiter(10);
  int logged = 0;
  for (int i = 0; i < 1000; ++i) {
    LogLimiter::Verdict verdict = limiter.Allow("join", kT0 + absl::Microseconds(i));
    logged += verdict.log ? 1 : 0;
    EXPECT_EQ(verdict.dropped, 0);
  }
  EXPECT_EQ(logged, 10);
  EXPECT_TRUE(limiter.Allow("denied", kT0).log) << "each kind has its own budget";
  LogLimiter::Verdict next = limiter.Allow("join", kT0 + absl::Seconds(1));
  EXPECT_TRUE(next.log);
  EXPECT_EQ(next.dropped, 990);
  EXPECT_EQ(limiter.Allow("join", kT0 + absl::Seconds(1)).dropped, 0) << "said once";
}

TEST(LogLimiterTest, ForLogCutsClientStringsAndHidesControlCharacters) {
  const std::string shown = ForLog("evil\nforged line\r" + std::string(10'000, 'x'));
  EXPECT_LE(shown.size(), kMaxLoggedClientBytes);
  EXPECT_THAT(shown, ::testing::StartsWith("evil?forged line?xxx"));
  EXPECT_THAT(shown, ::testing::HasSubstr("[cut: "));
  EXPECT_EQ(ForLog("node-1"), "node-1");
}

}  // namespace
}  // namespace muster::rdzv
