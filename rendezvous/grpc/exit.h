// The end of a process that used gRPC. When the last gRPC object goes on one
// of gRPC's own threads, gRPC cleans up in a detached thread; a process that
// returns from main meanwhile runs its static destructors under that thread
// and can die on its way out (SIGABRT or SIGSEGV after a job that succeeded).
// The order that keeps the last object on the program's own thread is in
// callback_ticker.h ("The end").
#ifndef MUSTER_RENDEZVOUS_GRPC_EXIT_H_
#define MUSTER_RENDEZVOUS_GRPC_EXIT_H_

#include "absl/time/time.h"

namespace muster::rdzv {

// What main returns, as `return FinishGrpc(Main(argc, argv));`, after every
// gRPC object of the program is destroyed: `code`, once gRPC has no user
// left and has finished cleaning up (at once for a program that never used
// it). If it has not within `limit` (an object left on one of its threads:
// a defect), the process does not return through the static destructors,
// which would race gRPC's threads into a crash that tells the caller the job
// failed: it flushes spdlog's loggers and the standard streams, says so on
// stderr, and ends with _exit(code).
int FinishGrpc(int code, absl::Duration limit = absl::Seconds(2));

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_GRPC_EXIT_H_
