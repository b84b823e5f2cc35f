// --rdzv-backend etcd as an agent uses it (NewEtcdRendezvousClient), against
// a real etcd cluster (etcd_test_cluster.h): what only the order of etcd's
// answers decides.
#include "rendezvous/etcd/backend.h"

#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/keys.h"
#include "rendezvous/rules/protocol.h"
#include "tests/rendezvous/etcd/requests.h"
#include "tests/support/etcd_cluster.h"

namespace muster::etcd {
namespace {

constexpr char kJob[] = "lease-job";

rdzv::JoinRequest JoinOfLeaseJob(const std::string& node) {
  rdzv::JoinRequest request = JoinOf(node, 1);
  request.set_job_id(kJob);
  request.mutable_config()->set_last_call_timeout_ms(100);
  return request;
}

absl::StatusOr<rdzv::Assignment> JoinNow(rdzv::RendezvousClient& rdzv,
                                         const rdzv::JoinRequest& request) {
  absl::Notification done;
  absl::StatusOr<rdzv::Assignment> out = absl::UnknownError("no answer");
  rdzv.Join(request, absl::Seconds(30), [&](absl::StatusOr<rdzv::Assignment> answer) {
    out = std::move(answer);
    done.Notify();
  });
  done.WaitForNotification();
  return out;
}

class EtcdRendezvousTest : public PlaintextClusterTest {};

// Found by bench/chaos_soak.py: an agent cut off from etcd past its lease
// learned that it was dropped before its lease keeper said the lease was
// gone; its join again, under the dead lease, failed ("etcdserver:
// requested lease not found") and ended the agent. Here the lease is
// revoked behind the agent's back, and the join comes before the keeper's
// next keep-alive (a third of the 60 s TTL away).
TEST_F(EtcdRendezvousTest, AJoinUnderALeaseThatEndedUnseenTakesANewOne) {
  if (SetUpStopped()) return;
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Create(Options());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::shared_ptr<EtcdClient> shared = *std::move(etcd);
  EtcdRendezvousOptions options;
  options.etcd = shared;
  options.job_id = kJob;
  options.lease_ttl = absl::Seconds(60);
  options.target = "etcd";
  std::unique_ptr<rdzv::RendezvousClient> rdzv = NewEtcdRendezvousClient(options);

  absl::StatusOr<rdzv::Assignment> first = JoinNow(*rdzv, JoinOfLeaseJob("n1"));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<GetResult> key = shared->Get(JobKeys(kJob).node("n1"));
  ASSERT_TRUE(key.ok() && key->kv.has_value()) << key.status();
  ASSERT_TRUE(shared->RevokeLease(key->kv->lease()).ok());

  rdzv::JoinRequest again = JoinOfLeaseJob("n1");
  again.set_node_secret(first->node_secret());
  absl::StatusOr<rdzv::Assignment> second = JoinNow(*rdzv, again);
  EXPECT_TRUE(second.ok()) << second.status();
}

}  // namespace
}  // namespace muster::etcd
