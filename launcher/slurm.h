// What a Slurm allocation tells muster, read from the environment srun and
// sbatch set: the job, the nodes, this node's place, its GPUs. Pure: the
// caller passes the environment; the launcher applies what no flag overrides.
#ifndef MUSTER_LAUNCHER_SLURM_H_
#define MUSTER_LAUNCHER_SLURM_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace muster {

struct SlurmJob {
  std::string job_id;              // SLURM_JOB_ID: the rendezvous id
  int nnodes = 1;                  // SLURM_NNODES
  int node_id = 0;                 // SLURM_NODEID: the node-rank hint; node 0 hosts
  std::vector<std::string> hosts;  // SLURM_JOB_NODELIST, expanded
  std::string hostlist_variable;   // which variable gave the hosts
  int nproc = 1;                   // workers per node
  std::string nproc_from;          // "SLURM_GPUS_ON_NODE=4", ..., or "default"
  int port = 0;                    // the rendezvous port, from the job id

  // The first host: where node 0's agent hosts the rendezvous.
  const std::string& rendezvous_host() const { return hosts.front(); }
  // One line for the start of the run: what was inferred, from what.
  std::string Describe() const;
};

// The rendezvous port of a job: 20000 + job id mod 10000, so that two jobs
// sharing a node do not collide, below Linux's ephemeral ports.
int SlurmRendezvousPort(const std::string& job_id);

// nullopt outside an allocation (no SLURM_JOB_ID). kInvalidArgument names
// the variables that disagree: SLURM_NNODES against the node list,
// SLURM_NODEID out of range, more than one task per node (each would be an
// agent), a malformed node list or GPU count.
absl::StatusOr<std::optional<SlurmJob>> DetectSlurm(
    const std::function<std::optional<std::string>(const char*)>& get);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_SLURM_H_
