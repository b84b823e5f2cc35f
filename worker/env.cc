#include "worker/env.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace muster::worker {
namespace {

constexpr const char* kHowToRun =
    "run it under a launcher (muster, torchrun or srun), which sets RANK, WORLD_SIZE, "
    "LOCAL_RANK, MASTER_ADDR and MASTER_PORT for each worker";

absl::StatusOr<int> ReadInt(const std::function<std::optional<std::string>(const char*)>& get,
                            const char* name, std::optional<int> fallback, int min, int max) {
  const std::optional<std::string> value = get(name);
  if (!value) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(name, " is not set; ", kHowToRun));
  }
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed) || parsed < min || parsed > max) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", *value, "' is not a number from ",
                                                   min, " to ", max, "; ", kHowToRun));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<WorkerEnv> ReadWorkerEnv(
    const std::function<std::optional<std::string>(const char*)>& get) {
  WorkerEnv env;
  absl::StatusOr<int> world = ReadInt(get, "WORLD_SIZE", std::nullopt, 1, 1 << 20);
  if (!world.ok()) return world.status();
  env.world_size = *world;
  absl::StatusOr<int> rank = ReadInt(get, "RANK", std::nullopt, 0, 1 << 20);
  if (!rank.ok()) return rank.status();
  if (*rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("RANK=", *rank, " but WORLD_SIZE=",
                                                   env.world_size, ": ranks go from 0 to ",
                                                   env.world_size - 1, "; ", kHowToRun));
  }
  env.rank = *rank;
  absl::StatusOr<int> local_rank = ReadInt(get, "LOCAL_RANK", 0, 0, 1 << 20);
  if (!local_rank.ok()) return local_rank.status();
  env.local_rank = *local_rank;
  if (env.world_size == 1) {
    // One rank talks to nobody: MASTER_ADDR and MASTER_PORT may be missing.
    env.master_addr = get("MASTER_ADDR").value_or("127.0.0.1");
    absl::StatusOr<int> port = ReadInt(get, "MASTER_PORT", 0, 0, 65535);
    if (!port.ok()) return port.status();
    env.master_port = *port;
    env.bootstrap_port = *port;
    return env;
  }
  const std::optional<std::string> addr = get("MASTER_ADDR");
  if (!addr || addr->empty()) {
    return absl::InvalidArgumentError(absl::StrCat("MASTER_ADDR is not set; ", kHowToRun));
  }
  env.master_addr = *addr;
  absl::StatusOr<int> port = ReadInt(get, "MASTER_PORT", std::nullopt, 1, 65535);
  if (!port.ok()) return port.status();
  env.master_port = *port;
  env.bootstrap_port = *port;
  // PyTorch's own test: the exact string "True".
  if (get("TORCHELASTIC_USE_AGENT_STORE") == "True") {
    if (env.master_port == 65535) {
      return absl::InvalidArgumentError(
          "MASTER_PORT=65535 is held by the launcher's store (TORCHELASTIC_USE_AGENT_STORE=True), "
          "and muster-allreduce needs MASTER_PORT+1 for itself; pick a lower master port");
    }
    env.agent_store = true;
    env.bootstrap_port = env.master_port + 1;
  }
  return env;
}

std::string BootstrapPortName(const WorkerEnv& env) {
  if (!env.agent_store) return absl::StrCat("MASTER_PORT ", env.bootstrap_port);
  return absl::StrCat("MASTER_PORT+1 ", env.bootstrap_port,
                      " (the launcher's store holds MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True)");
}

}  // namespace muster::worker
