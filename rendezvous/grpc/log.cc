#include "rendezvous/grpc/log.h"

#include <grpc/support/log.h>

#include "absl/strings/match.h"
#include "common/log.h"

namespace muster::rdzv {
namespace {

void ForwardToSpdlog(gpr_log_func_args* args) {
  static const auto logger = Logger("grpc");
  const char* message = args->message != nullptr ? args->message : "";
  // GPR_ASSERT logs this, then aborts: the one line that must not be hidden.
  const spdlog::level::level_enum level = absl::StartsWith(message, "assertion failed")
                                              ? spdlog::level::critical
                                              : spdlog::level::debug;
  logger->log(level, "{}:{}: {}", args->file != nullptr ? args->file : "?", args->line, message);
}

}  // namespace

void RouteGrpcLogsToSpdlog() { gpr_set_log_function(ForwardToSpdlog); }

}  // namespace muster::rdzv
