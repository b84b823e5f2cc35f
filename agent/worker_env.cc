#include "agent/worker_env.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace muster {

std::vector<std::string> WorkerCommand(const LaunchConfig& config, const std::string& python,
                                       int local_rank) {
  std::vector<std::string> argv;
  if (!config.no_python) {
    argv = {python, "-u"};
    if (config.module) argv.push_back("-m");
  }
  argv.push_back(config.script);
  const std::string rank = absl::StrCat(local_rank);
  for (const std::string& arg : config.script_args) {
    argv.push_back(absl::StrReplaceAll(arg, {{"${local_rank}", rank}}));
  }
  return argv;
}

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
  set("LOCAL_RANK", absl::StrCat(worker.local_rank));
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
  if (!index.contains("TORCH_NCCL_ASYNC_ERROR_HANDLING"))
    set("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (!index.contains("NCCL_ASYNC_ERROR_HANDLING")) set("NCCL_ASYNC_ERROR_HANDLING", "1");
  if (!index.contains("OMP_NUM_THREADS") && worker.local_world_size > 1) {
    set("OMP_NUM_THREADS", "1");
  }
  return env;
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
