// An agent's RendezvousClient over etcd (--rdzv-backend etcd): no
// rendezvous server, the job's state in an etcd cluster. Each agent writes
// only its own keys (etcd/keys.h) under a lease of its own (TTL
// heartbeat_timeout, kept alive: its liveness) and watches only its own
// outbox; one agent, elected through etcd, also runs the job's state
// machine (EtcdLeader), and another takes over when it goes. The calls
// mean what they mean against musterd:
//   Join          writes nodes/<node> and waits for its answer in the outbox;
//                 a call that times out deletes the key (the node leaves)
//   Heartbeat     reads the outbox: the round the leader last wrote there
//   ReportFailure, ReportDone, Leave
//                 write inbox/<node> and wait for the answer in the outbox
//   Status        reads the job's status key
//   Watch         the outbox's events, as they are written
// etcd's outages are ridden out: the etcd client retries every member,
// and the assignments say to ride out (Assignment::ride_out_outages).
#ifndef MUSTER_RENDEZVOUS_ETCD_BACKEND_H_
#define MUSTER_RENDEZVOUS_ETCD_BACKEND_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "rendezvous/client/client.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/members.h"

namespace muster::etcd {

// Where this node would run a member of the job's own etcd cluster (host
// mode's HA, etcd/members.h): the launcher's etcd child. Thread-safe.
class MemberHost {
 public:
  virtual ~MemberHost() = default;
  // What the node offers: its member's name, host and URLs (`node` unset).
  virtual MemberOffer Offer() const = 0;
  // Whether its member runs (the cluster's first, or one seated since).
  virtual bool Seated() const = 0;
  // Whether its member ran and has stopped: a member etcd may have removed,
  // never started again; the node offers no more.
  virtual bool Exited() const = 0;
  // Starts the member, which etcd has added, joining `initial_cluster`.
  // Returns at once; `done` runs once, on another thread, when it listens
  // or could not start.
  virtual void Join(const std::string& initial_cluster, std::function<void(absl::Status)> done) = 0;
};

struct EtcdRendezvousOptions {
  // The etcd cluster.
  std::shared_ptr<EtcdClient> etcd;
  // How the leader this agent may become reaches it, if not through `etcd`:
  // the leader's writes can be large (a round's answers), and a write whose
  // answer comes after the client's attempt_timeout is never known to have
  // landed, so the leader's client should wait longer per attempt.
  std::optional<EtcdOptions> leader_etcd;
  std::string job_id;
  // The TTL of this node's lease: a node whose agent no longer keeps it
  // alive this long is lost (the agent's heartbeat_timeout).
  absl::Duration lease_ttl = absl::Seconds(30);
  // Where the rendezvous is, for messages ("etcd at 10.0.0.1:2379,...").
  std::string target;
  // Host mode's own cluster: the agent elected also keeps its members
  // (EtcdSteward), and `member_host`, when set, is offered to run one.
  bool keep_members = false;
  std::shared_ptr<MemberHost> member_host;
};

std::unique_ptr<rdzv::RendezvousClient> NewEtcdRendezvousClient(EtcdRendezvousOptions options);

}  // namespace muster::etcd

#endif  // MUSTER_RENDEZVOUS_ETCD_BACKEND_H_
