#include "launcher/rendezvous_host.h"

#include "absl/strings/match.h"

namespace muster {

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

std::string NumericLoopback(const std::string& host) {
  return host == "localhost" ? "127.0.0.1" : host;
}

bool ShouldHostRendezvous(const HostingFacts& facts,
                          const std::function<bool(const std::string& host)>& is_local_address) {
  if (facts.is_host) return *facts.is_host;
  const std::string& host = facts.endpoint_host;
  return IsLoopback(host) || host == facts.host_name || host == facts.local_addr ||
         is_local_address(host);
}

std::string BindHost(const std::string& endpoint_host) {
  return IsLoopback(endpoint_host) ? NumericLoopback(endpoint_host) : "0.0.0.0";
}

}  // namespace muster
