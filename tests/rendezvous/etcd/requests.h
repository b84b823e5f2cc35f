// The requests the etcd backend's tests send as an agent would.
#ifndef MUSTER_TESTS_RENDEZVOUS_ETCD_REQUESTS_H_
#define MUSTER_TESTS_RENDEZVOUS_ETCD_REQUESTS_H_

#include <string>

#include "proto/rendezvous.pb.h"
#include "rendezvous/rules/protocol.h"

namespace muster::etcd {

// A join of `node` to a job of `nodes` nodes (min = max).
inline rdzv::JoinRequest JoinOf(const std::string& node, int nodes, int max_restarts = 1) {
  rdzv::JoinRequest request;
  request.set_protocol_version(rdzv::kProtocolVersion);
  rdzv::JobConfig* config = request.mutable_config();
  config->set_min_nodes(nodes);
  config->set_max_nodes(nodes);
  config->set_max_restarts(max_restarts);
  config->set_join_timeout_ms(60'000);
  config->set_heartbeat_timeout_ms(60'000);
  rdzv::NodeInfo* info = request.mutable_node();
  info->set_node_id(node);
  info->set_host("host-" + node);
  info->set_advertised_addr("addr-" + node);
  info->set_local_world_size(1);
  info->set_node_rank_hint(-1);
  info->set_master_port_candidate(29500);
  return request;
}

}  // namespace muster::etcd

#endif  // MUSTER_TESTS_RENDEZVOUS_ETCD_REQUESTS_H_
