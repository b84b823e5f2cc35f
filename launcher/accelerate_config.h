// `muster --accelerate-config FILE`: what `accelerate launch --config_file
// FILE` (Hugging Face accelerate 1.14) does on its multi-GPU, FSDP and
// DeepSpeed (environment only) paths, as torchrun options and the variables
// accelerate sets for the workers. Pure: the file comes in parsed
// (launcher/accelerate_file.h reads it), the environment and the port check
// as lookups.
//
// Each rule follows accelerate's own (commands/launch.py's
// _validate_launch_command and launch_command, utils/launch.py's
// prepare_multi_gpu_env and prepare_deepspeed_cmd_env), quirks included, so
// that a worker sees what it would under `accelerate launch`:
// - a value renders as Python's str() of what yaml.safe_load or json.load
//   read (True, 1.0, 'a'), lower-cased where accelerate lower-cases it;
// - a top-level key accelerate's argparse already has a non-None default
//   for (same_network, rdzv_backend, enable_cpu_affinity, downcast_bf16) is
//   not taken from the file, as accelerate 1.14 does not take it;
// - fsdp_config's keys gain fsdp_, dynamo_config's dynamo_ and fp8_config's
//   fp8_ when they lack it; deepspeed_config's and parallelism_config's go
//   in as they are;
// - the torchrun options accelerate's own command line shares (max_restarts
//   0, role default, monitor_interval 0.1, tee 0, rdzv_conf, log_dir,
//   module, no_python) are accelerate's values, whatever PET_ variables say.
// Where muster differs on purpose: a key no accelerate path reads is a
// warning, not accelerate's error; accelerate's check for RTX 40x0 GPUs
// (NCCL_P2P_DISABLE, NCCL_IB_DISABLE) is not made; inside Slurm the node
// count, node rank and rendezvous come from the allocation, not the file.
#ifndef MUSTER_LAUNCHER_ACCELERATE_CONFIG_H_
#define MUSTER_LAUNCHER_ACCELERATE_CONFIG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

// One value of the config, typed as Python's yaml.safe_load (YAML 1.1) or
// json.load gives it.
struct ConfigValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kList, kMap };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string text;                                         // kString's value
  std::vector<ConfigValue> items;                           // kList
  std::vector<std::pair<std::string, ConfigValue>> fields;  // kMap, in the file's order

  // Out of line: the members hold ConfigValue, complete only after this class.
  ConfigValue();
  ~ConfigValue();
  ConfigValue(const ConfigValue&);
  ConfigValue(ConfigValue&&) noexcept;
  ConfigValue& operator=(const ConfigValue&);
  ConfigValue& operator=(ConfigValue&&) noexcept;

  static ConfigValue None();
  static ConfigValue Bool(bool b);
  static ConfigValue Int(int64_t i);
  static ConfigValue Float(double d);
  static ConfigValue String(std::string s);

  // Python's str() of the value ("True", "1", "1e-05", "['a', 'b']").
  std::string PythonStr() const;
  // Python's bool() of the value.
  bool Truthy() const;
};

// A plain (unquoted) YAML 1.1 scalar typed as PyYAML's SafeLoader types it:
// null, bool (yes/no/on/off too), int (0x, 0o, 0b, _), float (with a dot,
// .inf, .nan), else a string. json: JSON's literals and numbers instead.
ConfigValue TypePlainScalar(absl::string_view text, bool json);

struct AccelerateInputs {
  // The launcher's own environment (OMP_NUM_THREADS, the MPI local sizes).
  std::function<std::optional<std::string>(const std::string&)> env;
  // Inside a Slurm allocation, its node count (it gives the nodes and the
  // rendezvous); 0 outside.
  int slurm_nodes = 0;
  // The options muster's command line gives as flags, by their variable's
  // name (ParsedCommandLine::flags_given): they stand for the file's.
  std::set<std::string> flags;
  // Whether something listens on this TCP port of this host already
  // (accelerate then launches one machine standalone).
  std::function<bool(int)> port_in_use;
  // A TCP port free on this host now (main_process_port: 0); 0 when none.
  std::function<int()> free_port;
  // The current directory, absolute (DeepSpeed's PYTHONPATH gets it).
  std::string cwd;
  int physical_cores = 1;
};

struct AccelerateLaunch {
  // torchrun's options as accelerate passes them, as their PET_ variables
  // (PET_NPROC_PER_NODE, PET_MASTER_PORT, ...): muster's own flags win.
  std::map<std::string, std::string> options;
  // What accelerate sets in its environment for the workers (ACCELERATE_*,
  // FSDP_*, PARALLELISM_CONFIG_*, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS).
  std::map<std::string, std::string> env;
  // One line each, for the console.
  std::vector<std::string> warnings;
};

// `config` is the whole file (a map); `file` names it in messages.
// Errors: kInvalidArgument naming the key, the problem and the fix; a path
// muster does not serve (TPU, SageMaker, mpirun, a single process, DeepSpeed's
// own multi-node launchers) names the launcher to use instead.
absl::StatusOr<AccelerateLaunch> TranslateAccelerateConfig(const ConfigValue& config,
                                                           absl::string_view file,
                                                           const AccelerateInputs& inputs);

// Where `accelerate launch` looks without --config_file:
// $HF_HOME/accelerate/default_config.yaml, HF_HOME defaulting to
// $XDG_CACHE_HOME/huggingface, that to ~/.cache/huggingface.
std::string DefaultAccelerateConfigPath(
    const std::function<std::optional<std::string>(const std::string&)>& env);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_ACCELERATE_CONFIG_H_
