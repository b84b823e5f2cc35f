// The end of a process that used gRPC. When the last gRPC object goes on one
// of gRPC's own threads, gRPC cleans up in a detached thread; a process that
// returns from main meanwhile runs its static destructors under that thread
// and can die on its way out (SIGABRT or SIGSEGV after a job that succeeded).
#ifndef MUSTER_RENDEZVOUS_GRPC_EXIT_H_
#define MUSTER_RENDEZVOUS_GRPC_EXIT_H_

#include "absl/time/time.h"

namespace muster::rdzv {

// Waits until gRPC has no user left and has finished cleaning up, for at
// most `limit`; false if it had not by then. Call at the end of main, after
// every gRPC object of the program is destroyed.
bool WaitForGrpcShutdown(absl::Duration limit);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_GRPC_EXIT_H_
