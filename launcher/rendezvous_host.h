// Which node hosts a c10d rendezvous (the one its endpoint names), where that
// node's embedded server listens, and the addresses agents use to reach it.
// Pure: whether a host is one of this machine's addresses is the caller's
// predicate (IsLocalAddress in local_address.h).
#ifndef MUSTER_LAUNCHER_RENDEZVOUS_HOST_H_
#define MUSTER_LAUNCHER_RENDEZVOUS_HOST_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace muster {

// "localhost", "::1" and 127.0.0.0/8: an endpoint only this machine reaches.
bool IsLoopback(const std::string& host);

// "localhost" as an address ("127.0.0.1"); any other host unchanged. gRPC
// and the peers' addresses want the number.
std::string NumericLoopback(const std::string& host);

struct HostingFacts {
  std::string endpoint_host;    // the host of --rdzv-endpoint, without brackets
  std::string host_name;        // this machine's name
  std::string local_addr;       // --local-addr ("" when not given)
  std::optional<bool> is_host;  // --rdzv-conf is_host, when given
};

// Whether the agent on this node should try to host the rendezvous: is_host
// when given (then `is_local_address` is not asked); else whether the
// endpoint's host is loopback, this machine's name, --local-addr, or one of
// this machine's addresses (asked last, as it may resolve a name).
// Several agents on one machine all answer yes: the first to bind the port
// hosts, the others become its clients.
bool ShouldHostRendezvous(const HostingFacts& facts,
                          const std::function<bool(const std::string& host)>& is_local_address);

// What the hosting node of a c10d job knows when it chooses whether the
// job's rendezvous lives on an etcd cluster of the job's own nodes (ha).
struct HaFacts {
  std::optional<bool> ha;  // --rdzv-conf ha, when given
  int max_nodes = 1;       // --nnodes' MAX
  bool etcd_on_path = false;
  bool tls = false;         // cacert, cert or key given
  bool munge_only = false;  // munge proves the agents, with no token
};

// The hosting node's choice: `on`, or host mode as ever; `why_not` is the
// line that says, once, that the job will not outlive this node and how to
// change that ("" where there is nothing to say: one node, or ha=0). An
// error is a usage error: ha=1 where it cannot be kept.
struct HaChoice {
  bool on = false;
  std::string why_not;
};
absl::StatusOr<HaChoice> ChooseHa(const HaFacts& facts);

// A joining node follows what the hosting node chose, as the endpoint
// answered (`host_serves_etcd`): its own ha, when given, must agree. An
// error is a usage error that names the endpoint.
absl::StatusOr<bool> FollowHostsHa(std::optional<bool> ha, bool host_serves_etcd,
                                   const std::string& endpoint);

// Where a hosting node's server listens for `endpoint_host`: the loopback
// address itself when the endpoint is loopback (nobody else could dial it),
// else every IPv4 address ("0.0.0.0").
std::string BindHost(const std::string& endpoint_host);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_RENDEZVOUS_HOST_H_
