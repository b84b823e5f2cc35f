// What RendezvousState tells without changing: assignments, deadlines,
// statuses, lists, figures, histories, a watch's catch-up.
#include "rendezvous/rules/state.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/constant_time.h"
#include "common/hmac.h"
#include "common/status.h"
#include "rendezvous/rules/node_secret.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state_internal.h"

namespace muster::rdzv {

using state_internal::FormatDuration;
using state_internal::JobEndedRecord;
using state_internal::kMaxNamedNodes;
using state_internal::NodeDoneRecord;
using state_internal::RoundChangedEvent;
using state_internal::RoundOpenedRecord;
using state_internal::WrongSecret;

std::optional<Assignment> RendezvousState::AssignmentOf(const NodeKey& key) const {
  auto it = jobs_.find(key.job_id);
  if (it == jobs_.end() || it->second.phase != Phase::kRunning) return std::nullopt;
  const Job& job = it->second;
  int rank_base = -1, world_size = 0;
  size_t group_rank = 0;
  for (size_t i = 0; i < job.participants.size(); ++i) {
    const Node& node = job.nodes.at(job.participants[i]);
    if (job.participants[i] == key.node_id) {
      rank_base = world_size;
      group_rank = i;
    }
    world_size += node.info.local_world_size();
  }
  if (rank_base < 0) return std::nullopt;
  return MakeAssignment(job, job.nodes.at(key.node_id), static_cast<int>(group_rank), rank_base,
                        world_size, job.nodes.at(job.participants.front()));
}

Assignment RendezvousState::MakeAssignment(const Job& job, const Node& node, int group_rank,
                                           int rank_base, int world_size,
                                           const Node& master) const {
  Assignment assignment;
  assignment.set_round(job.round);
  assignment.set_restart_count(job.restart_count);
  assignment.set_max_restarts(job.config.max_restarts());
  assignment.set_group_rank(group_rank);
  assignment.set_group_world_size(static_cast<int>(job.participants.size()));
  assignment.set_rank_base(rank_base);
  assignment.set_world_size(world_size);
  assignment.set_master_addr(master.addr);
  assignment.set_master_port(master.info.master_port_candidate());
  assignment.set_node_secret(node.secret);
  assignment.set_ride_out_outages(options_.ride_out_outages);
  assignment.set_preflight(job.round_preflight);
  if (options_.ride_out_outages) AddPeers(job, group_rank, &assignment);
  return assignment;
}

void RendezvousState::AddPeers(const Job& job, int group_rank, Assignment* assignment) const {
  const int n = static_cast<int>(job.participants.size());
  const int asked = std::min(kMaxPeers, n - 1);
  // Every other node of a small round; of a large one, `asked` spread evenly
  // around it, so that a node cut off with its neighbours still asks some
  // that are not.
  for (int k = 1; k <= asked; ++k) {
    const Node& peer = job.nodes.at(job.participants[(group_rank + k * n / (asked + 1)) % n]);
    Peer* out = assignment->add_peers();
    out->set_node_id(peer.info.node_id());
    out->set_host(peer.info.host());
    out->set_addr(peer.addr);
    out->set_port(peer.info.peer_port());
  }
  // From the secrets of the round's nodes, which only the server knows all
  // of: the same for each of them, unknown to anyone else, and another for
  // every round. Nothing new to journal: the secrets are durable.
  std::string material = absl::StrCat(job.id.size(), ":", job.id, job.round, ";");
  for (const std::string& id : job.participants) {
    const std::string& secret = job.nodes.at(id).secret;
    absl::StrAppend(&material, secret.size(), ":", secret);
  }
  assignment->set_peer_key(HmacSha256("muster peer key 1", material));
}

std::optional<absl::Time> RendezvousState::NextDeadline() const {
  std::optional<absl::Time> next;
  auto consider = [&next](absl::Time t) {
    if (!next || t < *next) next = t;
  };
  for (const auto& [id, job] : jobs_) {
    if (job.phase == Phase::kClosed) {
      consider(job.closed_at + kClosedJobRetention);
      continue;
    }
    if (job.nodes.empty()) consider(job.empty_since + EmptyJobLifetime(job));
    for (const auto& [node_id, node] : job.nodes) {
      if (!NeedsHeartbeat(job, node_id, node)) continue;
      consider(node.last_seen + absl::Milliseconds(job.config.heartbeat_timeout_ms()));
    }
    if (job.phase == Phase::kOpen) {
      if (job.last_call_deadline) consider(RoundDeadline(job));
      if (!job.joined.empty() && static_cast<int>(job.joined.size()) < job.config.min_nodes()) {
        consider(job.open_since + absl::Milliseconds(job.config.join_timeout_ms()));
      }
    }
  }
  return next;
}

absl::StatusOr<StatusResponse> RendezvousState::Status(absl::string_view job_id,
                                                       std::optional<absl::Time> now,
                                                       bool nodes) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "' on this server"));
  }
  return JobStatus(it->second, now, nodes);
}

const char* RendezvousState::PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kOpen: return "open";
    case Phase::kRunning: return "running";
    case Phase::kClosed: return "closed";
  }
  return "closed";
}

double RendezvousState::StepsPerSecond(const Job& job) {
  double steps_per_second = 0;
  if (job.phase != Phase::kRunning) return steps_per_second;
  for (const std::string& id : job.participants) {
    steps_per_second = std::max(steps_per_second, job.nodes.at(id).steps_per_second);
  }
  return steps_per_second;
}

void RendezvousState::AddProgress(const Job& job, std::optional<absl::Time> now,
                                  StatusResponse* response) {
  response->set_step(job.best_step);
  if (job.best_step >= 0) response->set_step_unix_ms(absl::ToUnixMillis(job.best_step_time));
  response->set_steps_per_second(StepsPerSecond(job));
  response->set_goodput(now ? Goodput(job, *now) : 0);
  response->set_no_progress_restarts(job.no_progress_restarts);
  for (const Exclusion& exclusion : job.excluded) *response->add_excluded() = exclusion;
}

StatusResponse RendezvousState::JobStatus(const Job& job, std::optional<absl::Time> now,
                                          bool nodes) const {
  StatusResponse response;
  response.set_job_id(job.id);
  response.set_state(std::string(PhaseName(job.phase)));
  response.set_round(job.round);
  response.set_restart_count(job.restart_count);
  response.set_participants(job.phase == Phase::kOpen ? static_cast<int>(job.joined.size())
                                                      : static_cast<int>(job.participants.size()));
  response.set_waiting(static_cast<int>(job.waiting.size()));
  *response.mutable_config() = job.config;
  response.set_last_call_remaining_ms(-1);
  if (job.phase == Phase::kOpen) {
    if (job.last_call_deadline && now) {
      response.set_last_call_remaining_ms(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(RoundDeadline(job) - *now)));
    }
    for (const std::string& node_id : job.not_back) {
      if (response.missing_size() == static_cast<int>(kMaxNamedNodes)) break;
      response.add_missing(job.nodes.at(node_id).info.host());  // each kMaxHostLength at most
    }
    response.set_missing_count(static_cast<int>(job.not_back.size()));
  }
  response.set_created_unix_ms(absl::ToUnixMillis(job.created_at));
  response.set_round_since_unix_ms(
      absl::ToUnixMillis(job.phase == Phase::kClosed ? job.closed_at : job.round_since));
  response.set_node_count(static_cast<int>(job.nodes.size()));
  if (job.phase != Phase::kOpen) {  // a closed job's last round
    int64_t world_size = 0;
    for (const std::string& id : job.participants) {
      auto node = job.nodes.find(id);
      if (node != job.nodes.end()) world_size += node->second.info.local_world_size();
    }
    response.set_world_size(static_cast<int>(world_size));  // Join keeps it within int32
  }
  if (job.phase == Phase::kClosed) {
    response.set_succeeded(job.succeeded);
    response.set_close_reason(job.close_reason);
    if (job.closed_event && job.closed_event->job_closed().has_root_cause()) {
      Failure* cause = response.mutable_root_cause();
      *cause = job.closed_event->job_closed().root_cause();
      cause->set_message(CutText(cause->message(), kMaxStatusMessageBytes));
    }
  }
  for (const Failure& failure : job.recent_failures) *response.add_recent_failures() = failure;
  AddProgress(job, now, &response);
  if (!nodes) return response;

  auto add = [&](const std::string& node_id, const Node& node, absl::string_view state,
                 int group_rank, int rank_base) {
    if (response.nodes_size() == static_cast<int>(kMaxListedNodes)) return;
    NodeStatus* out = response.add_nodes();
    out->set_node_id(node_id);
    out->set_host(node.info.host());
    out->set_addr(node.addr);
    out->set_state(std::string(state));
    out->set_group_rank(group_rank);
    out->set_rank_base(rank_base);
    out->set_local_world_size(node.info.local_world_size());
    out->set_joined_unix_ms(absl::ToUnixMillis(node.joined_at));
    out->set_last_seen_unix_ms(absl::ToUnixMillis(node.watching && now ? *now : node.last_seen));
    out->set_watching(node.watching);
    out->set_step(node.step);
    if (node.step >= 0) out->set_step_unix_ms(absl::ToUnixMillis(node.step_time));
    out->set_steps_per_second(node.steps_per_second);
  };
  std::set<std::string> listed;
  if (job.phase != Phase::kOpen) {  // a closed job's last round
    const absl::string_view running = PhaseName(job.phase);
    int rank_base = 0;
    for (size_t i = 0; i < job.participants.size(); ++i) {
      const std::string& id = job.participants[i];
      auto node_it = job.nodes.find(id);
      if (node_it == job.nodes.end()) continue;
      const Node& node = node_it->second;
      add(id, node, job.done.contains(id) ? "done" : running, static_cast<int>(i), rank_base);
      rank_base += node.info.local_world_size();
      listed.insert(id);
    }
  }
  std::vector<std::pair<int64_t, const std::string*>> others;
  for (const auto& [id, node] : job.nodes) {
    if (!listed.contains(id)) others.emplace_back(node.join_seq, &id);
  }
  std::sort(others.begin(), others.end());
  for (const auto& [seq, id] : others) {
    const absl::string_view state = job.phase == Phase::kClosed  ? "closed"
                                    : job.joined.contains(*id)   ? "joined"
                                    : job.not_back.contains(*id) ? "rejoining"
                                    : job.waiting.contains(*id)  ? "waiting"
                                                                 : "idle";
    add(*id, job.nodes.at(*id), state, -1, -1);
  }
  return response;
}

ListJobsResponse RendezvousState::ListJobs(absl::string_view prefix, absl::Time now) const {
  ListJobsResponse response;
  int32_t total = 0;
  for (auto it = jobs_.lower_bound(prefix);
       it != jobs_.end() && absl::StartsWith(it->first, prefix); ++it) {
    ++total;
    if (response.jobs_size() == static_cast<int>(kMaxListedJobs)) continue;
    StatusResponse* job = response.add_jobs();
    *job = JobStatus(it->second, now, /*nodes=*/false);
    job->mutable_root_cause()->clear_message();
    for (Failure& failure : *job->mutable_recent_failures()) failure.clear_message();
  }
  response.set_total(total);
  return response;
}

std::vector<RendezvousState::JobFigures> RendezvousState::Figures(absl::Time now) const {
  std::vector<JobFigures> out;
  out.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) {
    JobFigures& figures = out.emplace_back();
    figures.id = id;
    figures.state = PhaseName(job.phase);
    figures.nodes = static_cast<int64_t>(job.nodes.size());
    figures.restarts = job.restart_count;
    figures.rounds = job.rounds_by_reason;
    figures.step = job.best_step;
    figures.seconds_since_step = absl::ToDoubleSeconds(now - job.best_step_time);
    figures.goodput = Goodput(job, now);
    figures.excluded = static_cast<int64_t>(job.excluded.size());
    figures.no_progress_restarts = job.no_progress_restarts;
    figures.steps_per_second = StepsPerSecond(job);
  }
  return out;
}

absl::StatusOr<std::vector<JobEvent>> RendezvousState::History(absl::string_view job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "' on this server"));
  }
  return std::vector<JobEvent>(it->second.history.begin(), it->second.history.end());
}

absl::StatusOr<std::optional<WatchEvent>> RendezvousState::CatchUp(const NodeKey& key,
                                                                   absl::string_view secret,
                                                                   int64_t known_round) const {
  auto it = jobs_.find(key.job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", key.job_id, "' on this server"));
  }
  const Job& job = it->second;
  auto node = job.nodes.find(key.node_id);
  if (node != job.nodes.end() && !ConstantTimeEquals(node->second.secret, secret)) {
    return WrongSecret(key);
  }
  if (job.phase == Phase::kClosed) {
    if (node != job.nodes.end() || !job.closed_event) return job.closed_event;
    // A node that is no longer in the job learns what a join would: that it
    // closed and why, not the worker's message.
    WatchEvent event = *job.closed_event;
    event.mutable_job_closed()->mutable_root_cause()->clear_message();
    return event;
  }
  if (node == job.nodes.end()) return NotInJob(job, key.node_id, secret);
  if (job.round > known_round) {
    if (job.last_round_change) return job.last_round_change;
    return RoundChangedEvent(job.round, RoundChanged::REASON_UNSPECIFIED, "the job moved on");
  }
  return std::optional<WatchEvent>();
}

bool RendezvousState::IsParticipant(const Job& job, const std::string& node_id) {
  return std::find(job.participants.begin(), job.participants.end(), node_id) !=
         job.participants.end();
}

bool RendezvousState::NeedsHeartbeat(const Job& job, const std::string& node_id,
                                     const Node& node) const {
  // A pending join is alive while its call is open (the server drops the node
  // when the call is cancelled), and agents heartbeat only once in the job. A
  // node whose workers all finished may exit: it is not needed any more. An
  // open watch stream is a heartbeat.
  return !options_.external_liveness && !node.watching && !job.joined.contains(node_id) &&
         !job.waiting.contains(node_id) && !job.done.contains(node_id);
}

std::vector<std::string> RendezvousState::DescribeNodes(const Job& job,
                                                        const std::set<std::string>& ids) const {
  std::vector<std::string> names;
  for (const std::string& id : ids) {
    auto it = job.nodes.find(id);
    names.push_back(it == job.nodes.end() ? id : it->second.info.host());
  }
  return names;
}

}  // namespace muster::rdzv
