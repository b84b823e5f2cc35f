// Which node hosts a c10d rendezvous (the one its endpoint names), where that
// node's embedded server listens, and the addresses agents use to reach it.
// Pure: whether a host is one of this machine's addresses is the caller's
// predicate (IsLocalAddress in local_address.h).
#ifndef MUSTER_LAUNCHER_RENDEZVOUS_HOST_H_
#define MUSTER_LAUNCHER_RENDEZVOUS_HOST_H_

#include <functional>
#include <optional>
#include <string>

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

// Where a hosting node's server listens for `endpoint_host`: the loopback
// address itself when the endpoint is loopback (nobody else could dial it),
// else every IPv4 address ("0.0.0.0").
std::string BindHost(const std::string& endpoint_host);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_RENDEZVOUS_HOST_H_
