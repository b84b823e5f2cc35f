// The job's own etcd cluster (host mode's HA, --rdzv-conf ha=1): which of
// the job's nodes run its members. Each node that can run one offers to
// (members/<node>, under the node's lease: etcd/keys.h); the agent elected
// leader keeps the cluster at kClusterSize members with etcd's own
// membership calls, one step at a time: a member whose node withdrew its
// offer (the node is lost, or its member died) is removed, a node that
// offered is added as a learner and seated (seats/<node> tells it the
// cluster to join), and a learner that started is promoted. No replication
// or election of muster's own: etcd's raft does both; this only picks who.
//
// MemberPlanner is pure: the members etcd lists, the offers, and the time
// in; the one step to take out.
#ifndef MUSTER_RENDEZVOUS_ETCD_MEMBERS_H_
#define MUSTER_RENDEZVOUS_ETCD_MEMBERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace muster::etcd {

// Three members: a majority survives one loss at any moment, and each loss
// is repaired from the job's other nodes before the next.
inline constexpr int kClusterSize = 3;
// A member whose node has no offer is removed only after this long without
// one: a node writes its offer just after its member starts.
inline constexpr absl::Duration kOfferGrace = absl::Seconds(3);
// A learner that has not started after this long is removed (its node could
// not start it), and another node seated.
inline constexpr absl::Duration kLearnerStartTimeout = absl::Seconds(30);

// A member, as etcd's MemberList tells it.
struct MemberView {
  uint64_t id = 0;
  std::string peer_url;  // its first peer URL: how an offer names it
  bool learner = false;
  bool started = false;  // it has run (etcd lists its client URLs)
};

// A node's offer to run a member (members/<node>).
struct MemberOffer {
  std::string node;
  std::string name;  // its member's name
  std::string host;  // the node's host: members on distinct hosts come first
  std::string peer_url;
  std::string client_url;
};

struct MemberStep {
  enum class Kind { kNone, kRemove, kPromote, kAdd };
  Kind kind = Kind::kNone;
  uint64_t member = 0;  // kRemove, kPromote
  MemberOffer offer;    // kAdd: the node to add and seat
  std::string why;      // for the log
};

class MemberPlanner {
 public:
  // The next step, given the members and the live offers at `now`. Rules,
  // in order: remove a member whose peer URL no offer has had for
  // kOfferGrace (never the last started voter); promote a learner that
  // started; remove a learner not started after kLearnerStartTimeout; with
  // fewer than `size` voters and no learner, add the offer (not a member
  // yet) whose host has the fewest members, then the smallest node id.
  MemberStep Next(const std::vector<MemberView>& members, const std::vector<MemberOffer>& offers,
                  absl::Time now, int size = kClusterSize);

 private:
  // When each member was first seen without an offer, and each learner
  // first seen unstarted.
  std::map<uint64_t, absl::Time> orphan_since_;
  std::map<uint64_t, absl::Time> learner_since_;
};

// etcd's --initial-cluster for a member joining `members` (each seated
// member's name and peer URL; the one added last as `name`).
std::string InitialCluster(const std::vector<std::pair<std::string, std::string>>& members);

}  // namespace muster::etcd

#endif  // MUSTER_RENDEZVOUS_ETCD_MEMBERS_H_
