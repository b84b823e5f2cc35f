// The scale bench's simulated nodes: light (callback stubs, all in one
// process), but each sends what an agent sends, on a gRPC channel with an
// agent's channel arguments, and by default on a TCP connection of its own.
#ifndef MUSTER_BENCH_SIM_NODES_H_
#define MUSTER_BENCH_SIM_NODES_H_

#include <atomic>
#include <chrono>
#include <cstdint>
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

// One node: its join, and what came back.
struct SimNode {
  JoinRequest join;
  grpc::ClientContext join_context;
  JoinResponse join_response;
  grpc::Status join_status;
  SteadyClock::time_point answered;
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
absl::StatusOr<Fleet> NewFleet(const std::string& target, int connections,
                               const std::string& job_id, int nodes, absl::Duration join_timeout);

// Sends every node's join, due at `deadline`; each answer calls
// joins->Done() once the node's status and time are in.
void SendJoins(absl::Time deadline, Fleet* fleet, Countdown* joins);

// OK when every join succeeded and the assignments agree: group ranks
// 0..N-1 once each, one round, one master (rank 0's address and port
// candidate), world size kLocalWorldSize * N. REQUIRES: every join ended.
absl::Status CheckJoins(const Fleet& fleet);

// Every node's watch stream, as an agent keeps one open from its assignment
// to the end: no deadline, cancelled by CancelAndWait.
class WatchSet {
 public:
  WatchSet();
  // REQUIRES: CancelAndWait returned true, or Open was never called.
  ~WatchSet();

  // Opens a watch of `round` for every node of `fleet`, on its connection.
  void Open(const Fleet& fleet, int64_t round);
  // Streams the server has confirmed (its first event says it counts the
  // stream as the node's heartbeat).
  int started() const;
  // Events after that first one: each means the round moved on.
  int events() const { return events_.load(); }
  // kUnavailable, saying how many, when a stream has ended already.
  absl::Status CheckAllOpen();
  // Cancels every stream; whether all ended by `deadline`.
  bool CancelAndWait(absl::Time deadline);
  // Streams not ended yet.
  int open() { return open_.left(); }

 private:
  class Stream;
  Countdown open_;
  std::atomic<int> events_{0};
  std::vector<std::unique_ptr<Stream>> streams_;
};

}  // namespace muster::rdzv::scale

#endif  // MUSTER_BENCH_SIM_NODES_H_
