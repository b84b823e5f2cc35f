// The NCCL backend: one GPU per rank (LOCAL_RANK within the visible ones),
// buffers, a stream and a communicator, all released by their owners.
// Compiled where the CUDA toolkit and NCCL are; runs where there is a GPU.
#ifndef MUSTER_ALLREDUCE_NCCL_BACKEND_H_
#define MUSTER_ALLREDUCE_NCCL_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allreduce/allreduce.pb.h"
#include "allreduce/env.h"
#include "allreduce/runner.h"

namespace muster::allreduce {

struct GpuInfo {
  bool present = false;  // no GPU, or no driver: the TCP backend it is
  int device = -1;
  std::string bus_id;
};

// The GPU of LOCAL_RANK: device LOCAL_RANK among the visible ones, or the
// only one when a single GPU is visible (a launcher that gives each rank its
// own CUDA_VISIBLE_DEVICES). kInvalidArgument when LOCAL_RANK is beyond
// several visible GPUs: ranks would share GPUs.
absl::StatusOr<GpuInfo> ProbeGpu(int local_rank);

// A fresh ncclUniqueId, as bytes (rank 0, on its GPU `device`).
absl::StatusOr<std::string> NewNcclId(int device);

// Joins the communicator rank 0 made (`welcome.nccl_id()`) on `gpu`, with
// buffers for `max_bytes`. A group of collectives that does not finish
// within `timeout` fails, and the communicator is aborted; a blocking NCCL
// call (joining, a first collective's connections, finishing) that hangs
// past `timeout` plus 10 s ends the process with exit 1, naming it.
absl::StatusOr<std::unique_ptr<Runner>> NewNcclRunner(const WorkerEnv& env, const Welcome& welcome,
                                                      const GpuInfo& gpu, int64_t max_bytes,
                                                      const RunnerOptions& options,
                                                      absl::Duration timeout);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_NCCL_BACKEND_H_
