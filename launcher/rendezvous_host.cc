#include "launcher/rendezvous_host.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

absl::StatusOr<HaChoice> ChooseHa(const HaFacts& facts) {
  // What keeps the job's etcd from being as closed as the rendezvous it
  // replaces; ha=1 is refused there, rather than run open.
  std::string missing;
  if (facts.tls) {
    missing = "its members do not serve TLS yet";
  } else if (facts.munge_only) {
    missing = "munge gives its members no secret yet (a token_file does)";
  }
  if (facts.ha == true) {
    if (!missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ha=1 cannot keep this job's credential: ", missing, "; give ha=0 to every node"));
    }
    // Whether etcd is there is the caller's to say, with where it looked.
    return HaChoice{.on = true, .why_not = ""};
  }
  if (facts.ha == false || facts.max_nodes < 2) return HaChoice{};
  const std::string lost =
      "host mode: the job's rendezvous lives in this node's agent, so the job will not outlive "
      "this node";
  if (!missing.empty()) {
    return HaChoice{
        .on = false,
        .why_not = absl::StrCat(lost, " (the job's own etcd cluster would keep it, but ", missing,
                                "; ha=0 says this on purpose)")};
  }
  if (!facts.etcd_on_path) {
    return HaChoice{
        .on = false,
        .why_not = absl::StrCat(lost,
                                " (etcd is not on PATH: install etcd-server to keep the "
                                "rendezvous on an etcd cluster of the job's nodes; ha=0 says this "
                                "on purpose)")};
  }
  return HaChoice{.on = true, .why_not = ""};
}

absl::StatusOr<bool> FollowHostsHa(std::optional<bool> ha, bool host_serves_etcd,
                                   const std::string& endpoint) {
  if (!ha || *ha == host_serves_etcd) return host_serves_etcd;
  if (*ha) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ha=1 on this node, but the rendezvous host at ", endpoint,
        " runs host mode without it (ha=0 there, or no etcd on its PATH, or TLS or munge): give "
        "every node the same ha, or none"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("ha=0 on this node, but the rendezvous host at ", endpoint,
                   " keeps the job on an etcd cluster of its nodes (ha): give every node the "
                   "same ha, or none"));
}

}  // namespace muster
