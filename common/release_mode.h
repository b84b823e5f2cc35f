// What a production binary (muster, musterd) turns off at start.
#ifndef MUSTER_COMMON_RELEASE_MODE_H_
#define MUSTER_COMMON_RELEASE_MODE_H_

#include "absl/synchronization/mutex.h"

namespace muster {

// Debian builds Abseil without NDEBUG, which leaves its mutex deadlock
// detection on: a debugging aid that records every lock order in a global
// graph (a fifth of musterd's CPU at 10,000 nodes, in gRPC's locks as much as
// ours). The unit tests keep it on, where it catches lock-order bugs.
inline void EnterReleaseMode() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace muster

#endif  // MUSTER_COMMON_RELEASE_MODE_H_
