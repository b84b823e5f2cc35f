#include "allreduce/env.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hostlist.h"

namespace muster::allreduce {
namespace {

constexpr const char* kHowToRun =
    "run it under a launcher: muster or torchrun (which set RANK, WORLD_SIZE, LOCAL_RANK, "
    "MASTER_ADDR and MASTER_PORT for each worker), or srun, a task per rank (SLURM_PROCID, "
    "SLURM_STEP_NUM_TASKS)";

using Getter = std::function<std::optional<std::string>(const char*)>;

absl::StatusOr<int> ReadInt(const Getter& get, const char* name, std::optional<int> fallback,
                            int min, int max) {
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

// Under srun with no launcher in between, Slurm's variables stand in for the
// standard ones that are not set: the values, and a line that says whence.
struct StandIns {
  std::map<std::string, std::string> values;
  std::string description;
  std::string job;  // "Slurm job J step S"
};

absl::StatusOr<StandIns> SlurmStandIns(const Getter& get) {
  StandIns out;
  std::vector<std::string> said;
  auto stand_in = [&](const char* name, const std::string& value, const std::string& whence) {
    if (get(name)) return;  // the standard variable wins
    out.values[name] = value;
    said.push_back(absl::StrCat(name, " ", value, " (", whence, ")"));
  };
  stand_in("RANK", *get("SLURM_PROCID"), "SLURM_PROCID");
  stand_in("WORLD_SIZE", *get("SLURM_STEP_NUM_TASKS"), "SLURM_STEP_NUM_TASKS");
  if (get("SLURM_LOCALID")) stand_in("LOCAL_RANK", *get("SLURM_LOCALID"), "SLURM_LOCALID");
  if (!get("MASTER_ADDR")) {
    for (const char* list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (!get(list)) continue;
      absl::StatusOr<std::vector<std::string>> hosts = muster::ExpandHostlist(*get(list));
      if (!hosts.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(list, ": ", hosts.status().message()));
      }
      if (!hosts->empty()) {
        stand_in("MASTER_ADDR", hosts->front(), absl::StrCat("the first host of ", list));
      }
      break;
    }
  }
  // A port of this job step's own, 10000-19999: below Linux's ephemeral
  // ports and apart from muster's rendezvous ports (20000 + job id mod 10000).
  int64_t job = -1, step = 0;
  if (!get("SLURM_JOB_ID") || !absl::SimpleAtoi(*get("SLURM_JOB_ID"), &job) || job < 0) {
    job = -1;
  }
  if (!get("SLURM_STEP_ID") || !absl::SimpleAtoi(*get("SLURM_STEP_ID"), &step) || step < 0) {
    step = 0;
  }
  if (!get("MASTER_PORT")) {
    if (job < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("under srun, MASTER_PORT comes from SLURM_JOB_ID, which is '",
                       get("SLURM_JOB_ID").value_or("not set"), "'; set MASTER_PORT"));
    }
    stand_in("MASTER_PORT", absl::StrCat(10000 + job % 100 * 100 + step % 100),
             "from SLURM_JOB_ID and SLURM_STEP_ID");
  }
  if (job >= 0) out.job = absl::StrCat("Slurm job ", job, " step ", step);
  out.description = absl::StrCat("under srun: ", absl::StrJoin(said, ", "));
  return out;
}

absl::StatusOr<WorkerEnv> ReadStandard(const Getter& get) {
  WorkerEnv env;
  absl::StatusOr<int> world = ReadInt(get, "WORLD_SIZE", std::nullopt, 1, 1 << 20);
  if (!world.ok()) return world.status();
  env.world_size = *world;
  absl::StatusOr<int> rank = ReadInt(get, "RANK", std::nullopt, 0, 1 << 20);
  if (!rank.ok()) return rank.status();
  if (*rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK=", *rank, " but WORLD_SIZE=", env.world_size, ": ranks go from 0 to ",
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

}  // namespace

absl::StatusOr<WorkerEnv> ReadWorkerEnv(const Getter& get) {
  // An srun task: the batch script itself, and what it starts without srun,
  // has SLURM_PROCID (0) but no SLURM_STEP_NUM_TASKS.
  if (get("RANK") || !get("SLURM_PROCID") || !get("SLURM_STEP_NUM_TASKS")) {
    absl::StatusOr<WorkerEnv> env = ReadStandard(get);
    if (env.ok()) env->job = get("TORCHELASTIC_RUN_ID").value_or("");
    return env;
  }
  absl::StatusOr<StandIns> stand_ins = SlurmStandIns(get);
  if (!stand_ins.ok()) return stand_ins.status();
  absl::StatusOr<WorkerEnv> env = ReadStandard([&](const char* name) -> std::optional<std::string> {
    if (std::optional<std::string> value = get(name)) return value;
    auto it = stand_ins->values.find(name);
    if (it == stand_ins->values.end()) return std::nullopt;
    return it->second;
  });
  if (env.ok()) {
    env->under = stand_ins->description;
    env->job = stand_ins->job;
  }
  return env;
}

std::string BootstrapPortName(const WorkerEnv& env) {
  if (!env.agent_store) return absl::StrCat("MASTER_PORT ", env.bootstrap_port);
  return absl::StrCat(
      "MASTER_PORT+1 ", env.bootstrap_port,
      " (the launcher's store holds MASTER_PORT: TORCHELASTIC_USE_AGENT_STORE=True)");
}

}  // namespace muster::allreduce
