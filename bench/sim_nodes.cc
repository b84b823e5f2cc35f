#include "bench/sim_nodes.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rendezvous/channel.h"
#include "rendezvous/protocol.h"

namespace muster::rdzv::scale {

double MsSince(SteadyClock::time_point start, SteadyClock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

void Countdown::Add(int n) {
  absl::MutexLock lock(&mu_);
  left_ += n;
}

void Countdown::Done() {
  absl::MutexLock lock(&mu_);
  --left_;
}

bool Countdown::WaitUntil(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(
                                   +[](int* left) { return *left == 0; }, &left_),
                               deadline);
}

int Countdown::left() {
  absl::MutexLock lock(&mu_);
  return left_;
}

JoinRequest NodeJoinRequest(const std::string& job_id, int nodes, int index,
                            absl::Duration join_timeout) {
  JoinRequest join;
  join.set_job_id(job_id);
  JobConfig* job = join.mutable_config();
  job->set_min_nodes(nodes);
  job->set_max_nodes(nodes);
  job->set_max_restarts(3);
  job->set_last_call_timeout_ms(0);
  job->set_join_timeout_ms(absl::ToInt64Milliseconds(join_timeout));
  job->set_heartbeat_timeout_ms(kHeartbeatTimeoutMs);
  NodeInfo* info = join.mutable_node();
  char name[32];
  std::snprintf(name, sizeof name, "host-%05d", index);
  info->set_host(name);
  info->set_node_id(absl::StrCat(name, ":", 1000 + index, ":bench"));
  info->set_local_world_size(kLocalWorldSize);
  info->set_node_rank_hint(-1);
  info->set_master_port_candidate(kFirstMasterPort + index % 40'000);
  join.set_protocol_version(kProtocolVersion);
  return join;
}

absl::StatusOr<Fleet> NewFleet(const std::string& target, int connections,
                               const std::string& job_id, int nodes, absl::Duration join_timeout) {
  Fleet fleet;
  for (int i = 0; i < connections; ++i) {
    // As an agent's (launcher/main.cc).
    grpc::ChannelArguments args = ClientChannelArguments(kAgentKeepalive);
    // Channels with equal arguments would share one connection through the
    // global subchannel pool: each gets its own.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    // Connection setup is not part of the join timing.
    if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10)))) {
      return absl::UnavailableError(
          absl::StrCat("channel ", i, " to ", target, " did not connect within 10 s"));
    }
    fleet.stubs.push_back(Rendezvous::NewStub(channel));
    fleet.channels.push_back(std::move(channel));
  }
  fleet.nodes.reserve(nodes);
  for (int i = 0; i < nodes; ++i) {
    auto node = std::make_unique<SimNode>();
    node->join = NodeJoinRequest(job_id, nodes, i, join_timeout);
    node->join_context.set_wait_for_ready(true);
    fleet.nodes.push_back(std::move(node));
  }
  return fleet;
}

void SendJoins(absl::Time deadline, Fleet* fleet, Countdown* joins) {
  for (int i = 0; i < static_cast<int>(fleet->nodes.size()); ++i) {
    SimNode* node = fleet->nodes[i].get();
    node->join_context.set_deadline(absl::ToChronoTime(deadline));
    fleet->stub(i)->async()->Join(&node->join_context, &node->join, &node->join_response,
                                  [node, joins](grpc::Status status) {
                                    node->answered = SteadyClock::now();
                                    node->join_status = std::move(status);
                                    joins->Done();
                                  });
  }
}

namespace {

absl::Status CheckAssignments(const std::vector<std::unique_ptr<SimNode>>& nodes) {
  const int n = static_cast<int>(nodes.size());
  std::vector<int> owner(n, -1);
  const Assignment& first = nodes[0]->join_response.assignment();
  for (int i = 0; i < n; ++i) {
    const Assignment& a = nodes[i]->join_response.assignment();
    if (a.group_rank() < 0 || a.group_rank() >= n) {
      return absl::InternalError(absl::StrCat("node ", i, " got group rank ", a.group_rank()));
    }
    if (owner[a.group_rank()] != -1) {
      return absl::InternalError(absl::StrCat("nodes ", owner[a.group_rank()], " and ", i,
                                              " both got group rank ", a.group_rank()));
    }
    owner[a.group_rank()] = i;
    if (a.group_world_size() != n || a.world_size() != kLocalWorldSize * n) {
      return absl::InternalError(absl::StrCat("node ", i, " got group world size ",
                                              a.group_world_size(), " and world size ",
                                              a.world_size()));
    }
    if (a.rank_base() != kLocalWorldSize * a.group_rank()) {
      return absl::InternalError(absl::StrCat("node ", i, " got rank base ", a.rank_base(),
                                              " at group rank ", a.group_rank()));
    }
    if (a.round() != first.round() || a.master_addr() != first.master_addr() ||
        a.master_port() != first.master_port()) {
      return absl::InternalError(absl::StrCat("node ", i, " got master ", a.master_addr(), ":",
                                              a.master_port(), " in round ", a.round(),
                                              "; node 0 got ", first.master_addr(), ":",
                                              first.master_port(), " in round ", first.round()));
    }
  }
  const NodeInfo& master = nodes[owner[0]]->join.node();
  if (first.master_addr() != "127.0.0.1" || first.master_port() != master.master_port_candidate()) {
    return absl::InternalError(absl::StrCat(
        "master is ", first.master_addr(), ":", first.master_port(), ", but group rank 0 (",
        master.node_id(), ") offered 127.0.0.1:", master.master_port_candidate()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJoins(const Fleet& fleet) {
  const int n = static_cast<int>(fleet.nodes.size());
  int failed = 0;
  const SimNode* first_failed = nullptr;
  for (const auto& node : fleet.nodes) {
    if (node->join_status.ok()) continue;
    ++failed;
    if (first_failed == nullptr) first_failed = node.get();
  }
  if (first_failed != nullptr) {
    return absl::UnavailableError(absl::StrCat(
        failed, " of ", n, " joins failed; first: ", first_failed->join_status.error_message()));
  }
  return CheckAssignments(fleet.nodes);
}

// One node's watch stream.
class WatchSet::Stream final : public grpc::ClientReadReactor<WatchEvent> {
 public:
  Stream(Countdown* open, std::atomic<int>* events, WatchRequest request)
      : open_(open), events_(events), request_(std::move(request)) {}

  // No deadline, as an agent's watch has none: the run cancels it at the end.
  void Start(Rendezvous::Stub* stub) {
    stub->async()->Watch(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    // The server's first event says it counts the stream as the node's heartbeat.
    if (event_.has_watch_started()) {
      started_.store(true);
    } else {
      events_->fetch_add(1);
    }
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    ended_.store(true);
    open_->Done();  // last: the owner may free this once every stream is done
  }
  bool ended() const { return ended_.load(); }
  bool started() const { return started_.load(); }
  // REQUIRES: ended().
  const grpc::Status& status() const { return status_; }

 private:
  Countdown* const open_;
  std::atomic<int>* const events_;
  grpc::ClientContext context_;
  const WatchRequest request_;
  WatchEvent event_;
  grpc::Status status_;
  std::atomic<bool> ended_{false};
  std::atomic<bool> started_{false};
};

WatchSet::WatchSet() = default;
WatchSet::~WatchSet() = default;

void WatchSet::Open(const Fleet& fleet, int64_t round) {
  const int n = static_cast<int>(fleet.nodes.size());
  open_.Add(n);
  for (int i = 0; i < n; ++i) {
    WatchRequest request;
    request.set_job_id(fleet.nodes[i]->join.job_id());
    request.set_node_id(fleet.nodes[i]->join.node().node_id());
    request.set_node_secret(fleet.nodes[i]->join_response.assignment().node_secret());
    request.set_known_round(round);
    streams_.push_back(std::make_unique<Stream>(&open_, &events_, std::move(request)));
    streams_.back()->Start(fleet.stub(i));
  }
}

int WatchSet::started() const {
  int started = 0;
  for (const auto& stream : streams_) started += stream->started() ? 1 : 0;
  return started;
}

absl::Status WatchSet::CheckAllOpen() {
  const int n = static_cast<int>(streams_.size());
  for (const auto& stream : streams_) {
    if (stream->ended()) {
      const int open = open_.left();
      return absl::UnavailableError(
          absl::StrCat(open < n ? n - open : 0,
                       " watch streams ended early; one with: ", stream->status().error_message()));
    }
  }
  return absl::OkStatus();
}

bool WatchSet::CancelAndWait(absl::Time deadline) {
  for (auto& stream : streams_) stream->Cancel();
  return open_.WaitUntil(deadline);
}

}  // namespace muster::rdzv::scale
