// The leader's keeper of the job's own etcd cluster (host mode's HA,
// --rdzv-conf ha=1): beside EtcdLeader, in the agent elected, it takes
// MemberPlanner's steps (etcd/members.h) with etcd's own membership calls,
// one at a time, about once a second: remove, promote, or add a learner and
// seat its node (seats/<node>, written only while this agent still holds
// the leader key). etcd's membership calls cannot be fenced; a deposed
// leader's last step is one more step of the same plan, and the next
// leader plans from what etcd lists.
#ifndef MUSTER_RENDEZVOUS_ETCD_STEWARD_H_
#define MUSTER_RENDEZVOUS_ETCD_STEWARD_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/clock.h"
#include "rendezvous/etcd/client.h"

namespace muster::etcd {

struct StewardOptions {
  // Not owned; outlives the steward.
  EtcdClient* client = nullptr;
  std::string job_id;
  // The create revision of the leader key this agent holds.
  int64_t leader_revision = 0;
  const Clock* clock = &Clock::Real();
  absl::Duration interval = absl::Seconds(1);
};

class EtcdSteward {
 public:
  // Starts on a thread of its own.
  static std::unique_ptr<EtcdSteward> Start(StewardOptions options);
  // Stops; returns once its thread is gone (a call under way finishes first).
  virtual ~EtcdSteward() = default;
};

}  // namespace muster::etcd

#endif  // MUSTER_RENDEZVOUS_ETCD_STEWARD_H_
