// The leader of a job's rendezvous on etcd (--rdzv-backend etcd): the one
// agent of the job that won its election (etcd/keys.h) runs the job's
// RendezvousState, the same rules as musterd's. It reads the nodes' joins
// and reports from their keys, and writes each node's answers and events
// to that node's outbox and the job's durable state to the state key; every
// write is a transaction that holds only while its leader key is still the
// one it created, so a leader that lost its lease cannot write. A new
// leader starts from the state key (timers afresh, as a restarted musterd
// does), resends what its predecessor decided but may not have written,
// and goes on.
//
// A node's liveness is its etcd lease (TTL heartbeat_timeout): when its
// node key goes, the node is lost. The state's own heartbeat timers are off.
// When the job closes, the leader deletes the job's keys but `closed`,
// which tells a late node how the job ended and expires after
// kClosedJobRetention.
#ifndef MUSTER_RENDEZVOUS_ETCD_LEADER_H_
#define MUSTER_RENDEZVOUS_ETCD_LEADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/clock.h"
#include "rendezvous/etcd/client.h"

namespace muster::etcd {

struct LeaderOptions {
  // Not owned; outlives the leader.
  EtcdClient* client = nullptr;
  std::string job_id;
  // The create revision of the leader key this agent holds: the fence of
  // every write.
  int64_t leader_revision = 0;
  const Clock* clock = &Clock::Real();
  // Runs at most once, on the leader's thread, when it stops leading by
  // itself: its leader key is gone (its lease ended, kFailedPrecondition),
  // or etcd refused a write for good. Never runs once destruction began.
  std::function<void(absl::Status)> on_end;
};

class EtcdLeader {
 public:
  // Starts leading on a thread of its own.
  static std::unique_ptr<EtcdLeader> Start(LeaderOptions options);
  // Stops leading; returns once its thread and watches are gone. The leader
  // key is left to the caller (revoking its lease hands the job over at
  // once).
  virtual ~EtcdLeader() = default;
};

}  // namespace muster::etcd

#endif  // MUSTER_RENDEZVOUS_ETCD_LEADER_H_
