// The gRPC client's own lifetime rules, with no server in this process: a
// server would hold gRPC's callback threads alive and hide what is tested.
#include "rendezvous/client/client.h"

#include <atomic>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tests/rendezvous/grpc/callback_threads.h"
#include "tests/reserved_port.h"

namespace muster::rdzv {
namespace {

// Each call's context holds a reference to the channel. Were the last one
// dropped on gRPC's callback thread (the context going after the destructor
// stopped waiting), the channel would shut down and free the completion
// queue that very thread polls: a double free, seen by ASan, that crashes
// muster now and then on its way out. Many clients, each destroyed the
// moment its only call has answered, give that race its chances; and each
// time gRPC's callback threads are gone with the client (callback_ticker.h,
// "The end"), so nothing of it was left to them.
TEST(ClientTest, DestroyedRightAfterItsLastCallbackLeavesNothingRunning) {
  const ReservedPort refusing;  // refuses connections: nothing listens
  ASSERT_GT(refusing.port(), 0);
  const std::string target = "127.0.0.1:" + std::to_string(refusing.port());
  for (int i = 0; i < 1000; ++i) {
    std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target);
    StatusRequest request;
    request.set_job_id("job");
    absl::StatusOr<StatusResponse> status = client->StatusSync(request, absl::Seconds(5));
    ASSERT_TRUE(absl::IsUnavailable(status.status())) << status.status();
    client.reset();
    ASSERT_EQ(CallbackThreads(), 0) << "client " << i;
  }
}

// The same for a watch stream, whose context lives in the stream itself.
TEST(ClientTest, DestroyedRightAfterItsWatchEndedLeavesNothingRunning) {
  const ReservedPort refusing;  // refuses connections: nothing listens
  ASSERT_GT(refusing.port(), 0);
  const std::string target = "127.0.0.1:" + std::to_string(refusing.port());
  for (int i = 0; i < 1000; ++i) {
    std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target);
    WatchRequest request;
    request.set_job_id("job");
    request.set_node_id("node");
    absl::Notification ended;
    absl::Status status;
    client->Watch(
        request, [](const WatchEvent&) {},
        [&](absl::Status end) {
          status = std::move(end);
          ended.Notify();
        });
    ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
    ASSERT_TRUE(absl::IsUnavailable(status)) << status;
    client.reset();
    ASSERT_EQ(CallbackThreads(), 0) << "client " << i;
  }
}

// And for calls still in flight when the client goes, as at an agent's exit
// (a join that waits for its server, a heartbeat, a watch): each is
// cancelled, its callback runs once, and what the callback held goes with
// the client, before the callback threads are joined.
TEST(ClientTest, DestroyedWithCallsInFlightEndsThemAndLeavesNothingRunning) {
  const ReservedPort refusing;  // refuses connections: nothing listens
  ASSERT_GT(refusing.port(), 0);
  const std::string target = "127.0.0.1:" + std::to_string(refusing.port());
  for (int i = 0; i < 300; ++i) {
    // Each callback holds a share; two may run at once, on two of gRPC's threads.
    auto answered = std::make_shared<std::atomic<int>>(0);
    {
      std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target);
      JoinRequest join;
      join.set_job_id("job");
      client->Join(join, absl::Seconds(30),
                   [answered](absl::StatusOr<Assignment>) { ++*answered; });
      HeartbeatRequest beat;
      beat.set_job_id("job");
      client->Heartbeat(beat, absl::Seconds(30),
                        [answered](absl::StatusOr<int64_t>) { ++*answered; });
      WatchRequest watch;
      watch.set_job_id("job");
      client->Watch(
          watch, [](const WatchEvent&) {}, [answered](absl::Status) { ++*answered; });
    }
    EXPECT_EQ(*answered, 3) << "client " << i;
    ASSERT_EQ(answered.use_count(), 1) << "client " << i << " left a callback alive";
    ASSERT_EQ(CallbackThreads(), 0) << "client " << i;
  }
}

}  // namespace
}  // namespace muster::rdzv
