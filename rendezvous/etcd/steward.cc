#include "rendezvous/etcd/steward.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "proto/etcd_rendezvous.pb.h"
#include "rendezvous/etcd/keys.h"
#include "rendezvous/etcd/members.h"

namespace muster::etcd {
namespace {

using Kind = MemberStep::Kind;

class Steward final : public EtcdSteward {
 public:
  explicit Steward(StewardOptions options)
      : options_(std::move(options)), keys_(options_.job_id), logger_(Logger("rdzv")) {
    thread_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(options_.interval)) Step();
    });
  }

  ~Steward() override {
    stop_.Notify();
    thread_.join();
  }

 private:
  void Step();
  // Adds `offer`'s member as a learner and seats its node.
  void Seat(const MemberOffer& offer);

  const StewardOptions options_;
  const JobKeys keys_;
  const std::shared_ptr<spdlog::logger> logger_;
  MemberPlanner planner_;
  absl::Notification stop_;
  std::thread thread_;
};

std::vector<MemberView> Views(const std::vector<etcdserverpb::Member>& members) {
  std::vector<MemberView> out;
  for (const etcdserverpb::Member& member : members) {
    MemberView& view = out.emplace_back();
    view.id = member.id();
    if (!member.peerurls().empty()) view.peer_url = member.peerurls(0);
    view.learner = member.islearner();
    view.started = !member.clienturls().empty();
  }
  return out;
}

void Steward::Step() {
  absl::StatusOr<std::vector<etcdserverpb::Member>> members = options_.client->MemberList();
  if (!members.ok()) return;  // etcd away: the next step tries again
  absl::StatusOr<RangeResult> offered = options_.client->GetPrefix(keys_.members());
  if (!offered.ok()) return;
  std::vector<MemberOffer> offers;
  for (const mvccpb::KeyValue& kv : offered->kvs) {
    std::optional<std::string> node = JobKeys::NodeOf(kv.key(), keys_.members());
    rdzv::EtcdMemberOffer offer;
    if (!node || !offer.ParseFromString(kv.value())) continue;
    offers.push_back({*node, offer.name(), offer.host(), offer.peer_url(), offer.client_url()});
  }
  const MemberStep step = planner_.Next(Views(*members), offers, options_.clock->Now());
  switch (step.kind) {
    case Kind::kNone: return;
    case Kind::kRemove: {
      logger_->info("removing etcd member {:x} from the job's cluster: {}", step.member, step.why);
      absl::Status removed = options_.client->MemberRemove(step.member);
      if (!removed.ok()) logger_->warn("removing etcd member: {}", removed.message());
      return;
    }
    case Kind::kPromote: {
      // Refused until the learner has caught up: tried again next step.
      absl::Status promoted = options_.client->MemberPromote(step.member);
      if (promoted.ok()) logger_->info("etcd member {:x} is a voter: {}", step.member, step.why);
      return;
    }
    case Kind::kAdd: Seat(step.offer); return;
  }
}

void Steward::Seat(const MemberOffer& offer) {
  logger_->info("adding node {}'s etcd member ({}) to the job's cluster: {}", offer.node,
                offer.peer_url, "it offered, and the cluster is short of members");
  absl::StatusOr<etcdserverpb::Member> added = options_.client->MemberAdd(offer.peer_url, true);
  if (!added.ok()) {
    logger_->warn("adding node {}'s etcd member: {}", offer.node, added.status().message());
    return;
  }
  absl::StatusOr<std::vector<etcdserverpb::Member>> members = options_.client->MemberList();
  if (!members.ok()) return;  // the learner waits; unstarted, it is removed in time
  std::vector<std::pair<std::string, std::string>> cluster;
  for (const etcdserverpb::Member& member : *members) {
    if (member.peerurls().empty()) continue;
    const std::string& name = member.id() == added->id() ? offer.name : member.name();
    if (!name.empty()) cluster.emplace_back(name, member.peerurls(0));
  }
  rdzv::EtcdMemberSeat seat;
  seat.set_initial_cluster(InitialCluster(cluster));
  // Written only while this agent still leads.
  etcdserverpb::TxnRequest txn = FencedTxn(keys_.leader(), options_.leader_revision);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(keys_.seat(offer.node));
  put->set_value(seat.SerializeAsString());
  absl::StatusOr<etcdserverpb::TxnResponse> written = options_.client->Txn(txn);
  if (!written.ok() || !written->succeeded()) {
    logger_->warn("seating node {} in the job's etcd cluster: {}", offer.node,
                  written.ok() ? "this agent no longer leads" : written.status().message());
  }
}

}  // namespace

std::unique_ptr<EtcdSteward> EtcdSteward::Start(StewardOptions options) {
  return std::make_unique<Steward>(std::move(options));
}

}  // namespace muster::etcd
