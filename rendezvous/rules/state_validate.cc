// RendezvousState's checks of what clients send: job ids, configs, joins.
#include "rendezvous/rules/state.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/constant_time.h"
#include "common/status.h"
#include "rendezvous/rules/node_secret.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state_internal.h"

namespace muster::rdzv {

using state_internal::FormatDuration;
using state_internal::JobEndedRecord;
using state_internal::kMaxNamedNodes;
using state_internal::NodeDoneRecord;
using state_internal::RoundChangedEvent;
using state_internal::RoundOpenedRecord;
using state_internal::WrongSecret;

namespace {

bool HasControlCharacter(absl::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

absl::Status CheckHostField(absl::string_view field, absl::string_view value) {
  if (value.size() > kMaxHostLength) {
    return absl::InvalidArgumentError(absl::StrCat("the node's ", field, " is ", value.size(),
                                                   " bytes long; a host name or address has at "
                                                   "most ",
                                                   kMaxHostLength));
  }
  if (HasControlCharacter(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the node's ", field, " contains a control character; give a host name or address"));
  }
  return absl::OkStatus();
}

absl::Status CheckTimeout(absl::string_view name, int64_t ms, int64_t min_ms) {
  if (ms < min_ms || ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is ", FormatDuration(ms), "; give ",
                                                   FormatDuration(min_ms), " to ",
                                                   FormatDuration(kMaxTimeoutMs), " (7 days)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ClosedJob(absl::string_view job_id, absl::string_view reason, bool succeeded) {
  return absl::FailedPreconditionError(
      absl::StrCat("job '", job_id, succeeded ? kJobSucceeded : "' is closed", " (", reason, ")"));
}

absl::Status JoinToClosedJob(absl::string_view job_id, absl::string_view reason, bool succeeded) {
  return absl::FailedPreconditionError(
      absl::StrCat(ClosedJob(job_id, reason, succeeded).message(),
                   "; start a new job with a different --rdzv-id"));
}

absl::Status ValidateJobId(absl::string_view job_id, size_t max_length) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError(
        "the job id (--rdzv-id) is empty; give a short name without spaces");
  }
  if (job_id.size() > max_length) {
    return absl::InvalidArgumentError(absl::StrCat("the job id (--rdzv-id) is ", job_id.size(),
                                                   " characters long; use at most ", max_length));
  }
  for (char c : job_id) {
    if (!std::isgraph(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          "the job id (--rdzv-id) contains a space or control character; use letters, digits "
          "and punctuation only");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateJobConfig(const JobConfig& config) {
  if (config.min_nodes() <= 0 || config.min_nodes() > config.max_nodes()) {
    return absl::InvalidArgumentError(absl::StrCat("bad node range ", config.min_nodes(), ":",
                                                   config.max_nodes(), "; need 0 < MIN <= MAX"));
  }
  if (config.max_nodes() > kMaxNodes) {
    return absl::InvalidArgumentError(absl::StrCat("max_nodes (--nnodes) is ", config.max_nodes(),
                                                   "; a job has at most ", kMaxNodes, " nodes"));
  }
  if (config.max_restarts() < 0 || config.max_restarts() > kMaxRestarts) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_restarts is ", config.max_restarts(), "; give 0 to ", kMaxRestarts));
  }
  if (config.max_no_progress_restarts() < 0 || config.max_no_progress_restarts() > kMaxRestarts) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_no_progress_restarts is ", config.max_no_progress_restarts(),
                     "; give 0 to ", kMaxRestarts, " (0: no such rule)"));
  }
  if (config.max_node_failures() < 0 || config.max_node_failures() > kMaxRestarts) {
    return absl::InvalidArgumentError(absl::StrCat("max_node_failures is ",
                                                   config.max_node_failures(), "; give 0 to ",
                                                   kMaxRestarts, " (0: never exclude a node)"));
  }
  MUSTER_RETURN_IF_ERROR(CheckTimeout("last_call_timeout", config.last_call_timeout_ms(), 0));
  MUSTER_RETURN_IF_ERROR(CheckTimeout("join_timeout", config.join_timeout_ms(), 0));
  // A node must be able to die: a job without a heartbeat timeout would
  // wait for a vanished node forever.
  MUSTER_RETURN_IF_ERROR(
      CheckTimeout("heartbeat_timeout", config.heartbeat_timeout_ms(), kMinHeartbeatTimeoutMs));
  return absl::OkStatus();
}

absl::Status ValidateJoinRequest(const JoinRequest& request) {
  // First: an agent of another version may mean other things by the rest.
  if (request.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this agent speaks rendezvous protocol version ", request.protocol_version(),
        request.protocol_version() == 0 ? " (a muster older than protocol versions)" : "",
        ", the rendezvous speaks version ", kProtocolVersion,
        "; run the same muster version on every node (and musterd)"));
  }
  // The service checks a client's id itself, then may put a uid's namespace
  // before it (kMaxJobNamespaceLength).
  MUSTER_RETURN_IF_ERROR(ValidateJobId(request.job_id(), kMaxJobIdLength + kMaxJobNamespaceLength));
  MUSTER_RETURN_IF_ERROR(ValidateJobConfig(request.config()));
  const NodeInfo& info = request.node();
  if (info.node_id().empty() || info.node_id().size() > kMaxNodeIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("the node id is ", info.node_id().size(),
                                                   " bytes long; a join needs a node id of 1..",
                                                   kMaxNodeIdLength, " bytes"));
  }
  if (HasControlCharacter(info.node_id())) {
    return absl::InvalidArgumentError(
        "the node id contains a control character; use printable characters");
  }
  if (request.node_secret().size() > kMaxNodeSecretLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("the node secret is ", request.node_secret().size(),
                     " bytes long; the server's secrets have at most ", kMaxNodeSecretLength));
  }
  if (request.join_key().size() > kMaxNodeSecretLength) {
    return absl::InvalidArgumentError(absl::StrCat("the join key is ", request.join_key().size(),
                                                   " bytes long; at most ", kMaxNodeSecretLength));
  }
  MUSTER_RETURN_IF_ERROR(CheckHostField("host", info.host()));
  MUSTER_RETURN_IF_ERROR(
      CheckHostField("advertised address (--local-addr)", info.advertised_addr()));
  if (info.local_world_size() <= 0 || info.local_world_size() > kMaxLocalWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("local_world_size (--nproc-per-node) is ",
                                                   info.local_world_size(), "; a node runs 1 to ",
                                                   kMaxLocalWorldSize, " workers"));
  }
  if (info.master_port_candidate() < 0 || info.master_port_candidate() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("master_port_candidate is ",
                                                   info.master_port_candidate(),
                                                   "; give a TCP port 1..65535, or 0 for none"));
  }
  if (info.peer_port() < 0 || info.peer_port() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("peer_port is ", info.peer_port(),
                                                   "; give a UDP port 1..65535, or 0 for none"));
  }
  if (info.stop_allowance_ms() < 0 || info.stop_allowance_ms() > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("stop_allowance_ms is ",
                                                   info.stop_allowance_ms(), "; give 0 to ",
                                                   kMaxTimeoutMs, " (7 days)"));
  }
  return absl::OkStatus();
}

}  // namespace muster::rdzv
