// What each worker is started with: its command line and its environment,
// computed from the launch configuration and the round's assignment. Pure.
#ifndef MUSTER_AGENT_WORKER_ENV_H_
#define MUSTER_AGENT_WORKER_ENV_H_

#include <optional>
#include <string>
#include <vector>

#include "agent/config.h"

namespace muster {

// One node's place in a round, as the rendezvous assigned it.
struct NodePlacement {
  int group_rank = 0;
  int group_world_size = 1;
  int rank_base = 0;  // RANK of LOCAL_RANK 0
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
};

struct WorkerIdentity {
  int local_rank = 0;
  int local_world_size = 1;
  std::string run_id;
  std::string role;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  // MUSTER_PROGRESS_FILE (agent/progress.h); empty: not set.
  std::string progress_file;
  // --signals-to-handle as given, for TORCHELASTIC_SIGNALS_TO_HANDLE (as
  // torchrun 2.9 and later set it); empty: not set.
  std::string signals_to_handle;
  // --virtual-local-rank: LOCAL_RANK=0, and CUDA_VISIBLE_DEVICES this
  // worker's entry of the agent's list (REQUIRES: it has one; see
  // VirtualLocalRankProblem), else its local rank.
  bool virtual_local_rank = false;
};

// `python -u SCRIPT args`, `python -u -m MODULE args`, or `SCRIPT args` with
// --no-python; each arg goes through torchrun's template (agent/template.h):
// ${local_rank} and $local_rank become the worker's local rank, $$ a $.
std::vector<std::string> WorkerCommand(const LaunchConfig& config, const std::string& python,
                                       int local_rank);

// `base` (KEY=VALUE entries, the agent's environment) with torchrun's worker
// variables set on top (TORCHRUN.md, "Environment of each worker").
// OMP_NUM_THREADS=1 is added when unset and local_world_size > 1.
// The environment of --preload's interpreter: `base` with what
// WorkerEnvironment adds for every worker of the node alike (OMP_NUM_THREADS
// among them: libraries read it as they load), none of a rank's own.
std::vector<std::string> PreloadEnvironment(const std::vector<std::string>& base,
                                            int local_world_size);

std::vector<std::string> WorkerEnvironment(const std::vector<std::string>& base,
                                           const NodePlacement& placement,
                                           const WorkerIdentity& worker);

// Why --virtual-local-rank cannot give each of `nproc` workers a device of
// the agent's CUDA_VISIBLE_DEVICES (`visible`; nullopt: unset, any count
// works), or "" when it can.
std::string VirtualLocalRankProblem(const std::optional<std::string>& visible, int nproc);

// The value of `name` in KEY=VALUE entries; nullopt when unset.
std::optional<std::string> FindEnv(const std::vector<std::string>& env, const std::string& name);

// Sets `name` in KEY=VALUE entries: in place when there, else last.
void SetEnv(std::vector<std::string>& env, const std::string& name, const std::string& value);

}  // namespace muster

#endif  // MUSTER_AGENT_WORKER_ENV_H_
