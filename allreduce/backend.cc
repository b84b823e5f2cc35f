#include "allreduce/backend.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace muster::allreduce {

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  for (Backend backend : {Backend::kAuto, Backend::kNccl, Backend::kShm, Backend::kTcp}) {
    if (name == BackendName(backend)) return backend;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "'; give auto, nccl, shm or tcp"));
}

const char* BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kNccl: return "nccl";
    case Backend::kShm: return "shm";
    case Backend::kTcp: return "tcp";
  }
  return "auto";
}

bool MayUseGpu(Backend asked) { return asked == Backend::kAuto || asked == Backend::kNccl; }

absl::StatusOr<Backend> ChooseBackend(Backend asked, const BackendFacts& facts) {
  if (asked == Backend::kNccl && !facts.without_nccl.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend nccl, but rank(s) ", absl::StrJoin(facts.without_nccl, ", "),
                     " have no GPU or no NCCL; use --backend tcp or auto"));
  }
  if (asked == Backend::kShm && !facts.elsewhere.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend shm, but rank(s) ", absl::StrJoin(facts.elsewhere, ", "),
        " run on another machine than rank 0, or see another /dev/shm; use --backend tcp or "
        "auto"));
  }
  if (asked != Backend::kAuto) return asked;
  if (facts.without_nccl.empty()) return Backend::kNccl;
  return facts.elsewhere.empty() && facts.world_size > 1 ? Backend::kShm : Backend::kTcp;
}

}  // namespace muster::allreduce
