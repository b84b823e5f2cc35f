// Requests the service tests send, built one way: a join of the current
// protocol version, for a job of `nodes` nodes (min = max), a minute's
// timeouts, one worker.
#ifndef MUSTER_TESTS_RENDEZVOUS_SERVER_REQUESTS_H_
#define MUSTER_TESTS_RENDEZVOUS_SERVER_REQUESTS_H_

#include <string>

#include "absl/time/time.h"
#include "proto/rendezvous.pb.h"
#include "rendezvous/rules/protocol.h"

namespace muster::rdzv {

// The deadline of the tests' calls: shorter than kPendingWait (pending.h), so
// a callback always lands before a test gives up on it.
inline constexpr absl::Duration kRpc = absl::Seconds(5);
// The token of the servers that take one.
inline constexpr char kToken[] = "s3cret-token-0123456789abcdef";

inline JoinRequest MakeJoin(const std::string& job, const std::string& node, int nodes = 1) {
  JoinRequest request;
  request.set_job_id(job);
  request.set_protocol_version(kProtocolVersion);
  JobConfig* config = request.mutable_config();
  config->set_min_nodes(nodes);
  config->set_max_nodes(nodes);
  config->set_join_timeout_ms(60'000);
  config->set_heartbeat_timeout_ms(60'000);
  NodeInfo* info = request.mutable_node();
  info->set_node_id(node);
  info->set_host("host-" + node);
  info->set_local_world_size(1);
  info->set_node_rank_hint(-1);
  info->set_master_port_candidate(29500);
  return request;
}

}  // namespace muster::rdzv

#endif  // MUSTER_TESTS_RENDEZVOUS_SERVER_REQUESTS_H_
