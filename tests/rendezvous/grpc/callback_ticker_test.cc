#include "rendezvous/grpc/callback_ticker.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/rendezvous/grpc/callback_threads.h"

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

// The callback queue's threads run while some channel holds the queue, and
// are joined by whoever drops the last one: so while the ticker's channel is
// the process's only one, they must be gone when the ticker is, or its
// channel went later, on one of them (issue 30: a tick's callback that held
// the call, and with it the channel, past the count the destructor waits
// for; gRPC then freed its queue under the thread that ran the callback, a
// double free at 5 in 8,000 agent exits). Ended 2,000 times while ticking
// as fast as it can, so that a tick is often in flight.
TEST(CallbackTickerTest, EndsWithTheCallbackThreadsJoinedOnItsOwnThread) {
  ASSERT_EQ(CallbackThreads(), 0) << "an earlier test left a channel behind";
  for (int i = 0; i < 2000; ++i) {
    std::unique_ptr<CallbackTicker> ticker = CallbackTicker::StartForTest(absl::Microseconds(20));
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (ticker->ticks() < 1 + i % 4 && absl::Now() < give_up) {
      absl::SleepFor(absl::Microseconds(10));
    }
    ASSERT_GT(CallbackThreads(), 0) << "gRPC no longer names its callback threads so";
    ticker.reset();
    ASSERT_EQ(CallbackThreads(), 0) << "ticker " << i << " left its channel to a callback";
  }
}

}  // namespace
}  // namespace muster::rdzv
