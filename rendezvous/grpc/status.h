// The one place where gRPC and absl statuses are translated.
#ifndef MUSTER_RENDEZVOUS_GRPC_STATUS_H_
#define MUSTER_RENDEZVOUS_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace muster::rdzv {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_GRPC_STATUS_H_
