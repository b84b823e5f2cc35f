// Drawing a node's secret (rules/node_secret.h says what it is for).
#ifndef MUSTER_RENDEZVOUS_AUTH_NODE_SECRET_H_
#define MUSTER_RENDEZVOUS_AUTH_NODE_SECRET_H_

#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/rules/node_secret.h"

namespace muster::rdzv {

// 16 bytes from getrandom(2), as 32 lowercase hex digits (at most
// kMaxNodeSecretLength). kInternal when the kernel gives no randomness.
absl::StatusOr<std::string> NewNodeSecret();

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_AUTH_NODE_SECRET_H_
