#include "rendezvous/server/local_client.h"

#include <atomic>
#include <memory>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "rendezvous/rules/protocol.h"
#include "tests/rendezvous/server/pending.h"

namespace muster::rdzv {
namespace {

JoinRequest Request(const std::string& node, int min_nodes, int max_nodes) {
  JoinRequest request;
  request.set_job_id("job");
  JobConfig* config = request.mutable_config();
  config->set_min_nodes(min_nodes);
  config->set_max_nodes(max_nodes);
  config->set_max_restarts(1);
  config->set_last_call_timeout_ms(0);
  config->set_join_timeout_ms(60'000);
  config->set_heartbeat_timeout_ms(60'000);
  NodeInfo* info = request.mutable_node();
  info->set_node_id(node);
  info->set_host(node);
  info->set_local_world_size(2);
  info->set_master_port_candidate(29500);
  request.set_protocol_version(kProtocolVersion);
  return request;
}

TEST(LocalClientTest, OneNodeJobRunsToTheEnd) {
  auto hub = std::make_shared<RendezvousHub>();
  auto client = NewLocalClient(hub);
  absl::StatusOr<Assignment> assignment = client->JoinSync(Request("a", 1, 1), absl::Seconds(5));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  EXPECT_EQ(assignment->master_addr(), "127.0.0.1");
  EXPECT_EQ(assignment->world_size(), 2);

  absl::Notification closed;
  WatchRequest watch;
  watch.set_job_id("job");
  watch.set_node_id("a");
  watch.set_node_secret(assignment->node_secret());
  watch.set_known_round(assignment->round());
  client->Watch(
      watch,
      [&](const WatchEvent& event) {
        if (event.has_job_closed() && event.job_closed().succeeded()) closed.Notify();
      },
      [](absl::Status) {});
  ReportDoneRequest done;
  done.set_job_id("job");
  done.set_node_id("a");
  done.set_node_secret(assignment->node_secret());
  done.set_round(assignment->round());
  Pending<absl::Status> reported;
  client->ReportDone(done, absl::Seconds(1), reported.Callback());
  const absl::Status status = reported.Wait();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST(LocalClientTest, FailurePushesTheNextRound) {
  auto hub = std::make_shared<RendezvousHub>();
  auto client = NewLocalClient(hub);
  absl::StatusOr<Assignment> first = client->JoinSync(Request("a", 1, 1), absl::Seconds(5));
  ASSERT_TRUE(first.ok());
  absl::Notification changed;
  std::atomic<int64_t> new_round{-1};
  WatchRequest watch;
  watch.set_job_id("job");
  watch.set_node_id("a");
  watch.set_node_secret(first->node_secret());
  watch.set_known_round(first->round());
  client->Watch(
      watch,
      [&](const WatchEvent& event) {
        if (event.has_round_changed()) {
          new_round = event.round_changed().new_round();
          changed.Notify();
        }
      },
      [](absl::Status) {});
  ReportFailureRequest failure;
  failure.set_job_id("job");
  failure.set_node_id("a");
  failure.set_node_secret(first->node_secret());
  failure.set_round(first->round());
  failure.mutable_failure()->set_exit_code(1);
  Pending<absl::Status> reported;
  client->ReportFailure(failure, absl::Seconds(1), reported.Callback());
  const absl::Status status = reported.Wait();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(changed.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(new_round, first->round() + 1);
  JoinRequest rejoin = Request("a", 1, 1);
  rejoin.set_node_secret(first->node_secret());
  absl::StatusOr<Assignment> second = client->JoinSync(rejoin, absl::Seconds(5));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->restart_count(), 1);
  EXPECT_EQ(second->node_secret(), first->node_secret());
}

TEST(LocalClientTest, DestroyedClientRunsNoCallbackAndFreesItsNode) {
  auto hub = std::make_shared<RendezvousHub>();
  std::atomic<bool> called{false};
  {
    auto client = NewLocalClient(hub);
    client->Join(Request("a", 2, 2), absl::Seconds(5),
                 [&](absl::StatusOr<Assignment>) { called = true; });
  }
  EXPECT_FALSE(called);
  // The cancelled node left: a new pair of nodes forms the round alone.
  auto b = NewLocalClient(hub);
  auto c = NewLocalClient(hub);
  absl::Notification b_done;
  absl::StatusOr<Assignment> b_result;
  b->Join(Request("b", 2, 2), absl::Seconds(5), [&](absl::StatusOr<Assignment> r) {
    b_result = std::move(r);
    b_done.Notify();
  });
  absl::StatusOr<Assignment> c_result = c->JoinSync(Request("c", 2, 2), absl::Seconds(5));
  ASSERT_TRUE(b_done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(b_result.ok()) << b_result.status();
  ASSERT_TRUE(c_result.ok()) << c_result.status();
  EXPECT_EQ(b_result->world_size(), 4);
}

}  // namespace
}  // namespace muster::rdzv
