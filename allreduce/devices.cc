#include "allreduce/devices.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muster::allreduce {

absl::Status CheckDistinctDevices(const std::vector<RankIdentity>& ranks) {
  std::map<std::pair<std::string, std::string>, int> first_user;  // (host, bus id) -> rank
  for (const RankIdentity& identity : ranks) {
    if (identity.bus_id.empty()) continue;
    auto [it, fresh] = first_user.try_emplace({identity.host, identity.bus_id}, identity.rank);
    if (fresh) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks ", it->second, " and ", identity.rank, " both use the GPU at ", identity.bus_id,
        " on ", identity.host,
        ": each rank needs its own GPU. Pick the device from LOCAL_RANK (muster and torchrun "
        "set it for each worker), or give each rank its own CUDA_VISIBLE_DEVICES"));
  }
  return absl::OkStatus();
}

}  // namespace muster::allreduce
