#include "launcher/command_line.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/endpoint.h"

namespace muster {
namespace {

// The PET_ variables an allocation stands for, when Slurm's defaults apply.
absl::StatusOr<std::optional<SlurmJob>> SlurmDefaults(const std::vector<std::string>& args,
                                                      const EnvLookup& env,
                                                      std::map<std::string, std::string>& pet) {
  const bool standalone = std::find(args.begin(), args.end(), "--standalone") != args.end() ||
                          !env("PET_STANDALONE").value_or("").empty();
  if (standalone || env("MUSTER_IGNORE_SLURM").value_or("") == "1") return std::nullopt;
  absl::StatusOr<std::optional<SlurmJob>> job =
      DetectSlurm([&env](const char* name) { return env(name); });
  if (!job.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        job.status().message(), " (or set MUSTER_IGNORE_SLURM=1 to launch as if outside Slurm)"));
  }
  if (!*job) return job;
  const SlurmJob& j = **job;
  pet["PET_NNODES"] = std::to_string(j.nnodes);
  pet["PET_NODE_RANK"] = std::to_string(j.node_id);
  pet["PET_RDZV_ID"] = j.job_id;
  pet["PET_RDZV_BACKEND"] = "c10d";
  pet["PET_RDZV_ENDPOINT"] = FormatEndpoint(j.rendezvous_host(), j.port);
  pet["PET_NPROC_PER_NODE"] = std::to_string(j.nproc);
  return job;
}

}  // namespace

absl::StatusOr<CommandLine> ReadCommandLine(const std::vector<std::string>& args,
                                            const EnvLookup& env,
                                            const AccelerateLaunch* accelerate) {
  std::map<std::string, std::string> slurm_pet;
  absl::StatusOr<std::optional<SlurmJob>> slurm = SlurmDefaults(args, env, slurm_pet);
  if (!slurm.ok()) return slurm.status();
  absl::StatusOr<ParsedCommandLine> parsed =
      ParseCommandLine(args, [&](const std::string& name) -> std::optional<std::string> {
        if (accelerate != nullptr) {
          auto it = accelerate->options.find(name);
          if (it != accelerate->options.end()) return it->second;
        }
        if (std::optional<std::string> value = env(name)) return value;
        auto it = slurm_pet.find(name);
        if (it == slurm_pet.end()) return std::nullopt;
        return it->second;
      });
  if (!parsed.ok()) return parsed.status();
  CommandLine out{*std::move(parsed), *std::move(slurm)};
  LaunchConfig& config = out.parsed.config;
  config.in_slurm = out.slurm.has_value();
  if (out.slurm && config.rdzv_endpoint == slurm_pet["PET_RDZV_ENDPOINT"] &&
      !config.rdzv_conf.is_host) {
    config.rdzv_conf.is_host = out.slurm->node_id == 0;
  }
  return out;
}

}  // namespace muster
