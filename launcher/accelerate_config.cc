#include "launcher/accelerate_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace muster {

ConfigValue::ConfigValue() = default;
ConfigValue::~ConfigValue() = default;
ConfigValue::ConfigValue(const ConfigValue&) = default;
ConfigValue::ConfigValue(ConfigValue&&) noexcept = default;
ConfigValue& ConfigValue::operator=(const ConfigValue&) = default;
ConfigValue& ConfigValue::operator=(ConfigValue&&) noexcept = default;

ConfigValue ConfigValue::None() { return ConfigValue(); }

ConfigValue ConfigValue::Bool(bool b) {
  ConfigValue v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}

ConfigValue ConfigValue::Int(int64_t i) {
  ConfigValue v;
  v.kind = Kind::kInt;
  v.integer = i;
  return v;
}

ConfigValue ConfigValue::Float(double d) {
  ConfigValue v;
  v.kind = Kind::kFloat;
  v.number = d;
  return v;
}

ConfigValue ConfigValue::String(std::string s) {
  ConfigValue v;
  v.kind = Kind::kString;
  v.text = std::move(s);
  return v;
}

namespace {

// Python's repr() of a float (repr style 'short'): the shortest digits that
// read back the same, fixed notation for exponents -4..15, else d.dddde+XX.
std::string PythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buffer[64];
  auto [end, error] =
      std::to_chars(buffer, buffer + sizeof(buffer), d, std::chars_format::scientific);
  if (error != std::errc()) return "nan";
  std::string scientific(buffer, end);  // "-1.2345e+02"
  const size_t e = scientific.find('e');
  const int exponent = std::atoi(scientific.c_str() + e + 1);
  std::string sign = scientific[0] == '-' ? "-" : "";
  std::string digits =
      absl::StrReplaceAll(scientific.substr(sign.size(), e - sign.size()), {{".", ""}});
  if (exponent < -4 || exponent >= 16) {
    std::string mantissa = digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&mantissa, ".", digits.substr(1));
    return absl::StrCat(sign, mantissa, "e", exponent < 0 ? "-" : "+",
                        std::abs(exponent) < 10 ? "0" : "", std::abs(exponent));
  }
  if (exponent < 0) return absl::StrCat(sign, "0.", std::string(-exponent - 1, '0'), digits);
  const size_t point = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= point) {
    return absl::StrCat(sign, digits, std::string(point - digits.size(), '0'), ".0");
  }
  return absl::StrCat(sign, digits.substr(0, point), ".", digits.substr(point));
}

// Python's repr() of a string, as str() of a list shows its items.
std::string PythonRepr(const ConfigValue& value) {
  if (value.kind != ConfigValue::Kind::kString) return value.PythonStr();
  const char quote =
      value.text.find('\'') != std::string::npos && value.text.find('"') == std::string::npos
          ? '"'
          : '\'';
  std::string out(1, quote);
  for (char c : value.text) {
    if (c == '\\' || c == quote) out.push_back('\\');
    out.push_back(c);
  }
  out.push_back(quote);
  return out;
}

}  // namespace

std::string ConfigValue::PythonStr() const {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return boolean ? "True" : "False";
    case Kind::kInt: return std::to_string(integer);
    case Kind::kFloat: return PythonFloat(number);
    case Kind::kString: return text;
    case Kind::kList: {
      std::vector<std::string> shown;
      for (const ConfigValue& item : items) shown.push_back(PythonRepr(item));
      return absl::StrCat("[", absl::StrJoin(shown, ", "), "]");
    }
    case Kind::kMap: {
      std::vector<std::string> shown;
      for (const auto& [key, item] : fields) {
        shown.push_back(absl::StrCat(PythonRepr(String(key)), ": ", PythonRepr(item)));
      }
      return absl::StrCat("{", absl::StrJoin(shown, ", "), "}");
    }
  }
  return "None";
}

bool ConfigValue::Truthy() const {
  switch (kind) {
    case Kind::kNone: return false;
    case Kind::kBool: return boolean;
    case Kind::kInt: return integer != 0;
    case Kind::kFloat: return number != 0;
    case Kind::kString: return !text.empty();
    case Kind::kList: return !items.empty();
    case Kind::kMap: return !fields.empty();
  }
  return false;
}

namespace {

// Whether `name` is one of the space-separated words of `list`.
bool Listed(absl::string_view list, absl::string_view name) {
  for (absl::string_view word : absl::StrSplit(list, ' ', absl::SkipEmpty())) {
    if (word == name) return true;
  }
  return false;
}

// The length of the run of `s` from `at` made of `chars`.
size_t Run(absl::string_view s, size_t at, absl::string_view chars) {
  size_t end = at;
  while (end < s.size() && chars.find(s[end]) != absl::string_view::npos) ++end;
  return end - at;
}

constexpr absl::string_view kDigits = "0123456789";
constexpr absl::string_view kDigitsOr_ = "0123456789_";

// PyYAML's int: [-+]?(0b[01_]+|0[0-7_]+|0|[1-9][0-9_]*|0x[0-9a-fA-F_]+).
bool IsYamlInt(absl::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s.empty()) return false;
  if (absl::StartsWith(s, "0b")) return s.size() > 2 && Run(s, 2, "01_") == s.size() - 2;
  if (absl::StartsWith(s, "0x")) {
    return s.size() > 2 && Run(s, 2, "0123456789abcdefABCDEF_") == s.size() - 2;
  }
  if (s[0] == '0') return Run(s, 1, "01234567_") == s.size() - 1;
  return s[0] != '_' && Run(s, 0, kDigitsOr_) == s.size();
}

// An exponent [eE][-+][0-9]+ at `at`, or nothing: where it ends, or npos if malformed.
size_t Exponent(absl::string_view s, size_t at) {
  if (at == s.size()) return at;
  if ((s[at] != 'e' && s[at] != 'E') || at + 1 >= s.size() ||
      (s[at + 1] != '-' && s[at + 1] != '+')) {
    return absl::string_view::npos;
  }
  const size_t digits = Run(s, at + 2, kDigits);
  return digits == 0 ? absl::string_view::npos : at + 2 + digits;
}

// PyYAML's float: [-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)? | \.[0-9][0-9_]*(exp)? |
// [-+]?\.(inf|Inf|INF) | \.(nan|NaN|NAN).
bool IsYamlFloat(absl::string_view s) {
  if (Listed(".nan .NaN .NAN", s)) return true;
  if (!s.empty() && s[0] == '.') {
    return s.size() > 1 && kDigits.find(s[1]) != absl::string_view::npos &&
           Exponent(s, 2 + Run(s, 2, kDigitsOr_)) == s.size();
  }
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (Listed(".inf .Inf .INF", s)) return true;
  if (s.empty() || kDigits.find(s[0]) == absl::string_view::npos) return false;
  const size_t point = 1 + Run(s, 1, kDigitsOr_);
  if (point >= s.size() || s[point] != '.') return false;
  return Exponent(s, point + 1 + Run(s, point + 1, kDigitsOr_)) == s.size();
}

}  // namespace

ConfigValue TypePlainScalar(absl::string_view text, bool json) {
  const std::string s(text);
  if (json) {
    if (s == "true" || s == "false") return ConfigValue::Bool(s == "true");
    if (s == "null") return ConfigValue::None();
    int64_t i = 0;
    if (s.find_first_of(".eE") == std::string::npos && absl::SimpleAtoi(s, &i)) {
      return ConfigValue::Int(i);
    }
    double d = 0;
    if (absl::SimpleAtod(s, &d)) return ConfigValue::Float(d);
    return ConfigValue::String(s);
  }
  // PyYAML's implicit resolvers (resolver.py), for the forms a config holds.
  if (Listed("~ null Null NULL", s) || s.empty()) return ConfigValue::None();
  if (Listed("yes Yes YES no No NO true True TRUE false False FALSE on On ON off Off OFF", s)) {
    const std::string lower = absl::AsciiStrToLower(s);
    return ConfigValue::Bool(lower == "yes" || lower == "true" || lower == "on");
  }
  if (IsYamlInt(s)) {
    std::string digits = absl::StrReplaceAll(s, {{"_", ""}});
    const bool negative = digits[0] == '-';
    if (digits[0] == '-' || digits[0] == '+') digits.erase(0, 1);
    int base = 10;
    if (absl::StartsWith(digits, "0b")) {
      base = 2;
      digits.erase(0, 2);
    } else if (absl::StartsWith(digits, "0x")) {
      base = 16;
      digits.erase(0, 2);
    } else if (digits.size() > 1 && digits[0] == '0') {
      base = 8;
    }
    int64_t value = 0;
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
    if (error == std::errc() && end == digits.data() + digits.size()) {
      return ConfigValue::Int(negative ? -value : value);
    }
    return ConfigValue::String(s);
  }
  if (IsYamlFloat(s)) {
    std::string lower = absl::AsciiStrToLower(absl::StrReplaceAll(s, {{"_", ""}}));
    if (absl::StrContains(lower, "inf")) {
      return ConfigValue::Float(lower[0] == '-' ? -HUGE_VAL : HUGE_VAL);
    }
    if (absl::StrContains(lower, "nan")) return ConfigValue::Float(std::nan(""));
    double d = 0;
    if (absl::SimpleAtod(lower, &d)) return ConfigValue::Float(d);
  }
  return ConfigValue::String(s);
}

namespace {

using Args = std::map<std::string, ConfigValue>;
using Env = std::function<std::optional<std::string>(const std::string&)>;

constexpr int kDefaultPort = 29500;

// accelerate launch's argparse defaults that are not None, for the
// arguments its GPU paths read (launch_command_parser in accelerate 1.14).
Args ArgparseDefaults() {
  const ConfigValue f = ConfigValue::Bool(false);
  auto s = [](const char* text) { return ConfigValue::String(text); };
  auto i = [](int64_t value) { return ConfigValue::Int(value); };
  return {
      {"same_network", f},
      {"rdzv_backend", s("static")},
      {"enable_cpu_affinity", f},
      {"downcast_bf16", f},
      {"dynamo_mode", s("default")},
      {"dynamo_use_dynamic", f},
      {"dynamo_use_fullgraph", f},
      {"dynamo_use_regional_compilation", f},
      {"fp8_amax_compute_algo", s("most_recent")},
      {"fp8_amax_history_len", i(1024)},
      {"fp8_enable_fsdp_float8_all_gather", i(1)},
      {"fp8_format", s("HYBRID")},
      {"fp8_interval", i(1)},
      {"fp8_margin", i(0)},
      {"fp8_opt_level", s("O2")},
      {"fp8_pad_inner_dim", i(1)},
      {"fp8_use_autocast_during_eval", f},
      {"fsdp_activation_checkpointing", s("false")},
      {"fsdp_cpu_ram_efficient_loading", s("true")},
      {"fsdp_forward_prefetch", s("false")},
      {"fsdp_min_num_params", i(100000000)},
      {"fsdp_offload_params", s("false")},
      {"fsdp_reshard_after_forward", s("true")},
      {"fsdp_sharding_strategy", s("FULL_SHARD")},
      {"fsdp_sync_module_states", s("true")},
      {"fsdp_use_orig_params", s("true")},
      {"fsdp_version", s("1")},
      {"parallelism_config_cp_backend", s("torch")},
      {"parallelism_config_cp_comm_strategy", s("allgather")},
      {"parallelism_config_cp_size", i(1)},
      {"parallelism_config_dp_replicate_size", i(1)},
      {"parallelism_config_dp_shard_size", i(1)},
      {"parallelism_config_sp_attn_implementation", s("sdpa")},
      {"parallelism_config_sp_backend", s("deepspeed")},
      {"parallelism_config_sp_seq_length_is_variable", ConfigValue::Bool(true)},
      {"parallelism_config_sp_size", i(1)},
      {"parallelism_config_tp_size", i(1)},
  };
}

// ClusterConfig's fields (commands/config/config_args.py) with their
// defaults, in their order; the dicts start empty.
std::vector<std::pair<std::string, ConfigValue>> ClusterDefaults() {
  const ConfigValue f = ConfigValue::Bool(false);
  const ConfigValue none;
  const ConfigValue empty_map = [] {
    ConfigValue v;
    v.kind = ConfigValue::Kind::kMap;
    return v;
  }();
  return {
      {"compute_environment", ConfigValue::String("LOCAL_MACHINE")},
      {"distributed_type", none},
      {"mixed_precision", none},
      {"use_cpu", f},
      {"debug", f},
      {"num_processes", ConfigValue::Int(-1)},
      {"machine_rank", ConfigValue::Int(0)},
      {"num_machines", ConfigValue::Int(1)},
      {"gpu_ids", none},
      {"main_process_ip", none},
      {"main_process_port", none},
      {"rdzv_backend", ConfigValue::String("static")},
      {"same_network", f},
      {"main_training_function", ConfigValue::String("main")},
      {"enable_cpu_affinity", f},
      {"fp8_config", empty_map},
      {"deepspeed_config", empty_map},
      {"fsdp_config", empty_map},
      {"parallelism_config", empty_map},
      {"megatron_lm_config", empty_map},
      {"mpirun_config", empty_map},
      {"downcast_bf16", f},
      {"tpu_name", none},
      {"tpu_zone", none},
      {"tpu_use_cluster", f},
      {"tpu_use_sudo", f},
      {"command_file", none},
      {"commands", none},
      {"tpu_vm", none},
      {"tpu_env", none},
      {"dynamo_config", empty_map},
  };
}

const ConfigValue& Get(const Args& args, const std::string& key) {
  static const ConfigValue kNone;
  auto it = args.find(key);
  return it == args.end() ? kNone : it->second;
}

bool IsNone(const Args& args, const std::string& key) {
  return Get(args, key).kind == ConfigValue::Kind::kNone;
}

absl::Status Invalid(absl::string_view file, absl::string_view problem, absl::string_view fix) {
  return absl::InvalidArgumentError(
      absl::StrCat("--accelerate-config ", file, ": ", problem, "; ", fix));
}

// Where YAML 1.1 made a plain word a boolean, how to write the word.
std::string BooleanHint(const ConfigValue& value) {
  if (value.kind != ConfigValue::Kind::kBool) return "";
  return " (YAML reads a plain no, off, yes or on as a boolean: quote the word, e.g. 'no')";
}

// An integer setting, as accelerate's arithmetic needs it.
absl::StatusOr<int64_t> IntOf(const Args& args, const std::string& key, absl::string_view file) {
  const ConfigValue& value = Get(args, key);
  if (value.kind == ConfigValue::Kind::kInt) return value.integer;
  if (value.kind == ConfigValue::Kind::kBool) return value.boolean ? 1 : 0;
  int64_t parsed = 0;
  if (value.kind == ConfigValue::Kind::kString && absl::SimpleAtoi(value.text, &parsed)) {
    return parsed;
  }
  return Invalid(file, absl::StrCat(key, " is ", value.PythonStr(), ", not a whole number"),
                 absl::StrCat("give ", key, " as a number"));
}

// accelerate's get_int_from_env: the first variable set to a number >= 0, else `fallback`.
int64_t IntFromEnv(const Env& env, std::initializer_list<const char*> names, int64_t fallback) {
  for (const char* name : names) {
    std::optional<std::string> text = env ? env(name) : std::nullopt;
    int64_t value = -1;
    if (text && absl::SimpleAtoi(*text, &value) && value >= 0) return value;
  }
  return fallback;
}

// The file, as process_config and ClusterConfig leave it: the legacy keys
// converted, every field present. Unknown keys are named in `warnings`.
absl::StatusOr<std::vector<std::pair<std::string, ConfigValue>>> LoadCluster(
    const ConfigValue& config, absl::string_view file, std::vector<std::string>& warnings) {
  if (config.kind != ConfigValue::Kind::kMap) {
    return Invalid(file, "not a mapping of accelerate's settings",
                   "give the file `accelerate config` wrote (YAML or JSON)");
  }
  std::map<std::string, ConfigValue> given(config.fields.begin(), config.fields.end());
  if (auto it = given.find("fp16"); it != given.end()) {
    if (!given.contains("mixed_precision") && it->second.Truthy()) {
      given["mixed_precision"] = ConfigValue::String("fp16");
    }
    given.erase(it);
  }
  if (auto it = given.find("dynamo_backend"); it != given.end()) {
    ConfigValue dynamo;
    dynamo.kind = ConfigValue::Kind::kMap;
    if (it->second.PythonStr() != "NO") dynamo.fields.emplace_back("dynamo_backend", it->second);
    given["dynamo_config"] = dynamo;
    given.erase(it);
  }
  std::vector<std::pair<std::string, ConfigValue>> cluster = ClusterDefaults();
  std::set<std::string> known;
  for (auto& [name, value] : cluster) {
    known.insert(name);
    auto it = given.find(name);
    if (it == given.end()) continue;
    // A dict given as null stays the empty dict ClusterConfig makes of it.
    if (value.kind != ConfigValue::Kind::kMap || it->second.kind == ConfigValue::Kind::kMap) {
      value = it->second;
    }
  }
  std::vector<std::string> unknown;
  for (const auto& [name, value] : given) {
    if (!known.contains(name)) unknown.push_back(name);
  }
  if (!unknown.empty()) {
    warnings.push_back(absl::StrCat("--accelerate-config ", file, ": ignoring ",
                                    absl::StrJoin(unknown, ", "),
                                    ": no key of accelerate 1.14's config"));
  }
  return cluster;
}

// The launch paths muster serves; anything else names the launcher to use.
absl::Status CheckServed(const Args& cluster, absl::string_view file) {
  const std::string environment = Get(cluster, "compute_environment").PythonStr();
  if (environment == "AMAZON_SAGEMAKER") {
    return Invalid(file, "compute_environment AMAZON_SAGEMAKER runs on SageMaker",
                   "launch it with `accelerate launch --config_file FILE`, which submits the job");
  }
  if (environment != "LOCAL_MACHINE") {
    return Invalid(file, absl::StrCat("compute_environment ", environment, " is not accelerate's"),
                   "give LOCAL_MACHINE");
  }
  const ConfigValue& type_value = Get(cluster, "distributed_type");
  if (type_value.kind == ConfigValue::Kind::kNone) {
    return Invalid(file, "no distributed_type",
                   "give distributed_type: MULTI_GPU, FSDP or DEEPSPEED (what `accelerate config` "
                   "writes)");
  }
  const std::string type = type_value.PythonStr();
  if (type == "MULTI_GPU" || type == "FSDP" || type == "DEEPSPEED") return absl::OkStatus();
  if (type == "XLA") {
    return Invalid(file, "distributed_type XLA runs on TPUs",
                   "launch it with `accelerate launch --config_file FILE`");
  }
  if (type == "MULTI_CPU") {
    return Invalid(
        file, "distributed_type MULTI_CPU is accelerate's mpirun path",
        "launch it with `accelerate launch --config_file FILE`, or set distributed_type: "
        "MULTI_GPU to run one worker process per --nproc-per-node on CPUs too");
  }
  if (type == "NO") {
    return Invalid(file, "distributed_type NO runs one process with no launcher",
                   "run the script with python, or set distributed_type: MULTI_GPU");
  }
  if (type == "MEGATRON_LM" || absl::StartsWith(type, "MULTI_")) {
    return Invalid(file, absl::StrCat("distributed_type ", type, " is not a path muster serves"),
                   "launch it with `accelerate launch --config_file FILE`; muster serves "
                   "MULTI_GPU, FSDP and DEEPSPEED");
  }
  return Invalid(file, absl::StrCat("distributed_type ", type, " is not accelerate's"),
                 absl::StrCat("give MULTI_GPU, FSDP or DEEPSPEED", BooleanHint(type_value)));
}

// The prefix _validate_launch_command gives a dict's keys as they become arguments.
std::string ArgumentName(const std::string& dict, const std::string& key) {
  if (dict == "fsdp_config" && !absl::StartsWith(key, "fsdp")) return "fsdp_" + key;
  if (dict == "fp8_config" && !absl::StartsWith(key, "fp8")) return "fp8_" + key;
  if (dict == "dynamo_config" && !absl::StartsWith(key, "dynamo_")) return "dynamo_" + key;
  return key;
}

// _validate_launch_command's copy of the file into the arguments: a dict's
// every key; a scalar only where the argument is still None.
Args ArgumentsFrom(const std::vector<std::pair<std::string, ConfigValue>>& cluster) {
  Args args = ArgparseDefaults();
  for (const auto& [name, value] : cluster) {
    if (value.kind == ConfigValue::Kind::kMap) {
      for (const auto& [key, item] : value.fields) args[ArgumentName(name, key)] = item;
    } else if (name != "compute_environment" && name != "mixed_precision" &&
               name != "distributed_type" && IsNone(args, name)) {
      args[name] = value;
    }
  }
  return args;
}

struct Paths {
  bool deepspeed = false;
  bool fsdp = false;
  bool parallelism = false;
  bool mixed_precision_from_file = false;
  std::vector<std::string> deepspeed_fields;
};

// The port the file names (29500 when it names none), checked.
absl::StatusOr<int64_t> PortOf(const Args& args, absl::string_view file) {
  if (IsNone(args, "main_process_port")) return kDefaultPort;
  absl::StatusOr<int64_t> port = IntOf(args, "main_process_port", file);
  if (!port.ok()) return port.status();
  if (*port < 0 || *port > 65535) {
    return Invalid(file, absl::StrCat("main_process_port ", *port, " is no TCP port"),
                   "give 1 to 65535, or 0 for a free one");
  }
  return *port;
}

// What _filter_args hands torchrun whatever the environment says: accelerate
// launch's own values of the options its command line shares with torchrun's
// (an empty value stands for None, and hides the PET_ variable too).
void AcceleratesOwnOptions(const AccelerateInputs& inputs, AccelerateLaunch& out) {
  out.options.insert({{"PET_MAX_RESTARTS", "0"},
                      {"PET_MONITOR_INTERVAL", "0.1"},
                      {"PET_ROLE", "default"},
                      {"PET_TEE", "0"},
                      {"PET_RDZV_CONF", ""},
                      {"PET_LOG_DIR", ""},
                      {"PET_MODULE", ""},
                      {"PET_NO_PYTHON", ""}});
  // Inside Slurm the allocation's rendezvous stands.
  if (inputs.slurm_nodes == 0) out.options.insert({"PET_RDZV_BACKEND", "static"});
}

// Several machines: the head's endpoint, this machine's rank.
absl::Status PlanMachines(const Args& args, int64_t machines, int64_t port, absl::string_view file,
                          const AccelerateInputs& inputs, AccelerateLaunch& out) {
  if (inputs.slurm_nodes > 0) {
    if (inputs.slurm_nodes != machines) {
      out.warnings.push_back(absl::StrCat(
          "--accelerate-config ", file, ": num_machines is ", machines, " but the allocation has ",
          inputs.slurm_nodes, " nodes: the allocation's count stands, with ",
          out.options["PET_NPROC_PER_NODE"], " workers each (num_processes / num_machines)"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> rank = IntOf(args, "machine_rank", file);
  if (!rank.ok()) return rank.status();
  out.options["PET_NNODES"] = std::to_string(machines);
  out.options["PET_NODE_RANK"] = std::to_string(*rank);
  // A flag naming the head stands for the file's address and port.
  const bool head_given = inputs.flags.contains("PET_RDZV_ENDPOINT") ||
                          inputs.flags.contains("PET_MASTER_ADDR") ||
                          inputs.flags.contains("PET_STANDALONE");
  if (head_given) return absl::OkStatus();
  if (IsNone(args, "main_process_ip")) {
    return Invalid(file, absl::StrCat("num_machines ", machines, " but no main_process_ip"),
                   "give main_process_ip, the address of the machine with machine_rank 0 (or "
                   "--rdzv-endpoint HOST:PORT)");
  }
  if (port == 0) {
    return Invalid(file, "main_process_port 0 picks a different port on each machine",
                   "give the head's port");
  }
  const std::string ip = Get(args, "main_process_ip").PythonStr();
  if (Get(args, "same_network").Truthy()) {
    out.options["PET_MASTER_ADDR"] = ip;
    out.options["PET_MASTER_PORT"] = std::to_string(port);
  } else {
    out.options["PET_RDZV_ENDPOINT"] = absl::StrCat(ip, ":", port);
  }
  if (*rank == 0 && inputs.port_in_use && inputs.port_in_use(static_cast<int>(port))) {
    return Invalid(file, absl::StrCat("port ", port, " of this machine is in use"),
                   "give another main_process_port");
  }
  return absl::OkStatus();
}

// One machine: its port, or standalone where the port is taken, as accelerate does.
void PlanOneMachine(int64_t port, const AccelerateInputs& inputs, AccelerateLaunch& out) {
  if (inputs.slurm_nodes > 0) return;
  // A flag that chooses the port or the rendezvous stands, unchecked.
  if (inputs.flags.contains("PET_MASTER_PORT") || inputs.flags.contains("PET_RDZV_ENDPOINT") ||
      inputs.flags.contains("PET_STANDALONE")) {
    return;
  }
  if (port == 0) {
    const int free = inputs.free_port ? inputs.free_port() : 0;
    if (free > 0) {
      out.options["PET_MASTER_PORT"] = std::to_string(free);
    } else {
      out.options["PET_STANDALONE"] = "1";
    }
    return;
  }
  if (inputs.port_in_use && inputs.port_in_use(static_cast<int>(port))) {
    out.warnings.push_back(absl::StrCat("port ", port,
                                        " is in use: launching standalone on a free port, as "
                                        "accelerate does; give main_process_port to choose"));
    out.options["PET_STANDALONE"] = "1";
    return;
  }
  out.options["PET_MASTER_PORT"] = std::to_string(port);
}

// The nodes, workers and rendezvous, as prepare_multi_gpu_env (and
// prepare_deepspeed_cmd_env on its torchrun path) give them to torchrun.
absl::Status PlanNodes(const Args& args, absl::string_view file, const AccelerateInputs& inputs,
                       AccelerateLaunch& out) {
  absl::StatusOr<int64_t> processes = IntOf(args, "num_processes", file);
  absl::StatusOr<int64_t> machines = IntOf(args, "num_machines", file);
  absl::StatusOr<int64_t> port = PortOf(args, file);
  if (!processes.ok()) return processes.status();
  if (!machines.ok()) return machines.status();
  if (!port.ok()) return port.status();
  if (*machines < 1) {
    return Invalid(file, absl::StrCat("num_machines is ", *machines), "give 1 or more");
  }
  AcceleratesOwnOptions(inputs, out);
  if (*processes > 0) {
    if (*processes < *machines) {
      return Invalid(file,
                     absl::StrCat("num_processes ", *processes, " over num_machines ", *machines,
                                  " leaves a machine without a worker"),
                     "give num_processes, the workers of all machines, at least num_machines");
    }
    out.options["PET_NPROC_PER_NODE"] = std::to_string(*processes / *machines);
  } else if (!inputs.flags.contains("PET_NPROC_PER_NODE") && inputs.slurm_nodes == 0) {
    // As accelerate: "You need to manually pass in --num_processes".
    return Invalid(file, "no num_processes, the number of workers of all machines",
                   "give num_processes in the file, or --nproc-per-node N");
  }
  if (*machines > 1) return PlanMachines(args, *machines, *port, file, inputs, out);
  PlanOneMachine(*port, inputs, out);
  return absl::OkStatus();
}

// setup_fp8_env: every fp8_ argument that is not None.
void Fp8Env(const Args& args, std::map<std::string, std::string>& env) {
  for (const auto& [name, value] : args) {
    if (!absl::StartsWith(name, "fp8_") || value.kind == ConfigValue::Kind::kNone) continue;
    if (name == "fp8_override_linear_precision") {
      const char* parts[] = {"FPROP", "DGRAD", "WGRAD"};
      for (size_t i = 0; i < 3; ++i) {
        env[absl::StrCat("ACCELERATE_FP8_OVERRIDE_", parts[i])] =
            i < value.items.size() ? value.items[i].PythonStr() : "False";
      }
    } else {
      env["ACCELERATE_" + absl::AsciiStrToUpper(name)] = value.PythonStr();
    }
  }
  if (!args.contains("fp8_override_linear_precision")) {
    for (const char* part : {"FPROP", "DGRAD", "WGRAD"}) {
      env[absl::StrCat("ACCELERATE_FP8_OVERRIDE_", part)] = "False";
    }
  }
}

std::string Lower(const ConfigValue& value) { return absl::AsciiStrToLower(value.PythonStr()); }

// What every path sets: debug, the GPU mask, the mixed precision.
absl::Status CommonEnv(const Args& args, absl::string_view file,
                       std::map<std::string, std::string>& env) {
  if (Get(args, "debug").Truthy()) env["ACCELERATE_DEBUG_MODE"] = "true";
  const std::string gpu_ids = Get(args, "gpu_ids").PythonStr();
  if (gpu_ids != "all" && !IsNone(args, "gpu_ids")) env["CUDA_VISIBLE_DEVICES"] = gpu_ids;
  const std::string precision = Lower(Get(args, "mixed_precision"));
  if (precision != "no" && precision != "fp8" && precision != "fp16" && precision != "bf16") {
    return Invalid(
        file, absl::StrCat("mixed_precision ", precision, " is not accelerate's"),
        absl::StrCat("give no, fp16, bf16 or fp8", BooleanHint(Get(args, "mixed_precision"))));
  }
  env["ACCELERATE_MIXED_PRECISION"] = precision;
  if (precision == "fp8") Fp8Env(args, env);
  return absl::OkStatus();
}

void FsdpEnv(const Args& args, std::map<std::string, std::string>& env) {
  env["ACCELERATE_USE_FSDP"] = "true";
  env["FSDP_VERSION"] = Get(args, "fsdp_version").PythonStr();
  env["FSDP_SHARDING_STRATEGY"] = Get(args, "fsdp_sharding_strategy").PythonStr();
  env["FSDP_RESHARD_AFTER_FORWARD"] = Lower(Get(args, "fsdp_reshard_after_forward"));
  env["FSDP_OFFLOAD_PARAMS"] = Lower(Get(args, "fsdp_offload_params"));
  env["FSDP_MIN_NUM_PARAMS"] = Get(args, "fsdp_min_num_params").PythonStr();
  const std::pair<const char*, const char*> optional[] = {
      {"fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY"},
      {"fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP"},
      {"fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH"},
      {"fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE"},
  };
  for (const auto& [arg, var] : optional) {
    if (!IsNone(args, arg)) env[var] = Get(args, arg).PythonStr();
  }
  const std::pair<const char*, const char*> lowered[] = {
      {"fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH"},
      {"fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS"},
      {"fsdp_cpu_ram_efficient_loading", "FSDP_CPU_RAM_EFFICIENT_LOADING"},
      {"fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES"},
      {"fsdp_activation_checkpointing", "FSDP_ACTIVATION_CHECKPOINTING"},
  };
  for (const auto& [arg, var] : lowered) env[var] = Lower(Get(args, arg));
  if (!IsNone(args, "fsdp_ignored_modules")) {
    env["FSDP_IGNORED_MODULES"] = Get(args, "fsdp_ignored_modules").PythonStr();
  }
}

absl::Status ParallelismEnv(const Args& args, absl::string_view file,
                            std::map<std::string, std::string>& env) {
  const std::string prefix = "PARALLELISM_CONFIG_";
  env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true";
  for (const char* name : {"DP_REPLICATE_SIZE", "DP_SHARD_SIZE", "TP_SIZE", "CP_SIZE", "CP_BACKEND",
                           "SP_SIZE", "SP_BACKEND"}) {
    env[prefix + name] = Get(args, absl::AsciiStrToLower(prefix + name)).PythonStr();
  }
  absl::StatusOr<int64_t> cp = IntOf(args, "parallelism_config_cp_size", file);
  absl::StatusOr<int64_t> sp = IntOf(args, "parallelism_config_sp_size", file);
  if (!cp.ok()) return cp.status();
  if (!sp.ok()) return sp.status();
  if (*cp > 1) {
    env[prefix + "CP_COMM_STRATEGY"] = Get(args, "parallelism_config_cp_comm_strategy").PythonStr();
  }
  if (*sp > 1) {
    for (const char* name :
         {"SP_SEQ_LENGTH", "SP_SEQ_LENGTH_IS_VARIABLE", "SP_ATTN_IMPLEMENTATION"}) {
      env[prefix + name] = Get(args, absl::AsciiStrToLower(prefix + name)).PythonStr();
    }
  }
  return absl::OkStatus();
}

// prepare_multi_gpu_env's variables past the common ones.
absl::Status MultiGpuEnv(const Args& args, const Paths& paths, absl::string_view file,
                         std::map<std::string, std::string>& env) {
  const std::string backend = absl::AsciiStrToUpper(Get(args, "dynamo_backend").PythonStr());
  // accelerate 1.14's DynamoBackend.
  constexpr absl::string_view kBackends =
      "NO EAGER AOT_EAGER INDUCTOR AOT_TS_NVFUSER NVPRIMS_NVFUSER CUDAGRAPHS OFI FX2TRT ONNXRT "
      "TENSORRT AOT_TORCHXLA_TRACE_ONCE TORCHXLA_TRACE_ONCE TVM HPU_BACKEND";
  if (!Listed(kBackends, backend)) {
    return Invalid(file, absl::StrCat("dynamo_backend ", backend, " is not accelerate's"),
                   absl::StrCat("give one of ", absl::StrJoin(absl::StrSplit(kBackends, ' '), ", "),
                                BooleanHint(Get(args, "dynamo_backend"))));
  }
  env["ACCELERATE_DYNAMO_BACKEND"] = backend;
  env["ACCELERATE_DYNAMO_MODE"] = Get(args, "dynamo_mode").PythonStr();
  env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = Get(args, "dynamo_use_fullgraph").PythonStr();
  env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = Get(args, "dynamo_use_dynamic").PythonStr();
  env["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] =
      Get(args, "dynamo_use_regional_compilation").PythonStr();
  if (paths.fsdp) {
    if (Get(args, "fsdp_cpu_ram_efficient_loading").Truthy() &&
        !Get(args, "fsdp_sync_module_states").Truthy()) {
      return Invalid(file, "fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states",
                     "set fsdp_sync_module_states: true in fsdp_config");
    }
    FsdpEnv(args, env);
  }
  env["OMP_NUM_THREADS"] = Get(args, "num_cpu_threads_per_process").PythonStr();
  if (Get(args, "enable_cpu_affinity").Truthy()) env["ACCELERATE_CPU_AFFINITY"] = "1";
  if (paths.parallelism) return ParallelismEnv(args, file, env);
  return absl::OkStatus();
}

// prepare_deepspeed_cmd_env's variables past the common ones.
absl::Status DeepSpeedEnv(const Args& args, const Paths& paths, absl::string_view file,
                          const AccelerateInputs& inputs, std::map<std::string, std::string>& env) {
  std::vector<std::string> python_path;
  if (std::optional<std::string> given = inputs.env ? inputs.env("PYTHONPATH") : std::nullopt) {
    for (absl::string_view part : absl::StrSplit(*given, ':', absl::SkipEmpty())) {
      python_path.emplace_back(part);
    }
  }
  python_path.push_back(inputs.cwd);
  env["PYTHONPATH"] = absl::StrJoin(python_path, ":");
  std::vector<std::string> fields = paths.deepspeed_fields;
  if (paths.mixed_precision_from_file) fields.push_back("mixed_precision");
  env["ACCELERATE_CONFIG_DS_FIELDS"] = absl::AsciiStrToLower(absl::StrJoin(fields, ","));
  env["ACCELERATE_USE_DEEPSPEED"] = "true";
  const std::pair<const char*, const char*> as_is[] = {
      {"zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE"},
      {"gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"},
      {"deepspeed_config_file", "ACCELERATE_DEEPSPEED_CONFIG_FILE"},
      {"deepspeed_moe_layer_cls_names", "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES"},
  };
  for (const auto& [arg, var] : as_is) {
    if (!IsNone(args, arg)) env[var] = Get(args, arg).PythonStr();
  }
  const std::pair<const char*, const char*> lowered[] = {
      {"gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING"},
      {"offload_optimizer_device", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"},
      {"offload_param_device", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"},
      {"zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT"},
      {"zero3_save_16bit_model", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL"},
  };
  for (const auto& [arg, var] : lowered) {
    if (!IsNone(args, arg)) env[var] = Lower(Get(args, arg));
  }
  if (Get(args, "enable_cpu_affinity").Truthy()) env["ACCELERATE_CPU_AFFINITY"] = "1";
  if (paths.parallelism) return ParallelismEnv(args, file, env);
  return absl::OkStatus();
}

// The rest of _validate_launch_command: what it settles before a launcher runs.
absl::Status SettleArguments(Args& args,
                             const std::vector<std::pair<std::string, ConfigValue>>& cluster,
                             absl::string_view file, const AccelerateInputs& inputs, Paths& paths) {
  const Args file_values(cluster.begin(), cluster.end());
  if (IsNone(args, "gpu_ids")) args["gpu_ids"] = ConfigValue::String("all");
  absl::StatusOr<int64_t> machines = IntOf(args, "num_machines", file);
  if (!machines.ok()) return machines.status();
  const std::string gpu_ids = Get(args, "gpu_ids").PythonStr();
  if (!paths.deepspeed && !paths.fsdp && gpu_ids != "all" &&
      std::vector<std::string>(absl::StrSplit(gpu_ids, ',')).size() < 2 && *machines <= 1) {
    return Invalid(file, absl::StrCat("gpu_ids ", gpu_ids, " is one GPU for MULTI_GPU"),
                   "give two or more GPU ids, or gpu_ids: all");
  }
  const ConfigValue& precision = Get(file_values, "mixed_precision");
  paths.mixed_precision_from_file = precision.kind != ConfigValue::Kind::kNone;
  args["mixed_precision"] = paths.mixed_precision_from_file ? precision : ConfigValue::String("no");
  if (IsNone(args, "dynamo_backend")) args["dynamo_backend"] = ConfigValue::String("no");
  if (IsNone(args, "num_cpu_threads_per_process")) {
    int64_t threads = IntFromEnv(inputs.env, {"OMP_NUM_THREADS"}, 1);
    absl::StatusOr<int64_t> processes = IntOf(args, "num_processes", file);
    if (!processes.ok()) return processes.status();
    if (Get(args, "use_cpu").Truthy() && *processes >= 1 &&
        IntFromEnv(inputs.env, {"OMP_NUM_THREADS"}, 0) == 0) {
      const int64_t per_machine = std::max<int64_t>(*processes / *machines, 1);
      const int64_t local =
          IntFromEnv(inputs.env,
                     {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"},
                     per_machine);
      const int64_t per_process = local > 0 ? inputs.physical_cores / local : 0;
      if (per_process > 1) threads = per_process;
    }
    args["num_cpu_threads_per_process"] = ConfigValue::Int(threads);
  }
  return absl::OkStatus();
}

// The arguments every key of the file may become, for the unknown-key warning.
void WarnUnknownNested(const std::vector<std::pair<std::string, ConfigValue>>& cluster,
                       absl::string_view file, std::vector<std::string>& warnings) {
  // The arguments accelerate 1.14's GPU paths read from the dicts.
  constexpr absl::string_view kRead =
      "dynamo_backend dynamo_mode dynamo_use_fullgraph dynamo_use_dynamic "
      "dynamo_use_regional_compilation fsdp_version fsdp_sharding_strategy "
      "fsdp_reshard_after_forward fsdp_offload_params fsdp_min_num_params "
      "fsdp_auto_wrap_policy fsdp_transformer_layer_cls_to_wrap fsdp_backward_prefetch "
      "fsdp_state_dict_type fsdp_forward_prefetch fsdp_use_orig_params "
      "fsdp_cpu_ram_efficient_loading fsdp_sync_module_states fsdp_activation_checkpointing "
      "fsdp_ignored_modules zero_stage gradient_accumulation_steps gradient_clipping "
      "offload_optimizer_device offload_param_device offload_optimizer_nvme_path "
      "offload_param_nvme_path zero3_init_flag zero3_save_16bit_model deepspeed_config_file "
      "deepspeed_moe_layer_cls_names deepspeed_multinode_launcher deepspeed_hostfile "
      "deepspeed_exclusion_filter deepspeed_inclusion_filter "
      "parallelism_config_dp_replicate_size parallelism_config_dp_shard_size "
      "parallelism_config_tp_size parallelism_config_cp_size parallelism_config_cp_backend "
      "parallelism_config_cp_comm_strategy parallelism_config_sp_size "
      "parallelism_config_sp_backend parallelism_config_sp_seq_length "
      "parallelism_config_sp_seq_length_is_variable "
      "parallelism_config_sp_attn_implementation";
  std::vector<std::string> unknown;
  for (const auto& [name, value] : cluster) {
    if (value.kind != ConfigValue::Kind::kMap || name == "megatron_lm_config" ||
        name == "mpirun_config") {
      continue;
    }
    for (const auto& [key, item] : value.fields) {
      const std::string argument = ArgumentName(name, key);
      if (!Listed(kRead, argument) && !absl::StartsWith(argument, "fp8_")) {
        unknown.push_back(absl::StrCat(name, ".", key));
      }
    }
  }
  if (!unknown.empty()) {
    warnings.push_back(absl::StrCat("--accelerate-config ", file, ": ignoring ",
                                    absl::StrJoin(unknown, ", "),
                                    ": no setting accelerate 1.14 passes to the workers"));
  }
}

}  // namespace

absl::StatusOr<AccelerateLaunch> TranslateAccelerateConfig(const ConfigValue& config,
                                                           absl::string_view file,
                                                           const AccelerateInputs& inputs) {
  AccelerateLaunch out;
  absl::StatusOr<std::vector<std::pair<std::string, ConfigValue>>> cluster =
      LoadCluster(config, file, out.warnings);
  if (!cluster.ok()) return cluster.status();
  const Args file_values(cluster->begin(), cluster->end());
  if (absl::Status served = CheckServed(file_values, file); !served.ok()) return served;
  WarnUnknownNested(*cluster, file, out.warnings);

  const std::string type = Get(file_values, "distributed_type").PythonStr();
  Paths paths;
  paths.deepspeed = type == "DEEPSPEED";
  paths.fsdp = type == "FSDP";
  paths.parallelism = !Get(file_values, "parallelism_config").fields.empty();
  for (const auto& [key, value] : Get(file_values, "deepspeed_config").fields) {
    paths.deepspeed_fields.push_back(key);
  }
  Args args = ArgumentsFrom(*cluster);
  if (absl::Status settled = SettleArguments(args, *cluster, file, inputs, paths); !settled.ok()) {
    return settled;
  }
  if (paths.deepspeed) {
    const std::string launcher = IsNone(args, "deepspeed_multinode_launcher")
                                     ? "pdsh"
                                     : Get(args, "deepspeed_multinode_launcher").PythonStr();
    absl::StatusOr<int64_t> machines = IntOf(args, "num_machines", file);
    if (!machines.ok()) return machines.status();
    if (*machines > 1 && launcher != "standard") {
      return Invalid(file,
                     absl::StrCat("deepspeed_multinode_launcher ", launcher,
                                  " starts the nodes with DeepSpeed's own launcher"),
                     "launch it with `accelerate launch --config_file FILE`, or set "
                     "deepspeed_multinode_launcher: standard in deepspeed_config for muster");
    }
  }
  if (absl::Status nodes = PlanNodes(args, file, inputs, out); !nodes.ok()) return nodes;
  if (absl::Status common = CommonEnv(args, file, out.env); !common.ok()) return common;
  absl::Status rest = paths.deepspeed ? DeepSpeedEnv(args, paths, file, inputs, out.env)
                                      : MultiGpuEnv(args, paths, file, out.env);
  if (!rest.ok()) return rest;
  return out;
}

std::string DefaultAccelerateConfigPath(const Env& env) {
  auto get = [&env](const char* name) -> std::string {
    std::optional<std::string> value = env ? env(name) : std::nullopt;
    return value ? *value : "";
  };
  std::string home = get("HF_HOME");
  if (home.empty()) {
    std::string cache = get("XDG_CACHE_HOME");
    if (cache.empty()) cache = get("HOME") + "/.cache";
    home = cache + "/huggingface";
  }
  if (absl::StartsWith(home, "~/")) home = get("HOME") + home.substr(1);
  return home + "/accelerate/default_config.yaml";
}

}  // namespace muster
