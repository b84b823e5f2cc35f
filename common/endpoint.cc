#include "common/endpoint.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace muster {
namespace {

constexpr int kMaxPort = 65535;

bool IsHostChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

// A port: digits only, at most kMaxPort. nullopt otherwise.
std::optional<int> ParsePort(absl::string_view text) {
  if (text.empty()) return std::nullopt;
  int value = 0;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    // Capped above kMaxPort, so that a long run of digits cannot overflow.
    value = std::min(value * 10 + (c - '0'), kMaxPort + 1);
  }
  if (value > kMaxPort) return std::nullopt;
  return value;
}

// What is wrong with `text`, or "" when nothing is; `endpoint` gets the parts.
absl::string_view Problem(absl::string_view text, int default_port, Endpoint& endpoint) {
  absl::string_view host;
  std::optional<absl::string_view> port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return "the [ of an IPv6 address is not closed";
    host = text.substr(1, close - 1);
    const bool v6_chars = std::all_of(host.begin(), host.end(),
                                      [](char c) { return IsHostChar(c) || c == ':' || c == '%'; });
    if (host.empty() || !v6_chars || !absl::StrContains(host, ':')) {
      return "the text in [ ] is not an IPv6 address";
    }
    const absl::string_view after = text.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return "only :PORT may follow the ] of an IPv6 address";
      port = after.substr(1);
    }
  } else {
    if (std::count(text.begin(), text.end(), ':') > 1) return "an IPv6 address must be in brackets";
    const size_t colon = text.find(':');
    host = text.substr(0, colon);
    if (colon != absl::string_view::npos) port = text.substr(colon + 1);
    if (host.empty()) return "the host is missing";
    if (!std::all_of(host.begin(), host.end(), IsHostChar)) {
      return "the host may hold only letters, digits, '-', '.' and '_'";
    }
  }
  endpoint.host = std::string(host);
  endpoint.port = default_port;
  if (port) {
    const std::optional<int> number = ParsePort(*port);
    if (!number) return "the port must be a number from 0 to 65535";
    endpoint.port = *number;
  }
  return "";
}

}  // namespace

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view text, int default_port,
                                       absl::string_view flag) {
  Endpoint endpoint;
  const absl::string_view problem = Problem(text, default_port, endpoint);
  if (problem.empty()) return endpoint;
  return absl::InvalidArgumentError(absl::StrCat(problem, "; give ", flag, flag.empty() ? "" : " ",
                                                 "HOST[:PORT] or [IPV6][:PORT], e.g. node1:29400 "
                                                 "or [::1]:29400"));
}

std::string FormatEndpoint(absl::string_view host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace muster
