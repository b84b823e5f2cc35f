// RendezvousState's rules of progress and of bad nodes: the steps workers
// report, the goodput, the restarts that reached no new step, and the hosts
// kept out of a job.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/constant_time.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state.h"
#include "rendezvous/rules/state_internal.h"

namespace muster::rdzv {

absl::Status RendezvousState::ReportProgress(const NodeKey& key, absl::string_view secret,
                                             const Progress& progress, absl::Time now,
                                             Effects* effects) {
  for (const auto& [name, value, bound] :
       {std::tuple{"step", progress.step(), kMaxProgressValue},
        std::tuple{"count", progress.count(), kMaxProgressValue},
        std::tuple{"age_ms", progress.age_ms(), kMaxProgressAgeMs}}) {
    if (value < 0 || value > bound) {
      return absl::InvalidArgumentError(
          absl::StrCat("the progress report's ", name, " is ", value, "; give 0 to ", bound));
    }
  }
  absl::StatusOr<Job*> found = FindLiveNode(key, secret);
  if (!found.ok()) return found.status();
  Job& job = **found;
  Node& node = job.nodes[key.node_id];
  node.last_seen = now;
  if (progress.round() == job.round && job.phase == Phase::kRunning &&
      IsParticipant(job, key.node_id)) {
    NoteProgress(job, node, progress, now, effects);
  }
  return absl::OkStatus();
}

void RendezvousState::NoteProgress(Job& job, Node& node, const Progress& progress, absl::Time now,
                                   Effects* effects) {
  if (progress.step() <= node.step) return;  // nothing new from this node
  const absl::Time written = now - absl::Milliseconds(progress.age_ms());
  if (node.step >= 0 && written > node.step_time) {
    node.steps_per_second = static_cast<double>(progress.step() - node.step) /
                            absl::ToDoubleSeconds(written - node.step_time);
  }
  const bool first_of_round = !job.round_stepped;
  job.round_stepped = true;
  node.step = progress.step();
  node.step_time = written;
  if (progress.step() <= job.best_step) return;
  job.best_step = progress.step();
  job.best_step_time = written;
  job.round_progressed = true;
  job.progressed = true;
  job.no_progress_restarts = 0;
  if (first_of_round || now - job.progress_event_at >= kProgressEventInterval) {
    job.progress_event_at = now;
    AddEvent(job, JobEvent::PROGRESS, node.info.node_id(),
             node.steps_per_second > 0
                 ? absl::StrFormat("step %d (%.3g steps/s on %s)", progress.step(),
                                   node.steps_per_second, node.info.host())
                 : absl::StrCat("step ", progress.step(), " (on ", node.info.host(), ")"),
             now, effects);
  }
}

void RendezvousState::EndRound(Job& job, absl::Time now) {
  if (job.phase == Phase::kRunning && job.round_progressed) job.productive += now - job.round_since;
  job.round_progressed = false;
  job.round_stepped = false;
  for (auto& [id, node] : job.nodes) {
    node.step = -1;
    node.steps_per_second = 0;
  }
}

double RendezvousState::Goodput(const Job& job, absl::Time now) {
  absl::Duration productive = job.productive;
  if (job.phase == Phase::kRunning && job.round_progressed) productive += now - job.round_since;
  const absl::Time end = job.phase == Phase::kClosed ? job.closed_at : now;
  const absl::Duration wall = end - job.created_at;
  if (wall <= absl::ZeroDuration()) return 0;
  return std::clamp(absl::FDivDuration(productive, wall), 0.0, 1.0);
}

RendezvousState::FailureVerdict RendezvousState::JudgeFailure(Job& job, const std::string& node_id,
                                                              const std::string& detail,
                                                              bool preflight_failed) const {
  FailureVerdict verdict;
  if (!job.done.empty()) {
    verdict.outcome = absl::StrCat(
        detail, " after other nodes had finished; a partly finished job cannot restart");
    return verdict;
  }
  if (preflight_failed) {
    verdict.outcome = absl::StrCat(detail,
                                   " in the pre-flight all-reduce (--preflight): the job's "
                                   "communication is broken, which no restart mends");
    return verdict;
  }
  // A round that a restart began, and that reached no new step.
  if (!job.round_progressed && job.restart_count > 0) ++job.no_progress_restarts;
  verdict.exclusion = CountNodeFailure(job, node_id, detail);
  const int32_t stuck_after = job.config.max_no_progress_restarts();
  verdict.stuck = !verdict.exclusion && stuck_after > 0 && job.no_progress_restarts >= stuck_after;
  verdict.restart = !verdict.stuck && job.restart_count < job.config.max_restarts();
  if (verdict.stuck) {
    verdict.outcome = absl::StrCat(
        detail, "; ", job.no_progress_restarts, " restart(s) in a row reached no new step (",
        job.best_step >= 0 ? absl::StrCat("the job's last step: ", job.best_step)
                           : "no step was reported: does the script write MUSTER_PROGRESS_FILE?",
        "; --max-no-progress-restarts ", stuck_after,
        "): it fails the same way every time, so it stops; a requeue would do the same");
  } else if (verdict.restart) {
    verdict.outcome = absl::StrCat(detail, "; restart ", job.restart_count + 1, " of ",
                                   job.config.max_restarts());
  } else {
    verdict.outcome =
        absl::StrCat(detail, "; no restarts left (max_restarts ", job.config.max_restarts(), ")");
  }
  if (verdict.exclusion) {
    absl::StrAppend(&verdict.outcome, "; host ", job.nodes.at(node_id).info.host(), " is excluded");
  }
  return verdict;
}

std::optional<std::string> RendezvousState::CountNodeFailure(Job& job, const std::string& node_id,
                                                             const std::string& detail) {
  if (node_id == job.failing_node) {
    ++job.node_failures;
  } else {
    job.failing_node = node_id;
    job.node_failures = 1;
  }
  const int32_t limit = job.config.max_node_failures();
  // A job of one node has no other to go on with.
  if (limit <= 0 || job.config.max_nodes() <= 1 || job.node_failures < limit) return std::nullopt;
  return absl::StrCat("its workers were the root cause of ", job.node_failures,
                      " failures of the job in a row (--max-node-failures ", limit,
                      "); the last: ", detail);
}

const Exclusion* RendezvousState::FindExclusion(const Job& job, absl::string_view host) {
  for (const Exclusion& exclusion : job.excluded) {
    if (exclusion.host() == host) return &exclusion;
  }
  return nullptr;
}

void RendezvousState::ExcludeHost(Job& job, const std::string& host, const std::string& node_id,
                                  const std::string& cause, absl::Time now, Effects* effects,
                                  bool job_ends) {
  Exclusion& exclusion = job.excluded.emplace_back();
  exclusion.set_host(host);
  exclusion.set_node_id(node_id);
  exclusion.set_cause(CutText(cause, kMaxDetailBytes));
  exclusion.set_time_unix_ms(absl::ToUnixMillis(now));
  if (job.excluded.size() > kMaxExclusions) job.excluded.pop_front();
  job.failing_node.clear();
  job.node_failures = 0;
  // The job goes on with other nodes: its no-progress count starts again.
  job.no_progress_restarts = 0;
  WatchEvent event;
  *event.mutable_node_excluded()->mutable_exclusion() = job.excluded.back();
  event.mutable_node_excluded()->set_job_ends(job_ends);
  for (const auto& [id, node] : job.nodes) {
    if (node.info.host() == host) effects->pushed.emplace_back(NodeKey{job.id, id}, event);
  }
  AddEvent(job, JobEvent::NODE_EXCLUDED, node_id,
           absl::StrCat("host ", host, " excluded: ", job.excluded.back().cause()), now, effects);
  effects->log.push_back(absl::StrCat("job '", job.id, "': host ", host,
                                      " is excluded from the job: ", job.excluded.back().cause()));
}

void RendezvousState::TakeOutOfRound(Job& job, const std::string& host) {
  std::erase_if(job.participants,
                [&](const std::string& id) { return job.nodes.at(id).info.host() == host; });
}

absl::Status RendezvousState::RefuseUnhealthy(const JoinRequest& request, absl::Time now,
                                              Effects* effects) {
  const std::string& host = request.node().host();
  const std::string cause =
      absl::StrCat("its GPUs failed their health check before it was seated: ",
                   ForLog(request.health_fault(), kMaxReasonBytes));
  Job* job = FindJob(request.job_id());
  const auto on_host = [&](const auto& node) { return node.second.info.host() == host; };
  if (job != nullptr && job->phase != Phase::kClosed &&
      std::none_of(job->nodes.begin(), job->nodes.end(), on_host)) {
    ExcludeHost(*job, host, request.node().node_id(), cause, now, effects);
    RemoveExcludedNodes(*job, host, now, effects);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("host ", host, " ", kExcludedFromJob, " '", request.job_id(), "': ", cause));
}

bool RendezvousState::ExcludeNewcomers(Job& job, const std::string& detail, absl::Time now,
                                       Effects* effects) {
  if (job.newcomers.empty() || job.newcomers.size() >= job.participants.size()) return false;
  std::set<std::string> hosts;
  for (const std::string& id : job.newcomers) hosts.insert(job.nodes.at(id).info.host());
  const std::string cause = absl::StrCat(
      "the pre-flight all-reduce failed in the round that seated it (", detail,
      "): the nodes of the round before had passed it, so the newcomer is taken for the fault");
  AddEvent(job, JobEvent::WORKER_FAILED, "", absl::StrCat(detail, " in the pre-flight"), now,
           effects);
  for (const std::string& host : hosts) {
    ExcludeHost(job, host, "", cause, now, effects);
    TakeOutOfRound(job, host);
  }
  OpenNextRound(job, RoundChanged::NODE_LOST,
                absl::StrCat(detail, " in the pre-flight; the new node(s) are excluded"), now,
                effects);
  for (const std::string& host : hosts) RemoveExcludedNodes(job, host, now, effects);
  return true;
}

void RendezvousState::RemoveExcludedNodes(Job& job, const std::string& host, absl::Time now,
                                          Effects* effects) {
  std::vector<std::string> ids;
  for (const auto& [id, node] : job.nodes) {
    if (node.info.host() == host) ids.push_back(id);
  }
  const Exclusion* exclusion = FindExclusion(job, host);
  // The words an agent knows its exclusion by, and why, should a refused
  // call (its pending join, its failure report) tell it before the push.
  const std::string reason = absl::StrCat(kExcludedFromJob, " '", job.id,
                                          "': ", exclusion ? exclusion->cause() : "a bad node");
  for (const std::string& id : ids) {
    if (job.phase == Phase::kClosed) return;
    RemoveNode(job, id, reason, now, effects);
  }
}

JobProgress RendezvousState::DurableProgress(const Job& job) const {
  JobProgress progress;
  progress.set_best_step(job.best_step);
  progress.set_best_step_unix_ms(job.best_step >= 0 ? absl::ToUnixMillis(job.best_step_time) : 0);
  progress.set_no_progress_restarts(job.no_progress_restarts);
  progress.set_productive_ms(absl::ToInt64Milliseconds(job.productive));
  progress.set_progressed(job.progressed);
  progress.set_failing_node(job.failing_node);
  progress.set_node_failures(job.node_failures);
  for (const Exclusion& exclusion : job.excluded) *progress.add_excluded() = exclusion;
  progress.set_created_unix_ms(absl::ToUnixMillis(job.created_at));
  return progress;
}

void RendezvousState::RestoreProgress(Job& job, const JobProgress& progress) {
  job.best_step = std::clamp<int64_t>(progress.best_step(), -1, kMaxProgressValue);
  job.best_step_time = absl::FromUnixMillis(progress.best_step_unix_ms());
  job.no_progress_restarts = std::max(0, progress.no_progress_restarts());
  job.productive = absl::Milliseconds(std::max<int64_t>(0, progress.productive_ms()));
  job.progressed = progress.progressed();
  job.failing_node = progress.failing_node();
  job.node_failures = std::max(0, progress.node_failures());
  job.excluded.assign(progress.excluded().begin(), progress.excluded().end());
  while (job.excluded.size() > kMaxExclusions) job.excluded.pop_front();
  if (progress.created_unix_ms() > 0) {
    job.created_at = std::min(job.created_at, absl::FromUnixMillis(progress.created_unix_ms()));
  }
}

}  // namespace muster::rdzv
