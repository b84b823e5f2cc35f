// A node's secret: the server hands one to each node as it joins, and only
// the holder may speak for that node afterwards (heartbeat, watch, reports,
// leave, rejoin).
#ifndef MUSTER_RENDEZVOUS_NODE_SECRET_H_
#define MUSTER_RENDEZVOUS_NODE_SECRET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster::rdzv {

// The longest secret a request may present, in bytes.
inline constexpr size_t kMaxNodeSecretLength = 128;

// 16 bytes from getrandom(2), as 32 lowercase hex digits. kInternal when the
// kernel gives no randomness.
absl::StatusOr<std::string> NewNodeSecret();

// Whether a == b, in time that depends on the lengths only, not on where
// the first difference is.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_NODE_SECRET_H_
