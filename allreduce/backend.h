// The backends muster-allreduce can run on, and rank 0's choice among them
// from what the ranks said of themselves. Pure.
#ifndef MUSTER_ALLREDUCE_BACKEND_H_
#define MUSTER_ALLREDUCE_BACKEND_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster::allreduce {

enum class Backend {
  kAuto,  // asked only: rank 0 picks one of the others
  kNccl,  // NCCL on every rank's GPU
  kShm,   // shared memory: every rank on rank 0's machine, with its /dev/shm
  kTcp,   // a TCP ring: anywhere
};

// "auto", "nccl", "shm", "tcp" (the --backend values and the Welcome's).
// kInvalidArgument names the accepted ones.
absl::StatusOr<Backend> ParseBackend(absl::string_view name);
const char* BackendName(Backend backend);

// Whether a rank asked for `asked` may set up its GPU: not for a CPU
// backend, which leaves the GPUs alone.
bool MayUseGpu(Backend asked);

// What rank 0 knows of the ranks, for the choice.
struct BackendFacts {
  int world_size = 1;
  std::vector<int> without_nccl;  // ranks with no GPU, or a build without NCCL
  std::vector<int> elsewhere;     // ranks on another machine than rank 0, or another /dev/shm
};

// The backend every rank runs: the one asked, when every rank can use it;
// for kAuto, NCCL where every rank can, else shared memory where all ranks
// (more than one) share rank 0's machine, else TCP. Never kAuto.
// kInvalidArgument when nccl or shm is asked and some rank cannot use it,
// naming those ranks and the fix.
absl::StatusOr<Backend> ChooseBackend(Backend asked, const BackendFacts& facts);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_BACKEND_H_
