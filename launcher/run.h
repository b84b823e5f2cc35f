// A launch, from a parsed command line to the job's end: the checks that can
// be made before anything starts, the rendezvous (embedded when this node
// hosts it, else reached over gRPC), and this node's agent.
#ifndef MUSTER_LAUNCHER_RUN_H_
#define MUSTER_LAUNCHER_RUN_H_

#include "absl/status/statusor.h"
#include "agent/config.h"

namespace muster {

// Runs this node's part of `config` to the job's end. Checks the job id,
// the worker count (--nproc-per-node against the GPUs and CPUs), the
// program (ResolveProgram) and a static backend's node count before
// anything starts; then blocks the agent's signals, hosts or reaches the
// rendezvous and runs the agent. Reads the process environment (PATH,
// PYTHON_EXEC, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, MUSTER_LOG_LEVEL).
//
// Returns muster's exit code: Agent::Run's, or kExitWorkersFailed after
// printing why the agent could not set up. Errors: kInvalidArgument, the
// launch cannot start as given (a usage error: nothing was started), one
// line with the fix.
absl::StatusOr<int> RunLaunch(LaunchConfig config);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_RUN_H_
