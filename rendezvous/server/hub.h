// The rendezvous as a live, thread-safe object: the state machine, a clock
// and a timer thread, the joins waiting for their round and the nodes
// watching their job. Results leave through callbacks, so the gRPC service
// and the in-process client are both thin adapters over one hub.
//
// Callbacks never run with the hub's lock held (they may call back into the
// hub), and may run on the caller's thread before the call returns.
#ifndef MUSTER_RENDEZVOUS_SERVER_HUB_H_
#define MUSTER_RENDEZVOUS_SERVER_HUB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "rendezvous/rules/state.h"
#include "rendezvous/server/journal.h"

namespace muster::rdzv {

// How a hub keeps time, and what it lets clients make it hold.
struct HubOptions {
  // Where every call and timer reads the time. Not owned; must outlive the hub.
  const Clock* clock = &Clock::Real();
  // Whether the hub's own thread runs each deadline (join, heartbeat and
  // last-call timeouts, a closed job's retention) once the clock reaches it.
  // Without it nothing times out until the owner calls RunDueTimers: for a
  // hub on a FakeClock, whose time a thread waiting on real time would not
  // see move.
  bool timer_thread = true;
  // Bounds on jobs (see StateOptions).
  StateOptions state;
  // Where the durable changes go (musterd --state-dir); null: they are not
  // kept. The hub writes each change's records and makes them durable
  // before anything that depends on them leaves it (an answer, a pushed
  // event), and compacts the journal when it grows.
  std::shared_ptr<JournalWriter> journal;
  // Read back from `journal` as it opened: the state starts from them, its
  // timers from now (RendezvousState::Restore).
  std::vector<JournalRecord> restore;
  // Runs once if the journal cannot be written or synced: the state is no
  // longer durable, and nothing that depended on the failed write was
  // delivered. Null: log it and abort.
  std::function<void(const absl::Status&)> on_journal_failure;
  // Told every job event (RendezvousState's Effects::events) in the order
  // they happen, with the hub's lock held: it must be quick and must not
  // call into the hub (musterd --event-log writes a line). Null: nobody.
  std::function<void(const JobEvent&)> on_event;
};

class RendezvousHub {
 public:
  using JoinDone = std::function<void(absl::StatusOr<Assignment>)>;
  struct Watcher {
    std::function<void(const WatchEvent&)> on_event;
    // Runs once, when the watch ends for any reason but the job's close:
    // replaced (kAborted), cancelled (kCancelled), shutdown (kUnavailable),
    // or refused at the start (unknown job or node). After a JobClosed event
    // the hub just forgets the watcher.
    std::function<void(absl::Status)> on_end;
  };

  // Starts the timer thread, unless options.timer_thread is false.
  explicit RendezvousHub(HubOptions options = {});
  // Shuts down.
  ~RendezvousHub();
  RendezvousHub(const RendezvousHub&) = delete;
  RendezvousHub& operator=(const RendezvousHub&) = delete;

  // How Shutdown leaves the jobs.
  enum class Jobs {
    // Gone with the hub: pending joins and watches end kFailedPrecondition
    // (the job is lost).
    kLost,
    // Kept in the journal for the next start: they end kUnavailable, and
    // their agents call again (they ride out the outage).
    kKept,
  };
  // Ends every pending join and watch (see Jobs) and stops the timer
  // thread. Later calls fail with kUnavailable.
  void Shutdown(Jobs jobs = Jobs::kLost);

  // A ticket names one join or watch, so that a late cancel of an old one
  // cannot end its successor.
  uint64_t NewTicket();

  // Starts a join. `done` runs exactly once: with the assignment when the
  // round completes, or with an error (refused, job closed, timeout,
  // cancelled, shutdown). `peer` is the address the request came from. A
  // node new to the job gets a fresh secret in its assignment.
  void Join(const JoinRequest& request, const std::string& peer, uint64_t ticket, JoinDone done);
  // Ends the pending join `ticket` with kCancelled, if it is still pending,
  // and takes its node out of the job: nobody waits for that answer.
  void CancelJoin(const NodeKey& node, uint64_t ticket);

  // Subscribes the node to its job's events, starting with the one it
  // missed since `known_round`. Replaces an earlier watch of the node.
  void Watch(const WatchRequest& request, uint64_t ticket, Watcher watcher);
  // Ends the watch `ticket` with kCancelled, if it is still open.
  void CancelWatch(const NodeKey& node, uint64_t ticket);

  // Each of these, and Watch, must carry the node's secret (RendezvousState).
  absl::StatusOr<int64_t> Heartbeat(const HeartbeatRequest& request);
  absl::Status ReportFailure(const ReportFailureRequest& request);
  absl::Status ReportDone(const ReportDoneRequest& request);
  absl::Status Leave(const LeaveRequest& request);
  // The node is gone, as its owner's liveness says (HubOptions::state's
  // external_liveness): RendezvousState::DropNode. musterd has none; the
  // simulator's etcd leader does, as rendezvous/etcd/leader.cc does.
  void DropNode(const NodeKey& node, const std::string& why);
  // An operator's calls (no node secret; the caller checked who asks).
  absl::StatusOr<StatusResponse> Status(const std::string& job_id, bool nodes = false);
  // The jobs whose ids start with `prefix` (RendezvousState::ListJobs).
  ListJobsResponse ListJobs(const std::string& prefix);
  absl::Status Stop(const std::string& job_id, const std::string& reason);

  // Someone following a job's events (musterctl watch).
  struct Observer {
    // Runs with the hub's lock held, in the order the events happen: it
    // must only queue the event (no call into the hub, nothing that blocks).
    std::function<void(const JobEvent&)> queue;
    // Runs after, without the lock: sends what was queued.
    std::function<void()> flush;
    // Runs once if the hub ends the observation before a final event
    // (IsFinalEvent): at Shutdown (kUnavailable). Every job is forgotten
    // after a final event (a closed one restored from a journal has its
    // JOB_CLOSED in its history), so no observer outlives its job.
    std::function<void(absl::Status)> on_end;
  };
  // Queues the job's last events (its history), then each new one up to
  // and including a final event, after which the hub forgets the observer.
  // Errors, with nothing queued: kNotFound unknown job, kUnavailable after
  // Shutdown. Events reach observers as they happen, before the journal
  // holds them: they tell what happened, nothing depends on them.
  absl::Status ObserveJob(const std::string& job_id, uint64_t ticket, Observer observer);
  // Forgets the observer `ticket` of the job, if the hub still has it.
  void CancelObserve(const std::string& job_id, uint64_t ticket);

  // How many jobs the hub holds: open (not closed yet), and in all.
  struct JobCount {
    size_t open = 0;
    size_t all = 0;
  };
  JobCount CountJobs();
  // Every job's figures, for the metrics (RendezvousState::Figures).
  std::vector<RendezvousState::JobFigures> Figures();
  // The durable state, as the journal would be compacted to it
  // (RendezvousState::Snapshot): what a restart from the journal must give back.
  std::vector<JournalRecord> Snapshot();

  // Runs every deadline due at the clock's now, as the timer thread does
  // when it wakes, and delivers what follows (failed joins, completed
  // rounds, events) on the calling thread before it returns. Does nothing
  // after Shutdown. Safe alongside the timer thread, but meant for a hub
  // without one: a test moves its FakeClock, then calls this.
  void RunDueTimers();
  // The earliest deadline still to run, if any: the time at which
  // RunDueTimers next has something to do.
  std::optional<absl::Time> NextDeadline();

 private:
  struct PendingJoin {
    uint64_t ticket;
    JoinDone done;
  };
  struct Subscription {
    uint64_t ticket;
    std::shared_ptr<Watcher> watcher;
  };
  // What a state change sends out, collected under mu_ and run after.
  struct Deliveries {
    std::vector<std::pair<JoinDone, absl::StatusOr<Assignment>>> joins;
    std::vector<std::pair<std::shared_ptr<Watcher>, WatchEvent>> events;
    std::vector<std::pair<std::shared_ptr<Watcher>, absl::Status>> ends;
    // Observers with events queued, and observers ended.
    std::vector<std::shared_ptr<Observer>> flushes;
    std::vector<std::pair<std::shared_ptr<Observer>, absl::Status>> observer_ends;
    // The journal position they depend on (0: none).
    uint64_t sync_to = 0;
    bool empty() const {
      return joins.empty() && events.empty() && ends.empty() && flushes.empty() &&
             observer_ends.empty();
    }
  };

  void ApplyLocked(Effects& effects, Deliveries* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes what `deliveries` depends on durable, then runs it.
  void Deliver(Deliveries& deliveries);
  // Returns once the journal holds everything up to `position` (0, or no
  // journal: at once); kUnavailable when it cannot.
  absl::Status SyncJournal(uint64_t position);
  // The journal failed: from now on nothing that depends on it is
  // delivered. Any thread, the lock held or not.
  void MarkJournalFailed(const absl::Status& status);
  // After MarkJournalFailed, outside the lock: tells the owner (once) and
  // shuts the hub down, keeping the jobs as far as they were written.
  void OnJournalFailed();
  // Runs `change` on the state under mu_, then delivers its effects. Its
  // lambdas say they hold mu_ (ABSL_EXCLUSIVE_LOCKS_REQUIRED), for clang's
  // -Wthread-safety, which cannot see through the std::function.
  absl::Status Mutate(const std::string& job_id,
                      const std::function<absl::Status(Effects*)>& change);
  // While the server stops: ClosedJob for a job that closed, else `otherwise`.
  absl::Status ClosedOr(const std::string& job_id, absl::Status otherwise) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  const Clock& clock_;
  const std::shared_ptr<JournalWriter> journal_;
  const std::function<void(const absl::Status&)> on_journal_failure_;
  const std::function<void(const JobEvent&)> on_event_;
  std::atomic<bool> journal_failed_{false};
  std::atomic<bool> journal_failure_told_{false};
  absl::Mutex journal_error_mu_;
  absl::Status journal_error_ ABSL_GUARDED_BY(journal_error_mu_);
  absl::Mutex mu_;
  RendezvousState state_ ABSL_GUARDED_BY(mu_);
  std::map<NodeKey, PendingJoin> joins_ ABSL_GUARDED_BY(mu_);
  std::map<NodeKey, Subscription> watches_ ABSL_GUARDED_BY(mu_);
  // By job id and ticket.
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<Observer>> observers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool state_changed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVER_HUB_H_
