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

}  // namespace muster
