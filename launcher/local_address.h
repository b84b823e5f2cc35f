// Whether a host names this machine: the edge behind ShouldHostRendezvous
// (rendezvous_host.h), which asks getaddrinfo and getifaddrs.
#ifndef MUSTER_LAUNCHER_LOCAL_ADDRESS_H_
#define MUSTER_LAUNCHER_LOCAL_ADDRESS_H_

#include <optional>
#include <string>

namespace muster {

// Whether `host` (a name or an address) resolves to an address of one of
// this machine's interfaces. False when it does not resolve. A name may be
// looked up in DNS: this can block as long as the resolver does.
bool IsLocalAddress(const std::string& host);

// This machine's address on the way to `host`: the source address the
// kernel picks for it (a UDP socket connected there; nothing is sent),
// numeric. nullopt when `host` does not resolve or no route leads there.
std::optional<std::string> SourceAddressTo(const std::string& host);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_LOCAL_ADDRESS_H_
