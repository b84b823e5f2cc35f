// The agent's elastic rules as a pure state machine: what a node agent does
// when its round is assigned, a worker exits, a signal arrives, the
// rendezvous pushes a new round or closes the job, a heartbeat goes
// unanswered, or a timer is due. Events go in with the time; actions come
// out, in the order they are to be carried out. No processes, sockets or
// clocks: agent.cc carries the actions out, and the tests drive every
// phase x event pair on fake time.
#ifndef MUSTER_AGENT_ELASTIC_STATE_H_
#define MUSTER_AGENT_ELASTIC_STATE_H_

#include <signal.h>

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/child_process.h"
#include "agent/failure_report.h"
#include "proto/rendezvous.pb.h"

namespace muster {

// What the rules need to know of the launch.
struct ElasticOptions {
  std::string script;             // for the failure report's title
  std::string rdzv_target;        // where the rendezvous is, for messages
  bool hosts_rendezvous = false;  // the server runs in this process: stay until the job closes
  // Part of the rendezvous runs in this process (a member of host mode's
  // own etcd cluster, ha=1): a node that finished stays until the job
  // closes, as a host does; all else is as for any other node (excluded,
  // it leaves: its member leaves the cluster with it).
  bool stays_until_closed = false;
  absl::Duration join_timeout = absl::Minutes(10);
  absl::Duration keep_alive_interval = absl::Seconds(5);
  int keep_alive_max_attempt = 3;
  absl::Duration shutdown_grace = absl::Seconds(30);
  // Signals that stop the job (--signals-to-handle); any other that reaches
  // OnSignal is only forwarded to the workers.
  std::vector<int> stop_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  // --preflight allreduce: in a round whose assignment says so (one that
  // seats a node new to it; round 0), this node's workers first run the
  // pre-flight all-reduce; the script starts when all of them pass. One
  // that fails closes the job in round 0 (no restart mends a broken
  // communication path); later, it excludes the round's new nodes.
  bool preflight = false;
  // How often the workers' progress files are read while they run
  // (action::ReadProgress); zero: never.
  absl::Duration progress_poll = absl::Seconds(1);
  // A node is seated only once its GPUs pass a health check (NVML: no
  // fault pending, as many GPUs as --nproc-per-node gpu asked for): the
  // first join waits for action::CheckHealth's answer, kHealthCheckWait at most.
  bool health_check = false;
  // The edge can ask the other nodes of the round which round they are in
  // (action::AskPeers). Then a node that rides out an outage of the
  // rendezvous (musterd, etcd) with its workers running does so only while
  // every other node of its round says it is in the same round and cannot
  // reach the rendezvous either: a node cut off alone, whose seats the
  // rendezvous will give to a newer round, stops its workers at once.
  // Without it, such a node's old round runs until its link comes back.
  bool ask_peers = false;
  // Heartbeats go on while the watch stream is open: the stream is no sign
  // that the rendezvous answers (RendezvousClient::WatchOutlivesOutages).
  // Else an agent cut off from etcd would never learn it, nor ask its peers.
  bool heartbeat_with_watch = false;
  // The job's heartbeat_timeout: the rendezvous drops a node silent for
  // this long. A node alone in its round (no peer to ask) rides out an
  // outage this long at most.
  absl::Duration heartbeat_timeout = absl::Seconds(30);
};

// What another node of the round says when asked (action::AskPeers), or
// that it did not answer.
struct PeerAnswer {
  std::string node;       // who, for messages (its host)
  bool answered = false;  // false: no answer within the timeout
  int64_t round = -1;     // the newest round it knows of
  bool reaches_rendezvous = false;
};

// The phases of an agent. Workers live only in kRunning and kStopping.
enum class AgentPhase {
  kIdle,       // not started
  kJoining,    // a Join is in flight; no workers
  kRunning,    // this round's workers run
  kStopping,   // the workers are being stopped (grace, then SIGKILL)
  kFinishing,  // every worker succeeded; ReportDone is in flight or the job has yet to close
  kExiting,    // done: Exit was emitted; every later event is ignored
};

// What to do once every worker of the attempt has stopped.
// kExitLeave: this node cannot go on (it could not start its workers for a
// lack of its own); it leaves the job, which spends no restart on it.
// kExitExcluded: the rendezvous excluded this node's host (a bad node).
enum class AfterStop {
  kAwaitDecision,
  kRejoin,
  kExitFailed,
  kExitSignal,
  kExitLeave,
  kExitExcluded
};

// How far this node's workers got, as read from their MUSTER_PROGRESS_FILEs:
// the highest step any of them wrote, the count beside it, and when.
struct NodeProgress {
  int64_t step = -1;  // -1: none written
  int64_t count = 0;
  absl::Time written;
};

// Results of the rendezvous calls, and what its watch stream pushes.
namespace rdzv_event {
struct Joined {
  absl::StatusOr<rdzv::Assignment> assignment;
};
// An event of watch `generation` (see OpenWatch).
struct Pushed {
  uint64_t generation = 0;
  rdzv::WatchEvent event;
};
struct WatchEnded {
  uint64_t generation = 0;
  absl::Status status;
};
struct FailureReported {
  absl::Status status;
};
struct DoneReported {
  absl::Status status;
};
struct HeartbeatAnswered {
  absl::StatusOr<int64_t> round;
  uint64_t seq = 0;  // the SendHeartbeat's
};
struct JobStatusAnswered {
  absl::StatusOr<rdzv::StatusResponse> job;
};
}  // namespace rdzv_event

using RdzvEvent = std::variant<rdzv_event::Joined, rdzv_event::Pushed, rdzv_event::WatchEnded,
                               rdzv_event::FailureReported, rdzv_event::DoneReported,
                               rdzv_event::HeartbeatAnswered, rdzv_event::JobStatusAnswered>;

// What the rules ask of the edges.
namespace action {
// Join the job's rendezvous, waiting at most `timeout` (what is left of
// join_timeout); the answer comes back as rdzv_event::Joined.
struct Join {
  absl::Duration timeout = absl::InfiniteDuration();
  // The health check before this node's first join failed: what failed
  // (JoinRequest.health_fault; the rendezvous excludes the host).
  std::string health_fault;
};
// Check this node's GPUs before its first join (the GPU watcher); the
// answer comes back as ElasticState::OnHealthChecked.
struct CheckHealth {};
// Start this node's workers for `assignment`, attempt number `attempt`
// (0, 1, ...); then call ElasticState::OnWorkersStarted. `preflight`: start
// the pre-flight all-reduce in their places; once its exits are in, this
// action comes again for the script.
struct StartWorkers {
  rdzv::Assignment assignment;
  int attempt = 0;
  bool preflight = false;
};
// Send `sig` to the process group of every worker still running.
struct SignalWorkers {
  int sig = 0;
  // They did not stop within the grace: take their stacks first (where they hung).
  bool stacks_first = false;
};
// Give up on every worker still running: SIGKILL did not end them within
// kKillWait (they are stuck in the kernel). Say which, by pid, and drop them
// without waiting (Process::Abandon).
struct AbandonWorkers {};
// Tell the rendezvous that a worker of `round` failed.
struct ReportFailure {
  int64_t round = -1;
  WorkerFailure failure;
};
// Tell the rendezvous that every worker of `round` succeeded.
struct ReportDone {
  int64_t round = -1;
};
// `progress`: this node's workers wrote a new step since the last report.
struct SendHeartbeat {
  std::optional<rdzv::Progress> progress;
  // Given back with its answer (rdzv_event::HeartbeatAnswered::seq).
  uint64_t seq = 0;
};
// Read the workers' progress files (MUSTER_PROGRESS_FILE), then call
// ElasticState::OnProgress with what they say.
struct ReadProgress {};
// Open (or replace) the watch stream; its events carry `generation`.
struct OpenWatch {
  uint64_t generation = 0;
  int64_t known_round = -1;
};
// Ask the job's status, for the progress line while this node waits.
struct QueryStatus {};
// Ask every other node of `round` what it knows (ElasticOptions::ask_peers),
// each within `timeout`; then call ElasticState::OnPeersAnswered with one
// PeerAnswer per node (none: this node is alone in its round).
struct AskPeers {
  int64_t round = -1;
  absl::Duration timeout;
};
// This node found itself bad (`cause`: a GPU fault): leave the job asking
// that its host be excluded (LeaveRequest.exclude); no answer is awaited.
struct ExcludeSelf {
  std::string cause;
};
struct Log {
  enum class Level { kDebug, kInfo, kWarn, kError } level = Level::kInfo;
  std::string text;
};
// The agent is done: exit with `code`. Before that, print `report` (the
// failure table, may be empty) to stderr and log `why` (may be empty) as an
// error; `failures_seen` says this node had failed workers (their logs are
// worth pointing at). `leave_reason`: tell the rendezvous this node left.
struct Exit {
  int code = 0;
  std::string report;
  std::string why;
  bool failures_seen = false;
  std::optional<std::string> leave_reason;
  // A line on how far the job got (its last step, goodput, hosts excluded);
  // empty when nothing was reported.
  std::string summary;
  // This node's host was excluded: --on-node-excluded runs with it.
  std::optional<rdzv::Exclusion> excluded;
};
}  // namespace action

using Action = std::variant<action::Join, action::StartWorkers, action::SignalWorkers,
                            action::AbandonWorkers, action::CheckHealth, action::ReportFailure,
                            action::ReportDone, action::SendHeartbeat, action::ReadProgress,
                            action::OpenWatch, action::QueryStatus, action::AskPeers,
                            action::ExcludeSelf, action::Log, action::Exit>;
using Actions = std::vector<Action>;

class ElasticState {
 public:
  // How long a worker sent SIGKILL may take to be reaped before the agent
  // gives up on it and goes on (a process in D state ignores SIGKILL until
  // the kernel lets it go, which may be never).
  static constexpr absl::Duration kKillWait = absl::Seconds(10);
  // How long the first join waits for the health check to answer.
  static constexpr absl::Duration kHealthCheckWait = absl::Seconds(30);
  // How often a new step is reported at most (the first of a round at once).
  static constexpr absl::Duration kProgressReport = absl::Seconds(5);
  // The longest an agent with this grace takes from a stop to its join:
  // the grace, SIGKILL's wait, and a few seconds for the stacks and the
  // call (JoinRequest's NodeInfo.stop_allowance_ms).
  static absl::Duration StopAllowance(absl::Duration shutdown_grace) {
    return shutdown_grace + kKillWait + absl::Seconds(5);
  }
  // How long the other nodes of the round have to answer action::AskPeers.
  static constexpr absl::Duration kPeerTimeout = absl::Seconds(1);

  explicit ElasticState(ElasticOptions options);

  // Begins: the first Join.
  Actions Start(absl::Time now);

  // The workers of the latest StartWorkers are up: `started` of them run;
  // `spawn_failure` names the first that could not be started (the rest
  // were not tried), which counts as a failed worker, unless the agent
  // itself lacked what it takes (agent_out_of_resources): then the node
  // stops its workers and leaves the job with that reason.
  Actions OnWorkersStarted(int started, std::optional<WorkerFailure> spawn_failure, absl::Time now);
  // A worker exited with `status`. `failure` describes it (with what its
  // error file says) when the status is not a success.
  Actions OnWorkerExit(const ExitStatus& status, const WorkerFailure& failure, absl::Time now);
  // A signal reached the agent (never SIGCHLD: reaping is the edge's).
  Actions OnSignal(int sig, absl::Time now);
  Actions OnRdzv(RdzvEvent event, absl::Time now);
  // The time reached NextDeadline() (or later).
  Actions OnTimer(absl::Time now);
  // What ReadProgress found. A step past the last reported one is sent to
  // the rendezvous (with a heartbeat): the first of a round at once, then
  // at most every kProgressReport.
  Actions OnProgress(const NodeProgress& progress, absl::Time now);
  // The health check before the first join answered: `faults` (none: the
  // node is healthy) go with the join, which the rendezvous then refuses.
  Actions OnHealthChecked(const std::vector<std::string>& faults, absl::Time now);
  // The GPU check found a hardware fault on this node (`cause` names the
  // GPU and the fault): the node asks to be excluded (ExcludeSelf), stops
  // its workers and exits kExitNodeExcluded, as when the job excludes it.
  Actions OnNodeFault(const std::string& cause, absl::Time now);
  // The other nodes of round `round` answered action::AskPeers.
  Actions OnPeersAnswered(int64_t round, const std::vector<PeerAnswer>& answers, absl::Time now);
  // What this node tells a peer that asks (action::AskPeers).
  PeerAnswer AnswerPeer() const;
  // This node's workers' progress in the running round, as last read.
  const NodeProgress& progress() const { return progress_; }

  // When OnTimer must next run; nullopt: no timer is set.
  std::optional<absl::Time> NextDeadline() const;

  // The round a heartbeat answer says the job has moved on to, when this
  // node missed its push; nullopt when the answer tells nothing new.
  std::optional<rdzv::RoundChanged> MissedRound(const absl::StatusOr<int64_t>& answer) const;

  AgentPhase phase() const { return phase_; }
  bool done() const { return phase_ == AgentPhase::kExiting; }
  // True while the workers that run are being stopped (their exits are not
  // failures of their own, and what they leave behind is killed with them).
  bool stopping() const { return phase_ != AgentPhase::kRunning; }
  int live_workers() const { return live_; }
  int64_t round() const { return round_; }
  int attempts() const { return attempts_; }
  // The workers that run are the pre-flight's, not the script's.
  bool in_preflight() const { return after_preflight_.has_value(); }
  AfterStop after_stop() const { return after_stop_; }

 private:
  void StartJoin(absl::Time now, Actions* out);
  // Sends the Join of the join that began at join_started_.
  void SendJoin(absl::Time now, Actions* out);
  // Whether this node waits out an outage of the rendezvous: it runs apart
  // from the job's nodes (the assignment says so), and this node is not
  // the one that hosts it.
  bool RidesOut() const { return ride_out_ && !options_.hosts_rendezvous; }
  bool StaysUntilClosed() const { return options_.hosts_rendezvous || options_.stays_until_closed; }
  // A call to the rendezvous went unanswered (`status`): says so, and what
  // this node does meanwhile, once per outage.
  void NoteUnreachable(const absl::Status& status, absl::Time now, Actions* out);
  // What this node does while the rendezvous is away, in its phase.
  std::string Meanwhile(absl::Time now) const;
  // Why this node's workers may not ride out the outage, from what its
  // peers answered; empty: they may.
  std::string WhyNotRideOut(const std::vector<PeerAnswer>& answers, absl::Time now) const;
  // The rendezvous answered: ends an outage, saying so.
  void NoteReachable(absl::Time now, Actions* out);
  // Whether `status` is the rendezvous not answering (rather than refusing).
  static bool IsUnanswered(const absl::Status& status);
  // Whether the report under way is sent again after this unanswered try:
  // while the rendezvous is ridden out, until report_deadline_; otherwise
  // up to keep_alive_max_attempt tries, as heartbeats get.
  bool RetriesReport(const absl::Status& status, const char* what, absl::Time now, Actions* out);
  // What a kFailedPrecondition answer for a closed job tells (rdzv::ClosedJob).
  static rdzv::JobClosed ClosedBy(const absl::Status& status);
  void OnJoined(absl::StatusOr<rdzv::Assignment> assignment, absl::Time now, Actions* out);
  // The assignment this node takes: its workers start.
  void StartRound(rdzv::Assignment assignment, absl::Time now, Actions* out);
  // The heartbeat that checks unverified_ answered.
  void OnVerified(const absl::StatusOr<int64_t>& answer, absl::Time now, Actions* out);
  void ReportFailureAndStop(const WorkerFailure& failure, absl::Time now, Actions* out);
  // The last of failures_ is the pre-flight's: marked so, and the script's
  // start that waited for it dropped.
  void EndPreflightFailed();
  void StopWorkers(int sig, absl::Time now, Actions* out);
  void OnAllStopped(absl::Time now, Actions* out);
  void OnPushed(const rdzv::WatchEvent& event, absl::Time now, Actions* out);
  void OnRoundChanged(const rdzv::RoundChanged& changed, absl::Time now, Actions* out);
  void OnWatchEnded(const rdzv_event::WatchEnded& ended, absl::Time now, Actions* out);
  void OnFailureReported(const absl::Status& status, absl::Time now, Actions* out);
  void OnDoneReported(const absl::Status& status, absl::Time now, Actions* out);
  void OnHeartbeat(const absl::StatusOr<int64_t>& round, absl::Time now, Actions* out);
  void OnJobClosed(const rdzv::JobClosed& closed, absl::Time now, Actions* out);
  void OnNodeExcluded(const rdzv::NodeExcluded& excluded, absl::Time now, Actions* out);
  // What an exclusion does in each phase, once excluded_ says why.
  void StopForExclusion(absl::Time now, Actions* out);
  // The exit with kExitNodeExcluded, saying why.
  void ExitExcluded(const std::string& why, Actions* out);
  // Exit::summary: how far the job (or this node) got.
  std::string Summary() const;
  void OpenWatch(Actions* out);
  void ExitFailed(const std::string& why, Actions* out);
  // The job cannot go on with this rendezvous (it stopped answering, or it
  // refused our credential): stops the workers, if any, and exits failed
  // with `why`.
  void GiveUp(const std::string& why, absl::Time now, Actions* out);
  void Finish(int code, Actions* out);

  const ElasticOptions options_;
  AgentPhase phase_ = AgentPhase::kIdle;
  AfterStop after_stop_ = AfterStop::kAwaitDecision;
  int stop_signal_ = 0;  // the signal that is ending the agent, if any
  bool in_job_ = false;  // joined once: heartbeats and the watch run
  bool watch_open_ = false;
  // The server said the open watch stream counts as this node's heartbeat
  // (WatchStarted): no Heartbeat calls while it stays open. The channel's
  // keepalive pings find a server that vanished; that ends the stream.
  bool watch_started_ = false;
  uint64_t watch_generation_ = 0;  // tells the current watch from replaced ones
  int64_t round_ = -1;
  int64_t round_seen_ = -1;  // the newest round announced to this node
  int attempts_ = 0;
  int live_ = 0;
  int heartbeat_failures_ = 0;  // in a row
  // From the latest assignment: the rendezvous runs apart from the nodes.
  bool ride_out_ = false;
  // Since when the rendezvous has not answered; unset while it does.
  std::optional<absl::Time> unreachable_since_;
  // When the join under way began: its retries end at join_timeout from it.
  std::optional<absl::Time> join_started_;
  // The failure report (or done report) under way, resent while the
  // rendezvous is away, until its deadline (join_timeout after the first).
  std::optional<action::ReportFailure> unreported_failure_;
  std::optional<int64_t> unreported_done_;
  absl::Time report_deadline_;
  int report_failures_ = 0;  // unanswered tries of the report under way
  std::optional<rdzv::JobClosed> closed_;
  std::vector<WorkerFailure> failures_;  // of the latest failed attempt
  std::string leave_why_;                // AfterStop::kExitLeave: what this node lacks
  // An assignment that waited while this process did not run: its round
  // is checked with a heartbeat before the workers start.
  std::optional<rdzv::Assignment> unverified_;
  uint64_t verify_seq_ = 0;     // the heartbeat whose answer checks it
  uint64_t heartbeat_seq_ = 0;  // the last SendHeartbeat's seq
  // When a late timer last showed that this process had not run.
  std::optional<absl::Time> resumed_at_;
  // The pre-flight's workers run; the script waits for them with this assignment.
  std::optional<rdzv::Assignment> after_preflight_;

  // This node's host was excluded from the job: why (NodeExcluded, or a refused join).
  std::optional<rdzv::Exclusion> excluded_;
  // Excluded by the failure that also ended the job (NodeExcluded.job_ends):
  // the node ends as the job does, and --on-node-excluded still runs.
  std::optional<rdzv::Exclusion> excluded_as_job_ends_;
  // Progress of this round's workers, and what of it was reported.
  NodeProgress progress_;
  int64_t reported_step_ = -1;
  absl::Time reported_at_;
  int64_t last_step_ = -1;  // the highest step this node's workers wrote, any round
  std::optional<absl::Time> progress_poll_at_;
  // The health check before the first join: when it is given up on; and
  // what it found, sent with every join.
  std::optional<absl::Time> health_deadline_;
  std::string health_fault_;

  // When workers that SIGKILL did not end are given up on.
  std::optional<absl::Time> abandon_at_;
  std::optional<absl::Time> kill_at_, heartbeat_at_, watch_retry_at_, progress_at_, join_retry_at_,
      report_retry_at_;
  // While the rendezvous is away and the workers run: when the round's
  // other nodes are asked again (ElasticOptions::ask_peers).
  std::optional<absl::Time> peers_at_;
  // Said once an outage: a peer of the round reaches the rendezvous.
  bool told_peer_reaches_ = false;
};

// One line for the progress report while a node waits for its round: who is
// there, and who is not. `status` is the answer to QueryStatus.
std::string ProgressLine(const std::string& rdzv_target,
                         const absl::StatusOr<rdzv::StatusResponse>& status);

}  // namespace muster

#endif  // MUSTER_AGENT_ELASTIC_STATE_H_
