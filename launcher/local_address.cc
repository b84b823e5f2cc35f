#include "launcher/local_address.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "common/unique_handle.h"

namespace muster {
namespace {

bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

}  // namespace

bool IsLocalAddress(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  const UniqueAddrInfo resolved(found);
  ifaddrs* listed = nullptr;
  if (getifaddrs(&listed) != 0) return false;
  const UniqueIfAddrs interfaces(listed);
  for (const addrinfo* a = resolved.get(); a != nullptr; a = a->ai_next) {
    for (const ifaddrs* i = interfaces.get(); i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr != nullptr && SameAddress(a->ai_addr, i->ifa_addr)) return true;
    }
  }
  return false;
}

std::optional<std::string> SourceAddressTo(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  // Any port: a UDP connect only picks the route.
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return std::nullopt;
  const UniqueAddrInfo resolved(found);
  for (const addrinfo* a = resolved.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid() || connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) continue;
    sockaddr_storage own = {};
    socklen_t length = sizeof own;
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&own), &length) != 0) continue;
    char text[NI_MAXHOST] = {};
    if (getnameinfo(reinterpret_cast<sockaddr*>(&own), length, text, sizeof text, nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      return std::string(text);
    }
  }
  return std::nullopt;
}

}  // namespace muster
