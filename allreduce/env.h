// The standard environment a worker reads (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE), checked, so that
// muster-allreduce runs the same under muster, torchrun or srun. Under srun
// itself, with no launcher in between, Slurm's variables stand in.
#ifndef MUSTER_ALLREDUCE_ENV_H_
#define MUSTER_ALLREDUCE_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace muster::allreduce {

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
  // Where Slurm's variables stood in: what came from which ("under srun:
  // RANK 3 (SLURM_PROCID), ..."); empty otherwise.
  std::string under;
  // Which job this rank belongs to, where that is known: the launcher's
  // TORCHELASTIC_RUN_ID, or "Slurm job J step S". Rank 0 turns away a rank
  // of another job that reaches its port.
  std::string job;
};

// "MASTER_PORT" or "MASTER_PORT+1", with the port: for messages.
std::string BootstrapPortName(const WorkerEnv& env);

// Reads the variables through `get` (getenv in the binary). Every error is
// kInvalidArgument and names the variable, its value and the fix. Where RANK
// is not set but srun started this rank itself (SLURM_PROCID and
// SLURM_STEP_NUM_TASKS are set), each standard variable that is not set
// comes from Slurm's: RANK from SLURM_PROCID, WORLD_SIZE from
// SLURM_STEP_NUM_TASKS, LOCAL_RANK from SLURM_LOCALID, MASTER_ADDR the first
// host of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST, SLURM_NODELIST),
// MASTER_PORT 10000 + (job id mod 100) x 100 + step id mod 100.
absl::StatusOr<WorkerEnv> ReadWorkerEnv(
    const std::function<std::optional<std::string>(const char*)>& get);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_ENV_H_
