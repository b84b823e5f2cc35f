// The scale bench's simulated nodes: light (callback stubs, all in one
// process), but each sends what an agent sends, on a gRPC channel with an
// agent's channel arguments, and by default on a TCP connection of its own.
#ifndef MUSTER_BENCH_SIM_NODES_H_
#define MUSTER_BENCH_SIM_NODES_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/rendezvous.grpc.pb.h"

namespace muster::rdzv::scale {

using SteadyClock = std::chrono::steady_clock;

inline constexpr int kLocalWorldSize = 8;
inline constexpr int kFirstMasterPort = 20000;
// Agents' default (agent/config.h): long enough that no node is evicted
// while 10,000 joins are in flight.
inline constexpr int64_t kHeartbeatTimeoutMs = 30'000;
// How often an agent pings the server by default: heartbeat_timeout (30 s) / 3,
// shorter than keep_alive_interval (5 s) x keep_alive_max_attempt (3); see
// launcher/main.cc.
inline constexpr absl::Duration kAgentKeepalive = absl::Seconds(10);

double MsSince(SteadyClock::time_point start, SteadyClock::time_point end);

// Counts outstanding calls; WaitUntil returns when none is left or at `deadline`.
// Thread-safe.
class Countdown {
 public:
  void Add(int n);
  void Done();
  // Whether none was left by `deadline`.
  bool WaitUntil(absl::Time deadline);
  int left();

 private:
  absl::Mutex mu_;
  int left_ ABSL_GUARDED_BY(mu_) = 0;
};

// The join that node `index` of `nodes` sends for job `job_id`: min = max =
// `nodes`, kLocalWorldSize workers, no last call, no node-rank hint, host
// "host-<index>" and its own master port candidate.
JoinRequest NodeJoinRequest(const std::string& job_id, int nodes, int index,
                            absl::Duration join_timeout);

// One node: its join, and what came back; then, after a restart round, its
// join again and what came back of that.
struct SimNode {
  JoinRequest join;
  grpc::ClientContext join_context;
  JoinResponse join_response;
  grpc::Status join_status;
  SteadyClock::time_point answered;

  // The join again once the node's watch said the round moved on, with
  // the secret of its first assignment, as an agent rejoins.
  JoinRequest rejoin;
  grpc::ClientContext rejoin_context;
  JoinResponse rejoin_response;
  grpc::Status rejoin_status;
  SteadyClock::time_point rejoin_answered;
  // Set by the first RoundChanged the node sees: it rejoins once.
  std::atomic<bool> rejoining{false};

  // The node's latest assignment: its rejoin's once that was answered,
  // else its join's. REQUIRES: neither call is in flight.
  const Assignment& assignment() const {
    return rejoin_response.has_assignment() ? rejoin_response.assignment()
                                            : join_response.assignment();
  }
};

// The nodes of one run and their connections; node i calls on stub(i).
struct Fleet {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<Rendezvous::Stub>> stubs;
  std::vector<std::unique_ptr<SimNode>> nodes;

  Rendezvous::Stub* stub(int node) const { return stubs[node % stubs.size()].get(); }
};

// `nodes` nodes of job `job_id` on `connections` channels to `target`, each
// channel connected (within 10 s, kUnavailable if not) and each join built, so
// that neither counts in the join's time.
// Each channel pings the server every `keepalive` (kAgentKeepalive for an agent's).
absl::StatusOr<Fleet> NewFleet(const std::string& target, int connections,
                               const std::string& job_id, int nodes, absl::Duration join_timeout,
                               absl::Duration keepalive);

// Sends every node's join, due at `deadline`; each answer calls
// joins->Done() once the node's status and time are in.
void SendJoins(absl::Time deadline, Fleet* fleet, Countdown* joins);

// OK when every join succeeded and the assignments agree: group ranks
// 0..N-1 once each, one round, one master (rank 0's address and port
// candidate), world size kLocalWorldSize * N. REQUIRES: every join ended.
absl::Status CheckJoins(const Fleet& fleet);

// Sends node `index`'s join again (its first join, with the secret of its
// assignment), due at `deadline`; once the node's status and time are in,
// the answer calls `answered(index)`. At most once per node and run.
void SendRejoin(absl::Time deadline, Fleet* fleet, int index, std::function<void(int)> answered);

// As CheckJoins, for the rejoins, which must also all name `round` and
// `restart_count`. REQUIRES: every rejoin ended.
absl::Status CheckRejoins(const Fleet& fleet, int64_t round, int restart_count);

// Every node's watch stream, as an agent keeps one open from its assignment
// to the end, across rounds: no deadline, cancelled by CancelAndWait. A node
// has one current stream; ReopenEnded replaces one that ended, as an agent
// opens its watch again.
//
// Thread safety: every method may be called from any thread, gRPC's
// callbacks included (the hook of SetOnEvent runs on them), except the
// destructor.
class WatchSet {
 public:
  // What a stream of `node` received after its WatchStarted: the round
  // moved on, or the job closed.
  using OnEvent = std::function<void(int node, const WatchEvent& event)>;

  WatchSet();
  // REQUIRES: CancelAndWait returned true, or Open was never called.
  ~WatchSet();

  // Opens a watch of `round` for every node of `fleet`, on its connection.
  void Open(const Fleet& fleet, int64_t round);
  // From now on, every event after a stream's WatchStarted is also handed to `hook`.
  void SetOnEvent(OnEvent hook);
  // Reopens, at `round`, every node's current stream that ended by itself
  // (not cancelled here) at least `retry` ago, as an agent does; returns
  // how many it opened.
  int ReopenEnded(const Fleet& fleet, int64_t round, absl::Duration retry);
  // Current streams the server has confirmed (their first event says it
  // counts the stream as the node's heartbeat) and that have not ended.
  int started() const;
  // Current streams confirmed after `since` and not ended, and when the
  // first and the last of them were confirmed (`since` when there are none).
  int StartedSince(SteadyClock::time_point since, SteadyClock::time_point* first,
                   SteadyClock::time_point* last) const;
  // Events after a stream's first, every stream ever opened: each means
  // the round moved on.
  int events() const { return events_.load(); }
  // Streams opened by ReopenEnded, in all.
  int reopened() const { return reopened_.load(); }
  // How many of those ended by themselves, and the first one's status.
  int ReopenedFailed(std::string* first) const;
  // kUnavailable, saying how many, when a current stream has ended already.
  absl::Status CheckAllOpen() const;
  // Cancels every stream; whether all ended by `deadline`.
  bool CancelAndWait(absl::Time deadline);
  // Streams not ended yet.
  int open() { return open_.left(); }

 private:
  class Stream;
  std::unique_ptr<Stream> NewStream(const Fleet& fleet, int node, int64_t round, bool reopened);
  void Dispatch(int node, const WatchEvent& event);

  Countdown open_;
  std::atomic<int> events_{0};
  std::atomic<int> reopened_{0};
  mutable absl::Mutex mu_;
  OnEvent on_event_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Stream>> current_ ABSL_GUARDED_BY(mu_);  // by node
  // Replaced streams, kept until CancelAndWait: one may still be ending.
  std::vector<std::unique_ptr<Stream>> replaced_ ABSL_GUARDED_BY(mu_);
  // Apart from mu_: a stream's OnDone records here, and a cancel under mu_
  // might run it.
  mutable absl::Mutex failed_mu_;
  int reopened_failed_ ABSL_GUARDED_BY(failed_mu_) = 0;
  std::string first_reopened_failure_ ABSL_GUARDED_BY(failed_mu_);
};

}  // namespace muster::rdzv::scale

#endif  // MUSTER_BENCH_SIM_NODES_H_
