// Where a job's rendezvous lives in etcd (--rdzv-backend etcd): one prefix
// per run id, and under it
//
//   leader           the node id of the agent that runs the job's state
//                    machine, held by that agent's lease (an election: the
//                    first to create it leads; another takes over when its
//                    lease ends)
//   state            the job's durable state (journal records, see
//                    proto/etcd_rendezvous.proto), written by the leader only
//   status           the job's StatusResponse, for agents waiting to join
//   closed           how the job ended, kept for a while after every other
//                    key is deleted, so a late node learns it closed
//   nodes/<node>     a node's JoinRequest, under the node's lease: written
//                    for each join, deleted when the lease ends (the node is
//                    lost)
//   inbox/<node>     the node's latest report (failure, done, leave)
//   outbox/<node>    the leader's answers and events for that node: the one
//                    key a node watches, so a round costs O(1) per node
//   members/<node>   host mode's own etcd cluster (ha=1, etcd/members.h):
//                    the node's offer to run a member, under its lease
//   seats/<node>     the leader's word that etcd added the node's member:
//                    the cluster it starts it in
//
// No node writes a key every node writes: each writes its own, and only the
// leader writes the state (torch's c10d rendezvous compare-and-swaps one
// shared key and collapses past ~100 nodes). Pure: names only.
#ifndef MUSTER_RENDEZVOUS_ETCD_KEYS_H_
#define MUSTER_RENDEZVOUS_ETCD_KEYS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace muster::etcd {

// Every key of muster in etcd starts with this.
inline constexpr absl::string_view kKeyRoot = "/muster/v1/jobs/";

// `text` with every byte but [A-Za-z0-9._~-] written %XX: a job or node id
// becomes one path segment, so no id's keys are a prefix of another's.
std::string EscapeKeySegment(absl::string_view text);
// The inverse; nullopt for text EscapeKeySegment cannot have made.
std::optional<std::string> UnescapeKeySegment(absl::string_view text);

class JobKeys {
 public:
  explicit JobKeys(absl::string_view job_id);

  // Every key of the job starts with it (it ends with "/").
  const std::string& prefix() const { return prefix_; }
  std::string leader() const { return prefix_ + "leader"; }
  std::string state() const { return prefix_ + "state"; }
  std::string status() const { return prefix_ + "status"; }
  std::string closed() const { return prefix_ + "closed"; }
  std::string nodes() const { return prefix_ + "nodes/"; }
  std::string inbox() const { return prefix_ + "inbox/"; }
  std::string outbox() const { return prefix_ + "outbox/"; }
  std::string members() const { return prefix_ + "members/"; }
  std::string seats() const { return prefix_ + "seats/"; }
  std::string node(absl::string_view node_id) const { return nodes() + EscapeKeySegment(node_id); }
  std::string member(absl::string_view node_id) const {
    return members() + EscapeKeySegment(node_id);
  }
  std::string seat(absl::string_view node_id) const { return seats() + EscapeKeySegment(node_id); }
  std::string inbox(absl::string_view node_id) const { return inbox() + EscapeKeySegment(node_id); }
  std::string outbox(absl::string_view node_id) const {
    return outbox() + EscapeKeySegment(node_id);
  }

  // The node id of a key under `dir` (nodes(), inbox() or outbox()); nullopt
  // for a key that is not one of them.
  static std::optional<std::string> NodeOf(absl::string_view key, absl::string_view dir);

 private:
  std::string prefix_;
};

}  // namespace muster::etcd

#endif  // MUSTER_RENDEZVOUS_ETCD_KEYS_H_
