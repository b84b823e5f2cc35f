// The one grammar for a network endpoint as a user writes it ("host",
// "host:port", "[v6]", "[v6]:port"), and the one way to write a host and a
// port back (an IPv6 address in brackets). Pure: no name lookup.
#ifndef MUSTER_COMMON_ENDPOINT_H_
#define MUSTER_COMMON_ENDPOINT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

struct Endpoint {
  std::string host;  // without brackets: "node1", "10.0.0.1", "fe80::1%eth0"
  int port = 0;
};

// Parses `text` as HOST[:PORT] or [IPV6][:PORT]; without a port, the port is
// `default_port` (any value: -1 tells the caller that none was given).
// HOST holds letters, digits, '-', '.' and '_'; the text in brackets holds
// those, ':' (at least one) and '%' (a zone, "fe80::1%eth0"); PORT is digits,
// 0 to 65535. No other form: an IPv6 address without brackets is refused,
// since its last group cannot be told from a port.
//
// Errors: kInvalidArgument, "<what is wrong>; give <flag> HOST[:PORT] or
// [IPV6][:PORT], e.g. node1:29400 or [::1]:29400", where `flag` names the
// option that took the text (empty: none is named).
absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view text, int default_port,
                                       absl::string_view flag = "");

// "host:port", or "[host]:port" when `host` is an IPv6 address (holds a
// ':'). A host already in brackets is written as it is.
std::string FormatEndpoint(absl::string_view host, int port);
inline std::string FormatEndpoint(const Endpoint& endpoint) {
  return FormatEndpoint(endpoint.host, endpoint.port);
}

}  // namespace muster

#endif  // MUSTER_COMMON_ENDPOINT_H_
