// The rendezvous rules, as a pure state machine: no sockets, no clocks, no
// threads. Every call takes the current time and returns what the server must
// do (complete a pending join, push an event to a node) as Effects. The gRPC
// service only translates; every rendezvous rule (docs/ARCHITECTURE.md) lives here.
//
// Thread safety: none; the caller serializes all calls.
#ifndef MUSTER_RENDEZVOUS_RULES_STATE_H_
#define MUSTER_RENDEZVOUS_RULES_STATE_H_

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/journal.pb.h"
#include "proto/rendezvous.pb.h"
#include "rendezvous/rules/log_limiter.h"
#include "rendezvous/rules/text.h"

namespace muster::rdzv {

// A node of a job, as the server addresses it.
struct NodeKey {
  std::string job_id;
  std::string node_id;
  friend bool operator==(const NodeKey&, const NodeKey&) = default;
  friend auto operator<=>(const NodeKey&, const NodeKey&) = default;
};

// What a state change asks of the server, in order.
struct Effects {
  // Pending joins that now complete with these assignments.
  std::vector<std::pair<NodeKey, Assignment>> assigned;
  // Pending joins that now fail.
  std::vector<std::pair<NodeKey, absl::Status>> join_failed;
  // Events for the watch stream of these nodes.
  std::vector<std::pair<NodeKey, WatchEvent>> pushed;
  // One line per thing an operator wants to see in the log ("round 2 formed ...").
  std::vector<std::string> log;
  // What happened to jobs, in order, for those who follow them (musterctl
  // watch, musterd --event-log, metrics).
  std::vector<JobEvent> events;
  // The durable changes, in order (StateOptions::journal): a server that
  // keeps its state writes them, durably, before anything else above
  // leaves it.
  std::vector<JournalRecord> journal;
  // A timer deadline may have moved earlier: the hub's timer must look again.
  bool rearm_timer = false;

  bool empty() const {
    return assigned.empty() && join_failed.empty() && pushed.empty() && log.empty() &&
           events.empty() && journal.empty();
  }
};

// What a join may carry: bounds on every field, so that what a client sends
// cannot make the server hold, log or send back more than a few KiB.
inline constexpr size_t kMaxJobIdLength = 256;
// What a rendezvous may put before a client's job id to keep uids apart
// ("4294967295/", see RendezvousService): the hub's ids are this much longer.
inline constexpr size_t kMaxJobNamespaceLength = 11;
inline constexpr size_t kMaxNodeIdLength = 512;
inline constexpr size_t kMaxHostLength = 255;  // host and advertised_addr
inline constexpr int32_t kMaxLocalWorldSize = 65536;
inline constexpr int32_t kMaxNodes = 65536;
inline constexpr int32_t kMaxRestarts = 1'000'000;
inline constexpr int64_t kMinHeartbeatTimeoutMs = 1'000;
inline constexpr int64_t kMaxTimeoutMs = 7 * 24 * 3600 * 1000LL;  // 7 days
// A failure's message (a worker's traceback) is kept up to this size, cut
// beyond it; never refused.
inline constexpr size_t kMaxFailureMessageBytes = 64 * 1024;
// Every other text the server builds from client input and sends back (a
// round change's detail, a close reason, a leave reason): short enough to
// travel in a gRPC status, whose message goes in an 8 KiB header block
// percent-encoded (up to 3 bytes per byte).
inline constexpr size_t kMaxDetailBytes = 2048;
inline constexpr size_t kMaxReasonBytes = 256;
// What a progress report may say: a step and a count of 0..2^53 (exact in a
// double, as the metrics carry them), written up to a day ago.
inline constexpr int64_t kMaxProgressValue = int64_t{1} << 53;
inline constexpr int64_t kMaxProgressAgeMs = 24 * 3600 * 1000LL;
// Hosts a job keeps out at most (bad nodes); past it the oldest exclusion
// is forgotten.
inline constexpr size_t kMaxExclusions = 1024;
// A job's PROGRESS events: the first step of each round, then at most one
// this often.
inline constexpr absl::Duration kProgressEventInterval = absl::Minutes(1);

// Checks a job id: 1..max_length (256 for a client's id) printable ASCII
// characters with no white space.
absl::Status ValidateJobId(absl::string_view job_id, size_t max_length = kMaxJobIdLength);
// Checks a job's rules: 0 < min <= max <= 65536, 0 <= max_restarts <=
// 1,000,000, timeouts 0..7 days, heartbeat_timeout at least 1 s.
absl::Status ValidateJobConfig(const JobConfig& config);
// Why a call for a closed job is refused (kFailedPrecondition), the same
// from every rendezvous (musterd, an agent's, etcd's): "job 'J' is closed
// (REASON)", or "job 'J' succeeded and is closed (REASON)" (kJobSucceeded).
absl::Status ClosedJob(absl::string_view job_id, absl::string_view reason, bool succeeded);
// A join's: ClosedJob, and what to do instead.
absl::Status JoinToClosedJob(absl::string_view job_id, absl::string_view reason, bool succeeded);

// Checks a whole join: the protocol version (kFailedPrecondition when it is
// not this build's), the job id, its config and the node's fields
// (kInvalidArgument, naming the field and its bound).
absl::Status ValidateJoinRequest(const JoinRequest& request);

// What the server keeps of a job for its operators: its last events (a
// watch starts with them), each event's detail cut to this, and its last
// worker failures, their messages cut to this. About 40 KiB a job at most.
inline constexpr size_t kMaxJobHistory = 32;
// RoundChanged::Reason's values, 0 (a job's first round) included.
inline constexpr size_t kRoundReasons = RoundChanged::Reason_MAX + 1;
inline constexpr size_t kMaxEventDetailBytes = 1024;
inline constexpr size_t kMaxRecentFailures = 4;
inline constexpr size_t kMaxStatusMessageBytes = 4096;
// What one Status or ListJobs answer lists at most.
inline constexpr size_t kMaxListedNodes = 10'000;
inline constexpr size_t kMaxListedJobs = 1'000;

// Whether a job event ends its job's stream of events.
bool IsFinalEvent(const JobEvent& event);

// How long a closed job is remembered before Advance forgets it.
inline constexpr absl::Duration kClosedJobRetention = absl::Minutes(10);

// What a server lets its clients make it hold.
struct StateOptions {
  // A job with no live node (every node left, was lost, or cancelled its
  // join) is forgotten once its join_timeout has passed with no node in it,
  // or this long, whichever is shorter: a client's join_timeout cannot keep
  // an empty job for longer.
  absl::Duration max_join_timeout = absl::Hours(1);
  // Open (not yet closed) jobs at most; a join that would open one more is
  // refused with kResourceExhausted.
  size_t max_jobs = 10'000;
  // Closed jobs kept (for kClosedJobRetention, so that late nodes learn how
  // the job ended) at most; past it the longest closed are forgotten first.
  // With max_jobs, what bounds the server's memory whatever clients do.
  size_t max_closed_jobs = 10'000;
  // The rendezvous runs apart from the job's nodes (musterd, etcd), so its
  // agents wait out its outages (Assignment::ride_out_outages).
  bool ride_out_outages = false;
  // Emit a JournalRecord for every durable change (Effects::journal).
  bool journal = false;
  // Whether a node is alive is known elsewhere (an etcd lease): no
  // heartbeat timeout applies, and the owner calls DropNode for a node
  // that is gone.
  bool external_liveness = false;
  // How long a watch stream had been silent, at least, when it ended for
  // an unanswered keepalive ping: the ping's timeout. Applied to every end
  // (the server cannot tell why a stream ended), so no more than that. The
  // node's heartbeat timeout counts from then, though never from more than
  // half of it before the end.
  absl::Duration stream_silence = absl::ZeroDuration();
};

class RendezvousState {
 public:
  explicit RendezvousState(StateOptions options = {}) : options_(options) {}
  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;

  // A node asks to be in the job's next round. OK means the join is pending:
  // its Assignment arrives in `effects` now or from a later call. `peer_addr`
  // is the address the server saw, used when the node advertises none.
  // `new_secret` becomes the node's secret if the node is not live in the
  // job (the caller draws it: NewNodeSecret; this class has no randomness);
  // a live node keeps its own, and its join must present it, unless it was
  // never seated (never told it): a join with the join key of its first
  // then takes the place of its pending join. Every Assignment carries the
  // node's secret.
  // Errors: kInvalidArgument bad request; kFailedPrecondition the job is
  // closed, the node's config differs from the job's, or another protocol
  // version; kPermissionDenied a join for a live node without its secret;
  // kResourceExhausted the join would open more than max_jobs jobs.
  // A refused join changes nothing, but for one whose health check failed
  // (JoinRequest.health_fault, kFailedPrecondition): its host may be
  // excluded from the job (see RefuseUnhealthy).
  absl::Status Join(const JoinRequest& request, absl::string_view peer_addr,
                    absl::string_view new_secret, absl::Time now, Effects* effects);

  // The pending join of `node` was cancelled by its caller: nobody waits for
  // its answer, so the node leaves the job. For the server only, which knows
  // the call was that node's (it holds the call); no secret.
  void CancelJoin(const NodeKey& node, absl::Time now, Effects* effects);

  // The node is gone (its etcd lease ended): it leaves the job as a node
  // silent past its heartbeat timeout does, `why` saying how. For the
  // server only; no secret. Unknown nodes are ignored.
  void DropNode(const NodeKey& node, absl::string_view why, absl::Time now, Effects* effects);

  // The assignment the node has in the job's running round, as that round
  // gave it (for a server that must give it again); nullopt when the node
  // is not in a running round.
  std::optional<Assignment> AssignmentOf(const NodeKey& node) const;

  // Every call below for a node must present the node's secret (`secret`),
  // else it fails with kPermissionDenied and changes nothing.

  // Marks the node alive. Returns the job's current round.
  // Errors: kNotFound unknown job or node; kFailedPrecondition job closed.
  absl::StatusOr<int64_t> Heartbeat(const NodeKey& node, absl::string_view secret, absl::Time now);

  // The node's watch stream opened or ended. While it is open the node needs
  // no heartbeats: the stream is its heartbeat (the server's connection
  // keepalive ends it when the host vanishes or the agent stops answering).
  // When it ends, the node's heartbeat timeout starts from `now` less
  // StateOptions::stream_silence (at most half the timeout). Unknown nodes are ignored. No
  // secret: the server calls it for a watch CatchUp accepted.
  void SetWatching(const NodeKey& node, bool watching, absl::Time now, Effects* effects);

  // A worker of `node` failed in `round`. The first report of a running round
  // opens the next one (using a restart) or, with restarts spent, closes the
  // job as failed. Reports for an older round are ignored. That first report
  // is the failure's root cause: a host that is the root cause of
  // config.max_node_failures failures in a row is excluded (never seated
  // again in the job; its nodes are told NodeExcluded and the round opens
  // without them). After config.max_no_progress_restarts restarts in a row
  // whose rounds reached no new step, the job closes as stuck
  // (JobClosed.no_progress) instead of restarting.
  // A message over kMaxFailureMessageBytes is cut, not refused.
  absl::Status ReportFailure(const NodeKey& node, absl::string_view secret, int64_t round,
                             const Failure& failure, absl::Time now, Effects* effects);

  // How far the node's workers got (a heartbeat or a report carries it).
  // Only a report of the job's running round, from one of its members,
  // counts; others change nothing. A step past the job's best so far is a
  // new step: the round made progress (see ReportFailure), which the
  // goodput and --max-no-progress-restarts count.
  // Errors: as Heartbeat; kInvalidArgument a step, count or age out of
  // bounds (kMaxProgressValue, kMaxProgressAgeMs).
  absl::Status ReportProgress(const NodeKey& node, absl::string_view secret,
                              const Progress& progress, absl::Time now, Effects* effects);

  // Every worker of `node` succeeded in `round`. The job closes as succeeded
  // once every participant is done.
  absl::Status ReportDone(const NodeKey& node, absl::string_view secret, int64_t round,
                          absl::Time now, Effects* effects);

  // The node leaves on purpose (its agent was stopped). No restart is used.
  // `exclude`: it found itself bad (a GPU fault, `reason`): its host is
  // excluded, every node of it told NodeExcluded and taken out of the job.
  absl::Status Leave(const NodeKey& node, absl::string_view secret, absl::string_view reason,
                     absl::Time now, Effects* effects, bool exclude = false);

  // Runs every timer that has expired by `now`: last call, join timeout,
  // heartbeat timeout, and forgets closed jobs past their retention and
  // empty jobs past StateOptions::max_join_timeout.
  void Advance(absl::Time now, Effects* effects);

  // The earliest time at which Advance has something to do, if any.
  std::optional<absl::Time> NextDeadline() const;

  // Applies one durable change, as Effects::journal gave it, to rebuild the
  // state after a restart: records in the order they were emitted give back
  // every job's config, round, restart count, members (with their ranks
  // and secrets) and how it closed. The timers start again at `now`: every
  // member's heartbeat deadline, an open round's join timeout, a closed
  // job's retention. Pending joins and watches are not restored: their
  // agents call again. Emits no effects. Errors (kDataLoss): a record that
  // does not fit the state (a round of a job never formed); it is skipped.
  absl::Status Restore(const JournalRecord& record, absl::Time now);

  // The fewest records that Restore, on an empty state, turns into the
  // durable part of this one: what a journal is compacted to.
  std::vector<JournalRecord> Snapshot() const;

  // `now`, when given, dates last_call_remaining_ms and the last_seen of
  // nodes whose watch stream is open. With `nodes`, lists the job's nodes.
  absl::StatusOr<StatusResponse> Status(absl::string_view job_id,
                                        std::optional<absl::Time> now = std::nullopt,
                                        bool nodes = false) const;

  // Every job whose id starts with `prefix`, by id, without its nodes or
  // failure messages (at most kMaxListedJobs; `total` counts them all).
  ListJobsResponse ListJobs(absl::string_view prefix, absl::Time now) const;

  // What the metrics tell of one job (muster_rendezvous_*).
  struct JobFigures {
    std::string id;
    const char* state = "";  // "open", "running" or "closed", as in a status
    int64_t nodes = 0;       // live nodes
    int32_t restarts = 0;    // restarts used
    // Rounds formed, by why each was opened: the index is a
    // RoundChanged::Reason, REASON_UNSPECIFIED for the job's first round.
    // Counted since the job came to this server, or since a restart.
    std::array<int64_t, kRoundReasons> rounds{};
    int64_t step = -1;              // the job's highest step; -1: none reported
    double seconds_since_step = 0;  // at `now`
    double steps_per_second = 0;    // of the running round
    double goodput = 0;             // at `now`
    int64_t excluded = 0;           // hosts kept out
    int32_t no_progress_restarts = 0;
  };
  // Every job, by id, as of `now`.
  std::vector<JobFigures> Figures(absl::Time now) const;

  // The job's last events, oldest first (at most kMaxJobHistory).
  // Errors: kNotFound unknown job.
  absl::StatusOr<std::vector<JobEvent>> History(absl::string_view job_id) const;

  // An operator closes the job: it fails with "stopped by an operator:
  // <reason>", and every node is told. Errors: kNotFound unknown job;
  // kFailedPrecondition the job is closed already.
  absl::Status Stop(absl::string_view job_id, absl::string_view reason, absl::Time now,
                    Effects* effects);

  // For a node opening its watch stream while it believes it is in
  // `known_round`: the event it missed, if the job moved on (closed, or a
  // later round). A node no longer in a closed job learns that it closed and
  // why, but not the root cause's message. Errors: kNotFound unknown job or
  // node; kPermissionDenied wrong secret.
  absl::StatusOr<std::optional<WatchEvent>> CatchUp(const NodeKey& node, absl::string_view secret,
                                                    int64_t known_round) const;

  size_t job_count() const { return jobs_.size(); }
  // Jobs not closed yet: what StateOptions::max_jobs bounds.
  size_t open_job_count() const { return open_jobs_; }

 private:
  enum class Phase { kOpen, kRunning, kClosed };
  // "open", "running" or "closed": a status' and the metrics' name for it.
  static const char* PhaseName(Phase phase);

  struct Node {
    NodeInfo info;
    std::string secret;  // what every call for the node must present
    std::string addr;    // advertised, else the peer address
    absl::Time last_seen;
    absl::Time joined_at;  // its first join (or the state's restore)
    int64_t join_seq = 0;
    bool watching = false;     // its watch stream is open: it needs no heartbeats
    bool member = false;       // in the last round formed: its secret is durable
    bool secret_told = false;  // it has had an assignment, which carries its secret
    std::string join_key;      // of its first join (JoinRequest.join_key)
    // Its workers' progress in the running round: the highest step (-1:
    // none), when it was written, and the steps a second between the last
    // two reports that moved it.
    int64_t step = -1;
    absl::Time step_time;
    double steps_per_second = 0;
  };

  struct Job {
    std::string id;
    JobConfig config;
    Phase phase = Phase::kOpen;
    int64_t round = 0;
    int32_t restart_count = 0;
    int64_t next_join_seq = 0;
    std::map<std::string, Node> nodes;      // every live node of the job, by node id
    std::vector<std::string> participants;  // running round, in group-rank order
    std::set<std::string> joined;           // open round: joins pending
    std::set<std::string> waiting;          // joined while the round was running
    std::set<std::string> expected;         // open restart round: who must rejoin
    std::set<std::string> not_back;         // of `expected`, who has not joined yet
    std::set<std::string> done;             // running round: nodes whose workers all succeeded
    std::vector<std::string> lost;          // hosts lost since the last round formed
    int64_t live_workers = 0;               // sum of local_world_size over `nodes`
    absl::Time empty_since;                 // when `nodes` last became empty
    absl::Time created_at;                  // first join, or restore
    absl::Time round_since;                 // the round formed, opened or closed
    std::deque<JobEvent> history;           // the last kMaxJobHistory events
    std::deque<Failure> recent_failures;    // the last kMaxRecentFailures, messages cut
    absl::Time open_since = absl::InfiniteFuture();
    std::optional<absl::Time> last_call_deadline;
    bool succeeded = false;
    std::string close_reason;
    std::optional<WatchEvent> closed_event;  // what every node was told at close
    absl::Time closed_at;
    std::optional<WatchEvent> last_round_change;
    std::array<int64_t, kRoundReasons> rounds_by_reason{};  // see JobFigures
    bool journaled = false;  // a record of it was emitted: its end is one too
    // Nodes removed from the job, and why, so that a removed node that calls
    // again (an agent that was stopped) learns what happened to it; only a
    // caller with that node's secret does. At most config.max_nodes, the
    // oldest forgotten first.
    struct Removal {
      std::string secret;
      std::string why;
    };
    std::map<std::string, Removal> removed;
    std::deque<std::string> removed_order;

    // Progress (ReportProgress). The highest step of the job, when it was
    // reached, and whether the running round reached a new one.
    int64_t best_step = -1;
    absl::Time best_step_time;
    bool round_progressed = false;
    bool round_stepped = false;        // a member of the running round reported a step
    bool progressed = false;           // some round reached a new step
    int32_t no_progress_restarts = 0;  // in a row
    // Wall time of the ended rounds that made progress (goodput).
    absl::Duration productive;
    absl::Time progress_event_at = absl::InfinitePast();
    // Bad nodes: failures in a row whose root cause was node `failing_node`
    // (an agent: several may share a host), and the hosts kept out, oldest
    // first (at most kMaxExclusions).
    std::string failing_node;
    int32_t node_failures = 0;
    std::deque<Exclusion> excluded;
    // Running round: the nodes seated in it that were not in the round
    // before, and whether it runs the pre-flight (config.preflight and
    // newcomers: Assignment.preflight).
    std::set<std::string> newcomers;
    bool round_preflight = false;
    bool stuck = false;    // closing for --max-no-progress-restarts
    bool stopped = false;  // closing for an operator's Stop: no requeue wanted
  };
  using JobMap = std::map<std::string, Job, std::less<>>;

  Job* FindJob(absl::string_view job_id);
  // Join's steps. CheckJoin: every reason to refuse it (a closed job,
  // another config, a node id held by another agent, too many workers or
  // jobs), before anything changes. JobToJoin: the job, made if new.
  // RecordJoin: the node's record, its join counted. Then the node takes a
  // seat in the open round or waits, or a running round makes room for it.
  absl::Status CheckJoin(const JoinRequest& request);
  // A join whose health check failed (JoinRequest.health_fault): the join
  // is refused, and its host excluded from the job if there is one and no
  // node of it is on that host. The join carries no node secret, so it may
  // not speak against a host the job seated: a node there leaves with
  // LeaveRequest.exclude when its own check fails.
  absl::Status RefuseUnhealthy(const JoinRequest& request, absl::Time now, Effects* effects);
  Job& JobToJoin(const JoinRequest& request, absl::Time now, Effects* effects);
  void RecordJoin(Job& job, const JoinRequest& request, absl::string_view peer_addr,
                  absl::string_view new_secret, absl::Time now, Effects* effects);
  void JoinOpenRound(Job& job, const NodeInfo& info, absl::Time now, Effects* effects);
  void JoinRunningRound(Job& job, const NodeInfo& info, absl::Time now, Effects* effects);
  // kNotFound for a node that is not in `job`, saying why when it was
  // removed and the caller presents the secret it had.
  static absl::Status NotInJob(const Job& job, const std::string& node_id,
                               absl::string_view secret);
  // The job of a live node whose request presents `secret`.
  absl::StatusOr<Job*> FindLiveNode(const NodeKey& node, absl::string_view secret);
  // Seats waiting nodes (spares) in the open round, first come first
  // served, in the seats left: with `hold_for_expected`, the seats of the
  // last round's members that have not rejoined yet are not free.
  void SeatSpares(Job& job, bool hold_for_expected, absl::Time now);
  // How long an empty job is kept.
  absl::Duration EmptyJobLifetime(const Job& job) const;
  void MaybeComplete(Job& job, absl::Time now, Effects* effects);
  // When an open round at min_nodes completes without its missing nodes:
  // after the last call, and, in a restart round, not before each member
  // not back yet and still watching has had its stop allowance
  // (NodeInfo.stop_allowance_ms) since the round opened.
  // REQUIRES: job.last_call_deadline.
  absl::Time RoundDeadline(const Job& job) const;
  void CompleteRound(Job& job, absl::Time now, Effects* effects);
  void OpenNextRound(Job& job, RoundChanged::Reason reason, const std::string& detail,
                     absl::Time now, Effects* effects);
  // The running round ends (a new one opens, or the job closes): its time
  // counts towards the goodput when it made progress.
  static void EndRound(Job& job, absl::Time now);
  // The share of the job's wall time, up to `now`, in rounds that made progress.
  static double Goodput(const Job& job, absl::Time now);
  // Takes the progress of a member of the running round (ReportProgress).
  void NoteProgress(Job& job, Node& node, const Progress& progress, absl::Time now,
                    Effects* effects);
  // What the first failure of a running round leads to: a restart, or the
  // job's close (`stuck`: for --max-no-progress-restarts), with the host of
  // `node_id` excluded when `exclusion` says why; `outcome` says it all.
  struct FailureVerdict {
    bool restart = false;
    bool stuck = false;
    std::optional<std::string> exclusion;
    std::string outcome;
  };
  FailureVerdict JudgeFailure(Job& job, const std::string& node_id, const std::string& detail,
                              bool preflight_failed) const;
  // The root cause of the running round's failure was node `node_id`:
  // counts it, and says why its host is to be excluded when the node has
  // been the root cause config.max_node_failures times in a row (nullopt:
  // it stays).
  static std::optional<std::string> CountNodeFailure(Job& job, const std::string& node_id,
                                                     const std::string& detail);
  // Keeps `host` out of the job (`node_id`: the node that showed it, `cause`
  // why): records it and tells every node of it NodeExcluded (`job_ends`:
  // the same failure closes the job, so the nodes end as it does). The
  // caller then takes them out: TakeOutOfRound before it opens the next
  // round or closes the job (a failure's exclusion), and RemoveExcludedNodes.
  void ExcludeHost(Job& job, const std::string& host, const std::string& node_id,
                   const std::string& cause, absl::Time now, Effects* effects,
                   bool job_ends = false);
  static void TakeOutOfRound(Job& job, const std::string& host);
  // The pre-flight of a round that seated newcomers beside nodes of the
  // round before failed: the newcomers' hosts are excluded (they are what
  // changed), and the round opens again without them; no restart is spent.
  // False when it does not apply (round 0, or every node new).
  bool ExcludeNewcomers(Job& job, const std::string& detail, absl::Time now, Effects* effects);
  void RemoveExcludedNodes(Job& job, const std::string& host, absl::Time now, Effects* effects);
  static const Exclusion* FindExclusion(const Job& job, absl::string_view host);
  // What the journal keeps of the job's progress, and its inverse.
  JobProgress DurableProgress(const Job& job) const;
  static void RestoreProgress(Job& job, const JobProgress& progress);
  // Pending joins fail with `pending_join_code`.
  void Close(Job& job, bool succeeded, const std::string& reason,
             const std::optional<Failure>& root_cause, absl::Time now, Effects* effects,
             absl::StatusCode pending_join_code = absl::StatusCode::kFailedPrecondition);
  void RemoveNode(Job& job, const std::string& node_id, const std::string& why, absl::Time now,
                  Effects* effects);
  // RemoveNode's work but the journal record: the node out of the job, and
  // what follows (a new round, the job's close). `node`: its entry in job.nodes.
  void TakeOut(Job& job, decltype(Job::nodes)::iterator node, const std::string& why,
               absl::Time now, Effects* effects);
  // The hosts of `ids`, for messages.
  std::vector<std::string> DescribeNodes(const Job& job, const std::set<std::string>& ids) const;
  static bool IsParticipant(const Job& job, const std::string& node_id);
  // Whether the heartbeat timer applies to the node.
  bool NeedsHeartbeat(const Job& job, const std::string& node_id, const Node& node) const;
  // The assignment of `node` in the job's running round. REQUIRES: the
  // round's participants are set, in group-rank order.
  Assignment MakeAssignment(const Job& job, const Node& node, int group_rank, int rank_base,
                            int world_size, const Node& master) const;
  // Assignment.peers and peer_key, for the node of `group_rank`.
  void AddPeers(const Job& job, int group_rank, Assignment* assignment) const;

  // Adds an event of `job` to its history and to effects->events.
  void AddEvent(Job& job, JobEvent::Kind kind, absl::string_view node_id, absl::string_view detail,
                absl::Time now, Effects* effects);
  // Adds an event of `job` to its history only, and returns it.
  const JobEvent& KeepEvent(Job& job, JobEvent::Kind kind, absl::string_view node_id,
                            absl::string_view detail, absl::Time now);
  // The fastest steps a second of a member of the running round (0: none).
  static double StepsPerSecond(const Job& job);
  // The job's progress, goodput and exclusions, for a status.
  static void AddProgress(const Job& job, std::optional<absl::Time> now, StatusResponse* response);
  // The status of `job` (see Status).
  StatusResponse JobStatus(const Job& job, std::optional<absl::Time> now, bool nodes) const;

  // Appends `record` to effects->journal when the state keeps a journal.
  void Record(Effects* effects, JournalRecord record) const;
  // Erases the job (an iterator of jobs_), saying so in the journal.
  JobMap::iterator Forget(JobMap::iterator it, Effects* effects);
  // The RoundFormed record of `job` with these members, in this order.
  JournalRecord RoundFormedRecord(const Job& job, const std::vector<std::string>& members) const;
  // Rebuilds a job's nodes from a RoundFormed record.
  void RestoreRoundFormed(const RoundFormed& formed, absl::Time now);
  absl::Status RestoreRoundOpened(const RoundOpened& opened, absl::Time now);
  absl::Status RestoreNodeRemoved(const NodeRemoved& removed, absl::Time now);
  void RestoreJobEnded(const JobEnded& ended, absl::Time now);

  // Forgets the longest closed jobs while more than max_closed_jobs are
  // kept. Not from inside a loop over jobs_: it erases from it.
  void TrimClosedJobs(Effects* effects);
  // Adds `line` to the log unless more than 10 lines of `kind` came this
  // second; says how many were left out on the next that is added. For the
  // lines one per job: a flood of junk jobs is no flood of log lines.
  void LogLimited(absl::string_view kind, std::string line, absl::Time now, Effects* effects);

  const StateOptions options_;
  JobMap jobs_;
  size_t open_jobs_ = 0;
  // Closed jobs in the order they closed (their closed_at, their id); an
  // entry whose job was forgotten since, or reopened under the same id, is
  // stale and skipped.
  std::deque<std::pair<absl::Time, std::string>> closed_order_;
  LogLimiter log_limiter_;
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_RULES_STATE_H_
