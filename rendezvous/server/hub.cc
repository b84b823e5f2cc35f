#include "rendezvous/server/hub.h"

#include <algorithm>

#include "common/log.h"
#include "common/status.h"
#include "rendezvous/auth/node_secret.h"

namespace muster::rdzv {
namespace {

// The timer thread looks again at least this often, so that a wake it
// missed delays a deadline by this much at most.
constexpr absl::Duration kMaxTimerSleep = absl::Seconds(1);

absl::Status Unavailable() {
  return absl::UnavailableError("the rendezvous server is shutting down");
}

// What a pending join or watch is told when the server stops.
absl::Status Stopped(RendezvousHub::Jobs jobs) {
  if (jobs == RendezvousHub::Jobs::kKept) {
    return absl::UnavailableError(
        "the rendezvous server is restarting and keeps this job (musterd --state-dir); call "
        "again");
  }
  return absl::FailedPreconditionError(
      "the rendezvous server is shutting down and keeps no state: this job is lost with it");
}

StateOptions WithJournal(StateOptions state, bool journal) {
  state.journal = journal;
  return state;
}

}  // namespace

RendezvousHub::RendezvousHub(HubOptions options)
    : clock_(*options.clock), journal_(std::move(options.journal)),
      on_journal_failure_(std::move(options.on_journal_failure)),
      on_event_(std::move(options.on_event)),
      state_(WithJournal(options.state, journal_ != nullptr)) {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_.Now();
    for (const JournalRecord& record : options.restore) {
      if (absl::Status restored = state_.Restore(record, now); !restored.ok()) {
        Logger("rdzv")->warn("state: {}; that record is skipped", restored.message());
      }
    }
  }
  // Started in the body, once every member exists: the loop reads them.
  if (options.timer_thread) timer_ = std::thread([this] { TimerLoop(); });
}

RendezvousHub::~RendezvousHub() { Shutdown(); }

void RendezvousHub::Shutdown(Jobs jobs) {
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    if (!shutting_down_) {
      shutting_down_ = true;
      for (auto& [key, join] : joins_)
        deliveries.joins.emplace_back(std::move(join.done), Stopped(jobs));
      joins_.clear();
      for (auto& [key, watch] : watches_)
        deliveries.ends.emplace_back(watch.watcher, Stopped(jobs));
      watches_.clear();
      for (auto& [key, observer] : observers_)
        deliveries.observer_ends.emplace_back(observer, Stopped(jobs));
      observers_.clear();
      state_changed_ = true;  // wakes the timer thread to see it
    }
  }
  Deliver(deliveries);
  if (timer_.joinable() && timer_.get_id() != std::this_thread::get_id()) timer_.join();
}

absl::Status RendezvousHub::SyncJournal(uint64_t position) {
  if (journal_ == nullptr || position == 0) return absl::OkStatus();
  if (!journal_failed_) {
    if (absl::Status synced = journal_->SyncTo(position); !synced.ok()) MarkJournalFailed(synced);
  }
  if (!journal_failed_) return absl::OkStatus();
  OnJournalFailed();
  return absl::UnavailableError(
      "the rendezvous server cannot write its journal and is stopping; call again");
}

void RendezvousHub::MarkJournalFailed(const absl::Status& status) {
  absl::MutexLock lock(&journal_error_mu_);
  if (journal_error_.ok()) journal_error_ = status;
  journal_failed_ = true;
}

void RendezvousHub::OnJournalFailed() {
  if (journal_failure_told_.exchange(true)) return;
  absl::Status error;
  {
    absl::MutexLock lock(&journal_error_mu_);
    error = journal_error_;
  }
  Logger("rdzv")->critical(
      "state: cannot write the journal ({}); no answer that depends on it is given, and the "
      "server stops: the jobs are kept as far as the journal holds them",
      error.message());
  if (on_journal_failure_) on_journal_failure_(error);
  Shutdown(Jobs::kKept);
}

uint64_t RendezvousHub::NewTicket() {
  absl::MutexLock lock(&mu_);
  return next_ticket_++;
}

void RendezvousHub::ApplyLocked(Effects& effects, Deliveries* out) {
  static const auto logger = Logger("rdzv");
  for (const std::string& line : effects.log) logger->info("{}", line);
  for (auto& [key, assignment] : effects.assigned) {
    auto it = joins_.find(key);
    if (it == joins_.end()) continue;  // its caller went away
    out->joins.emplace_back(std::move(it->second.done), std::move(assignment));
    joins_.erase(it);
  }
  for (auto& [key, status] : effects.join_failed) {
    auto it = joins_.find(key);
    if (it == joins_.end()) continue;
    out->joins.emplace_back(std::move(it->second.done), std::move(status));
    joins_.erase(it);
  }
  for (const auto& [key, event] : effects.pushed) {
    auto it = watches_.find(key);
    if (it == watches_.end()) continue;
    out->events.emplace_back(it->second.watcher, event);
    if (event.has_job_closed()) watches_.erase(it);  // the last event of a watch
  }
  for (const JobEvent& event : effects.events) {
    if (on_event_) on_event_(event);
    const bool final = IsFinalEvent(event);
    for (auto it = observers_.lower_bound({event.job_id(), 0});
         it != observers_.end() && it->first.first == event.job_id();) {
      it->second->queue(event);
      out->flushes.push_back(it->second);
      it = final ? observers_.erase(it) : std::next(it);
    }
  }
  if (effects.rearm_timer) state_changed_ = true;
  if (journal_ == nullptr || effects.journal.empty() || journal_failed_) return;
  absl::StatusOr<uint64_t> position = journal_->Append(effects.journal);
  if (!position.ok()) {
    MarkJournalFailed(position.status());
    return;
  }
  out->sync_to = *position;
  if (journal_->WantsCompaction()) {
    // Under the lock: the snapshot and the records after it must not interleave.
    if (absl::Status compacted = journal_->Compact(state_.Snapshot()); !compacted.ok()) {
      MarkJournalFailed(compacted);
    }
  }
}

void RendezvousHub::Deliver(Deliveries& deliveries) {
  if (absl::Status synced = SyncJournal(deliveries.sync_to); !synced.ok() || journal_failed_) {
    // What these depend on may be lost: the joins and watches are told to
    // call again, and no event goes out.
    for (auto& [done, result] : deliveries.joins) done(synced.ok() ? Unavailable() : synced);
    for (auto& [watcher, event] : deliveries.events) {
      // A closed job's watch was forgotten with its last event: end it here
      // (the others end with the shutdown below).
      if (event.has_job_closed()) watcher->on_end(synced.ok() ? Unavailable() : synced);
    }
    for (auto& [watcher, status] : deliveries.ends) watcher->on_end(std::move(status));
    for (auto& observer : deliveries.flushes) observer->flush();
    for (auto& [observer, status] : deliveries.observer_ends) observer->on_end(std::move(status));
    deliveries = Deliveries();
    OnJournalFailed();
    return;
  }
  for (auto& [done, result] : deliveries.joins) done(std::move(result));
  for (auto& [watcher, event] : deliveries.events) watcher->on_event(event);
  for (auto& [watcher, status] : deliveries.ends) watcher->on_end(std::move(status));
  for (auto& observer : deliveries.flushes) observer->flush();
  for (auto& [observer, status] : deliveries.observer_ends) observer->on_end(std::move(status));
  deliveries = Deliveries();
}

absl::Status RendezvousHub::ClosedOr(const std::string& job_id, absl::Status otherwise) const {
  // A job that closed as the server stops is still told how it ended: a
  // node whose report crosses the end of a hosting agent learns why its job
  // closed, not just that the server went away.
  absl::StatusOr<StatusResponse> status = state_.Status(job_id);
  if (status.ok() && status->state() == "closed") {
    return ClosedJob(job_id, status->close_reason(), status->succeeded());
  }
  return otherwise;
}

absl::Status RendezvousHub::Mutate(const std::string& job_id,
                                   const std::function<absl::Status(Effects*)>& change) {
  Deliveries deliveries;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return ClosedOr(job_id, Unavailable());
    Effects effects;
    status = change(&effects);
    ApplyLocked(effects, &deliveries);
  }
  Deliver(deliveries);
  return status;
}

void RendezvousHub::Join(const JoinRequest& request, const std::string& peer, uint64_t ticket,
                         JoinDone done) {
  const NodeKey key{request.job_id(), request.node().node_id()};
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    absl::Status status = shutting_down_ ? Unavailable() : absl::OkStatus();
    Effects effects;
    const absl::Time now = clock_.Now();
    // Drawn for every join; the state keeps it only for a node new to the job.
    absl::StatusOr<std::string> secret = NewNodeSecret();
    if (status.ok() && !secret.ok()) status = secret.status();
    if (status.ok()) status = state_.Join(request, peer, *secret, now, &effects);
    // A node that left and joins again may have kept its watch stream open.
    if (status.ok() && watches_.contains(key)) state_.SetWatching(key, true, now, &effects);
    if (status.ok()) {
      PendingJoin& slot = joins_[key];
      if (slot.done) {
        deliveries.joins.emplace_back(
            std::move(slot.done),
            absl::AbortedError("superseded by a newer join of the same node"));
      }
      slot = PendingJoin{ticket, std::move(done)};
    } else {
      deliveries.joins.emplace_back(std::move(done), status);
    }
    ApplyLocked(effects, &deliveries);
  }
  Deliver(deliveries);
}

void RendezvousHub::CancelJoin(const NodeKey& key, uint64_t ticket) {
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    auto it = joins_.find(key);
    if (it == joins_.end() || it->second.ticket != ticket) return;  // answered already
    deliveries.joins.emplace_back(std::move(it->second.done),
                                  absl::CancelledError("join cancelled by the caller"));
    joins_.erase(it);
    // Nobody waits for this answer: the node must not be put into a round,
    // where it could even be everyone's master.
    Effects effects;
    state_.CancelJoin(key, clock_.Now(), &effects);
    ApplyLocked(effects, &deliveries);
  }
  Deliver(deliveries);
}

void RendezvousHub::Watch(const WatchRequest& request, uint64_t ticket, Watcher watcher) {
  const NodeKey key{request.job_id(), request.node_id()};
  auto shared = std::make_shared<Watcher>(std::move(watcher));
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::optional<WatchEvent>> missed =
        shutting_down_ ? absl::StatusOr<std::optional<WatchEvent>>(Unavailable())
                       : state_.CatchUp(key, request.node_secret(), request.known_round());
    if (!missed.ok()) {
      deliveries.ends.emplace_back(shared, missed.status());
    } else if (*missed && (*missed)->has_job_closed()) {
      deliveries.events.emplace_back(shared, **missed);
    } else {
      Subscription& slot = watches_[key];
      if (slot.watcher) {
        deliveries.ends.emplace_back(slot.watcher, absl::AbortedError("replaced by a newer watch"));
      }
      slot = Subscription{ticket, shared};
      // Opening the watch is a sign of life, and from now on the open stream is.
      const absl::Time now = clock_.Now();
      absl::StatusOr<int64_t> round = state_.Heartbeat(key, request.node_secret(), now);
      Effects effects;
      state_.SetWatching(key, true, now, &effects);
      ApplyLocked(effects, &deliveries);
      if (journal_ != nullptr)
        deliveries.sync_to = std::max(deliveries.sync_to, journal_->written());
      WatchEvent started;
      started.mutable_watch_started()->set_round(round.ok() ? *round : request.known_round());
      deliveries.events.emplace_back(shared, std::move(started));
      if (*missed) deliveries.events.emplace_back(shared, **missed);
    }
  }
  Deliver(deliveries);
}

void RendezvousHub::CancelWatch(const NodeKey& key, uint64_t ticket) {
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    auto it = watches_.find(key);
    if (it == watches_.end() || it->second.ticket != ticket) return;
    deliveries.ends.emplace_back(std::move(it->second.watcher),
                                 absl::CancelledError("watch cancelled by the caller"));
    watches_.erase(it);
    // The stream was the node's heartbeat: its heartbeat timeout starts now.
    Effects effects;
    state_.SetWatching(key, false, clock_.Now(), &effects);
    ApplyLocked(effects, &deliveries);
  }
  Deliver(deliveries);
}

absl::StatusOr<int64_t> RendezvousHub::Heartbeat(const HeartbeatRequest& request) {
  absl::StatusOr<int64_t> round;
  uint64_t position = 0;
  if (request.has_progress()) {
    // Progress may tell a job's watchers (a PROGRESS event), as a change does.
    MUSTER_RETURN_IF_ERROR(
        Mutate(request.job_id(), [&](Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          const NodeKey key{request.job_id(), request.node_id()};
          round = state_.Heartbeat(key, request.node_secret(), clock_.Now());
          if (journal_ != nullptr) position = journal_->written();
          if (!round.ok()) return round.status();
          return state_.ReportProgress(key, request.node_secret(), request.progress(), clock_.Now(),
                                       effects);
        }));
    MUSTER_RETURN_IF_ERROR(SyncJournal(position));
    return round;
  }
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return ClosedOr(request.job_id(), Unavailable());
    round = state_.Heartbeat({request.job_id(), request.node_id()}, request.node_secret(),
                             clock_.Now());
    if (journal_ != nullptr) position = journal_->written();
  }
  // The round it answers must survive a restart of the server.
  MUSTER_RETURN_IF_ERROR(SyncJournal(position));
  return round;
}

absl::Status RendezvousHub::ReportFailure(const ReportFailureRequest& request) {
  return Mutate(request.job_id(), [&](Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const NodeKey key{request.job_id(), request.node_id()};
    // How far the round got counts before its failure is judged.
    if (request.has_progress()) {
      (void)state_.ReportProgress(key, request.node_secret(), request.progress(), clock_.Now(),
                                  effects);
    }
    return state_.ReportFailure(key, request.node_secret(), request.round(), request.failure(),
                                clock_.Now(), effects);
  });
}

absl::Status RendezvousHub::ReportDone(const ReportDoneRequest& request) {
  return Mutate(request.job_id(), [&](Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const NodeKey key{request.job_id(), request.node_id()};
    if (request.has_progress()) {
      (void)state_.ReportProgress(key, request.node_secret(), request.progress(), clock_.Now(),
                                  effects);
    }
    return state_.ReportDone(key, request.node_secret(), request.round(), clock_.Now(), effects);
  });
}

absl::Status RendezvousHub::Leave(const LeaveRequest& request) {
  return Mutate(request.job_id(), [&](Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_.Leave({request.job_id(), request.node_id()}, request.node_secret(),
                        request.reason(), clock_.Now(), effects, request.exclude());
  });
}

void RendezvousHub::DropNode(const NodeKey& node, const std::string& why) {
  Mutate(node.job_id, [&](Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    state_.DropNode(node, why, clock_.Now(), effects);
    return absl::OkStatus();
  }).IgnoreError();
}

absl::StatusOr<StatusResponse> RendezvousHub::Status(const std::string& job_id, bool nodes) {
  absl::StatusOr<StatusResponse> status;
  uint64_t position = 0;
  {
    absl::MutexLock lock(&mu_);
    status = state_.Status(job_id, clock_.Now(), nodes);
    if (journal_ != nullptr) position = journal_->written();
  }
  MUSTER_RETURN_IF_ERROR(SyncJournal(position));
  return status;
}

ListJobsResponse RendezvousHub::ListJobs(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  return state_.ListJobs(prefix, clock_.Now());
}

absl::Status RendezvousHub::Stop(const std::string& job_id, const std::string& reason) {
  return Mutate(job_id, [&](Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_.Stop(job_id, reason, clock_.Now(), effects);
  });
}

absl::Status RendezvousHub::ObserveJob(const std::string& job_id, uint64_t ticket,
                                       Observer observer) {
  auto shared = std::make_shared<Observer>(std::move(observer));
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return Unavailable();
    absl::StatusOr<std::vector<JobEvent>> history = state_.History(job_id);
    if (!history.ok()) return history.status();
    bool ended = false;
    for (const JobEvent& event : *history) {
      shared->queue(event);
      ended = ended || IsFinalEvent(event);
    }
    if (!ended) observers_[{job_id, ticket}] = shared;
  }
  shared->flush();
  return absl::OkStatus();
}

void RendezvousHub::CancelObserve(const std::string& job_id, uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  observers_.erase({job_id, ticket});
}

std::vector<RendezvousState::JobFigures> RendezvousHub::Figures() {
  absl::MutexLock lock(&mu_);
  return state_.Figures(clock_.Now());
}

std::vector<JournalRecord> RendezvousHub::Snapshot() {
  absl::MutexLock lock(&mu_);
  return state_.Snapshot();
}

RendezvousHub::JobCount RendezvousHub::CountJobs() {
  absl::MutexLock lock(&mu_);
  return {state_.open_job_count(), state_.job_count()};
}

void RendezvousHub::RunDueTimers() {
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    Effects effects;
    state_.Advance(clock_.Now(), &effects);
    ApplyLocked(effects, &deliveries);
  }
  Deliver(deliveries);
}

std::optional<absl::Time> RendezvousHub::NextDeadline() {
  absl::MutexLock lock(&mu_);
  return state_.NextDeadline();
}

void RendezvousHub::TimerLoop() {
  Deliveries deliveries;
  absl::MutexLock lock(&mu_);
  while (!shutting_down_) {
    const absl::Time now = clock_.Now();
    std::optional<absl::Time> next = state_.NextDeadline();
    absl::Duration wait = kMaxTimerSleep;
    if (next && *next - now < wait) wait = *next - now;
    if (wait > absl::ZeroDuration()) {
      state_changed_ = false;
      // Wakes early when a call changed the state: it may have set an earlier
      // deadline. A timeout rather than a deadline: the deadlines are on
      // clock_, which the mutex does not know.
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](RendezvousHub* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
                                 return self->state_changed_ || self->shutting_down_;
                               },
                               this),
                           wait);
      continue;
    }
    Effects effects;
    state_.Advance(now, &effects);
    ApplyLocked(effects, &deliveries);
    if (!deliveries.empty()) {
      mu_.Unlock();
      Deliver(deliveries);
      mu_.Lock();
    }
  }
}

}  // namespace muster::rdzv
