#include "agent/worker_env.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/template.h"

namespace muster {

std::vector<std::string> WorkerCommand(const LaunchConfig& config, const std::string& python,
                                       int local_rank) {
  std::vector<std::string> argv;
  if (!config.no_python) {
    argv = {python, "-u"};
    if (config.module) argv.push_back("-m");
  }
  const std::map<std::string, std::string, std::less<>> vars = {
      {"local_rank", absl::StrCat(local_rank)}};
  // torchrun substitutes in the script too when python runs it (it is one of
  // the interpreter's arguments), not the program --no-python runs.
  argv.push_back(config.no_python ? config.script : SubstituteTemplate(config.script, vars));
  for (const std::string& arg : config.script_args) {
    argv.push_back(SubstituteTemplate(arg, vars));
  }
  return argv;
}

namespace {

// What every worker of the node gets unless `set` (its keys) has it.
std::vector<std::pair<std::string, std::string>> NodeDefaults(
    const std::map<std::string, size_t>& set, int local_world_size) {
  std::vector<std::pair<std::string, std::string>> defaults;
  for (const char* key : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}) {
    if (!set.contains(key)) defaults.emplace_back(key, "1");
  }
  if (!set.contains("OMP_NUM_THREADS") && local_world_size > 1) {
    defaults.emplace_back("OMP_NUM_THREADS", "1");
  }
  return defaults;
}

}  // namespace

std::vector<std::string> WorkerEnvironment(const std::vector<std::string>& base,
                                           const NodePlacement& placement,
                                           const WorkerIdentity& worker) {
  // Keeps the agent's order; our variables replace theirs in place or go last.
  std::vector<std::string> env;
  std::map<std::string, size_t> index;
  auto set = [&](const std::string& key, const std::string& value) {
    std::string entry = absl::StrCat(key, "=", value);
    auto [it, inserted] = index.try_emplace(key, env.size());
    if (inserted) {
      env.push_back(std::move(entry));
    } else {
      env[it->second] = std::move(entry);
    }
  };
  for (const std::string& entry : base) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    set(entry.substr(0, eq), entry.substr(eq + 1));
  }
  const int rank = placement.rank_base + worker.local_rank;
  if (worker.virtual_local_rank) {
    // As torchrun: the worker's own entry of the agent's list, else its index.
    set("LOCAL_RANK", "0");
    auto visible = index.find("CUDA_VISIBLE_DEVICES");
    std::string device = absl::StrCat(worker.local_rank);
    if (visible != index.end()) {
      const std::string list = env[visible->second].substr(sizeof("CUDA_VISIBLE_DEVICES"));
      std::vector<absl::string_view> devices = absl::StrSplit(list, ',');
      const size_t at = static_cast<size_t>(worker.local_rank);
      device = at < devices.size() ? std::string(absl::StripAsciiWhitespace(devices[at])) : "";
    }
    set("CUDA_VISIBLE_DEVICES", device);
  } else {
    set("LOCAL_RANK", absl::StrCat(worker.local_rank));
  }
  set("RANK", absl::StrCat(rank));
  set("GROUP_RANK", absl::StrCat(placement.group_rank));
  set("GROUP_WORLD_SIZE", absl::StrCat(placement.group_world_size));
  set("ROLE_RANK", absl::StrCat(rank));
  set("ROLE_WORLD_SIZE", absl::StrCat(placement.world_size));
  set("ROLE_NAME", worker.role);
  set("LOCAL_WORLD_SIZE", absl::StrCat(worker.local_world_size));
  set("WORLD_SIZE", absl::StrCat(placement.world_size));
  set("MASTER_ADDR", placement.master_addr);
  set("MASTER_PORT", absl::StrCat(placement.master_port));
  set("TORCHELASTIC_RESTART_COUNT", absl::StrCat(placement.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", absl::StrCat(placement.max_restarts));
  set("TORCHELASTIC_RUN_ID", worker.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  set("TORCHELASTIC_ERROR_FILE", worker.error_file);
  if (!worker.progress_file.empty()) set("MUSTER_PROGRESS_FILE", worker.progress_file);
  if (!worker.signals_to_handle.empty()) {
    set("TORCHELASTIC_SIGNALS_TO_HANDLE", worker.signals_to_handle);
  }
  for (const auto& [key, value] : NodeDefaults(index, worker.local_world_size)) set(key, value);
  return env;
}

std::vector<std::string> PreloadEnvironment(const std::vector<std::string>& base,
                                            int local_world_size) {
  std::map<std::string, size_t> index;
  for (const std::string& entry : base) index.try_emplace(entry.substr(0, entry.find('=')), 0);
  std::vector<std::string> env = base;
  for (const auto& [key, value] : NodeDefaults(index, local_world_size)) {
    env.push_back(absl::StrCat(key, "=", value));
  }
  return env;
}

std::string VirtualLocalRankProblem(const std::optional<std::string>& visible, int nproc) {
  if (!visible) return "";
  const size_t devices = std::count(visible->begin(), visible->end(), ',') + 1;
  if (devices >= static_cast<size_t>(nproc)) return "";
  return absl::StrCat(
      "--virtual-local-rank gives each worker one device of CUDA_VISIBLE_DEVICES=", *visible,
      ", which names ", devices, " for ", nproc, " workers; give --nproc-per-node ", devices,
      " or name a device for each worker");
}

namespace {

// Where `name`'s entry is in `env`, or end().
template <typename Env>
auto FindEntry(Env& env, const std::string& name) {
  return std::find_if(env.begin(), env.end(), [&](const std::string& entry) {
    return entry.size() > name.size() && entry[name.size()] == '=' && absl::StartsWith(entry, name);
  });
}

}  // namespace

std::optional<std::string> FindEnv(const std::vector<std::string>& env, const std::string& name) {
  auto it = FindEntry(env, name);
  if (it == env.end()) return std::nullopt;
  return it->substr(name.size() + 1);
}

void SetEnv(std::vector<std::string>& env, const std::string& name, const std::string& value) {
  std::string entry = absl::StrCat(name, "=", value);
  auto it = FindEntry(env, name);
  if (it == env.end()) {
    env.push_back(std::move(entry));
  } else {
    *it = std::move(entry);
  }
}

}  // namespace muster
