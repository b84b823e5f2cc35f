#include "rendezvous/grpc_exit.h"

#include <grpc/grpc.h>

#include "absl/time/clock.h"

namespace muster::rdzv {

bool WaitForGrpcShutdown(absl::Duration limit) {
  // grpc_is_initialized takes the lock gRPC's clean-up holds: a 0 means the
  // clean-up is over, not merely begun.
  const absl::Time give_up = absl::Now() + limit;
  while (grpc_is_initialized()) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace muster::rdzv
