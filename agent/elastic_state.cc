#include "agent/elastic_state.h"

#include <signal.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/exit_codes.h"
#include "rendezvous/rules/protocol.h"

namespace muster {
namespace {

using Level = action::Log::Level;
// A timer this late means the agent itself was not running.
constexpr absl::Duration kStalled = absl::Seconds(3);

constexpr absl::Duration kWatchRetry = absl::Seconds(1);
// How soon a join or a report the rendezvous did not answer is sent again.
constexpr absl::Duration kCallRetry = absl::Seconds(1);
constexpr absl::Duration kProgressInterval = absl::Seconds(5);
constexpr absl::Duration kFirstProgress = absl::Seconds(2);

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d)); }

// Whole seconds, rounded up: for "N s left".
int64_t SecondsLeft(absl::Duration d) {
  return std::max<int64_t>(0, absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1))));
}

void Log(Actions* out, Level level, std::string text) {
  out->push_back(action::Log{level, std::move(text)});
}

}  // namespace

ElasticState::ElasticState(ElasticOptions options) : options_(std::move(options)) {}

Actions ElasticState::Start(absl::Time now) {
  Actions out;
  if (phase_ != AgentPhase::kIdle) return out;
  if (options_.health_check) {
    phase_ = AgentPhase::kJoining;
    health_deadline_ = now + kHealthCheckWait;
    out.push_back(action::CheckHealth{});
    return out;
  }
  StartJoin(now, &out);
  return out;
}

Actions ElasticState::OnHealthChecked(const std::vector<std::string>& faults, absl::Time now) {
  Actions out;
  if (!health_deadline_ || phase_ != AgentPhase::kJoining) return out;
  health_deadline_.reset();
  if (!faults.empty()) {
    health_fault_ = absl::StrJoin(faults, "; ");
    Log(&out, Level::kError,
        absl::StrCat("this node's GPUs failed their health check: ", health_fault_,
                     "; it is not seated, and the rendezvous is told"));
  }
  StartJoin(now, &out);
  return out;
}

void ElasticState::StartJoin(absl::Time now, Actions* out) {
  phase_ = AgentPhase::kJoining;
  progress_at_ = now + kFirstProgress;
  join_started_ = now;
  join_retry_at_.reset();
  // Reports of a round this node has left behind are not wanted any more.
  unreported_failure_.reset();
  unreported_done_.reset();
  report_retry_at_.reset();
  SendJoin(now, out);
}

void ElasticState::SendJoin(absl::Time now, Actions* out) {
  out->push_back(action::Join{
      std::max(absl::ZeroDuration(), *join_started_ + options_.join_timeout - now), health_fault_});
}

rdzv::JobClosed ElasticState::ClosedBy(const absl::Status& status) {
  rdzv::JobClosed closed;
  closed.set_reason(std::string(status.message()));
  closed.set_succeeded(rdzv::ClosedJobSucceeded(status.message()));
  return closed;
}

bool ElasticState::IsUnanswered(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

std::string ElasticState::Meanwhile(absl::Time now) const {
  switch (phase_) {
    case AgentPhase::kRunning:
      if (options_.ask_peers) {
        return absl::StrCat("this node's ", live_,
                            " worker(s) keep running while the round's other nodes cannot reach "
                            "it either, and it waits for the rendezvous to come back");
      }
      return absl::StrCat("this node's ", live_,
                          " worker(s) keep running, and it waits for the rendezvous to come back");
    case AgentPhase::kJoining:
      return absl::StrCat("the join is retried until join_timeout (",
                          SecondsLeft(*join_started_ + options_.join_timeout - now), " s left)");
    case AgentPhase::kStopping:
      if (unreported_failure_) {
        return absl::StrCat("the failure report is retried until join_timeout (",
                            SecondsLeft(report_deadline_ - now), " s left)");
      }
      return "this node waits for it to decide the next round";
    case AgentPhase::kFinishing:
      if (unreported_done_) {
        return absl::StrCat("the report that this node finished is retried until join_timeout (",
                            SecondsLeft(report_deadline_ - now), " s left)");
      }
      return "this node waits for it to close the job";
    case AgentPhase::kIdle:
    case AgentPhase::kExiting: break;
  }
  return "";
}

void ElasticState::NoteUnreachable(const absl::Status& status, absl::Time now, Actions* out) {
  if (unreachable_since_) return;
  unreachable_since_ = now;
  // Whether the others of the round can reach it decides whether the
  // workers ride the outage out: asked at once, and again while it lasts.
  if (options_.ask_peers && phase_ == AgentPhase::kRunning && RidesOut()) peers_at_ = now;
  Log(out, Level::kWarn,
      absl::StrCat("the rendezvous at ", options_.rdzv_target, " does not answer (",
                   status.message(), "); ", Meanwhile(now)));
}

void ElasticState::NoteReachable(absl::Time now, Actions* out) {
  if (!unreachable_since_) return;
  heartbeat_failures_ = 0;  // what failed before is not "in a row" any more
  peers_at_.reset();
  told_peer_reaches_ = false;
  Log(out, Level::kInfo,
      absl::StrCat("the rendezvous at ", options_.rdzv_target, " answers again, after ",
                   absl::StrFormat("%.1f", absl::ToDoubleSeconds(now - *unreachable_since_)),
                   " s away"));
  unreachable_since_.reset();
}

void ElasticState::OnJoined(absl::StatusOr<rdzv::Assignment> assignment, absl::Time now,
                            Actions* out) {
  if (phase_ != AgentPhase::kJoining) return;
  if (!health_fault_.empty()) {
    // Never seated, whatever the answer (the rendezvous refuses it).
    ExitExcluded(
        absl::StrCat(
            "this node's GPUs failed their health check before it was seated: ", health_fault_,
            assignment.ok()
                ? std::string()
                : absl::StrCat(" (the rendezvous: ", assignment.status().message(), ")")),
        out);
    return;
  }
  if (!assignment.ok()) {
    const absl::Status& status = assignment.status();
    if (absl::IsUnauthenticated(status)) {
      // The client's message names the rendezvous and the token file.
      ExitFailed(std::string(status.message()), out);
    } else if (absl::IsFailedPrecondition(status) && ClosedBy(status).succeeded()) {
      // The job succeeded without this node (a spare, or a node that came
      // back late): nothing failed.
      Log(out, Level::kInfo, std::string(status.message()));
      OnJobClosed(ClosedBy(status), now, out);
    } else if (absl::StrContains(status.message(), rdzv::kExcludedFromJob)) {
      ExitExcluded(absl::StrCat("the rendezvous at ", options_.rdzv_target,
                                " refused this node: ", status.message()),
                   out);
    } else if (IsUnanswered(status) && !options_.hosts_rendezvous && (!in_job_ || RidesOut()) &&
               now + kCallRetry < *join_started_ + options_.join_timeout) {
      // The rendezvous went away during the join (a musterd that restarts),
      // or is not up yet: it may answer before join_timeout.
      join_retry_at_ = now + kCallRetry;
      NoteUnreachable(status, now, out);
    } else if (!in_job_ && (absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status)) &&
               !options_.hosts_rendezvous) {
      ExitFailed(absl::StrCat("no rendezvous answered at ", options_.rdzv_target,
                              " within join_timeout (", Seconds(options_.join_timeout),
                              " s): is the node that hosts it (or musterd) running, and is "
                              "--rdzv-endpoint right? (",
                              status.message(), ")"),
                 out);
    } else {
      ExitFailed(
          absl::StrCat("rendezvous at ", options_.rdzv_target, " failed: ", status.message()), out);
    }
    return;
  }
  const std::optional<absl::Time> due = NextDeadline();
  if ((due && now - *due >= kStalled) || (resumed_at_ && now - *resumed_at_ < kStalled)) {
    // This process did not run while the answer waited for it (SIGSTOP):
    // the round may be over, this node dropped from it. A heartbeat says.
    Log(out, Level::kWarn,
        absl::StrCat("this agent did not run while its seat in round ", assignment->round(),
                     " waited for it; asking the rendezvous whether that round still runs"));
    unverified_ = *std::move(assignment);
    verify_seq_ = ++heartbeat_seq_;
    out->push_back(action::SendHeartbeat{std::nullopt, verify_seq_});
    return;
  }
  StartRound(*std::move(assignment), now, out);
}

void ElasticState::OnVerified(const absl::StatusOr<int64_t>& answer, absl::Time now, Actions* out) {
  rdzv::Assignment assignment = *std::exchange(unverified_, std::nullopt);
  if (phase_ != AgentPhase::kJoining) return;
  const absl::Status& status = answer.status();
  if (status.ok() && *answer == assignment.round()) {
    StartRound(std::move(assignment), now, out);  // it runs
  } else if (absl::IsFailedPrecondition(status)) {
    OnJobClosed(ClosedBy(status), now, out);
  } else {
    // Over, or none can tell (the rendezvous did not answer): a join is safe.
    Log(out, Level::kWarn,
        absl::StrCat("round ", assignment.round(), " is over or cannot be checked (",
                     status.ok() ? absl::StrCat("the job is in round ", *answer)
                                 : std::string(status.message()),
                     "); joining again"));
    StartJoin(now, out);
  }
}

void ElasticState::StartRound(rdzv::Assignment assignment, absl::Time now, Actions* out) {
  progress_at_.reset();
  join_started_.reset();
  NoteReachable(now, out);
  ride_out_ = assignment.ride_out_outages();
  round_ = assignment.round();
  if (!in_job_) {
    in_job_ = true;
    heartbeat_at_ = now + options_.keep_alive_interval;
  }
  if (!watch_open_) OpenWatch(out);
  failures_.clear();
  live_ = 0;
  after_preflight_.reset();
  if (options_.preflight && assignment.preflight()) {
    Log(out, Level::kInfo,
        "--preflight allreduce: checking the job's all-reduce across every rank before the "
        "script starts");
    after_preflight_ = assignment;
    out->push_back(action::StartWorkers{std::move(assignment), attempts_, /*preflight=*/true});
    return;
  }
  out->push_back(action::StartWorkers{std::move(assignment), attempts_});
  ++attempts_;
}

Actions ElasticState::OnWorkersStarted(int started, std::optional<WorkerFailure> spawn_failure,
                                       absl::Time now) {
  Actions out;
  if (phase_ != AgentPhase::kJoining) return out;
  live_ = started;
  phase_ = AgentPhase::kRunning;
  progress_ = NodeProgress{};
  reported_step_ = -1;
  if (!in_preflight() && options_.progress_poll > absl::ZeroDuration()) {
    progress_poll_at_ = now + options_.progress_poll;
  }
  // Workers that start while the rendezvous is away (the script after the
  // pre-flight) are checked with the peers too.
  if (options_.ask_peers && unreachable_since_ && RidesOut() && !peers_at_) peers_at_ = now;
  if (spawn_failure && spawn_failure->agent_out_of_resources) {
    const std::string lack = spawn_failure->error ? spawn_failure->error->message : "";
    Log(&out, Level::kError,
        absl::StrCat("rank ", spawn_failure->rank, " could not start: ", lack,
                     "; stopping this node's workers"));
    leave_why_ = absl::StrCat("this node could not start rank ", spawn_failure->rank, ": ", lack,
                              " (the agent ran out, not the worker: raise ulimit -n, or free "
                              "memory); it leaves the job without spending a restart");
    after_stop_ = AfterStop::kExitLeave;
    StopWorkers(SIGTERM, now, &out);
    return out;
  }
  if (spawn_failure) {
    failures_.push_back(*spawn_failure);
    if (in_preflight()) EndPreflightFailed();
    Log(&out, Level::kError,
        absl::StrCat("rank ", spawn_failure->rank, " could not start: ",
                     spawn_failure->error ? spawn_failure->error->message : ""));
    ReportFailureAndStop(failures_.back(), now, &out);
  }
  // The job moved on while this node joined or its workers were being
  // started (a wait for the GPUs to be freed, or for --preload's imports):
  // the change was noted then; it is acted on now.
  if (round_seen_ > round_) {
    Log(&out, Level::kInfo,
        absl::StrCat("round ", round_, " is over already: the job is in round ", round_seen_));
    if (phase_ == AgentPhase::kRunning) {
      after_stop_ = AfterStop::kRejoin;
      StopWorkers(SIGTERM, now, &out);
    } else if (phase_ == AgentPhase::kStopping && after_stop_ == AfterStop::kAwaitDecision) {
      after_stop_ = AfterStop::kRejoin;
      if (live_ == 0) OnAllStopped(now, &out);
    }
  }
  return out;
}

void ElasticState::EndPreflightFailed() {
  failures_.back().preflight = true;
  after_preflight_.reset();
}

void ElasticState::ReportFailureAndStop(const WorkerFailure& failure, absl::Time now,
                                        Actions* out) {
  unreported_failure_ = action::ReportFailure{round_, failure};
  report_deadline_ = now + options_.join_timeout;
  report_failures_ = 0;
  out->push_back(*unreported_failure_);
  after_stop_ = AfterStop::kAwaitDecision;
  StopWorkers(SIGTERM, now, out);
}

void ElasticState::StopWorkers(int sig, absl::Time now, Actions* out) {
  phase_ = AgentPhase::kStopping;
  progress_poll_at_.reset();
  out->push_back(action::SignalWorkers{sig});
  kill_at_ = now + options_.shutdown_grace;
  if (live_ == 0) OnAllStopped(now, out);
}

void ElasticState::OnAllStopped(absl::Time now, Actions* out) {
  kill_at_.reset();
  abandon_at_.reset();
  switch (after_stop_) {
    case AfterStop::kAwaitDecision:
      break;  // the rendezvous decides: a new round, or the end of the job
    case AfterStop::kRejoin: StartJoin(now, out); break;
    case AfterStop::kExitFailed: ExitFailed(closed_ ? closed_->reason() : "", out); break;
    case AfterStop::kExitSignal: Finish(128 + stop_signal_, out); break;
    case AfterStop::kExitExcluded:
      if (options_.hosts_rendezvous && !closed_ && in_job_) {
        // The other nodes still need the rendezvous: stay, without workers,
        // until the job ends. Out of the job, this node gets no pushes: its
        // heartbeats tell when it closed.
        Log(out, Level::kInfo,
            "this node hosts the job's rendezvous: it stays, without workers, until the job ends");
        phase_ = AgentPhase::kFinishing;
        watch_started_ = false;
        heartbeat_at_ = now + options_.keep_alive_interval;
        break;
      }
      ExitExcluded(
          absl::StrCat("this node", excluded_->host().empty() ? "" : "'s host ", excluded_->host(),
                       " is excluded from the job: ", excluded_->cause()),
          out);
      break;
    case AfterStop::kExitLeave: {
      Finish(kExitWorkersFailed, out);
      auto& exit = std::get<action::Exit>(out->back());
      exit.why = leave_why_;
      exit.leave_reason = leave_why_;
      break;
    }
  }
}

Actions ElasticState::OnWorkerExit(const ExitStatus& status, const WorkerFailure& failure,
                                   absl::Time now) {
  Actions out;
  if (phase_ == AgentPhase::kExiting || live_ == 0) return out;
  --live_;
  if (phase_ == AgentPhase::kRunning) {
    if (!status.success()) {
      failures_.push_back(failure);
      if (in_preflight()) {
        EndPreflightFailed();
        Log(&out, Level::kError,
            absl::StrCat("the pre-flight all-reduce failed: rank ", failure.rank, " (local rank ",
                         failure.local_rank, ") ", DescribeExit(failure),
                         " (its report is above); the script is not started (in the job's first "
                         "round the job closes; in a later one the nodes it seated are "
                         "excluded)"));
        ReportFailureAndStop(failures_.back(), now, &out);
        return out;
      }
      Log(&out, Level::kError,
          absl::StrCat("rank ", failure.rank, " (local rank ", failure.local_rank, ", pid ",
                       failure.pid, ") failed: ", DescribeExit(failure),
                       failure.killed_for.empty() ? "" : ": ", failure.killed_for,
                       "; stopping the other workers"));
      ReportFailureAndStop(failure, now, &out);
      return out;
    }
    if (live_ == 0 && in_preflight()) {
      Log(&out, Level::kInfo, "the pre-flight all-reduce passed on this node; starting the script");
      phase_ = AgentPhase::kJoining;  // as after a join: OnWorkersStarted follows
      out.push_back(action::StartWorkers{*std::move(after_preflight_), attempts_});
      after_preflight_.reset();
      ++attempts_;
      return out;
    }
    if (live_ == 0) {
      phase_ = AgentPhase::kFinishing;
      progress_poll_at_.reset();
      unreported_done_ = round_;
      report_deadline_ = now + options_.join_timeout;
      report_failures_ = 0;
      out.push_back(action::ReportDone{round_});
    }
    return out;
  }
  if (phase_ == AgentPhase::kStopping) {
    // A worker that failed on its own while we were stopping the group is
    // worth reporting; one that died of our stop signal is not.
    if (!status.success() && status.signal != SIGTERM && status.signal != SIGKILL &&
        status.signal != stop_signal_ && after_stop_ != AfterStop::kExitSignal) {
      failures_.push_back(failure);
    }
    if (live_ == 0) OnAllStopped(now, &out);
  }
  return out;
}

Actions ElasticState::OnSignal(int sig, absl::Time now) {
  Actions out;
  if (phase_ == AgentPhase::kExiting) return out;
  out.push_back(action::SignalWorkers{sig});
  if (std::find(options_.stop_signals.begin(), options_.stop_signals.end(), sig) ==
      options_.stop_signals.end()) {
    Log(&out, Level::kInfo,
        absl::StrCat("forwarded ", SignalName(sig), " to ", live_, " worker(s)"));
    return out;
  }
  if (stop_signal_ != 0) {
    // A second stop signal (Ctrl-C twice): do not wait out the grace period.
    Log(&out, Level::kWarn, absl::StrCat(SignalName(sig), " again: killing the workers now"));
    out.push_back(action::SignalWorkers{SIGKILL});
    kill_at_.reset();  // sent already
    if (live_ > 0 && !abandon_at_) abandon_at_ = now + kKillWait;
    return out;
  }
  stop_signal_ = sig;
  Log(&out, Level::kWarn,
      absl::StrCat("received ", SignalName(sig), ": stopping ", live_, " worker(s) (grace ",
                   absl::StrFormat("%.1f", absl::ToDoubleSeconds(options_.shutdown_grace)), " s)"));
  if (phase_ == AgentPhase::kRunning || phase_ == AgentPhase::kStopping) {
    after_stop_ = AfterStop::kExitSignal;
    if (phase_ == AgentPhase::kRunning) {
      phase_ = AgentPhase::kStopping;
      progress_poll_at_.reset();
      kill_at_ = now + options_.shutdown_grace;
    }
    // Stopped already, waiting for the rendezvous to decide: nothing to wait for.
    if (live_ == 0) OnAllStopped(now, &out);
    return out;
  }
  Finish(128 + sig, &out);
  return out;
}

Actions ElasticState::OnRdzv(RdzvEvent event, absl::Time now) {
  Actions out;
  if (phase_ == AgentPhase::kExiting || phase_ == AgentPhase::kIdle) return out;
  if (auto* joined = std::get_if<rdzv_event::Joined>(&event)) {
    OnJoined(std::move(joined->assignment), now, &out);
  } else if (auto* pushed = std::get_if<rdzv_event::Pushed>(&event)) {
    if (pushed->event.has_watch_started()) {
      if (pushed->generation == watch_generation_) {
        watch_started_ = true;
        heartbeat_failures_ = 0;  // the server answered: failures so far are not in a row
        NoteReachable(now, &out);
      }
    } else {
      OnPushed(pushed->event, now, &out);
    }
  } else if (auto* ended = std::get_if<rdzv_event::WatchEnded>(&event)) {
    OnWatchEnded(*ended, now, &out);
  } else if (auto* reported = std::get_if<rdzv_event::FailureReported>(&event)) {
    OnFailureReported(reported->status, now, &out);
  } else if (auto* done = std::get_if<rdzv_event::DoneReported>(&event)) {
    OnDoneReported(done->status, now, &out);
  } else if (auto* beat = std::get_if<rdzv_event::HeartbeatAnswered>(&event)) {
    if (unverified_ && beat->seq == verify_seq_) {
      OnVerified(beat->round, now, &out);  // only its own answer, sent since it waited
    } else {
      OnHeartbeat(beat->round, now, &out);
    }
  } else if (auto* job = std::get_if<rdzv_event::JobStatusAnswered>(&event)) {
    if (phase_ == AgentPhase::kJoining && absl::IsUnauthenticated(job->job.status())) {
      GiveUp(std::string(job->job.status().message()), now, &out);
    } else if (phase_ == AgentPhase::kJoining) {
      Log(&out, Level::kInfo, ProgressLine(options_.rdzv_target, job->job));
    }
  }
  return out;
}

void ElasticState::OnWatchEnded(const rdzv_event::WatchEnded& ended, absl::Time now, Actions* out) {
  if (ended.generation != watch_generation_) return;  // a replaced watch
  watch_open_ = false;
  if (watch_started_ && heartbeat_at_ && !closed_ && !ended.status.ok()) {
    // The server's heartbeat timeout for this node starts now: beat at once.
    heartbeat_at_ = now;
  }
  watch_started_ = false;
  if (!closed_ && absl::IsUnauthenticated(ended.status)) {
    // Retrying cannot help: the rendezvous will refuse every call.
    if (phase_ != AgentPhase::kFinishing) GiveUp(std::string(ended.status.message()), now, out);
    return;
  }
  if (!closed_ && !ended.status.ok() && !absl::IsCancelled(ended.status) &&
      !absl::IsAborted(ended.status)) {
    if (RidesOut() && IsUnanswered(ended.status)) {
      NoteUnreachable(ended.status, now, out);
    } else {
      // Heartbeats say whether the rendezvous is gone for good; the watch just retries.
      Log(out, Level::kDebug,
          absl::StrCat("lost the rendezvous watch stream (", ended.status.message(),
                       "); reconnecting"));
    }
    watch_retry_at_ = now + kWatchRetry;
  }
}

bool ElasticState::RetriesReport(const absl::Status& status, const char* what, absl::Time now,
                                 Actions* out) {
  if (!IsUnanswered(status) || now + kCallRetry >= report_deadline_) return false;
  if (RidesOut()) {
    NoteUnreachable(status, now, out);
  } else {
    // A connection the server closed while this agent did not run, or a
    // server busy for a moment: one unanswered call is not the end.
    if (++report_failures_ >= options_.keep_alive_max_attempt) return false;
    if (report_failures_ == 1) {
      Log(out, Level::kWarn,
          absl::StrCat("the ", what, " report to the rendezvous at ", options_.rdzv_target,
                       " failed (", status.message(), "); trying again, ",
                       options_.keep_alive_max_attempt, " tries in all (keep_alive_max_attempt)"));
    }
  }
  report_retry_at_ = now + kCallRetry;
  return true;
}

void ElasticState::OnFailureReported(const absl::Status& status, absl::Time now, Actions* out) {
  if (!unreported_failure_) return;  // of a round this node has left behind
  if (status.ok()) {
    unreported_failure_.reset();
    NoteReachable(now, out);
    return;
  }
  // Reported when the rendezvous comes back: the job must learn of it.
  if (RetriesReport(status, "failure", now, out)) return;
  unreported_failure_.reset();
  if (absl::StrContains(status.message(), rdzv::kExcludedFromJob)) {
    // Excluded by another's report of the same round; its push may come later.
    rdzv::NodeExcluded excluded;
    excluded.mutable_exclusion()->set_cause(std::string(status.message()));
    OnNodeExcluded(excluded, now, out);
    return;
  }
  if (absl::IsNotFound(status) && absl::StrContains(status.message(), rdzv::kDroppedFromJob)) {
    // Dropped while it did not run or could not reach the rendezvous: the
    // job went on without it, and its workers failed as their peers moved
    // on. Its failure is no longer the job's: it joins again.
    Log(out, Level::kWarn,
        absl::StrCat("the rendezvous dropped this node (", status.message(),
                     ") before its workers' failure reached it; rejoining once they stopped"));
    if (phase_ == AgentPhase::kStopping && after_stop_ == AfterStop::kAwaitDecision) {
      after_stop_ = AfterStop::kRejoin;
      if (live_ == 0) OnAllStopped(now, out);
    }
    return;
  }
  Log(out, Level::kError,
      absl::StrCat("could not report the failure to the rendezvous at ", options_.rdzv_target, ": ",
                   status.message()));
  if (phase_ == AgentPhase::kStopping && after_stop_ == AfterStop::kAwaitDecision) {
    after_stop_ = AfterStop::kExitFailed;
    if (live_ == 0) OnAllStopped(now, out);
  }
}

void ElasticState::OnDoneReported(const absl::Status& status, absl::Time now, Actions* out) {
  if (phase_ != AgentPhase::kFinishing || !unreported_done_) return;
  if (RetriesReport(status, "done", now, out)) return;
  unreported_done_.reset();
  if (status.ok()) {
    NoteReachable(now, out);
    // A host stays until the job closes: the other nodes still need it.
    if (!StaysUntilClosed()) Finish(kExitSuccess, out);
  } else if (absl::IsAborted(status)) {
    Log(out, Level::kInfo,
        absl::StrCat("the job moved on while this node finished: ", status.message()));
  } else if (absl::IsFailedPrecondition(status)) {
    // The job closed as this node finished (an earlier report of it may
    // have closed it, its answer lost): it ends as the job did.
    Log(out, Level::kInfo,
        absl::StrCat("the job closed as this node finished: ", status.message()));
    OnJobClosed(ClosedBy(status), now, out);
  } else {
    Log(out, Level::kWarn,
        absl::StrCat("workers succeeded but the rendezvous could not be told: ", status.message()));
    Finish(kExitSuccess, out);
  }
}

void ElasticState::OnPushed(const rdzv::WatchEvent& event, absl::Time now, Actions* out) {
  if (event.has_round_changed()) {
    OnRoundChanged(event.round_changed(), now, out);
  } else if (event.has_job_closed()) {
    OnJobClosed(event.job_closed(), now, out);
  } else if (event.has_node_excluded()) {
    OnNodeExcluded(event.node_excluded(), now, out);
  }
}

namespace {

// "this node's host h1", or "this node" when only a refused call told
// (its message names the node).
std::string WhoIsExcluded(const rdzv::Exclusion& exclusion) {
  return exclusion.host().empty() ? "this node"
                                  : absl::StrCat("this node's host ", exclusion.host());
}

}  // namespace

void ElasticState::OnNodeExcluded(const rdzv::NodeExcluded& excluded, absl::Time now,
                                  Actions* out) {
  const rdzv::Exclusion& exclusion = excluded.exclusion();
  if (excluded_ || excluded_as_job_ends_) return;
  if (excluded.job_ends()) {
    // No restart is left: the JobClosed that follows ends this node as it
    // ends every other, with the job's exit code.
    excluded_as_job_ends_ = exclusion;
    Log(out, Level::kError,
        absl::StrCat("the job excluded ", WhoIsExcluded(exclusion), ": ", exclusion.cause(),
                     "; the same failure ends the job"));
    return;
  }
  excluded_ = exclusion;
  Log(out, Level::kError,
      absl::StrCat("the job excluded ", WhoIsExcluded(exclusion), ": ", exclusion.cause(),
                   "; the job goes on without it"));
  StopForExclusion(now, out);
}

Actions ElasticState::OnNodeFault(const std::string& cause, absl::Time now) {
  Actions out;
  if (excluded_ || phase_ == AgentPhase::kIdle || phase_ == AgentPhase::kExiting) return out;
  rdzv::Exclusion exclusion;
  exclusion.set_cause(absl::StrCat("its own health check failed: ", cause));
  excluded_ = exclusion;
  Log(&out, Level::kError,
      absl::StrCat("this node is bad: ", cause,
                   "; it leaves the job, which excludes its host and goes on without it"));
  if (in_job_) out.push_back(action::ExcludeSelf{cause});
  StopForExclusion(now, &out);
  return out;
}

void ElasticState::StopForExclusion(absl::Time now, Actions* out) {
  switch (phase_) {
    case AgentPhase::kRunning:
      after_stop_ = AfterStop::kExitExcluded;
      StopWorkers(SIGTERM, now, out);
      break;
    case AgentPhase::kStopping:
      if (after_stop_ != AfterStop::kExitSignal) {
        after_stop_ = AfterStop::kExitExcluded;
        if (live_ == 0) OnAllStopped(now, out);
      }
      break;
    case AgentPhase::kJoining:
    case AgentPhase::kFinishing:
      after_stop_ = AfterStop::kExitExcluded;
      OnAllStopped(now, out);
      break;
    case AgentPhase::kIdle:
    case AgentPhase::kExiting: break;
  }
}

void ElasticState::ExitExcluded(const std::string& why, Actions* out) {
  std::string report;
  if (!failures_.empty()) report = FormatFailureReport(options_.script, attempts_, failures_);
  Finish(kExitNodeExcluded, out);
  auto& exit = std::get<action::Exit>(out->back());
  exit.report = std::move(report);
  exit.why = why;
  exit.failures_seen = !failures_.empty();
  exit.excluded = excluded_;
  if (!exit.excluded) {
    // Refused at its join: the message is all it has.
    rdzv::Exclusion refused;
    refused.set_cause(why);
    exit.excluded = refused;
  }
}

void ElasticState::OnRoundChanged(const rdzv::RoundChanged& changed, absl::Time now, Actions* out) {
  // Old news, or already being acted on (a push and a heartbeat may both tell).
  if (changed.new_round() <= std::max(round_, round_seen_)) return;
  round_seen_ = changed.new_round();
  Log(out, Level::kInfo,
      absl::StrCat("job moves to round ", changed.new_round(), ": ", changed.detail()));
  switch (phase_) {
    case AgentPhase::kRunning:
      after_stop_ = AfterStop::kRejoin;
      StopWorkers(SIGTERM, now, out);
      break;
    case AgentPhase::kStopping:
      if (after_stop_ == AfterStop::kAwaitDecision) {
        after_stop_ = AfterStop::kRejoin;
        if (live_ == 0) OnAllStopped(now, out);
      }
      break;
    case AgentPhase::kFinishing: StartJoin(now, out); break;
    case AgentPhase::kIdle:
    case AgentPhase::kJoining:
    case AgentPhase::kExiting: break;
  }
}

std::optional<rdzv::RoundChanged> ElasticState::MissedRound(
    const absl::StatusOr<int64_t>& answer) const {
  if (!answer.ok() || *answer <= round_ || phase_ == AgentPhase::kJoining) return std::nullopt;
  // A push was lost: the heartbeat answer says the job moved on.
  rdzv::RoundChanged changed;
  changed.set_new_round(*answer);
  changed.set_detail("the job moved on (seen in a heartbeat)");
  return changed;
}

void ElasticState::OnHeartbeat(const absl::StatusOr<int64_t>& answer, absl::Time now,
                               Actions* out) {
  const absl::Status& status = answer.status();
  if (absl::IsCancelled(status)) return;
  if (absl::IsUnauthenticated(status)) {
    // Refused, not unanswered: no second try. A finishing node's pending
    // ReportDone decides.
    if (!closed_ && phase_ != AgentPhase::kFinishing)
      GiveUp(std::string(status.message()), now, out);
    return;
  }
  const bool answered =
      status.ok() || absl::IsNotFound(status) || absl::IsFailedPrecondition(status);
  // Dropped by a rendezvous that was away: it came back without the job.
  const bool forgotten = absl::IsNotFound(status) && unreachable_since_.has_value() &&
                         !absl::StrContains(status.message(), rdzv::kDroppedFromJob);
  if (answered) {
    if (unreachable_since_) {
      NoteReachable(now, out);
    } else if (heartbeat_failures_ > 0) {
      Log(out, Level::kInfo,
          absl::StrCat("the rendezvous at ", options_.rdzv_target, " answers again"));
    }
    heartbeat_failures_ = 0;
  }
  if (status.ok()) {
    if (std::optional<rdzv::RoundChanged> missed = MissedRound(answer)) {
      OnRoundChanged(*missed, now, out);
    }
    return;
  }
  if (absl::IsNotFound(status)) {
    if (phase_ == AgentPhase::kRunning) {
      // The rendezvous dropped this node (it was silent too long): these
      // workers are no longer part of the job.
      Log(out, Level::kWarn,
          forgotten ? absl::StrCat("the rendezvous at ", options_.rdzv_target,
                                   " came back without this job (", status.message(),
                                   "; a musterd restarted without --state-dir forgets its jobs); "
                                   "stopping the workers and rejoining")
                    : absl::StrCat("the rendezvous dropped this node (", status.message(),
                                   "); stopping the workers and rejoining"));
      after_stop_ = AfterStop::kRejoin;
      StopWorkers(SIGTERM, now, out);
    } else if (phase_ == AgentPhase::kStopping && after_stop_ == AfterStop::kAwaitDecision) {
      // No decision will come for a node out of the job: it joins again.
      Log(out, Level::kWarn,
          absl::StrCat("the rendezvous dropped this node (", status.message(),
                       ") while it waited for the next round; rejoining"));
      after_stop_ = AfterStop::kRejoin;
      if (live_ == 0) OnAllStopped(now, out);
    }
    return;  // stopping otherwise, or joining already
  }
  if (absl::IsFailedPrecondition(status)) {
    // The pushed JobClosed, when it came first, says more (the root cause).
    if (closed_) return;
    OnJobClosed(ClosedBy(status), now, out);
    return;
  }
  ++heartbeat_failures_;
  if (RidesOut()) {
    // Nothing needs the rendezvous now: its outage is waited out.
    NoteUnreachable(status, now, out);
    return;
  }
  if (heartbeat_failures_ == 1) {
    Log(out, Level::kWarn,
        absl::StrCat("heartbeat to the rendezvous at ", options_.rdzv_target,
                     " failed: ", status.message()));
  }
  if (heartbeat_failures_ < options_.keep_alive_max_attempt) return;
  // The pending ReportDone decides; with none pending (the job moved on as
  // this node finished), nothing else would.
  if (phase_ == AgentPhase::kFinishing && unreported_done_) return;
  GiveUp(absl::StrCat("the rendezvous at ", options_.rdzv_target, " did not answer ",
                      heartbeat_failures_,
                      " heartbeats in a row (keep_alive_max_attempt); the job cannot go on "
                      "without it"),
         now, out);
}

void ElasticState::GiveUp(const std::string& why, absl::Time now, Actions* out) {
  heartbeat_at_.reset();
  watch_retry_at_.reset();
  join_retry_at_.reset();
  report_retry_at_.reset();
  if (phase_ == AgentPhase::kRunning || phase_ == AgentPhase::kStopping) {
    Log(out, Level::kError, absl::StrCat(why, "; stopping the workers"));
    rdzv::JobClosed closed;
    closed.set_reason(why);
    closed_ = closed;
    if (after_stop_ != AfterStop::kExitSignal) after_stop_ = AfterStop::kExitFailed;
    if (phase_ == AgentPhase::kRunning) {
      StopWorkers(SIGTERM, now, out);
    } else if (live_ == 0) {
      OnAllStopped(now, out);
    }
    return;
  }
  ExitFailed(why, out);
}

void ElasticState::OnJobClosed(const rdzv::JobClosed& closed, absl::Time now, Actions* out) {
  closed_ = closed;
  switch (phase_) {
    case AgentPhase::kRunning:
      // Even a job that closed as succeeded cannot use this node's workers any more.
      Log(out, Level::kWarn,
          absl::StrCat("the job closed while this node's workers run: ", closed.reason()));
      after_stop_ = AfterStop::kExitFailed;
      StopWorkers(SIGTERM, now, out);
      break;
    case AgentPhase::kStopping:
      if (after_stop_ != AfterStop::kExitSignal && after_stop_ != AfterStop::kExitExcluded) {
        after_stop_ = AfterStop::kExitFailed;
        if (live_ == 0) OnAllStopped(now, out);
      }
      break;
    case AgentPhase::kFinishing:
    case AgentPhase::kJoining:
      if (excluded_) {
        ExitExcluded(absl::StrCat("this node's host ", excluded_->host(),
                                  " was excluded from the job: ", excluded_->cause()),
                     out);
      } else if (closed.succeeded()) {
        Finish(kExitSuccess, out);
      } else {
        ExitFailed(closed.reason(), out);
      }
      break;
    case AgentPhase::kIdle:
    case AgentPhase::kExiting: break;
  }
}

Actions ElasticState::OnTimer(absl::Time now) {
  Actions out;
  if (phase_ == AgentPhase::kExiting) return out;
  if (const std::optional<absl::Time> due = NextDeadline(); due && now - *due >= kStalled) {
    // The timer is due every keep_alive_interval at most: this process did not run.
    resumed_at_ = now;
    Log(&out, Level::kWarn,
        absl::StrCat("this agent did not run for ",
                     absl::StrFormat("%.1f", absl::ToDoubleSeconds(now - *due)),
                     " s (it was stopped, or starved of CPU); the rendezvous may have dropped "
                     "this node meanwhile"));
  }
  if (kill_at_ && now >= *kill_at_) {
    kill_at_.reset();
    if (live_ > 0) {
      Log(&out, Level::kWarn,
          absl::StrCat(live_, " worker(s) still running ",
                       absl::StrFormat("%.1f", absl::ToDoubleSeconds(options_.shutdown_grace)),
                       " s after the stop signal; sending SIGKILL"));
      out.push_back(action::SignalWorkers{SIGKILL, /*stacks_first=*/true});
      if (!abandon_at_) abandon_at_ = now + kKillWait;
    }
  }
  if (abandon_at_ && now >= *abandon_at_) {
    abandon_at_.reset();
    if (live_ > 0 && phase_ == AgentPhase::kStopping) {
      Log(&out, Level::kError,
          absl::StrCat(live_, " worker(s) still not reaped ",
                       absl::StrFormat("%.0f", absl::ToDoubleSeconds(kKillWait)),
                       " s after SIGKILL: stuck in the kernel (D state: a hung file system or "
                       "device); giving up on them and going on"));
      out.push_back(action::AbandonWorkers{});
      live_ = 0;
      OnAllStopped(now, &out);
      if (phase_ == AgentPhase::kExiting) return out;
    }
  }
  if (heartbeat_at_ && now >= *heartbeat_at_) {
    heartbeat_at_ = now + options_.keep_alive_interval;
    // The open watch stream is the heartbeat otherwise.
    if (!watch_started_ || options_.heartbeat_with_watch) {
      out.push_back(action::SendHeartbeat{std::nullopt, ++heartbeat_seq_});
    }
  }
  if (health_deadline_ && now >= *health_deadline_) {
    health_deadline_.reset();
    Log(&out, Level::kWarn,
        absl::StrCat("the GPU health check did not answer within ",
                     absl::ToInt64Seconds(kHealthCheckWait),
                     " s (NVML hangs?); joining without it"));
    StartJoin(now, &out);
  }
  if (progress_poll_at_ && now >= *progress_poll_at_) {
    progress_poll_at_ = now + options_.progress_poll;
    out.push_back(action::ReadProgress{});
  }
  if (progress_at_ && now >= *progress_at_) {
    progress_at_ = now + kProgressInterval;
    out.push_back(action::QueryStatus{});
  }
  if (peers_at_ && now >= *peers_at_) {
    // Asked again keep_alive_interval after the answers (OnPeersAnswered),
    // never while a question is open.
    peers_at_.reset();
    if (phase_ == AgentPhase::kRunning && unreachable_since_) {
      out.push_back(action::AskPeers{round_, kPeerTimeout});
    }
  }
  if (watch_retry_at_ && now >= *watch_retry_at_) {
    watch_retry_at_.reset();
    OpenWatch(&out);
  }
  if (join_retry_at_ && now >= *join_retry_at_) {
    join_retry_at_.reset();
    if (phase_ == AgentPhase::kJoining) SendJoin(now, &out);
  }
  if (report_retry_at_ && now >= *report_retry_at_) {
    report_retry_at_.reset();
    if (unreported_failure_) {
      out.push_back(*unreported_failure_);
    } else if (unreported_done_ && phase_ == AgentPhase::kFinishing) {
      out.push_back(action::ReportDone{*unreported_done_});
    }
  }
  return out;
}

Actions ElasticState::OnProgress(const NodeProgress& progress, absl::Time now) {
  Actions out;
  if (phase_ != AgentPhase::kRunning || in_preflight() || progress.step <= progress_.step) {
    return out;
  }
  progress_ = progress;
  last_step_ = std::max(last_step_, progress.step);
  // The first step of a round says the job trains again: told at once.
  if (reported_step_ >= 0 && now - reported_at_ < kProgressReport) return out;
  reported_step_ = progress.step;
  reported_at_ = now;
  rdzv::Progress report;
  report.set_step(progress.step);
  report.set_count(progress.count);
  report.set_age_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(now - progress.written)));
  report.set_round(round_);
  out.push_back(action::SendHeartbeat{std::move(report), ++heartbeat_seq_});
  return out;
}

std::string ElasticState::WhyNotRideOut(const std::vector<PeerAnswer>& answers,
                                        absl::Time now) const {
  if (answers.empty()) {
    // Alone in its round: nobody to ask. The rendezvous could seat a spare
    // on its seats once it has dropped this node, heartbeat_timeout after
    // it last heard from it.
    if (now - *unreachable_since_ < options_.heartbeat_timeout) return "";
    return absl::StrCat("it has not reached the rendezvous for heartbeat_timeout (",
                        Seconds(options_.heartbeat_timeout),
                        " s), after which the rendezvous drops it");
  }
  for (const PeerAnswer& peer : answers) {
    if (peer.answered && peer.round > round_) {
      return absl::StrCat("node ", peer.node, " is in round ", peer.round,
                          " already: the rendezvous dropped this node");
    }
  }
  for (const PeerAnswer& peer : answers) {
    if (!peer.answered) {
      return absl::StrCat("node ", peer.node, " of its round does not answer either");
    }
  }
  // Every peer is in this round still. One that reaches the rendezvous
  // would know of a newer round (its watch), so none has started: the
  // workers keep running, and the next answers say when one does.
  return "";
}

Actions ElasticState::OnPeersAnswered(int64_t round, const std::vector<PeerAnswer>& answers,
                                      absl::Time now) {
  Actions out;
  if (round != round_ || phase_ != AgentPhase::kRunning || !unreachable_since_ || !RidesOut()) {
    return out;
  }
  const std::string why = WhyNotRideOut(answers, now);
  if (why.empty()) {
    peers_at_ = now + options_.keep_alive_interval;
    auto reaches = std::find_if(answers.begin(), answers.end(),
                                [](const PeerAnswer& peer) { return peer.reaches_rendezvous; });
    if (reaches != answers.end() && !told_peer_reaches_) {
      told_peer_reaches_ = true;
      Log(&out, Level::kInfo,
          absl::StrCat("node ", reaches->node, " of its round reaches the rendezvous, which ",
                       "this node does not: a fault between the two; its workers keep running ",
                       "while every node of the round is in it still"));
    }
    return out;
  }
  // Just woken (SIGSTOP) into an outage, it asks at once: "for 0.0 s" would mislead.
  const absl::Duration away = now - *unreachable_since_;
  Log(&out, Level::kWarn,
      absl::StrCat("the rendezvous at ", options_.rdzv_target,
                   away < absl::Milliseconds(100) ? std::string(" does not answer")
                                                  : absl::StrFormat(" has not answered for %.1f s",
                                                                    absl::ToDoubleSeconds(away)),
                   " and ", why, "; stopping this node's workers (round ", round_,
                   ") so that no newer round runs beside them, and rejoining"));
  peers_at_.reset();
  after_stop_ = AfterStop::kRejoin;
  StopWorkers(SIGTERM, now, &out);
  return out;
}

PeerAnswer ElasticState::AnswerPeer() const {
  PeerAnswer answer;
  answer.answered = true;
  answer.round = std::max(round_, round_seen_);
  answer.reaches_rendezvous = !unreachable_since_.has_value();
  return answer;
}

std::optional<absl::Time> ElasticState::NextDeadline() const {
  if (phase_ == AgentPhase::kExiting) return std::nullopt;
  std::optional<absl::Time> next;
  for (const auto& t :
       {kill_at_, abandon_at_, heartbeat_at_, watch_retry_at_, progress_at_, join_retry_at_,
        report_retry_at_, progress_poll_at_, health_deadline_, peers_at_}) {
    if (t && (!next || *t < *next)) next = t;
  }
  return next;
}

void ElasticState::OpenWatch(Actions* out) {
  watch_open_ = true;
  watch_retry_at_.reset();
  out->push_back(action::OpenWatch{++watch_generation_, round_});
}

void ElasticState::ExitFailed(const std::string& why, Actions* out) {
  std::string report;
  if (!failures_.empty()) {
    const bool preflight = std::any_of(failures_.begin(), failures_.end(),
                                       [](const WorkerFailure& f) { return f.preflight; });
    report = FormatFailureReport(
        preflight ? "muster-allreduce (the pre-flight, --preflight)" : options_.script,
        preflight ? 1 : attempts_, failures_);
  }
  // The root cause is another node's when none of this node's failures is
  // it (host names alone cannot tell: several agents may share a host).
  const bool root_is_remote =
      closed_ && closed_->has_root_cause() &&
      std::none_of(failures_.begin(), failures_.end(), [this](const WorkerFailure& f) {
        return f.rank == closed_->root_cause().rank();
      });
  if (root_is_remote) {
    const rdzv::Failure& root = closed_->root_cause();
    absl::StrAppend(&report, "Root cause on another node: rank ", root.rank(), " on ", root.host(),
                    root.signal() != 0 ? absl::StrCat(" (signal ", root.signal(), ")")
                                       : absl::StrCat(" (exit code ", root.exit_code(), ")"),
                    root.message().empty() ? "" : ": ", root.message(), "\n");
  }
  const int code = closed_ && closed_->no_progress()  ? kExitNoProgress
                   : closed_ && closed_->progressed() ? kExitFailedAfterProgress
                                                      : kExitWorkersFailed;
  Finish(code, out);
  auto& exit = std::get<action::Exit>(out->back());
  exit.report = std::move(report);
  exit.why = why;
  exit.failures_seen = !failures_.empty();
  exit.excluded = excluded_as_job_ends_;
}

std::string ElasticState::Summary() const {
  std::string summary;
  if (closed_ && closed_->last_step() >= 0) {
    summary = absl::StrFormat(
        "the job's last step: %d; goodput %.0f%% (the share of its time in "
        "rounds that made progress)",
        closed_->last_step(), 100 * closed_->goodput());
  } else if (last_step_ >= 0) {
    summary = absl::StrCat("the last step this node's workers reached: ", last_step_);
  }
  if (closed_ && closed_->excluded_size() > 0) {
    std::vector<std::string> hosts;
    for (const rdzv::Exclusion& exclusion : closed_->excluded()) {
      hosts.push_back(absl::StrCat(exclusion.host(), " (", exclusion.cause(), ")"));
    }
    absl::StrAppend(&summary, summary.empty() ? "" : "; ",
                    "hosts excluded: ", absl::StrJoin(hosts, "; "));
  }
  if (closed_ && closed_->no_progress()) {
    absl::StrAppend(&summary, summary.empty() ? "" : "; ", "exit code ", kExitNoProgress,
                    ": stuck, do not requeue");
  } else if (closed_ && closed_->progressed() && !closed_->succeeded()) {
    absl::StrAppend(&summary, summary.empty() ? "" : "; ", "exit code ", kExitFailedAfterProgress,
                    ": it made progress, a requeue resumes it");
  }
  return summary;
}

void ElasticState::Finish(int code, Actions* out) {
  phase_ = AgentPhase::kExiting;
  action::Exit exit;
  exit.code = code;
  if (stop_signal_ != 0 && in_job_) {
    // Tell the job we left on purpose, so it does not wait out a heartbeat.
    exit.leave_reason = absl::StrCat("agent stopped by ", SignalName(stop_signal_));
  }
  exit.summary = Summary();
  out->push_back(std::move(exit));
}

std::string ProgressLine(const std::string& rdzv_target,
                         const absl::StatusOr<rdzv::StatusResponse>& status) {
  if (!status.ok()) {
    return absl::StrCat("waiting for the rendezvous at ", rdzv_target, " (",
                        status.status().message(), ")");
  }
  const rdzv::StatusResponse& job = *status;
  std::string line = absl::StrCat(
      "waiting for nodes: ", job.participants(), "/", job.config().max_nodes(), " joined (min ",
      job.config().min_nodes(), ", max ", job.config().max_nodes(), ")");
  if (job.last_call_remaining_ms() >= 0) {
    absl::StrAppend(&line, ", last call ends in ", (job.last_call_remaining_ms() + 999) / 1000,
                    " s");
  }
  if (job.missing_count() > 0) {
    absl::StrAppend(&line, "; not back yet: ", absl::StrJoin(job.missing(), ", "));
    if (job.missing_count() > job.missing_size()) {
      absl::StrAppend(&line, " and ", job.missing_count() - job.missing_size(), " more");
    }
  }
  return line;
}

}  // namespace muster
