// The standard environment a worker reads (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE), checked, so that
// muster-allreduce runs the same under muster, torchrun or srun.
#ifndef MUSTER_WORKER_ENV_H_
#define MUSTER_WORKER_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace muster::worker {

struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  int master_port = 0;
  // The port rank 0 listens on for the bootstrap. MASTER_PORT, except where
  // the launcher's own store already holds MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True: torchrun's static rendezvous, and
  // every rendezvous since PyTorch 2.4): then MASTER_PORT + 1.
  int bootstrap_port = 0;
  bool agent_store = false;
};

// "MASTER_PORT" or "MASTER_PORT+1", with the port: for messages.
std::string BootstrapPortName(const WorkerEnv& env);

// Reads the variables through `get` (getenv in the binary). Every error is
// kInvalidArgument and names the variable, its value and the fix.
absl::StatusOr<WorkerEnv> ReadWorkerEnv(
    const std::function<std::optional<std::string>(const char*)>& get);

}  // namespace muster::worker

#endif  // MUSTER_WORKER_ENV_H_
