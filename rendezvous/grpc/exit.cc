#include "rendezvous/grpc/exit.h"

#include <errno.h>  // program_invocation_short_name
#include <unistd.h>

#include <cstdio>

#include <grpc/grpc.h>
#include <spdlog/spdlog.h>

#include "absl/time/clock.h"

namespace muster::rdzv {
namespace {

// False if gRPC had not cleaned up within `limit`.
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

}  // namespace

int FinishGrpc(int code, absl::Duration limit) {
  if (WaitForGrpcShutdown(limit)) return code;
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& logger) { logger->flush(); });
  std::fflush(stdout);
  std::fprintf(stderr,
               "%s: gRPC had not finished cleaning up %s after the end; exiting %d without "
               "it (please report this)\n",
               program_invocation_short_name, absl::FormatDuration(limit).c_str(), code);
  std::fflush(stderr);
  _exit(code);
}

}  // namespace muster::rdzv
