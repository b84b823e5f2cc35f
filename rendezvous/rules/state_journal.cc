// RendezvousState and the journal: the records it emits, and the state
// rebuilt from them (Restore) or written whole (Snapshot).
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

absl::Status UnknownJob(absl::string_view kind, absl::string_view job_id) {
  return absl::DataLossError(
      absl::StrCat("a ", kind, " record for job '", job_id, "', which has no round formed"));
}

}  // namespace

void RendezvousState::Record(Effects* effects, JournalRecord record) const {
  if (options_.journal) effects->journal.push_back(std::move(record));
}

JournalRecord RendezvousState::RoundFormedRecord(const Job& job,
                                                 const std::vector<std::string>& members) const {
  JournalRecord record;
  RoundFormed* formed = record.mutable_round_formed();
  formed->set_job_id(job.id);
  *formed->mutable_config() = job.config;
  formed->set_round(job.round);
  formed->set_restart_count(job.restart_count);
  formed->set_next_join_seq(job.next_join_seq);
  for (const std::string& node_id : members) {
    const Node& node = job.nodes.at(node_id);
    DurableNode* durable = formed->add_members();
    *durable->mutable_info() = node.info;
    durable->set_secret(node.secret);
    durable->set_addr(node.addr);
    durable->set_join_seq(node.join_seq);
  }
  *formed->mutable_progress() = DurableProgress(job);
  return record;
}

void RendezvousState::RestoreRoundFormed(const RoundFormed& formed, absl::Time now) {
  auto [it, created] = jobs_.try_emplace(formed.job_id());
  Job& job = it->second;
  if (created || job.phase == Phase::kClosed) ++open_jobs_;
  job = Job();
  job.id = formed.job_id();
  job.config = formed.config();
  job.phase = Phase::kRunning;
  job.round = formed.round();
  job.restart_count = formed.restart_count();
  job.next_join_seq = formed.next_join_seq();
  job.journaled = true;
  job.empty_since = now;
  job.created_at = now;
  job.round_since = now;
  for (const DurableNode& durable : formed.members()) {
    Node& node = job.nodes[durable.info().node_id()];
    node.info = durable.info();
    node.secret = durable.secret();
    node.addr = durable.addr();
    node.join_seq = durable.join_seq();
    node.last_seen = now;  // its heartbeat deadline starts again
    node.joined_at = now;
    node.member = true;
    node.secret_told = true;
    job.live_workers += node.info.local_world_size();
    job.participants.push_back(durable.info().node_id());
  }
  if (formed.has_progress()) RestoreProgress(job, formed.progress());
}

absl::Status RendezvousState::RestoreRoundOpened(const RoundOpened& opened, absl::Time now) {
  Job* job = FindJob(opened.job_id());
  if (job == nullptr || job->phase == Phase::kClosed) {
    return UnknownJob("round-opened", opened.job_id());
  }
  job->phase = Phase::kOpen;
  job->round = opened.round();
  job->restart_count = opened.restart_count();
  job->open_since = now;  // its join timeout starts again
  job->last_call_deadline.reset();
  job->done.clear();
  job->joined.clear();
  job->waiting.clear();
  job->expected.clear();
  job->expected.insert(job->participants.begin(), job->participants.end());
  job->not_back = job->expected;
  job->participants.clear();
  job->last_round_change = opened.event();
  if (opened.has_progress()) RestoreProgress(*job, opened.progress());
  return absl::OkStatus();
}

absl::Status RendezvousState::RestoreNodeRemoved(const NodeRemoved& removed, absl::Time now) {
  Job* job = FindJob(removed.job_id());
  if (job == nullptr) return UnknownJob("node-removed", removed.job_id());
  auto node = job->nodes.find(removed.node_id());
  if (node == job->nodes.end()) return absl::OkStatus();
  job->live_workers -= node->second.info.local_world_size();
  job->lost.push_back(node->second.info.host());
  job->nodes.erase(node);
  if (job->nodes.empty()) job->empty_since = now;
  job->expected.erase(removed.node_id());
  job->not_back.erase(removed.node_id());
  job->done.erase(removed.node_id());
  std::erase(job->participants, removed.node_id());
  return absl::OkStatus();
}

void RendezvousState::RestoreJobEnded(const JobEnded& ended, absl::Time now) {
  auto [it, created] = jobs_.try_emplace(ended.job_id());
  Job& job = it->second;
  if (created) {
    job.id = ended.job_id();
    job.created_at = now;
  } else if (job.phase != Phase::kClosed) {
    --open_jobs_;
  }
  job.config = ended.config();
  job.round = ended.round();
  job.restart_count = ended.restart_count();
  job.phase = Phase::kClosed;
  job.journaled = true;
  job.closed_at = now;  // kept for its retention from now
  job.succeeded = ended.event().job_closed().succeeded();
  job.close_reason = ended.event().job_closed().reason();
  job.closed_event = ended.event();
  job.stuck = ended.event().job_closed().no_progress();
  if (ended.has_progress()) RestoreProgress(job, ended.progress());
  // Its events are not journaled, but how it ended is: a watch of it
  // shows that, and ends.
  job.history.clear();
  KeepEvent(job, JobEvent::JOB_CLOSED, "",
            absl::StrCat(job.close_reason,
                         " (closed before this rendezvous restarted: the time is the restart's)"),
            now);
  job.joined.clear();
  job.waiting.clear();
  job.expected.clear();
  job.not_back.clear();
  job.last_call_deadline.reset();
  closed_order_.emplace_back(now, job.id);
}

absl::Status RendezvousState::Restore(const JournalRecord& record, absl::Time now) {
  switch (record.record_case()) {
    case JournalRecord::kRoundFormed: RestoreRoundFormed(record.round_formed(), now); break;
    case JournalRecord::kRoundOpened: return RestoreRoundOpened(record.round_opened(), now);
    case JournalRecord::kNodeRemoved: return RestoreNodeRemoved(record.node_removed(), now);
    case JournalRecord::kNodeDone: {
      const NodeDone& done = record.node_done();
      Job* job = FindJob(done.job_id());
      if (job == nullptr) return UnknownJob("node-done", done.job_id());
      if (job->phase == Phase::kRunning && job->round == done.round() &&
          IsParticipant(*job, done.node_id())) {
        job->done.insert(done.node_id());
      }
      break;
    }
    case JournalRecord::kJobEnded: RestoreJobEnded(record.job_ended(), now); break;
    case JournalRecord::kJobForgotten: {
      auto it = jobs_.find(record.job_forgotten().job_id());
      if (it == jobs_.end()) break;
      if (it->second.phase != Phase::kClosed) --open_jobs_;
      jobs_.erase(it);
      break;
    }
    case JournalRecord::RECORD_NOT_SET:
      return absl::DataLossError("a record of a kind this muster does not know");
  }
  return absl::OkStatus();
}

std::vector<JournalRecord> RendezvousState::Snapshot() const {
  std::vector<JournalRecord> out;
  for (const auto& [id, job] : jobs_) {
    if (!job.journaled) continue;
    // Its members, in rank order while a round runs.
    std::vector<std::string> members;
    if (job.phase == Phase::kRunning) {
      members = job.participants;
    } else {
      for (const auto& [node_id, node] : job.nodes) {
        if (node.member) members.push_back(node_id);
      }
    }
    if (!members.empty() || job.phase != Phase::kClosed) {
      out.push_back(RoundFormedRecord(job, members));
    }
    if (job.phase == Phase::kOpen) {
      out.push_back(RoundOpenedRecord(job.id, job.round, job.restart_count, job.last_round_change));
      *out.back().mutable_round_opened()->mutable_progress() = DurableProgress(job);
    } else if (job.phase == Phase::kRunning) {
      for (const std::string& node_id : job.done) {
        out.push_back(NodeDoneRecord(job.id, node_id, job.round));
      }
    } else {
      out.push_back(
          JobEndedRecord(job.id, job.config, job.round, job.restart_count, job.closed_event));
      *out.back().mutable_job_ended()->mutable_progress() = DurableProgress(job);
    }
  }
  return out;
}

}  // namespace muster::rdzv
