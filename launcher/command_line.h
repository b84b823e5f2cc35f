// muster's whole command line: Slurm's allocation as defaults (inside one),
// then torchrun's options over them (ParseCommandLine). Pure apart from
// --standalone's random id: the environment is the caller's lookup.
#ifndef MUSTER_LAUNCHER_COMMAND_LINE_H_
#define MUSTER_LAUNCHER_COMMAND_LINE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/accelerate_config.h"
#include "launcher/options.h"
#include "launcher/slurm.h"

namespace muster {

struct CommandLine {
  ParsedCommandLine parsed;
  // The allocation whose defaults were applied; nullopt outside Slurm, with
  // --standalone (or PET_STANDALONE), or with MUSTER_IGNORE_SLURM=1.
  std::optional<SlurmJob> slurm;
};

// Inside a Slurm allocation, what it says (DetectSlurm) fills every option
// that neither a flag nor the user's PET_ variable gives: --nnodes,
// --node-rank, --rdzv-id, --rdzv-backend c10d, --rdzv-endpoint (the first
// host, port from the job id) and --nproc-per-node. When the endpoint is
// Slurm's and is_host is not given, node 0 hosts the rendezvous and no other
// node does: the host names in the node list often differ from the nodes'
// own names.
//
// Errors: kInvalidArgument, ParseCommandLine's, or the allocation's
// inconsistency with the way out (MUSTER_IGNORE_SLURM=1).
//
// With `accelerate` (--accelerate-config's translation), its torchrun
// options stand between the flags and the PET_ variables: a flag wins over
// the file, the file over the environment and Slurm, as under `accelerate
// launch`.
absl::StatusOr<CommandLine> ReadCommandLine(const std::vector<std::string>& args,
                                            const EnvLookup& env,
                                            const AccelerateLaunch* accelerate = nullptr);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_COMMAND_LINE_H_
