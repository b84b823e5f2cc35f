// A node's secret: the server hands one to each node as it joins, and only
// the holder may speak for that node afterwards (heartbeat, watch, reports,
// leave, rejoin). The state machine compares secrets (ConstantTimeEquals,
// common/constant_time.h); the server draws them (auth/node_secret.h).
#ifndef MUSTER_RENDEZVOUS_RULES_NODE_SECRET_H_
#define MUSTER_RENDEZVOUS_RULES_NODE_SECRET_H_

#include <cstddef>

namespace muster::rdzv {

// The longest secret a request may present, in bytes.
inline constexpr size_t kMaxNodeSecretLength = 128;

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_RULES_NODE_SECRET_H_
