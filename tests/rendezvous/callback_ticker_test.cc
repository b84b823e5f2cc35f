#include "rendezvous/callback_ticker.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace muster::rdzv {
namespace {

TEST(CallbackTickerTest, HoldersShareOneTicker) {
  std::shared_ptr<CallbackTicker> client = CallbackTicker::Acquire();
  std::shared_ptr<CallbackTicker> server = CallbackTicker::Acquire();
  EXPECT_EQ(client.get(), server.get());
}

// Each tick is a call on the lame channel that gRPC completed on its callback
// threads: what keeps one of them waiting in the queue.
TEST(CallbackTickerTest, TicksCompleteWhileHeld) {
  std::shared_ptr<CallbackTicker> ticker = CallbackTicker::Acquire();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (ticker->ticks() < 3 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(ticker->ticks(), 3);
}

}  // namespace
}  // namespace muster::rdzv
