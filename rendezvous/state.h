// The rendezvous rules, as a pure state machine: no sockets, no clocks, no
// threads. Every call takes the current time and returns what the server must
// do (complete a pending join, push an event to a node) as Effects. The gRPC
// service only translates; every rule of ARCHITECTURE.md lives here.
//
// Thread safety: none; the caller serializes all calls.
#ifndef MUSTER_RENDEZVOUS_STATE_H_
#define MUSTER_RENDEZVOUS_STATE_H_

#include <cstdint>
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
#include "proto/rendezvous.pb.h"

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
  // A timer deadline may have moved earlier: the hub's timer must look again.
  bool rearm_timer = false;

  bool empty() const {
    return assigned.empty() && join_failed.empty() && pushed.empty() && log.empty();
  }
};

// Checks a job id: 1..256 printable ASCII characters with no white space.
absl::Status ValidateJobId(absl::string_view job_id);
// Checks a job's rules: 0 < min <= max, max_restarts >= 0, timeouts >= 0.
absl::Status ValidateJobConfig(const JobConfig& config);

// How long a closed job is remembered before Advance forgets it.
inline constexpr absl::Duration kClosedJobRetention = absl::Minutes(10);

class RendezvousState {
 public:
  RendezvousState() = default;
  RendezvousState(const RendezvousState&) = delete;
  RendezvousState& operator=(const RendezvousState&) = delete;

  // A node asks to be in the job's next round. OK means the join is pending:
  // its Assignment arrives in `effects` now or from a later call. `peer_addr`
  // is the address the server saw, used when the node advertises none.
  // Errors: kInvalidArgument bad request; kFailedPrecondition the job is
  // closed, or the node's config differs from the job's.
  absl::Status Join(const JoinRequest& request, absl::string_view peer_addr, absl::Time now,
                    Effects* effects);

  // Marks the node alive. Returns the job's current round.
  // Errors: kNotFound unknown job or node; kFailedPrecondition job closed.
  absl::StatusOr<int64_t> Heartbeat(const NodeKey& node, absl::Time now);

  // The node's watch stream opened or ended. While it is open the node needs
  // no heartbeats: the stream is its heartbeat (the server's connection
  // keepalive ends it when the host vanishes). When it ends, the node's
  // heartbeat timeout starts from `now`. Unknown nodes are ignored.
  void SetWatching(const NodeKey& node, bool watching, absl::Time now, Effects* effects);

  // A worker of `node` failed in `round`. The first report of a running round
  // opens the next one (using a restart) or, with restarts spent, closes the
  // job as failed. Reports for an older round are ignored.
  absl::Status ReportFailure(const NodeKey& node, int64_t round, const Failure& failure,
                             absl::Time now, Effects* effects);

  // Every worker of `node` succeeded in `round`. The job closes as succeeded
  // once every participant is done.
  absl::Status ReportDone(const NodeKey& node, int64_t round, absl::Time now, Effects* effects);

  // The node leaves on purpose (its agent was stopped). No restart is used.
  absl::Status Leave(const NodeKey& node, absl::string_view reason, absl::Time now,
                     Effects* effects);

  // Runs every timer that has expired by `now`: last call, join timeout,
  // heartbeat timeout.
  void Advance(absl::Time now, Effects* effects);

  // The earliest time at which Advance has something to do, if any.
  std::optional<absl::Time> NextDeadline() const;

  // `now`, when given, dates last_call_remaining_ms.
  absl::StatusOr<StatusResponse> Status(absl::string_view job_id,
                                        std::optional<absl::Time> now = std::nullopt) const;

  // For a node opening its watch stream while it believes it is in
  // `known_round`: the event it missed, if the job moved on (closed, or a
  // later round). Errors: kNotFound unknown job or node.
  absl::StatusOr<std::optional<WatchEvent>> CatchUp(const NodeKey& node, int64_t known_round) const;

  size_t job_count() const { return jobs_.size(); }

 private:
  enum class Phase { kOpen, kRunning, kClosed };

  struct Node {
    NodeInfo info;
    std::string addr;  // advertised, else the peer address
    absl::Time last_seen;
    int64_t join_seq = 0;
    bool watching = false;  // its watch stream is open: it needs no heartbeats
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
    std::set<std::string> done;             // running round: nodes whose workers all succeeded
    std::vector<std::string> lost;          // hosts lost since the last round formed
    absl::Time open_since = absl::InfiniteFuture();
    std::optional<absl::Time> last_call_deadline;
    bool succeeded = false;
    std::string close_reason;
    std::optional<WatchEvent> closed_event;  // what every node was told at close
    absl::Time closed_at;
    std::optional<WatchEvent> last_round_change;
  };

  Job* FindJob(absl::string_view job_id);
  absl::StatusOr<Job*> FindLiveNode(const NodeKey& node);
  void MaybeComplete(Job& job, absl::Time now, Effects* effects);
  void CompleteRound(Job& job, absl::Time now, Effects* effects);
  void OpenNextRound(Job& job, RoundChanged::Reason reason, const std::string& detail,
                     absl::Time now, Effects* effects);
  // Pending joins fail with `pending_join_code`.
  void Close(Job& job, bool succeeded, const std::string& reason,
             const std::optional<Failure>& root_cause, absl::Time now, Effects* effects,
             absl::StatusCode pending_join_code = absl::StatusCode::kFailedPrecondition);
  void RemoveNode(Job& job, const std::string& node_id, const std::string& why, absl::Time now,
                  Effects* effects);
  std::string DescribeNodes(const Job& job, const std::set<std::string>& ids) const;
  static bool IsParticipant(const Job& job, const std::string& node_id);
  // Whether the heartbeat timer applies to the node.
  static bool NeedsHeartbeat(const Job& job, const std::string& node_id, const Node& node);

  std::map<std::string, Job, std::less<>> jobs_;
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_STATE_H_
