#include "rendezvous/rules/state.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/constant_time.h"
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

namespace {

std::string DescribeFailure(const Failure& failure) {
  std::string exit = failure.signal() != 0 ? absl::StrCat("signal ", failure.signal())
                                           : absl::StrCat("exit code ", failure.exit_code());
  return absl::StrCat("rank ", failure.rank(), " on ", failure.host(), " failed with ", exit);
}

}  // namespace

bool IsFinalEvent(const JobEvent& event) {
  return event.kind() == JobEvent::JOB_CLOSED || event.kind() == JobEvent::JOB_FORGOTTEN;
}

RendezvousState::Job* RendezvousState::FindJob(absl::string_view job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<RendezvousState::Job*> RendezvousState::FindLiveNode(const NodeKey& key,
                                                                    absl::string_view secret) {
  Job* job = FindJob(key.job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", key.job_id, "' on this server"));
  }
  if (job->phase == Phase::kClosed) {
    return ClosedJob(job->id, job->close_reason, job->succeeded);
  }
  auto node = job->nodes.find(key.node_id);
  if (node == job->nodes.end()) return NotInJob(*job, key.node_id, secret);
  if (!ConstantTimeEquals(node->second.secret, secret)) return WrongSecret(key);
  return job;
}

absl::Status RendezvousState::CheckJoin(const JoinRequest& request) {
  const NodeInfo& info = request.node();
  Job* existing = FindJob(request.job_id());
  if (existing != nullptr) {
    const Job& job = *existing;
    if (job.phase == Phase::kClosed) {
      return JoinToClosedJob(job.id, job.close_reason, job.succeeded);
    }
    const JobConfig& want = job.config;
    const JobConfig& got = request.config();
    if (got.min_nodes() != want.min_nodes() || got.max_nodes() != want.max_nodes() ||
        got.max_restarts() != want.max_restarts()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job.id, "' runs with --nnodes ", want.min_nodes(), ":", want.max_nodes(),
          " --max-restarts ", want.max_restarts(), ", but this node asked for --nnodes ",
          got.min_nodes(), ":", got.max_nodes(), " --max-restarts ", got.max_restarts(),
          "; give every node the same values, or use another --rdzv-id"));
    }
    if (got.max_no_progress_restarts() != want.max_no_progress_restarts() ||
        got.max_node_failures() != want.max_node_failures()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job.id, "' runs with --max-no-progress-restarts ",
          want.max_no_progress_restarts(), " --max-node-failures ", want.max_node_failures(),
          ", but this node asked for --max-no-progress-restarts ", got.max_no_progress_restarts(),
          " --max-node-failures ", got.max_node_failures(), "; give every node the same values"));
    }
    if (got.preflight() != want.preflight()) {
      auto preflight = [](bool on) { return on ? "--preflight allreduce" : "no --preflight"; };
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", job.id, "' runs with ", preflight(want.preflight()),
          ", but this node asked for ", preflight(got.preflight()),
          ": the first round's workers would differ; give every node the same --preflight"));
    }
    if (const Exclusion* excluded = FindExclusion(job, info.host())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "host ", info.host(), " ", kExcludedFromJob, " '", job.id, "': ", excluded->cause(),
          "; it is not seated again in this job (check or replace the node, then start a new "
          "job, or give the job another node)"));
    }
    int64_t workers = job.live_workers + info.local_world_size();
    if (auto live = job.nodes.find(info.node_id()); live != job.nodes.end()) {
      // A node never seated was never told its secret: its agent, which
      // gave up on a join the server still holds (a connection that broke
      // on one side first), joins again without it, superseding it; its
      // join key, drawn by that agent process, says it is the same one.
      const bool unseated_again = !live->second.secret_told && !request.join_key().empty() &&
                                  ConstantTimeEquals(live->second.join_key, request.join_key());
      if (!unseated_again && !ConstantTimeEquals(live->second.secret, request.node_secret())) {
        return absl::PermissionDeniedError(absl::StrCat(
            "node id ", info.node_id(), " is held by another agent in job '", job.id,
            "'; a node speaks only for itself: every agent needs its own node id (muster makes "
            "one per agent; is a copy of this agent's requests being replayed?)"));
      }
      workers -= live->second.info.local_world_size();
    }
    if (workers > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("job '", job.id, "' would have ", workers,
                       " workers with this node; a world size has at most ",
                       std::numeric_limits<int32_t>::max()));
    }
  } else if (open_jobs_ >= options_.max_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the rendezvous holds ", open_jobs_, " open jobs, its most (musterd --max-jobs ",
        options_.max_jobs, "); wait for jobs to end, or run musterd with a larger --max-jobs"));
  }
  return absl::OkStatus();
}

RendezvousState::Job& RendezvousState::JobToJoin(const JoinRequest& request, absl::Time now,
                                                 Effects* effects) {
  if (jobs_.find(request.job_id()) == jobs_.end()) TrimClosedJobs(effects);
  auto [it, created] = jobs_.try_emplace(request.job_id());
  Job& job = it->second;
  if (created) {
    ++open_jobs_;
    job.id = request.job_id();
    job.config = request.config();
    job.empty_since = now;
    job.created_at = now;
    job.round_since = now;
    LogLimited("created",
               absl::StrCat("job '", job.id, "' created: nodes ", job.config.min_nodes(), ":",
                            job.config.max_nodes(), ", max_restarts ", job.config.max_restarts()),
               now, effects);
  }
  return job;
}

void RendezvousState::RecordJoin(Job& job, const JoinRequest& request, absl::string_view peer_addr,
                                 absl::string_view new_secret, absl::Time now, Effects* effects) {
  const NodeInfo& info = request.node();
  auto [node_it, is_new] = job.nodes.try_emplace(info.node_id());
  Node& node = node_it->second;
  if (is_new) {
    node.secret = std::string(new_secret);
    node.join_key = request.join_key();
  } else {
    job.live_workers -= node.info.local_world_size();
  }
  job.live_workers += info.local_world_size();
  node.info = info;
  node.addr = info.advertised_addr().empty() ? std::string(peer_addr) : info.advertised_addr();
  node.last_seen = now;
  node.join_seq = job.next_join_seq++;
  if (is_new) {
    node.joined_at = now;
    AddEvent(job, JobEvent::NODE_JOINED, info.node_id(),
             absl::StrCat("node ", info.host(), " joined with ", info.local_world_size(),
                          info.local_world_size() == 1 ? " worker" : " workers"),
             now, effects);
  }
}

void RendezvousState::JoinOpenRound(Job& job, const NodeInfo& info, absl::Time now,
                                    Effects* effects) {
  job.waiting.erase(info.node_id());  // a spare that joins again
  if (!job.joined.contains(info.node_id()) && !job.expected.contains(info.node_id())) {
    // A member rejoining a restart round keeps its seat: a newcomer takes
    // only a seat no member holds.
    const int held = static_cast<int>(job.not_back.size());
    if (static_cast<int>(job.joined.size()) + held >= job.config.max_nodes()) {
      job.waiting.insert(info.node_id());
      effects->log.push_back(absl::StrCat("job '", job.id, "': node ", info.host(),
                                          " waits; the seats of round ", job.round,
                                          " are held for its members"));
      return;
    }
  }
  if (job.joined.empty()) {
    job.open_since = now;
    effects->rearm_timer = true;
  }
  job.joined.insert(info.node_id());
  job.not_back.erase(info.node_id());
  MaybeComplete(job, now, effects);
}

void RendezvousState::JoinRunningRound(Job& job, const NodeInfo& info, absl::Time now,
                                       Effects* effects) {
  // The round is running. A participant that joins again has lost its
  // workers; anyone else waits for the next round.
  const bool participant = IsParticipant(job, info.node_id());
  job.waiting.insert(info.node_id());
  if (!job.done.empty()) {
    // Part of the job has finished: a new round would run it again.
    effects->log.push_back(absl::StrCat("job '", job.id, "': node ", info.host(),
                                        " waits; the running round is finishing"));
  } else if (participant) {
    OpenNextRound(job, RoundChanged::NODE_JOINED, absl::StrCat("node ", info.host(), " rejoined"),
                  now, effects);
  } else if (static_cast<int>(job.participants.size()) < job.config.max_nodes()) {
    OpenNextRound(job, RoundChanged::NODE_JOINED, absl::StrCat("node ", info.host(), " joined"),
                  now, effects);
  } else {
    effects->log.push_back(absl::StrCat("job '", job.id, "': node ", info.host(),
                                        " waits; the running round is full (",
                                        job.config.max_nodes(), " nodes)"));
  }
}

absl::Status RendezvousState::Join(const JoinRequest& request, absl::string_view peer_addr,
                                   absl::string_view new_secret, absl::Time now, Effects* effects) {
  MUSTER_RETURN_IF_ERROR(ValidateJoinRequest(request));
  // Every check first: a refused join changes nothing.
  MUSTER_RETURN_IF_ERROR(CheckJoin(request));
  if (!request.health_fault().empty()) return RefuseUnhealthy(request, now, effects);
  Job& job = JobToJoin(request, now, effects);
  RecordJoin(job, request, peer_addr, new_secret, now, effects);
  if (job.phase == Phase::kOpen) {
    JoinOpenRound(job, request.node(), now, effects);
  } else {
    JoinRunningRound(job, request.node(), now, effects);
  }
  return absl::OkStatus();
}

void RendezvousState::CancelJoin(const NodeKey& key, absl::Time now, Effects* effects) {
  DropNode(key, "cancelled its join", now, effects);
}

void RendezvousState::DropNode(const NodeKey& key, absl::string_view why, absl::Time now,
                               Effects* effects) {
  Job* job = FindJob(key.job_id);
  if (job == nullptr || job->phase == Phase::kClosed) return;
  RemoveNode(*job, key.node_id, std::string(why), now, effects);
}

absl::StatusOr<int64_t> RendezvousState::Heartbeat(const NodeKey& key, absl::string_view secret,
                                                   absl::Time now) {
  absl::StatusOr<Job*> job = FindLiveNode(key, secret);
  if (!job.ok()) return job.status();
  (*job)->nodes[key.node_id].last_seen = now;
  return (*job)->round;
}

void RendezvousState::SetWatching(const NodeKey& key, bool watching, absl::Time now,
                                  Effects* effects) {
  Job* job = FindJob(key.job_id);
  if (job == nullptr) return;
  auto it = job->nodes.find(key.node_id);
  if (it == job->nodes.end() || it->second.watching == watching) return;
  it->second.watching = watching;
  if (!watching) {
    const absl::Duration timeout = absl::Milliseconds(job->config.heartbeat_timeout_ms());
    it->second.last_seen = now - std::min(options_.stream_silence, timeout / 2);
    effects->rearm_timer = true;  // its heartbeat deadline starts now
  }
}

absl::Status RendezvousState::ReportFailure(const NodeKey& key, absl::string_view secret,
                                            int64_t round, const Failure& reported, absl::Time now,
                                            Effects* effects) {
  absl::StatusOr<Job*> found = FindLiveNode(key, secret);
  if (!found.ok()) {
    // A failure report racing the job's close is expected; the close already said it all.
    return absl::IsFailedPrecondition(found.status()) ? absl::OkStatus() : found.status();
  }
  Job& job = **found;
  job.nodes[key.node_id].last_seen = now;
  if (round != job.round || job.phase != Phase::kRunning || !IsParticipant(job, key.node_id)) {
    return absl::OkStatus();  // stale: the job already moved on
  }
  // A real traceback can be long: cut, never refused, or the report is lost.
  Failure failure = reported;
  failure.set_message(CutText(reported.message(), kMaxFailureMessageBytes));
  failure.set_host(ForLog(reported.host(), kMaxHostLength));
  const std::string detail = DescribeFailure(failure);
  Failure& recent = job.recent_failures.emplace_back(failure);
  recent.set_message(CutText(failure.message(), kMaxStatusMessageBytes));
  if (job.recent_failures.size() > kMaxRecentFailures) job.recent_failures.pop_front();
  // Only the pre-flight's failure, which only a round that seated new nodes
  // of a job that asked for one runs, is spared the restarts.
  const bool preflight_failed =
      failure.no_restart() && job.config.preflight() && job.round_preflight;
  if (preflight_failed && ExcludeNewcomers(job, detail, now, effects)) return absl::OkStatus();
  const FailureVerdict verdict = JudgeFailure(job, key.node_id, detail, preflight_failed);
  AddEvent(job, JobEvent::WORKER_FAILED, key.node_id, verdict.outcome, now, effects);
  const std::string host = job.nodes.at(key.node_id).info.host();
  if (verdict.exclusion) {
    ExcludeHost(job, host, key.node_id, *verdict.exclusion, now, effects, !verdict.restart);
    TakeOutOfRound(job, host);
  }
  if (verdict.restart) {
    ++job.restart_count;
    OpenNextRound(job, RoundChanged::WORKER_FAILED, verdict.outcome, now, effects);
  } else {
    job.stuck = verdict.stuck;
    Close(job, false, verdict.outcome, failure, now, effects);
  }
  if (verdict.exclusion) RemoveExcludedNodes(job, host, now, effects);
  return absl::OkStatus();
}

absl::Status RendezvousState::ReportDone(const NodeKey& key, absl::string_view secret,
                                         int64_t round, absl::Time now, Effects* effects) {
  absl::StatusOr<Job*> found = FindLiveNode(key, secret);
  if (!found.ok()) return found.status();
  Job& job = **found;
  job.nodes[key.node_id].last_seen = now;
  if (round != job.round || job.phase != Phase::kRunning) {
    return absl::AbortedError(
        absl::StrCat("round ", round, " is over; the job is in round ", job.round));
  }
  if (!IsParticipant(job, key.node_id)) {
    return absl::AbortedError(absl::StrCat("node ", key.node_id, " is not in round ", job.round));
  }
  job.done.insert(key.node_id);
  Record(effects, NodeDoneRecord(job.id, key.node_id, round));
  if (job.done.size() == job.participants.size()) {
    Close(job, true, "every node finished", std::nullopt, now, effects);
  }
  return absl::OkStatus();
}

absl::Status RendezvousState::Leave(const NodeKey& key, absl::string_view secret,
                                    absl::string_view reason, absl::Time now, Effects* effects,
                                    bool exclude) {
  absl::StatusOr<Job*> found = FindLiveNode(key, secret);
  if (!found.ok()) {
    return absl::IsFailedPrecondition(found.status()) ? absl::OkStatus() : found.status();
  }
  if (exclude) {
    // Its own health check found it bad: the round goes on without its host
    // (NODE_LOST, no restart spent).
    Job& job = **found;
    const std::string host = job.nodes.at(key.node_id).info.host();
    ExcludeHost(job, host, key.node_id,
                absl::StrCat("its own health check failed: ", ForLog(reason, kMaxReasonBytes)), now,
                effects);
    RemoveExcludedNodes(job, host, now, effects);
    return absl::OkStatus();
  }
  RemoveNode(**found, key.node_id,
             absl::StrCat("left", reason.empty() ? "" : ": ", ForLog(reason, kMaxReasonBytes)), now,
             effects);
  return absl::OkStatus();
}

void RendezvousState::LogLimited(absl::string_view kind, std::string line, absl::Time now,
                                 Effects* effects) {
  const LogLimiter::Verdict verdict = log_limiter_.Allow(kind, now);
  if (!verdict.log) return;
  if (verdict.dropped > 0) {
    absl::StrAppend(&line, " (and ", verdict.dropped, " more '", kind,
                    "' lines left out: at most 10 a second)");
  }
  effects->log.push_back(std::move(line));
}

void RendezvousState::TrimClosedJobs(Effects* effects) {
  int forgotten = 0;
  while (!closed_order_.empty()) {
    const auto& [closed_at, id] = closed_order_.front();
    auto it = jobs_.find(id);
    const bool stale = it == jobs_.end() || it->second.phase != Phase::kClosed ||
                       it->second.closed_at != closed_at;
    if (!stale && jobs_.size() - open_jobs_ <= options_.max_closed_jobs) break;
    if (!stale) {
      Forget(it, effects);
      ++forgotten;
    }
    closed_order_.pop_front();
  }
  if (forgotten > 0) {
    effects->log.push_back(
        absl::StrCat(forgotten, " closed job(s) forgotten early: the rendezvous keeps at most ",
                     options_.max_closed_jobs, " closed jobs"));
  }
}

void RendezvousState::Advance(absl::Time now, Effects* effects) {
  // A closed job is kept a while, so that late nodes learn it is over, then
  // forgotten: a long-lived server does not grow, and the id can be used again.
  // A job nobody is in (they left, were lost, or never got in) is forgotten
  // too: joins that are cancelled at once cannot fill the server with jobs.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& job = it->second;
    const bool closed = job.phase == Phase::kClosed;
    const bool expired = closed
                             ? now - job.closed_at >= kClosedJobRetention
                             : job.nodes.empty() && now - job.empty_since >= EmptyJobLifetime(job);
    if (!expired) {
      ++it;
      continue;
    }
    if (!closed) {
      AddEvent(job, JobEvent::JOB_FORGOTTEN, "",
               absl::StrCat("no node in it for ",
                            FormatDuration(absl::ToInt64Milliseconds(EmptyJobLifetime(job)))),
               now, effects);
    }
    LogLimited("forgotten",
               closed
                   ? absl::StrCat("job '", job.id, "' forgotten")
                   : absl::StrCat("job '", job.id, "' forgotten: no node in it for ",
                                  FormatDuration(absl::ToInt64Milliseconds(EmptyJobLifetime(job)))),
               now, effects);
    it = Forget(it, effects);
  }
  for (auto& [id, job] : jobs_) {
    if (job.phase == Phase::kClosed) continue;
    // Heartbeats first: a dead node must not complete a round.
    const absl::Duration timeout = absl::Milliseconds(job.config.heartbeat_timeout_ms());
    std::vector<std::string> dead;
    for (const auto& [node_id, node] : job.nodes) {
      if (NeedsHeartbeat(job, node_id, node) && now - node.last_seen >= timeout) {
        dead.push_back(node_id);
      }
    }
    for (const std::string& node_id : dead) {
      if (job.phase == Phase::kClosed) break;
      RemoveNode(job, node_id,
                 absl::StrCat("silent for ", FormatDuration(job.config.heartbeat_timeout_ms())),
                 now, effects);
    }
    if (job.phase != Phase::kOpen) continue;
    MaybeComplete(job, now, effects);
    // At MIN or more the last call completes the round; the join timeout is for too few.
    if (job.phase == Phase::kOpen && !job.joined.empty() &&
        static_cast<int>(job.joined.size()) < job.config.min_nodes() &&
        now - job.open_since >= absl::Milliseconds(job.config.join_timeout_ms())) {
      std::vector<std::string> names = DescribeNodes(job, job.not_back);
      for (const std::string& host : job.lost) names.push_back(absl::StrCat(host, " (lost)"));
      std::string missing_names = absl::StrJoin(
          names.begin(), names.begin() + std::min(names.size(), kMaxNamedNodes), ", ");
      if (names.size() > kMaxNamedNodes) {
        absl::StrAppend(&missing_names, " and ", names.size() - kMaxNamedNodes, " more");
      }
      std::string reason =
          absl::StrCat("join timeout: ", job.joined.size(), " of at least ", job.config.min_nodes(),
                       " nodes joined within ", FormatDuration(job.config.join_timeout_ms()));
      if (!missing_names.empty()) absl::StrAppend(&reason, "; missing: ", missing_names);
      Close(job, false, reason, std::nullopt, now, effects, absl::StatusCode::kDeadlineExceeded);
    }
  }
  TrimClosedJobs(effects);
}

absl::Status RendezvousState::Stop(absl::string_view job_id, absl::string_view reason,
                                   absl::Time now, Effects* effects) {
  Job* job = FindJob(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "' on this server"));
  }
  if (job->phase == Phase::kClosed) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job->id, "' is closed already (", job->close_reason, ")"));
  }
  job->stopped = true;
  Close(*job, false,
        absl::StrCat("stopped by an operator", reason.empty() ? "" : ": ",
                     ForLog(reason, kMaxReasonBytes)),
        std::nullopt, now, effects);
  return absl::OkStatus();
}

void RendezvousState::AddEvent(Job& job, JobEvent::Kind kind, absl::string_view node_id,
                               absl::string_view detail, absl::Time now, Effects* effects) {
  effects->events.push_back(KeepEvent(job, kind, node_id, detail, now));
}

const JobEvent& RendezvousState::KeepEvent(Job& job, JobEvent::Kind kind, absl::string_view node_id,
                                           absl::string_view detail, absl::Time now) {
  JobEvent event;
  event.set_time_unix_ms(absl::ToUnixMillis(now));
  event.set_job_id(job.id);
  event.set_round(job.round);
  event.set_kind(kind);
  event.set_node_id(std::string(node_id));
  event.set_detail(CutText(detail, kMaxEventDetailBytes));
  if (kind == JobEvent::JOB_CLOSED) event.set_succeeded(job.succeeded);
  if (job.history.size() >= kMaxJobHistory) job.history.pop_front();
  return job.history.emplace_back(std::move(event));
}

void RendezvousState::MaybeComplete(Job& job, absl::Time now, Effects* effects) {
  const int joined = static_cast<int>(job.joined.size());
  if (joined >= job.config.max_nodes()) {
    CompleteRound(job, now, effects);
    return;
  }
  if (joined < job.config.min_nodes()) {
    job.last_call_deadline.reset();
    return;
  }
  // A restart round is done as soon as everyone who was there is back.
  if (!job.expected.empty() && job.not_back.empty()) {
    CompleteRound(job, now, effects);
    return;
  }
  if (!job.last_call_deadline) {
    job.last_call_deadline = now + absl::Milliseconds(job.config.last_call_timeout_ms());
    effects->rearm_timer = true;
    if (const absl::Time ends = RoundDeadline(job); ends > now) {
      effects->log.push_back(absl::StrCat("job '", job.id, "': ", joined, " nodes joined (min ",
                                          job.config.min_nodes(), ", max ", job.config.max_nodes(),
                                          "); last call ends in ",
                                          FormatDuration(absl::ToInt64Milliseconds(ends - now))));
    }
  }
  if (now >= RoundDeadline(job)) {
    // The members that are not back by the last call give up their seats.
    SeatSpares(job, /*hold_for_expected=*/false, now);
    CompleteRound(job, now, effects);
  }
}

absl::Time RendezvousState::RoundDeadline(const Job& job) const {
  absl::Time deadline = *job.last_call_deadline;
  // A restart round holds the seats of its members still stopping their
  // workers, as long as each said that may take. A member whose watch
  // stream ended (its agent is gone, or cut off) is not stopping: it is
  // dropped at its heartbeat timeout.
  for (const std::string& id : job.not_back) {
    auto node = job.nodes.find(id);
    if (node == job.nodes.end() || !(node->second.watching || options_.external_liveness)) {
      continue;
    }
    deadline = std::max(
        deadline, job.round_since + absl::Milliseconds(node->second.info.stop_allowance_ms()));
  }
  return deadline;
}

void RendezvousState::SeatSpares(Job& job, bool hold_for_expected, absl::Time now) {
  if (job.waiting.empty()) return;
  const int held = hold_for_expected ? static_cast<int>(job.not_back.size()) : 0;
  const int free = job.config.max_nodes() - static_cast<int>(job.joined.size()) - held;
  if (free <= 0) return;
  std::vector<const std::string*> spares;
  for (const std::string& id : job.waiting) spares.push_back(&id);
  std::sort(spares.begin(), spares.end(), [&job](const std::string* a, const std::string* b) {
    return job.nodes.at(*a).join_seq < job.nodes.at(*b).join_seq;
  });
  if (static_cast<int>(spares.size()) > free) spares.resize(free);
  if (job.joined.empty()) job.open_since = now;
  std::vector<std::string> seated;
  for (const std::string* id : spares) seated.push_back(*id);
  for (const std::string& id : seated) {
    job.waiting.erase(id);
    job.joined.insert(id);
    job.not_back.erase(id);
  }
}

absl::Duration RendezvousState::EmptyJobLifetime(const Job& job) const {
  return std::min(absl::Milliseconds(job.config.join_timeout_ms()), options_.max_join_timeout);
}

void RendezvousState::CompleteRound(Job& job, absl::Time now, Effects* effects) {
  // The pre-flight checks what changed: the nodes not in the round before.
  job.newcomers.clear();
  for (const std::string& node_id : job.joined) {
    if (!job.expected.contains(node_id)) job.newcomers.insert(node_id);
  }
  job.round_preflight = job.config.preflight() && !job.newcomers.empty();
  std::vector<const Node*> order;
  order.reserve(job.joined.size());
  bool all_hinted = true;
  for (const std::string& node_id : job.joined) {
    const Node& node = job.nodes.at(node_id);
    order.push_back(&node);
    all_hinted = all_hinted && node.info.node_rank_hint() >= 0;
  }
  // Deterministic ranks: by node-rank hint where every node gives one, else by
  // host name; join order breaks ties.
  std::sort(order.begin(), order.end(), [all_hinted](const Node* a, const Node* b) {
    if (all_hinted && a->info.node_rank_hint() != b->info.node_rank_hint()) {
      return a->info.node_rank_hint() < b->info.node_rank_hint();
    }
    if (a->info.host() != b->info.host()) return a->info.host() < b->info.host();
    return a->join_seq < b->join_seq;
  });

  // Fits: Join keeps the sum over the job's live nodes within int32.
  int world_size = 0;
  for (const Node* node : order) world_size += node->info.local_world_size();
  const Node& master = *order.front();

  effects->rearm_timer = true;  // participants' heartbeat deadlines start now
  job.participants.clear();
  job.phase = Phase::kRunning;
  job.joined.clear();
  job.expected.clear();
  job.not_back.clear();
  job.done.clear();
  job.lost.clear();
  job.last_call_deadline.reset();
  job.open_since = absl::InfiniteFuture();

  for (const Node* node : order) job.participants.push_back(node->info.node_id());
  int rank_base = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const Node& node = *order[i];
    effects->assigned.emplace_back(
        NodeKey{job.id, node.info.node_id()},
        MakeAssignment(job, node, static_cast<int>(i), rank_base, world_size, master));
    rank_base += node.info.local_world_size();
  }
  // The round's members are the job's durable nodes (RoundFormed): one of
  // an earlier round left out of this one is not, as a restore has it.
  for (auto& [node_id, node] : job.nodes) node.member = false;
  for (const std::string& node_id : job.participants) {
    Node& node = job.nodes[node_id];
    node.last_seen = now;
    node.member = true;
    node.secret_told = true;  // its assignment carries it
  }
  job.journaled = options_.journal;
  job.round_since = now;
  Record(effects, RoundFormedRecord(job, job.participants));
  const std::string formed =
      absl::StrCat(order.size(), " nodes, world size ", world_size, ", master ", master.addr, ":",
                   master.info.master_port_candidate(), ", restarts ", job.restart_count, "/",
                   job.config.max_restarts());
  const int reason = job.round > 0 && job.last_round_change
                         ? job.last_round_change->round_changed().reason()
                         : RoundChanged::REASON_UNSPECIFIED;
  if (reason >= 0 && static_cast<size_t>(reason) < kRoundReasons) ++job.rounds_by_reason[reason];
  AddEvent(job, JobEvent::ROUND_STARTED, "", formed, now, effects);
  effects->log.push_back(absl::StrCat("job '", job.id, "' round ", job.round, ": ", formed));
}

void RendezvousState::OpenNextRound(Job& job, RoundChanged::Reason reason,
                                    const std::string& detail, absl::Time now, Effects* effects) {
  effects->rearm_timer = true;
  EndRound(job, now);
  ++job.round;
  job.phase = Phase::kOpen;
  job.open_since = now;
  job.round_since = now;
  job.last_call_deadline.reset();
  job.done.clear();
  job.expected.clear();
  job.not_back.clear();
  job.joined.clear();
  const WatchEvent event = RoundChangedEvent(job.round, reason, detail);
  job.last_round_change = event;
  JournalRecord opened = RoundOpenedRecord(job.id, job.round, job.restart_count, event);
  *opened.mutable_round_opened()->mutable_progress() = DurableProgress(job);
  Record(effects, std::move(opened));
  for (const std::string& node_id : job.participants) {
    job.expected.insert(node_id);
    job.not_back.insert(node_id);
    effects->pushed.emplace_back(NodeKey{job.id, node_id}, event);
  }
  job.participants.clear();
  // Waiting nodes are pending joins already. Members that joined again while
  // the round ran are back; spares take only the seats no member holds.
  for (auto it = job.waiting.begin(); it != job.waiting.end();) {
    if (job.expected.contains(*it)) {
      job.joined.insert(*it);
      job.not_back.erase(*it);
      it = job.waiting.erase(it);
    } else {
      ++it;
    }
  }
  SeatSpares(job, /*hold_for_expected=*/true, now);
  effects->log.push_back(absl::StrCat("job '", job.id, "' round ", job.round,
                                      " opened: ", event.round_changed().detail()));
  if (!job.joined.empty()) MaybeComplete(job, now, effects);
}

void RendezvousState::Close(Job& job, bool succeeded, const std::string& reason,
                            const std::optional<Failure>& root_cause, absl::Time now,
                            Effects* effects, absl::StatusCode pending_join_code) {
  if (job.phase != Phase::kClosed) {
    --open_jobs_;
    closed_order_.emplace_back(now, job.id);
  }
  EndRound(job, now);
  job.phase = Phase::kClosed;
  job.closed_at = now;
  effects->rearm_timer = true;  // the retention deadline
  job.succeeded = succeeded;
  job.close_reason = CutText(reason, kMaxDetailBytes);
  WatchEvent event;
  JobClosed* closed = event.mutable_job_closed();
  closed->set_succeeded(succeeded);
  closed->set_reason(job.close_reason);
  if (root_cause) *closed->mutable_root_cause() = *root_cause;
  closed->set_no_progress(job.stuck);
  // What a requeue would resume: a failed job, not one an operator stopped.
  closed->set_progressed(job.progressed && !succeeded && !job.stopped);
  closed->set_last_step(job.best_step);
  closed->set_goodput(Goodput(job, now));
  for (const Exclusion& exclusion : job.excluded) *closed->add_excluded() = exclusion;
  job.closed_event = event;
  job.journaled = options_.journal;
  JournalRecord ended = JobEndedRecord(job.id, job.config, job.round, job.restart_count, event);
  *ended.mutable_job_ended()->mutable_progress() = DurableProgress(job);
  Record(effects, std::move(ended));
  for (const auto& [node_id, node] : job.nodes) {
    effects->pushed.emplace_back(NodeKey{job.id, node_id}, event);
  }
  const absl::Status refused =
      absl::Status(pending_join_code, ClosedJob(job.id, job.close_reason, succeeded).message());
  for (const std::string& node_id : job.joined) {
    effects->join_failed.emplace_back(NodeKey{job.id, node_id}, refused);
  }
  for (const std::string& node_id : job.waiting) {
    effects->join_failed.emplace_back(NodeKey{job.id, node_id}, refused);
  }
  job.joined.clear();
  job.waiting.clear();
  job.expected.clear();
  job.not_back.clear();
  job.last_call_deadline.reset();
  AddEvent(job, JobEvent::JOB_CLOSED, "", job.close_reason, now, effects);
  effects->log.push_back(absl::StrCat("job '", job.id, "' closed, ",
                                      succeeded ? "succeeded" : "failed", ": ", job.close_reason));
}

absl::Status RendezvousState::NotInJob(const Job& job, const std::string& node_id,
                                       absl::string_view secret) {
  auto removed = job.removed.find(node_id);
  if (removed != job.removed.end() && ConstantTimeEquals(removed->second.secret, secret)) {
    return absl::NotFoundError(absl::StrCat("node ", node_id, " ", kDroppedFromJob, " '", job.id,
                                            "': ", removed->second.why));
  }
  return absl::NotFoundError(absl::StrCat("node ", node_id, " is not part of job '", job.id, "'"));
}

void RendezvousState::RemoveNode(Job& job, const std::string& node_id, const std::string& why,
                                 absl::Time now, Effects* effects) {
  auto node_it = job.nodes.find(node_id);
  if (node_it == job.nodes.end()) return;
  const bool member = node_it->second.member;
  TakeOut(job, node_it, why, now, effects);
  // Journalled after what its removal led to (a round opened, the job
  // closed): a journal torn between the two then restores the node in
  // that round, where it is dropped again, rather than a running round
  // that lacks its ranks, which would never end.
  if (member) {
    JournalRecord record;
    record.mutable_node_removed()->set_job_id(job.id);
    record.mutable_node_removed()->set_node_id(node_id);
    Record(effects, std::move(record));
  }
}

void RendezvousState::TakeOut(Job& job, decltype(Job::nodes)::iterator node_it,
                              const std::string& why, absl::Time now, Effects* effects) {
  const std::string node_id = node_it->first;  // the entry goes below
  const std::string host = node_it->second.info.host();
  std::string secret = node_it->second.secret;
  effects->rearm_timer = true;
  job.live_workers -= node_it->second.info.local_world_size();
  job.nodes.erase(node_it);
  if (job.nodes.empty()) job.empty_since = now;
  job.lost.push_back(host);
  job.waiting.erase(node_id);
  job.expected.erase(node_id);
  job.not_back.erase(node_id);
  const bool was_done = job.done.erase(node_id) > 0;
  const std::string detail = absl::StrCat("node ", host, " ", why);
  AddEvent(job, JobEvent::NODE_LOST, node_id, detail, now, effects);
  if (job.removed.insert_or_assign(node_id, Job::Removal{std::move(secret), detail}).second) {
    job.removed_order.push_back(node_id);
  }
  while (job.removed_order.size() > static_cast<size_t>(std::max(1, job.config.max_nodes()))) {
    job.removed.erase(job.removed_order.front());
    job.removed_order.pop_front();
  }
  if (job.joined.erase(node_id) > 0) {
    effects->join_failed.emplace_back(
        NodeKey{job.id, node_id},
        absl::AbortedError(absl::StrCat("removed from job '", job.id, "': ", detail)));
  }
  auto participant = std::find(job.participants.begin(), job.participants.end(), node_id);
  if (job.phase == Phase::kRunning && participant != job.participants.end()) {
    job.participants.erase(participant);
    if (was_done) {
      // Its workers finished: the others run on, and the job ends when they are done.
      effects->log.push_back(absl::StrCat("job '", job.id, "': ", detail, " after finishing"));
      return;
    }
    if (!job.done.empty()) {
      Close(job, false,
            absl::StrCat(detail,
                         " after other nodes had finished; a partly finished job cannot "
                         "restart"),
            std::nullopt, now, effects);
      return;
    }
    if (job.participants.empty() && job.waiting.empty()) {
      Close(job, false, absl::StrCat(detail, "; no nodes left"), std::nullopt, now, effects);
      return;
    }
    OpenNextRound(job, RoundChanged::NODE_LOST, detail, now, effects);
    return;
  }
  effects->log.push_back(absl::StrCat("job '", job.id, "': ", detail));
  if (job.phase == Phase::kOpen) {
    // A member that is gone frees its seat for a spare.
    SeatSpares(job, /*hold_for_expected=*/true, now);
    if (job.joined.empty() && job.expected.empty() && job.waiting.empty() &&
        job.participants.empty()) {
      job.open_since = absl::InfiniteFuture();
    }
    MaybeComplete(job, now, effects);
  }
}

RendezvousState::JobMap::iterator RendezvousState::Forget(JobMap::iterator it, Effects* effects) {
  if (it->second.journaled) {
    JournalRecord record;
    record.mutable_job_forgotten()->set_job_id(it->first);
    Record(effects, std::move(record));
  }
  if (it->second.phase != Phase::kClosed) --open_jobs_;
  return jobs_.erase(it);
}

}  // namespace muster::rdzv
