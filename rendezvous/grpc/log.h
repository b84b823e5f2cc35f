// gRPC's own log lines ("Failed to add :29400 address to server", connection
// noise) go to spdlog, not raw to stderr.
#ifndef MUSTER_RENDEZVOUS_GRPC_LOG_H_
#define MUSTER_RENDEZVOUS_GRPC_LOG_H_

namespace muster::rdzv {

// Routes gRPC's log through muster's Logger("grpc") at debug level, so a user
// sees muster's own clear message instead, and MUSTER_LOG_LEVEL=debug (with
// GRPC_VERBOSITY) shows gRPC's. An assertion gRPC fails just before it aborts
// stays visible, at critical. Call before gRPC starts; thread-safe after.
void RouteGrpcLogsToSpdlog();

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_GRPC_LOG_H_
