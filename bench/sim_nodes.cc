#include "bench/sim_nodes.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rendezvous/grpc/channel.h"
#include "rendezvous/rules/protocol.h"

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
                               const std::string& job_id, int nodes, absl::Duration join_timeout,
                               absl::Duration keepalive) {
  Fleet fleet;
  for (int i = 0; i < connections; ++i) {
    // As an agent's (launcher/main.cc).
    grpc::ChannelArguments args = ClientChannelArguments(keepalive);
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

void SendRejoin(absl::Time deadline, Fleet* fleet, int index, std::function<void(int)> answered) {
  SimNode* node = fleet->nodes[index].get();
  node->rejoin = node->join;
  node->rejoin.set_node_secret(node->join_response.assignment().node_secret());
  node->rejoin_context.set_wait_for_ready(true);
  node->rejoin_context.set_deadline(absl::ToChronoTime(deadline));
  fleet->stub(index)->async()->Join(
      &node->rejoin_context, &node->rejoin, &node->rejoin_response,
      [node, index, answered = std::move(answered)](grpc::Status status) {
        node->rejoin_answered = SteadyClock::now();
        node->rejoin_status = std::move(status);
        answered(index);
      });
}

namespace {

using Answer = const JoinResponse& (*)(const SimNode&);

// Whether the answers `answer` picks agree (see CheckJoins).
absl::Status CheckAssignments(const std::vector<std::unique_ptr<SimNode>>& nodes, Answer answer) {
  const int n = static_cast<int>(nodes.size());
  std::vector<int> owner(n, -1);
  const Assignment& first = answer(*nodes[0]).assignment();
  for (int i = 0; i < n; ++i) {
    const Assignment& a = answer(*nodes[i]).assignment();
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
    if (a.round() != first.round() || a.restart_count() != first.restart_count() ||
        a.master_addr() != first.master_addr() || a.master_port() != first.master_port()) {
      return absl::InternalError(
          absl::StrCat("node ", i, " got master ", a.master_addr(), ":", a.master_port(),
                       " in round ", a.round(), " (restart ", a.restart_count(), "); node 0 got ",
                       first.master_addr(), ":", first.master_port(), " in round ", first.round(),
                       " (restart ", first.restart_count(), ")"));
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

// OK when every call `status` picks succeeded; else how many failed, and the first's message.
absl::Status CheckCalls(const Fleet& fleet, const grpc::Status SimNode::*status, const char* what) {
  const int n = static_cast<int>(fleet.nodes.size());
  int failed = 0;
  const SimNode* first_failed = nullptr;
  for (const auto& node : fleet.nodes) {
    if ((*node.*status).ok()) continue;
    ++failed;
    if (first_failed == nullptr) first_failed = node.get();
  }
  if (first_failed == nullptr) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      failed, " of ", n, " ", what, " failed; first: ", (*first_failed.*status).error_message()));
}

}  // namespace

absl::Status CheckJoins(const Fleet& fleet) {
  if (absl::Status calls = CheckCalls(fleet, &SimNode::join_status, "joins"); !calls.ok()) {
    return calls;
  }
  return CheckAssignments(
      fleet.nodes, [](const SimNode& node) -> const JoinResponse& { return node.join_response; });
}

absl::Status CheckRejoins(const Fleet& fleet, int64_t round, int restart_count) {
  if (absl::Status calls = CheckCalls(fleet, &SimNode::rejoin_status, "rejoins"); !calls.ok()) {
    return calls;
  }
  const Assignment& a = fleet.nodes[0]->rejoin_response.assignment();
  if (a.round() != round || a.restart_count() != restart_count) {
    return absl::InternalError(absl::StrCat("the rejoins got round ", a.round(), " and restart ",
                                            a.restart_count(), "; want round ", round,
                                            " and restart ", restart_count));
  }
  return CheckAssignments(
      fleet.nodes, [](const SimNode& node) -> const JoinResponse& { return node.rejoin_response; });
}

// One node's watch stream.
class WatchSet::Stream final : public grpc::ClientReadReactor<WatchEvent> {
 public:
  // `reopened`: opened again after an earlier stream of the node ended.
  Stream(WatchSet* set, int node, WatchRequest request, bool reopened)
      : set_(set), node_(node), reopened_(reopened), request_(std::move(request)) {}

  // No deadline, as an agent's watch has none: the run cancels it at the end.
  void Start(Rendezvous::Stub* stub) {
    stub->async()->Watch(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void Cancel() {
    cancelled_.store(true);
    context_.TryCancel();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    // The server's first event says it counts the stream as the node's heartbeat.
    if (event_.has_watch_started()) {
      started_at_ = SteadyClock::now();
      started_.store(true);
    } else {
      set_->events_.fetch_add(1);
      set_->Dispatch(node_, event_);
    }
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    ended_at_ = SteadyClock::now();
    if (reopened_ && !cancelled_.load()) {
      absl::MutexLock lock(&set_->failed_mu_);
      if (set_->reopened_failed_++ == 0) {
        set_->first_reopened_failure_ =
            absl::StrCat("code ", status.error_code(), ": ", status.error_message());
      }
    }
    ended_.store(true);
    set_->open_.Done();  // last: the owner may free this once every stream is done
  }
  bool ended() const { return ended_.load(); }
  bool started() const { return started_.load(); }
  // Ended, and not by Cancel.
  bool ended_by_itself() const { return ended_.load() && !cancelled_.load(); }
  // REQUIRES: started().
  SteadyClock::time_point started_at() const { return started_at_; }
  // REQUIRES: ended().
  SteadyClock::time_point ended_at() const { return ended_at_; }
  const grpc::Status& status() const { return status_; }

 private:
  WatchSet* const set_;
  const int node_;
  const bool reopened_;
  grpc::ClientContext context_;
  const WatchRequest request_;
  WatchEvent event_;
  grpc::Status status_;
  // Written before the flag that publishes them.
  SteadyClock::time_point started_at_, ended_at_;
  std::atomic<bool> ended_{false};
  std::atomic<bool> started_{false};
  std::atomic<bool> cancelled_{false};
};

WatchSet::WatchSet() = default;
WatchSet::~WatchSet() = default;

std::unique_ptr<WatchSet::Stream> WatchSet::NewStream(const Fleet& fleet, int node, int64_t round,
                                                      bool reopened) {
  const SimNode& sim = *fleet.nodes[node];
  WatchRequest request;
  request.set_job_id(sim.join.job_id());
  request.set_node_id(sim.join.node().node_id());
  request.set_node_secret(sim.assignment().node_secret());
  request.set_known_round(round);
  open_.Add(1);
  return std::make_unique<Stream>(this, node, std::move(request), reopened);
}

void WatchSet::Open(const Fleet& fleet, int64_t round) {
  const int n = static_cast<int>(fleet.nodes.size());
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < n; ++i) {
    current_.push_back(NewStream(fleet, i, round, /*reopened=*/false));
    current_.back()->Start(fleet.stub(i));
  }
}

void WatchSet::SetOnEvent(OnEvent hook) {
  absl::MutexLock lock(&mu_);
  on_event_ = std::move(hook);
}

void WatchSet::Dispatch(int node, const WatchEvent& event) {
  OnEvent hook;
  {
    absl::MutexLock lock(&mu_);
    hook = on_event_;
  }
  if (hook) hook(node, event);
}

int WatchSet::ReopenEnded(const Fleet& fleet, int64_t round, absl::Duration retry) {
  const SteadyClock::time_point due = SteadyClock::now() - absl::ToChronoNanoseconds(retry);
  std::vector<Stream*> to_start;
  std::vector<int> nodes;
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < static_cast<int>(current_.size()); ++i) {
      if (!current_[i]->ended_by_itself() || current_[i]->ended_at() > due) continue;
      replaced_.push_back(
          std::exchange(current_[i], NewStream(fleet, i, round, /*reopened=*/true)));
      to_start.push_back(current_[i].get());
      nodes.push_back(i);
    }
  }
  // Started outside the lock (a stream's first callbacks may come at once);
  // a stream not started yet has not ended, so no other call replaces it.
  for (size_t k = 0; k < to_start.size(); ++k) to_start[k]->Start(fleet.stub(nodes[k]));
  reopened_.fetch_add(static_cast<int>(to_start.size()));
  return static_cast<int>(to_start.size());
}

int WatchSet::ReopenedFailed(std::string* first) const {
  absl::MutexLock lock(&failed_mu_);
  *first = first_reopened_failure_;
  return reopened_failed_;
}

int WatchSet::started() const {
  absl::MutexLock lock(&mu_);
  int started = 0;
  for (const auto& stream : current_) started += stream->started() && !stream->ended() ? 1 : 0;
  return started;
}

int WatchSet::StartedSince(SteadyClock::time_point since, SteadyClock::time_point* first,
                           SteadyClock::time_point* last) const {
  absl::MutexLock lock(&mu_);
  int started = 0;
  *first = *last = since;
  for (const auto& stream : current_) {
    if (!stream->started() || stream->ended() || stream->started_at() <= since) continue;
    *first = started == 0 ? stream->started_at() : std::min(*first, stream->started_at());
    *last = std::max(*last, stream->started_at());
    ++started;
  }
  return started;
}

absl::Status WatchSet::CheckAllOpen() const {
  absl::MutexLock lock(&mu_);
  int ended = 0;
  const Stream* first = nullptr;
  for (const auto& stream : current_) {
    if (!stream->ended()) continue;
    ++ended;
    if (first == nullptr) first = stream.get();
  }
  if (first == nullptr) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      ended, " watch streams ended early; one with: ", first->status().error_message()));
}

bool WatchSet::CancelAndWait(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    on_event_ = nullptr;
    for (auto& stream : current_) stream->Cancel();
    for (auto& stream : replaced_) stream->Cancel();
  }
  return open_.WaitUntil(deadline);
}

}  // namespace muster::rdzv::scale
