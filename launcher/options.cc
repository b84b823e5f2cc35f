#include "launcher/options.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/endpoint.h"
#include "common/status.h"

namespace muster {
namespace {

// Every option muster accepts, in the order of kSpecs.
enum class Key {
  kNnodes,
  kNprocPerNode,
  kNodeRank,
  kLocalAddr,
  kRdzvBackend,
  kRdzvEndpoint,
  kRdzvId,
  kRdzvConf,
  kStandalone,
  kMasterAddr,
  kMasterPort,
  kModule,
  kNoPython,
  kRunPath,
  kRole,
  kStartMethod,
  kPreload,
  kAccelerateConfig,
  kMaxRestarts,
  kMonitorInterval,
  kShutdownTimeout,
  kMaxNoProgressRestarts,
  kMaxNodeFailures,
  kOnNodeExcluded,
  kLogDir,
  kRedirects,
  kTee,
  kLocalRanksFilter,
  kLogLinePrefixTemplate,
  kDuplicateStdoutFilters,
  kDuplicateStderrFilters,
  kLogsSpecs,
  kEventLogHandler,
  kSignalsToHandle,
  kVirtualLocalRank,
  kNumaBinding,
  kPreflight,
  kGpuCheckInterval,
  kGpuReport,
  kGpuReleaseWait,
  kPrintCompletion,
  kHelp,
  kVersion,
};
constexpr size_t kNumKeys = static_cast<size_t>(Key::kVersion) + 1;

struct OptionSpec {
  Key key;
  absl::string_view name;        // the spelling used in messages
  absl::string_view spellings;   // CLI11's comma-separated name list
  absl::string_view env;         // PET_ variable; empty for --help and --version
  absl::string_view value_name;  // empty for a flag
  absl::string_view default_text;
  absl::string_view group;
  absl::string_view description;
  // The torchrun release that brought the option ("" for muster's own), for the help.
  absl::string_view since;
};

constexpr absl::string_view kNodesGroup = "Nodes and workers";
constexpr absl::string_view kRdzvGroup = "Rendezvous";
constexpr absl::string_view kRunGroup = "How workers run";
constexpr absl::string_view kRestartGroup = "Restarts and shutdown";
constexpr absl::string_view kLogGroup = "Output and logs";
constexpr absl::string_view kGpuGroup = "GPU checks (muster's own)";
constexpr absl::string_view kOtherGroup = "Other";

// The token file when --rdzv-conf names none.
constexpr absl::string_view kTokenFileEnv = "MUSTER_TOKEN_FILE";

constexpr absl::string_view kRdzvConfKeys =
    "join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, keep_alive_interval, "
    "read_timeout (seconds >= 0), keep_alive_max_attempt (integer >= 1), is_host (1/0/true/false), "
    "ha (1/0: host mode on an etcd cluster of the job's nodes; default: on for 2+ nodes where "
    "etcd is installed), "
    "timeout (static and etcd backends: their join timeout), store_type (tcp), "
    "token_file, cacert, cert, key, munge_socket, event_log (paths), auth (none/token/munge), "
    "metrics_port (0..65535), metrics_listen (an IPv4 address), metrics_password_file (a path); "
    "etcd: user, "
    "password, protocol (http/https), ca_cert, ssl_cert, ssl_cert_key";

constexpr std::array<OptionSpec, kNumKeys> kSpecs = {{
    {Key::kNnodes, "--nnodes", "--nnodes", "PET_NNODES", "N|MIN:MAX", "1:1", kNodesGroup,
     "N nodes, or elastic from MIN to MAX nodes", "1.10"},
    {Key::kNprocPerNode, "--nproc-per-node", "--nproc-per-node,--nproc_per_node",
     "PET_NPROC_PER_NODE", "N|gpu|cpu|auto", "1", kNodesGroup,
     "workers on this node; auto: one per GPU if any, else per CPU", "1.10"},
    {Key::kNodeRank, "--node-rank", "--node-rank,--node_rank", "PET_NODE_RANK", "RANK", "0",
     kNodesGroup, "this node's rank (static backend; else a hint)", "1.10"},
    {Key::kLocalAddr, "--local-addr", "--local-addr,--local_addr", "PET_LOCAL_ADDR", "ADDR",
     "host name", kNodesGroup, "address advertised for this node", "2.0"},
    {Key::kRdzvBackend, "--rdzv-backend", "--rdzv-backend,--rdzv_backend", "PET_RDZV_BACKEND",
     "static|c10d|muster|etcd", "static", kRdzvGroup,
     "c10d and muster: muster's rendezvous (an agent or musterd);\n"
     "etcd (or etcd-v2): an etcd v3 cluster, no server of muster's",
     "1.10"},
    {Key::kRdzvEndpoint, "--rdzv-endpoint", "--rdzv-endpoint,--rdzv_endpoint", "PET_RDZV_ENDPOINT",
     "HOST[:PORT]", "none", kRdzvGroup,
     "rendezvous server, IPv6 in [ ], port 29400 if omitted;\n"
     "etcd: its members, HOST[:PORT],... (port 2379)",
     "1.10"},
    {Key::kRdzvId, "--rdzv-id", "--rdzv-id,--rdzv_id", "PET_RDZV_ID", "ID", "none", kRdzvGroup,
     "the job's id, the same on every node", "1.10"},
    {Key::kRdzvConf, "--rdzv-conf", "--rdzv-conf,--rdzv_conf", "PET_RDZV_CONF", "KEY=VALUE,...",
     "none", kRdzvGroup,
     "seconds: join_timeout (600), last_call_timeout (30),\n"
     "close_timeout (30), heartbeat_timeout (30), read_timeout (60),\n"
     "keep_alive_interval (5); keep_alive_max_attempt (3); is_host (1/0);\n"
     "ha (c10d, 1/0): the rendezvous on an etcd cluster of the job's own\n"
     "nodes, so the job outlives the node that hosts it; on by default\n"
     "with 2+ nodes where etcd is installed, ha=0 for the host alone;\n"
     "timeout: the static and etcd backends' join timeout; store_type=tcp;\n"
     "torchrun's other keys are accepted, unknown ones ignored with a warning;\n"
     "token_file=PATH: the job's shared token (else MUSTER_TOKEN_FILE);\n"
     "cacert=PATH: TLS, the server checked against this CA;\n"
     "cert=PATH,key=PATH: with cacert, this node's client certificate;\n"
     "auth=none|token|munge (default: token with a token file,\n"
     "else munge inside Slurm where munged runs, else none);\n"
     "munge_socket=PATH (default /run/munge/munge.socket.2);\n"
     "event_log=PATH: the agent's events appended, one JSON object a line;\n"
     "metrics_port=PORT: Prometheus metrics at http://127.0.0.1:PORT/metrics\n"
     "(metrics_listen=ADDR: another address, e.g. 0.0.0.0;\n"
     "metrics_password_file=PATH: the password they ask for);\n"
     "etcd: user=NAME,password=TEXT (etcd's own auth), protocol=http|https,\n"
     "and torchrun's etcd-v2 names ca_cert, ssl_cert, ssl_cert_key",
     "1.10"},
    {Key::kStandalone, "--standalone", "--standalone", "PET_STANDALONE", "", "off", kRdzvGroup,
     "one node; rendezvous on a free local port, random id", "1.10"},
    {Key::kMasterAddr, "--master-addr", "--master-addr,--master_addr", "PET_MASTER_ADDR", "ADDR",
     "127.0.0.1", kRdzvGroup, "static backend: address of node rank 0", "1.10"},
    {Key::kMasterPort, "--master-port", "--master-port,--master_port", "PET_MASTER_PORT", "PORT",
     "29500", kRdzvGroup, "static backend: port on node rank 0", "1.10"},
    {Key::kModule, "--module", "-m,--module", "PET_MODULE", "", "off", kRunGroup,
     "run SCRIPT as a module: python -u -m SCRIPT", "1.10"},
    {Key::kNoPython, "--no-python", "--no-python,--no_python", "PET_NO_PYTHON", "", "off",
     kRunGroup, "exec SCRIPT directly, without python", "1.10"},
    {Key::kRunPath, "--run-path", "--run-path,--run_path", "PET_RUN_PATH", "", "off", kRunGroup,
     "accepted for compatibility (what the default does)", "1.10"},
    {Key::kRole, "--role", "--role", "PET_ROLE", "NAME", "default", kRunGroup,
     "the workers' role name (ROLE_NAME)", "1.10"},
    {Key::kStartMethod, "--start-method", "--start-method,--start_method", "PET_START_METHOD",
     "spawn|fork|forkserver", "spawn", kRunGroup, "accepted for compatibility", "1.10"},
    {Key::kPreload, "--preload", "--preload", "MUSTER_PRELOAD", "MODULES", "none", kRunGroup,
     "import MODULES (comma-separated, e.g. torch) once per node,\n"
     "in an interpreter every worker is forked from: a restart\n"
     "pays neither python's start nor the imports; none: off",
     ""},
    {Key::kAccelerateConfig, "--accelerate-config", "--accelerate-config,--accelerate_config",
     "MUSTER_ACCELERATE_CONFIG", "FILE", "", kRunGroup,
     "launch as `accelerate launch --config_file FILE` would:\n"
     "its workers, nodes and ACCELERATE_*/FSDP_* variables;\n"
     "these flags win over the file; default: accelerate's own",
     ""},
    {Key::kMaxRestarts, "--max-restarts", "--max-restarts,--max_restarts", "PET_MAX_RESTARTS", "N",
     "0", kRestartGroup, "worker group restarts allowed after failures", "1.10"},
    {Key::kMonitorInterval, "--monitor-interval", "--monitor-interval,--monitor_interval",
     "PET_MONITOR_INTERVAL", "SECONDS", "0.1", kRestartGroup,
     "accepted; muster reacts to exits at once", "1.10"},
    {Key::kShutdownTimeout, "--shutdown-timeout", "--shutdown-timeout,--shutdown_timeout",
     "PET_SHUTDOWN_TIMEOUT", "SECONDS", "30", kRestartGroup,
     "grace from SIGTERM to SIGKILL when stopping workers;\n"
     "else TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
     "main (2026)"},
    {Key::kMaxNoProgressRestarts, "--max-no-progress-restarts",
     "--max-no-progress-restarts,--max_no_progress_restarts", "", "K", "0 (off)", kRestartGroup,
     "stop after K restarts in a row that reached no new step\n"
     "(MUSTER_PROGRESS_FILE), with exit code 70: do not requeue",
     ""},
    {Key::kMaxNodeFailures, "--max-node-failures", "--max-node-failures,--max_node_failures", "",
     "K", "3", kRestartGroup,
     "exclude the host of a node whose workers caused K failures\n"
     "of the job in a row; a spare takes its seat; 0: never",
     ""},
    {Key::kOnNodeExcluded, "--on-node-excluded", "--on-node-excluded,--on_node_excluded", "", "CMD",
     "none", kRestartGroup,
     "run CMD (sh -c) on a node when its host is excluded, with\n"
     "MUSTER_EXCLUDED_HOST and MUSTER_EXCLUSION_CAUSE set",
     ""},
    {Key::kLogDir, "--log-dir", "--log-dir,--log_dir", "PET_LOG_DIR", "DIR", "a new temp dir",
     kLogGroup, "per-worker stdout.log, stderr.log, error.json", "1.10"},
    {Key::kRedirects, "--redirects", "-r,--redirects", "PET_REDIRECTS", "0-3|RANK:V,...", "0",
     kLogGroup,
     "worker output to log files: 0 none, 1 stdout, 2 stderr,\n"
     "3 both; or per local rank, e.g. 0:1,1:2",
     "1.10"},
    {Key::kTee, "--tee", "-t,--tee", "PET_TEE", "0-3|RANK:V,...", "0", kLogGroup,
     "as --redirects, and to the console too", "1.10"},
    {Key::kLocalRanksFilter, "--local-ranks-filter", "--local-ranks-filter,--local_ranks_filter",
     "PET_LOCAL_RANKS_FILTER", "RANKS", "all", kLogGroup,
     "local ranks shown on the console, e.g. 0 or 0,3", "2.3"},
    {Key::kLogLinePrefixTemplate, "--log-line-prefix-template",
     "--log-line-prefix-template,--log_line_prefix_template", "PET_LOG_LINE_PREFIX_TEMPLATE",
     "TEMPLATE", "[rank ${rank}]: ", kLogGroup,
     "console prefix of each worker line: ${role_name}, ${rank},\n"
     "${local_rank}, ${pid}, ${hostname}; else\n"
     "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
     "main (2026)"},
    {Key::kDuplicateStdoutFilters, "--duplicate-stdout-filters",
     "--duplicate-stdout-filters,--duplicate_stdout_filters", "PET_DUPLICATE_STDOUT_FILTERS",
     "TEXT,...", "none", kLogGroup,
     "stdout lines holding one of these (,, is a comma) also go\n"
     "to attempt_<n>/filtered_stdout.log",
     "2.10"},
    {Key::kDuplicateStderrFilters, "--duplicate-stderr-filters",
     "--duplicate-stderr-filters,--duplicate_stderr_filters", "PET_DUPLICATE_STDERR_FILTERS",
     "TEXT,...", "none", kLogGroup, "the same for stderr, to filtered_stderr.log", "2.10"},
    {Key::kLogsSpecs, "--logs-specs", "--logs-specs,--logs_specs", "", "NAME", "default", kLogGroup,
     "the log layout: muster has torchrun's default only", "2.3"},
    {Key::kEventLogHandler, "--event-log-handler", "--event-log-handler,--event_log_handler",
     "PET_EVENT_LOG_HANDLER", "null|console", "null", kLogGroup,
     "console: the agent's events on stderr, one JSON object a line", "2.8"},
    {Key::kSignalsToHandle, "--signals-to-handle", "--signals-to-handle,--signals_to_handle",
     "PET_SIGNALS_TO_HANDLE", "SIG,...", "SIGTERM,SIGINT,SIGHUP,SIGQUIT", kRestartGroup,
     "signals that stop the job (sent on to the workers first);\n"
     "SIGUSR1 and SIGUSR2 left out only reach the workers,\n"
     "any other left out ends muster and its workers at once",
     "2.9"},
    {Key::kVirtualLocalRank, "--virtual-local-rank", "--virtual-local-rank,--virtual_local_rank",
     "PET_VIRTUAL_LOCAL_RANK", "", "off", kNodesGroup,
     "each worker sees LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES\n"
     "narrowed to its own device",
     "2.10"},
    {Key::kNumaBinding, "--numa-binding", "--numa-binding,--numa_binding", "",
     "node|socket|exclusive|core-complex", "off", kNodesGroup,
     "bind each worker to the CPUs (and memory) near its GPU:\n"
     "its NUMA node, its socket, a share of the node's cores\n"
     "no other worker gets, or the cores of one L3 cache",
     "2.9"},
    {Key::kPreflight, "--preflight", "--preflight", "", "allreduce|none", "none", kGpuGroup,
     "allreduce: in the job's first round, every rank runs\n"
     "muster-allreduce (a few seconds) before the script; a wrong\n"
     "sum, a missing rank or two ranks on one GPU close the job",
     ""},
    {Key::kGpuCheckInterval, "--gpu-check-interval", "--gpu-check-interval,--gpu_check_interval",
     "", "SECONDS", "30", kGpuGroup,
     "map this node's workers to its GPUs (NVML) a few seconds\n"
     "into each round, then every SECONDS; warn when local ranks\n"
     "share a GPU while another has none, or a GPU idles; 0: off",
     ""},
    {Key::kGpuReport, "--gpu-report", "--gpu-report,--gpu_report", "", "", "off", kGpuGroup,
     "a console line per node every 5 minutes: each GPU's\n"
     "utilization, memory used and local ranks",
     ""},
    {Key::kGpuReleaseWait, "--gpu-release-wait", "--gpu-release-wait,--gpu_release_wait", "",
     "SECONDS", "50", kGpuGroup,
     "before a restarted round starts, wait at most SECONDS for\n"
     "the last round's processes to free this node's GPUs\n"
     "(NVML's process lists); 0: do not wait",
     ""},
    {Key::kPrintCompletion, "--print-completion", "--print-completion,--print_completion", "",
     "bash|zsh|tcsh", "", kOtherGroup, "print a completion script for this shell and exit",
     "main (2026)"},
    {Key::kHelp, "--help", "-h,--help", "", "", "", kOtherGroup, "print this help and exit", ""},
    {Key::kVersion, "--version", "--version", "", "", "", kOtherGroup,
     "print muster's version and exit", ""},
}};

constexpr bool SpecsInKeyOrder() {
  for (size_t i = 0; i < kSpecs.size(); ++i) {
    if (static_cast<size_t>(kSpecs[i].key) != i) return false;
  }
  return true;
}
static_assert(SpecsInKeyOrder(), "kSpecs must list the options in the order of Key");

constexpr absl::string_view kUsage = "usage: muster [options] SCRIPT [args...]";

// Stands for the empty value of `--opt=`, which CLI11 would otherwise take as `--opt` and then
// consume the next argument as the value.
constexpr absl::string_view kEmptyValue = "\x1f";

// Variables of torch's own that an option falls back to after its PET_ one, as torchrun reads them.
constexpr absl::string_view FallbackEnv(Key key) {
  switch (key) {
    case Key::kShutdownTimeout: return "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";
    case Key::kLogLinePrefixTemplate: return "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE";
    default: return "";
  }
}

// An option's value and where it came from.
struct Given {
  const OptionSpec* spec;
  std::string value;
  std::string env;  // the variable it was read from; empty when from the command line
};

class GivenOptions {
 public:
  const Given* Get(Key key) const {
    const auto& given = given_[static_cast<size_t>(key)];
    return given ? &*given : nullptr;
  }
  void Set(Key key, Given given) { given_[static_cast<size_t>(key)] = std::move(given); }

 private:
  std::array<std::optional<Given>, kNumKeys> given_;
};

// The value as it should appear in a one-line message: quoted when empty or when it holds
// whitespace or control characters, which are escaped.
std::string Shown(absl::string_view value) {
  bool plain = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return c > ' ' && c != '\x7f' && c != '\'';
  });
  if (plain) return std::string(value);
  return absl::StrCat("'", absl::CHexEscape(value), "'");
}

// `text` with every control character (a newline, say) turned into a space.
std::string OneLine(absl::string_view text) {
  std::string line(text);
  auto is_control = [](char c) { return c >= 0 && c < ' '; };
  std::replace_if(line.begin(), line.end(), is_control, ' ');
  return line;
}

std::string Describe(const Given& given) {
  if (!given.env.empty()) {
    return absl::StrCat(given.env, "=", Shown(given.value), " (", given.spec->name, ")");
  }
  if (given.spec->value_name.empty()) {
    return absl::StrCat(given.spec->name, "=", Shown(given.value));
  }
  return absl::StrCat(given.spec->name, " ", Shown(given.value));
}

absl::Status Invalid(const Given& given, absl::string_view problem, absl::string_view fix) {
  return absl::InvalidArgumentError(absl::StrCat(Describe(given), ": ", problem, "; ", fix));
}

// A base-10 integer, surrounding whitespace allowed. Values beyond int64 clamp to its limits so
// that range checks report them as too large or too small.
std::optional<int64_t> ToInt(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ptr != end) return std::nullopt;
  if (ec == std::errc::result_out_of_range) {
    return text.front() == '-' ? std::numeric_limits<int64_t>::min()
                               : std::numeric_limits<int64_t>::max();
  }
  if (ec != std::errc()) return std::nullopt;
  return value;
}

// A finite decimal number, surrounding whitespace allowed.
std::optional<double> ToDouble(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return std::nullopt;
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value)) return std::nullopt;
  return value;
}

absl::StatusOr<int> ParseInt(const Given& given, int64_t min, int64_t max, absl::string_view fix) {
  std::optional<int64_t> value = ToInt(given.value);
  if (!value) return Invalid(given, "not an integer", fix);
  if (*value < min) return Invalid(given, absl::StrCat("must be at least ", min), fix);
  if (*value > max) return Invalid(given, absl::StrCat("must be at most ", max), fix);
  return static_cast<int>(*value);
}

// --preload: module names (a.b.c), comma-separated; "none" or "": none.
absl::StatusOr<std::vector<std::string>> ParsePreload(const Given& given) {
  constexpr absl::string_view kFix =
      "give --preload MODULES, e.g. torch or torch,numpy (none: off)";
  std::vector<std::string> modules;
  const absl::string_view value = absl::StripAsciiWhitespace(given.value);
  if (value.empty() || value == "none") return modules;
  for (absl::string_view name : absl::StrSplit(value, ',')) {
    name = absl::StripAsciiWhitespace(name);
    bool valid = !name.empty();
    for (absl::string_view part : absl::StrSplit(name, '.')) {
      valid = valid && !part.empty() && !absl::ascii_isdigit(part.front()) &&
              std::all_of(part.begin(), part.end(),
                          [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
    }
    if (!valid) {
      return Invalid(given, absl::StrCat(Shown(name), " is not a module name"), kFix);
    }
    modules.emplace_back(name);
  }
  return modules;
}

// Durations beyond this many seconds (about 31 years) are rejected rather than overflowing.
constexpr int64_t kMaxSeconds = 1'000'000'000;

std::chrono::milliseconds SecondsToMillis(double seconds) {
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

// Seconds >= 0 (> 0 when !allow_zero), fractions allowed.
absl::StatusOr<double> ParseSeconds(const Given& given, bool allow_zero, absl::string_view fix) {
  std::optional<double> value = ToDouble(given.value);
  if (!value) return Invalid(given, "not a number of seconds", fix);
  if (allow_zero ? *value < 0 : *value <= 0) {
    return Invalid(given, allow_zero ? "must be 0 or more" : "must be more than 0", fix);
  }
  if (*value > kMaxSeconds) {
    return Invalid(given, absl::StrCat("must be at most ", kMaxSeconds, " seconds"), fix);
  }
  return *value;
}

// 1/0/true/false, any case.
std::optional<bool> ToBool(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "1" || lower == "true") return true;
  if (lower == "0" || lower == "false") return false;
  return std::nullopt;
}

// A flag's value: "true" from CLI11 for a bare --flag, or the text of --flag=VALUE or PET_FLAG.
absl::StatusOr<bool> ParseFlag(const Given& given) {
  if (std::optional<bool> value = ToBool(given.value)) return *value;
  if (given.env.empty()) {
    return Invalid(given, "a flag takes no value",
                   absl::StrCat("write ", given.spec->name, " alone to turn it on"));
  }
  return Invalid(given, "not a flag value", absl::StrCat("set ", given.env, " to 1 or 0"));
}

absl::StatusOr<bool> FlagIsOn(const GivenOptions& given, Key key) {
  const Given* flag = given.Get(key);
  if (flag == nullptr) return false;
  return ParseFlag(*flag);
}

absl::Status ApplyNodes(const GivenOptions& given, LaunchConfig& config) {
  if (const Given* nnodes = given.Get(Key::kNnodes)) {
    constexpr absl::string_view kFix = "give --nnodes N or MIN:MAX with 0 < MIN <= MAX";
    std::vector<absl::string_view> parts = absl::StrSplit(nnodes->value, ':');
    if (parts.size() > 2) return Invalid(*nnodes, "not N or MIN:MAX", kFix);
    std::optional<int64_t> min = ToInt(parts.front());
    std::optional<int64_t> max = ToInt(parts.back());
    if (!min || !max) return Invalid(*nnodes, "not N or MIN:MAX", kFix);
    if (*min < 1 || *max < 1) return Invalid(*nnodes, "node counts must be at least 1", kFix);
    if (*min > *max) return Invalid(*nnodes, "MIN is greater than MAX", kFix);
    if (*max > std::numeric_limits<int>::max()) return Invalid(*nnodes, "too many nodes", kFix);
    config.min_nodes = static_cast<int>(*min);
    config.max_nodes = static_cast<int>(*max);
  }
  if (const Given* nproc = given.Get(Key::kNprocPerNode)) {
    absl::string_view text = nproc->value;
    if (text == "gpu") {
      config.nproc_kind = NprocKind::kGpu;
    } else if (text == "cpu") {
      config.nproc_kind = NprocKind::kCpu;
    } else if (text == "auto") {
      config.nproc_kind = NprocKind::kAuto;
    } else {
      constexpr absl::string_view kFix = "give --nproc-per-node N (N >= 1), gpu, cpu or auto";
      std::optional<int64_t> count = ToInt(text);
      if (!count) return Invalid(*nproc, "not a number, gpu, cpu or auto", kFix);
      absl::StatusOr<int> checked = ParseInt(*nproc, 1, std::numeric_limits<int>::max(), kFix);
      if (!checked.ok()) return checked.status();
      config.nproc_kind = NprocKind::kCount;
      config.nproc_per_node = *checked;
    }
  }
  if (const Given* node_rank = given.Get(Key::kNodeRank)) {
    absl::StatusOr<int> rank =
        ParseInt(*node_rank, 0, std::numeric_limits<int>::max(), "give --node-rank N with N >= 0");
    if (!rank.ok()) return rank.status();
    config.node_rank = *rank;
    config.node_rank_given = true;
  }
  if (const Given* local_addr = given.Get(Key::kLocalAddr)) config.local_addr = local_addr->value;
  return absl::OkStatus();
}

// Keys torchrun's rendezvous backends read (torch/distributed/elastic/rendezvous/
// and launcher/api.py, PyTorch 1.13 to main) that mean nothing to muster's:
// accepted as torchrun accepts them. The note is printed as a warning; none
// for a key that torchrun's own c10d backend ignores too.
struct TorchrunOnlyKey {
  absl::string_view key;
  absl::string_view note;
};
constexpr TorchrunOnlyKey kTorchrunOnlyRdzvKeys[] = {
    {"rank", ""},       // static: torchrun sets it from --node-rank, whatever was given
    {"use_libuv", ""},  // PyTorch 2.3-2.4; workers' TCPStore follows USE_LIBUV, muster's too
    {"etcd_prefix",
     "is torchrun's etcd (v1) key prefix; muster's etcd backend keeps its keys under "
     "/muster/v1/jobs/, so it is ignored"},
};

// Keys torchrun passes on as arguments of its own (a crash there), each with
// the option that says it.
constexpr std::pair<absl::string_view, absl::string_view> kOptionNotRdzvKey[] = {
    {"local_addr", "--local-addr"},    {"backend", "--rdzv-backend"},
    {"endpoint", "--rdzv-endpoint"},   {"run_id", "--rdzv-id"},
    {"min_nodes", "--nnodes MIN:MAX"}, {"max_nodes", "--nnodes MIN:MAX"},
};

// is_host's values as torchrun's RendezvousParameters.get_as_bool reads them, any case.
std::optional<bool> ToTorchBool(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  for (absl::string_view yes : {"1", "true", "t", "yes", "y"}) {
    if (lower == yes) return true;
  }
  for (absl::string_view no : {"0", "false", "f", "no", "n"}) {
    if (lower == no) return false;
  }
  return std::nullopt;
}

// One pass of --rdzv-conf over a RdzvConf: what it needs and what it found.
struct RdzvConfPass {
  RdzvConfPass(const Given& given_, bool timeout_is_join_, RdzvConf& conf_,
               std::vector<std::string>& warnings_)
      : given(given_), timeout_is_join(timeout_is_join_), conf(conf_), warnings(warnings_) {}

  const Given& given;
  // torchrun's `timeout` key is this backend's join timeout (static: its
  // store's timeout; etcd, torchrun's v1: the whole rendezvous').
  bool timeout_is_join;
  RdzvConf& conf;
  std::vector<std::string>& warnings;
  std::string fix = absl::StrCat("give KEY=VALUE pairs separated by commas; keys: ", kRdzvConfKeys);
  std::optional<std::chrono::milliseconds> timeout;
  bool join_timeout_given = false;

  absl::Status Invalid(absl::string_view what) const { return muster::Invalid(given, what, fix); }
};

// Keys of seconds.
constexpr std::pair<absl::string_view, std::chrono::milliseconds RdzvConf::*> kDurationKeys[] = {
    {"join_timeout", &RdzvConf::join_timeout},
    {"last_call_timeout", &RdzvConf::last_call_timeout},
    {"close_timeout", &RdzvConf::close_timeout},
    {"heartbeat_timeout", &RdzvConf::heartbeat_timeout},
    {"keep_alive_interval", &RdzvConf::keep_alive_interval},
    {"read_timeout", &RdzvConf::read_timeout},
};

// Keys taken as text, read or checked when the launch starts. The second
// spellings of the TLS files are torchrun's etcd-v2 backend's.
constexpr std::pair<absl::string_view, std::string RdzvConf::*> kTextKeys[] = {
    {"token_file", &RdzvConf::token_file},
    {"cacert", &RdzvConf::cacert},
    {"ca_cert", &RdzvConf::cacert},
    {"cert", &RdzvConf::cert},
    {"ssl_cert", &RdzvConf::cert},
    {"key", &RdzvConf::key},
    {"ssl_cert_key", &RdzvConf::key},
    {"user", &RdzvConf::etcd_user},
    {"password", &RdzvConf::etcd_password},
    {"munge_socket", &RdzvConf::munge_socket},
    {"event_log", &RdzvConf::event_log},
    {"metrics_listen", &RdzvConf::metrics_listen},
    {"metrics_password_file", &RdzvConf::metrics_password_file},
};

template <typename Table>
auto FindKey(const Table& table, absl::string_view key) {
  return std::find_if(std::begin(table), std::end(table),
                      [&](const auto& entry) { return entry.first == key; });
}

// A key of seconds or of text; nullopt: not one of those.
std::optional<absl::Status> ApplyTableKey(RdzvConfPass& pass, absl::string_view key,
                                          absl::string_view value) {
  if (auto text = FindKey(kTextKeys, key); text != std::end(kTextKeys)) {
    pass.conf.*(text->second) = std::string(value);
    return absl::OkStatus();
  }
  auto duration = FindKey(kDurationKeys, key);
  if (duration == std::end(kDurationKeys)) return std::nullopt;
  std::optional<double> seconds = ToDouble(value);
  if (!seconds || *seconds < 0 || *seconds > kMaxSeconds) {
    return pass.Invalid(absl::StrCat(key, " needs seconds >= 0, not ", Shown(value)));
  }
  if (key == "heartbeat_timeout" && *seconds < 1) {
    // The rendezvous refuses it too: a node must be able to be declared dead.
    return muster::Invalid(
        pass.given, absl::StrCat("heartbeat_timeout needs at least 1 second, not ", Shown(value)),
        "give heartbeat_timeout=1 or more (the default is 30)");
  }
  pass.conf.*(duration->second) = SecondsToMillis(*seconds);
  pass.join_timeout_given |= key == "join_timeout";
  return absl::OkStatus();
}

// keep_alive_max_attempt, metrics_port, timeout; nullopt: none of those.
std::optional<absl::Status> ApplyNumberKey(RdzvConfPass& pass, absl::string_view key,
                                           absl::string_view value) {
  if (key == "keep_alive_max_attempt") {
    std::optional<int64_t> attempts = ToInt(value);
    if (!attempts || *attempts < 1 || *attempts > std::numeric_limits<int>::max()) {
      return pass.Invalid(absl::StrCat(key, " needs an integer >= 1, not ", Shown(value)));
    }
    pass.conf.keep_alive_max_attempt = static_cast<int>(*attempts);
  } else if (key == "metrics_port") {
    std::optional<int64_t> port = ToInt(value);
    if (!port || *port < 0 || *port > 65535) {
      return pass.Invalid(absl::StrCat(key, " needs a port number 0..65535, not ", Shown(value)));
    }
    pass.conf.metrics_port = static_cast<int>(*port);
  } else if (key == "timeout") {
    // c10d (and etcd-v2) read it not at all, nor does muster's c10d.
    if (!pass.timeout_is_join) return absl::OkStatus();
    std::optional<double> seconds = ToDouble(value);
    if (!seconds || *seconds <= 0 || *seconds > kMaxSeconds) {
      return pass.Invalid(absl::StrCat(key, " needs seconds > 0, not ", Shown(value)));
    }
    pass.timeout = SecondsToMillis(*seconds);
  } else {
    return std::nullopt;
  }
  return absl::OkStatus();
}

// is_host, ha, protocol, auth, store_type; nullopt: none of those.
std::optional<absl::Status> ApplyChoiceKey(RdzvConfPass& pass, absl::string_view key,
                                           absl::string_view value) {
  if (key == "is_host" || key == "ha") {
    std::optional<bool> on = ToTorchBool(value);
    if (!on) {
      return pass.Invalid(
          absl::StrCat(key, " needs 1, 0, true, false, yes or no, not ", Shown(value)));
    }
    (key == "ha" ? pass.conf.ha : pass.conf.is_host) = *on;
  } else if (key == "protocol") {
    const std::string protocol = absl::AsciiStrToLower(value);
    if (protocol != "http" && protocol != "https") {
      return pass.Invalid(absl::StrCat("protocol needs http or https, not ", Shown(value)));
    }
    pass.conf.etcd_protocol = protocol;
  } else if (key == "auth") {
    if (value == "none") {
      pass.conf.auth = RdzvAuth::kNone;
    } else if (value == "token") {
      pass.conf.auth = RdzvAuth::kToken;
    } else if (value == "munge") {
      pass.conf.auth = RdzvAuth::kMunge;
    } else {
      return pass.Invalid(absl::StrCat("auth needs none, token or munge, not ", Shown(value)));
    }
  } else if (key == "store_type") {
    const std::string type = absl::AsciiStrToLower(value);
    if (type != "tcp" && type != "file") {
      return pass.Invalid(absl::StrCat("store_type needs tcp or file, not ", Shown(value)));
    }
    if (type == "file") {
      pass.warnings.push_back(absl::StrCat(
          pass.given.spec->name,
          ": store_type=file is ignored: muster's rendezvous is a server of its own (an agent "
          "or musterd), never a file"));
    }
  } else {
    return std::nullopt;
  }
  return absl::OkStatus();
}

// A key muster does not read: an option given as a key (an error), one only
// torchrun reads, or one nobody reads (warnings).
absl::Status ApplyOtherKey(RdzvConfPass& pass, absl::string_view key) {
  if (auto option = FindKey(kOptionNotRdzvKey, key); option != std::end(kOptionNotRdzvKey)) {
    return muster::Invalid(pass.given,
                           absl::StrCat(key, " is not a rendezvous setting but an option"),
                           absl::StrCat("give ", option->second, " instead"));
  }
  if (auto torchrun =
          std::find_if(std::begin(kTorchrunOnlyRdzvKeys), std::end(kTorchrunOnlyRdzvKeys),
                       [&](const TorchrunOnlyKey& entry) { return entry.key == key; });
      torchrun != std::end(kTorchrunOnlyRdzvKeys)) {
    if (!torchrun->note.empty()) {
      pass.warnings.push_back(absl::StrCat(pass.given.spec->name, ": ", key, " ", torchrun->note));
    }
    return absl::OkStatus();
  }
  // torchrun ignores a key no backend reads; so does muster, but says so.
  pass.warnings.push_back(
      absl::StrCat(pass.given.spec->name, ": ignoring the unknown key ", Shown(key),
                   " (neither muster nor torchrun reads it; muster's keys: ", kRdzvConfKeys, ")"));
  return absl::OkStatus();
}

// `timeout_is_join`: see RdzvConfPass.
absl::Status ApplyRdzvConf(const Given& given, bool timeout_is_join, RdzvConf& conf,
                           std::vector<std::string>& warnings) {
  RdzvConfPass pass(given, timeout_is_join, conf, warnings);
  absl::string_view text = absl::StripAsciiWhitespace(given.value);
  if (text.empty()) return absl::OkStatus();
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) return pass.Invalid("an empty entry");
    size_t equals = item.find('=');
    if (equals == absl::string_view::npos) {
      return pass.Invalid(absl::StrCat(Shown(item), " has no '='"));
    }
    absl::string_view key = absl::StripAsciiWhitespace(item.substr(0, equals));
    absl::string_view value = absl::StripAsciiWhitespace(item.substr(equals + 1));
    if (key.empty()) return pass.Invalid(absl::StrCat(Shown(item), " has no key"));
    if (value.empty()) return pass.Invalid(absl::StrCat(Shown(key), " has no value"));
    std::optional<absl::Status> applied = ApplyTableKey(pass, key, value);
    if (!applied) applied = ApplyNumberKey(pass, key, value);
    if (!applied) applied = ApplyChoiceKey(pass, key, value);
    if (!applied) applied = ApplyOtherKey(pass, key);
    MUSTER_RETURN_IF_ERROR(*applied);
  }
  if (pass.timeout && timeout_is_join && !pass.join_timeout_given)
    conf.join_timeout = *pass.timeout;
  return absl::OkStatus();
}

std::string RandomRunId() {
  std::random_device device;
  uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(16, '0');
  for (char& digit : id) {
    digit = kHex[bits >> 60];
    bits <<= 4;
  }
  return id;
}

absl::Status ApplyRendezvous(const GivenOptions& given, LaunchConfig& config,
                             std::vector<std::string>& warnings) {
  absl::StatusOr<bool> standalone = FlagIsOn(given, Key::kStandalone);
  if (!standalone.ok()) return standalone.status();
  const Given* backend = given.Get(Key::kRdzvBackend);
  const Given* endpoint = given.Get(Key::kRdzvEndpoint);
  const Given* id = given.Get(Key::kRdzvId);
  if (*standalone) {
    if (const Given* nnodes = given.Get(Key::kNnodes);
        nnodes != nullptr && (config.min_nodes != 1 || config.max_nodes != 1)) {
      return Invalid(*nnodes, "--standalone runs exactly one node",
                     "drop --nnodes, or drop --standalone and give --rdzv-backend c10d "
                     "--rdzv-endpoint HOST:PORT for several nodes");
    }
    // As torchrun: --standalone wins over explicit rendezvous options, so they are not checked.
    if (backend != nullptr) {
      warnings.push_back(absl::StrCat("--standalone ignores ", Describe(*backend),
                                      ": it always uses muster's embedded rendezvous"));
    }
    if (endpoint != nullptr) {
      warnings.push_back(absl::StrCat("--standalone ignores ", Describe(*endpoint),
                                      ": it always listens on localhost:0, a free local port"));
    }
    if (id != nullptr) {
      warnings.push_back(
          absl::StrCat("--standalone ignores ", Describe(*id), ": it picks a random id"));
    }
    config.standalone = true;
    config.rdzv_backend = RdzvBackend::kMuster;
    config.rdzv_endpoint = "localhost:0";
    config.rdzv_id = RandomRunId();
  } else {
    if (backend != nullptr) {
      if (backend->value == "static") {
        config.rdzv_backend = RdzvBackend::kStatic;
      } else if (backend->value == "c10d" || backend->value == "muster") {
        config.rdzv_backend = RdzvBackend::kMuster;
      } else if (backend->value == "etcd" || backend->value == "etcd-v2") {
        config.rdzv_backend = RdzvBackend::kEtcd;
      } else {
        return Invalid(*backend, "unsupported rendezvous backend",
                       "give --rdzv-backend static, c10d, muster (the same as c10d) or etcd");
      }
    }
    if (endpoint != nullptr) {
      // etcd's list of members is parsed when the launch starts.
      if (!endpoint->value.empty() && config.rdzv_backend != RdzvBackend::kEtcd) {
        // Only the shape is checked here; the port's default is the launcher's.
        absl::StatusOr<Endpoint> parsed = ParseEndpoint(endpoint->value, 0, endpoint->spec->name);
        if (!parsed.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(Describe(*endpoint), ": ", parsed.status().message()));
        }
      }
      config.rdzv_endpoint = endpoint->value;
    }
    if (id != nullptr) config.rdzv_id = id->value;
  }
  if (const Given* conf = given.Get(Key::kRdzvConf)) {
    absl::Status status =
        ApplyRdzvConf(*conf,
                      !config.standalone && (config.rdzv_backend == RdzvBackend::kStatic ||
                                             config.rdzv_backend == RdzvBackend::kEtcd),
                      config.rdzv_conf, warnings);
    if (!status.ok()) return status;
  }
  if (const Given* addr = given.Get(Key::kMasterAddr)) {
    if (absl::StripAsciiWhitespace(addr->value).empty()) {
      return Invalid(*addr, "empty", "give --master-addr HOST, e.g. 127.0.0.1");
    }
    config.master_addr = addr->value;
  }
  if (const Given* port = given.Get(Key::kMasterPort)) {
    absl::StatusOr<int> number = ParseInt(*port, 1, 65535, "give --master-port 1..65535");
    if (!number.ok()) return number.status();
    config.master_port = *number;
  }
  return absl::OkStatus();
}

absl::Status ApplyRun(const GivenOptions& given, LaunchConfig& config) {
  for (auto [key, field] : {std::pair{Key::kModule, &LaunchConfig::module},
                            std::pair{Key::kNoPython, &LaunchConfig::no_python},
                            std::pair{Key::kRunPath, &LaunchConfig::run_path}}) {
    absl::StatusOr<bool> on = FlagIsOn(given, key);
    if (!on.ok()) return on.status();
    config.*field = *on;
  }
  if (config.module && config.no_python) {
    return absl::InvalidArgumentError(
        "-m and --no-python cannot be used together: -m runs python -m MODULE, --no-python runs "
        "SCRIPT directly; keep one of them");
  }
  if (const Given* role = given.Get(Key::kRole)) {
    if (absl::StripAsciiWhitespace(role->value).empty()) {
      return Invalid(*role, "empty", "give --role NAME, or leave it out for 'default'");
    }
    config.role = role->value;
  }
  if (const Given* method = given.Get(Key::kStartMethod)) {
    if (method->value != "spawn" && method->value != "fork" && method->value != "forkserver") {
      return Invalid(*method, "unknown start method",
                     "give --start-method spawn, fork or forkserver");
    }
    config.start_method = method->value;
  }
  if (const Given* numa = given.Get(Key::kNumaBinding)) {
    static constexpr std::pair<absl::string_view, NumaBinding> kBindings[] = {
        {"node", NumaBinding::kNode},
        {"socket", NumaBinding::kSocket},
        {"exclusive", NumaBinding::kExclusive},
        {"core-complex", NumaBinding::kCoreComplex}};
    auto binding = std::find_if(std::begin(kBindings), std::end(kBindings),
                                [&](const auto& entry) { return entry.first == numa->value; });
    if (binding == std::end(kBindings)) {
      return Invalid(*numa, "unknown binding",
                     "give --numa-binding node, socket, exclusive or core-complex");
    }
    config.numa_binding = binding->second;
  }
  absl::StatusOr<bool> virtual_local_rank = FlagIsOn(given, Key::kVirtualLocalRank);
  if (!virtual_local_rank.ok()) return virtual_local_rank.status();
  config.virtual_local_rank = *virtual_local_rank;
  if (const Given* preflight = given.Get(Key::kPreflight)) {
    if (preflight->value != "allreduce" && preflight->value != "none") {
      return Invalid(*preflight, "unknown pre-flight", "give --preflight allreduce, or none");
    }
    config.preflight = preflight->value == "allreduce";
  }
  if (const Given* interval = given.Get(Key::kGpuCheckInterval)) {
    constexpr absl::string_view kFix =
        "give --gpu-check-interval SECONDS, 1 or more (0 turns the check off), e.g. 30";
    absl::StatusOr<double> seconds = ParseSeconds(*interval, /*allow_zero=*/true, kFix);
    if (!seconds.ok()) return seconds.status();
    if (*seconds > 0 && *seconds < 1) return Invalid(*interval, "below a second", kFix);
    config.gpu_check_interval = SecondsToMillis(*seconds);
  }
  if (const Given* wait = given.Get(Key::kGpuReleaseWait)) {
    absl::StatusOr<double> seconds = ParseSeconds(
        *wait, /*allow_zero=*/true, "give --gpu-release-wait SECONDS (>= 0; 0: no wait), e.g. 50");
    if (!seconds.ok()) return seconds.status();
    config.gpu_release_wait = SecondsToMillis(*seconds);
  }
  absl::StatusOr<bool> gpu_report = FlagIsOn(given, Key::kGpuReport);
  if (!gpu_report.ok()) return gpu_report.status();
  config.gpu_report = *gpu_report;
  if (config.gpu_report && config.gpu_check_interval.count() == 0) {
    return absl::InvalidArgumentError(
        "--gpu-report with --gpu-check-interval 0: the report comes from the GPU check, which is "
        "off; drop one of them");
  }
  return absl::OkStatus();
}

// The signals --signals-to-handle may name: those a launcher may be sent to
// stop it (by a user, a scheduler, a preemption notice). Not SIGKILL or
// SIGSTOP (no process can catch them), nor SIGCHLD, SIGPIPE, the job-control
// signals or those of a fault.
constexpr std::pair<absl::string_view, int> kHandleableSignals[] = {
    {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
    {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},
    {"SIGALRM", SIGALRM}, {"SIGXCPU", SIGXCPU}, {"SIGPWR", SIGPWR},
};

absl::Status ParseSignalsToHandle(const Given& given, LaunchConfig& config) {
  std::vector<absl::string_view> names;
  for (const auto& [name, number] : kHandleableSignals) names.push_back(name);
  const std::string fix =
      absl::StrCat("give --signals-to-handle NAME[,NAME...] from ", absl::StrJoin(names, ", "),
                   " (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)");
  std::vector<int> signals;
  // As torchrun: split on commas, each name stripped, Python's spelling.
  for (absl::string_view item : absl::StrSplit(given.value, ',')) {
    item = absl::StripAsciiWhitespace(item);
    auto known = std::find_if(std::begin(kHandleableSignals), std::end(kHandleableSignals),
                              [&](const auto& entry) { return entry.first == item; });
    if (known == std::end(kHandleableSignals)) {
      return Invalid(given,
                     item.empty() ? std::string("an empty signal name")
                                  : absl::StrCat(Shown(item), " is not a signal muster can handle"),
                     fix);
    }
    if (std::find(signals.begin(), signals.end(), known->second) == signals.end()) {
      signals.push_back(known->second);
    }
  }
  config.signals_to_handle = std::move(signals);
  config.signals_to_handle_text = given.value;
  return absl::OkStatus();
}

absl::Status ApplyRestarts(const GivenOptions& given, LaunchConfig& config) {
  if (const Given* restarts = given.Get(Key::kMaxRestarts)) {
    absl::StatusOr<int> count = ParseInt(*restarts, 0, std::numeric_limits<int>::max(),
                                         "give --max-restarts N with N >= 0");
    if (!count.ok()) return count.status();
    config.max_restarts = *count;
  }
  if (const Given* stuck = given.Get(Key::kMaxNoProgressRestarts)) {
    absl::StatusOr<int> count =
        ParseInt(*stuck, 0, 1'000'000, "give --max-no-progress-restarts K, 0 to 1000000 (0: off)");
    if (!count.ok()) return count.status();
    config.max_no_progress_restarts = *count;
  }
  if (const Given* failures = given.Get(Key::kMaxNodeFailures)) {
    absl::StatusOr<int> count = ParseInt(
        *failures, 0, 1'000'000, "give --max-node-failures K, 0 to 1000000 (0: never exclude)");
    if (!count.ok()) return count.status();
    config.max_node_failures = *count;
  }
  if (const Given* preload = given.Get(Key::kPreload)) {
    absl::StatusOr<std::vector<std::string>> modules = ParsePreload(*preload);
    if (!modules.ok()) return modules.status();
    config.preload = *std::move(modules);
  }
  if (const Given* file = given.Get(Key::kAccelerateConfig)) {
    if (file->value.empty()) {
      return Invalid(*file, "empty",
                     "give --accelerate-config FILE, or default for accelerate's own");
    }
    config.accelerate_config = file->value;
  }
  if (const Given* command = given.Get(Key::kOnNodeExcluded)) {
    if (absl::StripAsciiWhitespace(command->value).empty()) {
      return Invalid(*command, "an empty command",
                     "give --on-node-excluded 'CMD', run by sh -c on an excluded node");
    }
    config.on_node_excluded = command->value;
  }
  if (const Given* interval = given.Get(Key::kMonitorInterval)) {
    absl::StatusOr<double> seconds =
        ParseSeconds(*interval, /*allow_zero=*/false, "give --monitor-interval SECONDS, e.g. 0.1");
    if (!seconds.ok()) return seconds.status();
    config.monitor_interval_s = *seconds;
  }
  if (const Given* timeout = given.Get(Key::kShutdownTimeout)) {
    absl::StatusOr<double> seconds = ParseSeconds(
        *timeout, /*allow_zero=*/true, "give --shutdown-timeout SECONDS (>= 0), e.g. 30");
    if (!seconds.ok()) return seconds.status();
    config.shutdown_grace = SecondsToMillis(*seconds);
  }
  if (const Given* signals = given.Get(Key::kSignalsToHandle)) {
    MUSTER_RETURN_IF_ERROR(ParseSignalsToHandle(*signals, config));
  }
  return absl::OkStatus();
}

absl::Status ParseRedirectSpec(const Given& given, RedirectSpec& spec) {
  std::string fix = absl::StrCat("give ", given.spec->name,
                                 " 0 (none), 1 (stdout), 2 (stderr) or 3 (both) for every local "
                                 "rank, or LOCAL_RANK:VALUE pairs such as 0:1,1:2");
  auto to_std = [](absl::string_view text) -> std::optional<StdRedirect> {
    text = absl::StripAsciiWhitespace(text);
    if (text.size() != 1 || text[0] < '0' || text[0] > '3') return std::nullopt;
    int bits = text[0] - '0';
    return StdRedirect{.out = (bits & 1) != 0, .err = (bits & 2) != 0};
  };
  if (!absl::StrContains(given.value, ':')) {
    std::optional<StdRedirect> all = to_std(given.value);
    if (!all) return Invalid(given, "not a value 0..3 or a LOCAL_RANK:VALUE list", fix);
    spec = RedirectSpec{.all = *all, .per_rank = {}};
    return absl::OkStatus();
  }
  RedirectSpec per_rank;
  for (absl::string_view item : absl::StrSplit(given.value, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    if (parts.size() != 2) {
      return Invalid(given, absl::StrCat(Shown(item), " is not LOCAL_RANK:VALUE"), fix);
    }
    std::optional<int64_t> rank = ToInt(parts[0]);
    if (!rank || *rank < 0 || *rank > std::numeric_limits<int>::max()) {
      return Invalid(given, absl::StrCat("local rank ", Shown(parts[0]), " is not an integer >= 0"),
                     fix);
    }
    std::optional<StdRedirect> value = to_std(parts[1]);
    if (!value) {
      return Invalid(
          given, absl::StrCat("local rank ", *rank, " gets ", Shown(parts[1]), ", not 0..3"), fix);
    }
    if (!per_rank.per_rank.emplace(static_cast<int>(*rank), *value).second) {
      return Invalid(given, absl::StrCat("local rank ", *rank, " is given twice"), fix);
    }
  }
  spec = std::move(per_rank);
  return absl::OkStatus();
}

// A --duplicate-std*-filters list as torchrun splits it: at commas, ",,"
// standing for a comma (read left to right: "a,,,b" is "a," and "b"). An
// empty text is one empty filter, which every line holds.
std::vector<std::string> SplitFilters(absl::string_view text) {
  std::vector<std::string> filters(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      filters.back().push_back(text[i]);
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      filters.back().push_back(',');
      ++i;
    } else {
      filters.emplace_back();
    }
  }
  return filters;
}

absl::Status ApplyLogs(const GivenOptions& given, LaunchConfig& config) {
  if (const Given* dir = given.Get(Key::kLogDir)) config.log_dir = dir->value;
  if (const Given* redirects = given.Get(Key::kRedirects)) {
    absl::Status status = ParseRedirectSpec(*redirects, config.redirects);
    if (!status.ok()) return status;
  }
  if (const Given* tee = given.Get(Key::kTee)) {
    absl::Status status = ParseRedirectSpec(*tee, config.tee);
    if (!status.ok()) return status;
  }
  if (const Given* filter = given.Get(Key::kLocalRanksFilter)) {
    // Empty means every rank, as in torchrun.
    if (!absl::StripAsciiWhitespace(filter->value).empty()) {
      std::set<int> ranks;
      for (absl::string_view item : absl::StrSplit(filter->value, ',')) {
        std::optional<int64_t> rank = ToInt(item);
        if (!rank || *rank < 0 || *rank > std::numeric_limits<int>::max()) {
          return Invalid(*filter,
                         absl::StrCat(Shown(item), " is not a local rank (an integer >= 0)"),
                         "give --local-ranks-filter RANK[,RANK...], e.g. 0 or 0,3");
        }
        ranks.insert(static_cast<int>(*rank));
      }
      config.local_ranks_filter = std::move(ranks);
    }
  }
  if (const Given* prefix = given.Get(Key::kLogLinePrefixTemplate)) {
    config.log_line_prefix_template = prefix->value;
  }
  for (auto [key, field] :
       {std::pair{Key::kDuplicateStdoutFilters, &LaunchConfig::duplicate_stdout_filters},
        std::pair{Key::kDuplicateStderrFilters, &LaunchConfig::duplicate_stderr_filters}}) {
    if (const Given* filters = given.Get(key)) config.*field = SplitFilters(filters->value);
  }
  if (const Given* specs = given.Get(Key::kLogsSpecs)) {
    if (specs->value != "default") {
      return Invalid(*specs,
                     "torchrun loads a log layout from a Python entry point "
                     "(torchrun.logs_specs); muster has one layout, torchrun's default",
                     "drop --logs-specs, or give --logs-specs default");
    }
  }
  if (const Given* handler = given.Get(Key::kEventLogHandler)) {
    // torchrun's handlers: console, and null and dynamic_rendezvous (both
    // discard the events outside Meta's own build).
    if (handler->value == "console") {
      config.console_events = true;
    } else if (handler->value != "null" && handler->value != "dynamic_rendezvous") {
      return Invalid(*handler, "unknown event log handler",
                     "give --event-log-handler null (the default) or console");
    }
  }
  return absl::OkStatus();
}

// Fills `config` from the options given, checking every value and how they combine.
absl::Status Apply(const GivenOptions& given, LaunchConfig& config,
                   std::vector<std::string>& warnings) {
  // In this order: ApplyRendezvous checks --standalone against the node counts ApplyNodes set.
  absl::Status status = ApplyNodes(given, config);
  if (status.ok()) status = ApplyRendezvous(given, config, warnings);
  if (status.ok()) status = ApplyRun(given, config);
  if (status.ok()) status = ApplyRestarts(given, config);
  if (status.ok()) status = ApplyLogs(given, config);
  return status;
}

// The help text's layout: per option its short and dashed long spelling (not the underscore one),
// the value's name, the description and the default.
class HelpFormatter final : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(40); }

  std::string make_usage(const CLI::App* /*app*/, std::string /*name*/) const override {
    return "Usage: muster [options] SCRIPT [script args...]\n\n";
  }

  // Groups are separated by one blank line, which make_groups() already puts between them.
  std::string make_group(std::string group, bool is_positional,
                         std::vector<const CLI::Option*> options) const override {
    std::string text = absl::StrCat(group, ":\n");
    for (const CLI::Option* option : options) {
      absl::StrAppend(&text, make_option(option, is_positional));
    }
    return text;
  }

  std::string make_option_name(const CLI::Option* option, bool /*is_positional*/) const override {
    std::string name;
    for (const std::string& short_name : option->get_snames()) {
      absl::StrAppend(&name, "-", short_name, ", ");
    }
    if (name.empty()) name = "    ";
    absl::StrAppend(&name, "--", option->get_lnames().front());
    return name;
  }

  std::string make_option_opts(const CLI::Option* option) const override {
    return option->get_type_size() == 0 ? "" : " " + option->get_type_name();
  }

  std::string make_option_desc(const CLI::Option* option) const override {
    std::string description = option->get_description();
    if (!option->get_default_str().empty()) {
      absl::StrAppend(&description, " [default: ", option->get_default_str(), "]");
    }
    return description;
  }
};

constexpr absl::string_view kHelpFooter =
    "Options go before SCRIPT; everything after SCRIPT, options included, goes to it untouched.\n"
    "With -m, SCRIPT is a module name. ${local_rank} in script args becomes each worker's rank.\n"
    "Every option also takes underscores (--nproc_per_node), the form --opt=value, and the\n"
    "environment variable PET_<NAME> (PET_NPROC_PER_NODE=4, PET_STANDALONE=1) when not on the\n"
    "command line. The shutdown grace falls back to TORCH_ELASTIC_SHUTDOWN_TIMEOUT (seconds).\n"
    "PYTHON_EXEC names the interpreter (default python3).";

// Declares every option to CLI11, which only splits the command line; values are checked later.
std::array<CLI::Option*, kNumKeys> DeclareOptions(CLI::App& app) {
  app.set_help_flag();  // --help is declared below like any flag, so CLI11 never throws for it
  app.prefix_command();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.formatter(std::make_shared<HelpFormatter>());
  app.footer(std::string(kHelpFooter));
  std::array<CLI::Option*, kNumKeys> options{};
  for (const OptionSpec& spec : kSpecs) {
    // No variable is bound (an lvalue second argument would be taken as one): values are read
    // back from results().
    std::string spellings(spec.spellings);
    CLI::Option* option = spec.value_name.empty()
                              ? app.add_flag(spellings)
                              : app.add_option(spellings)->type_name(std::string(spec.value_name));
    option->description(spec.since.empty()
                            ? std::string(spec.description)
                            : absl::StrCat(spec.description, " (torchrun ", spec.since, ")"));
    option->group(std::string(spec.group));
    if (!spec.default_text.empty()) option->default_str(std::string(spec.default_text));
    options[static_cast<size_t>(spec.key)] = option;
  }
  return options;
}

// Returns the spec whose spelling `token` is (an option name alone, no value), or nullptr.
const OptionSpec* FindSpelling(absl::string_view token) {
  for (const OptionSpec& spec : kSpecs) {
    for (absl::string_view spelling : absl::StrSplit(spec.spellings, ',')) {
      if (spelling == token) return &spec;
    }
  }
  return nullptr;
}

// Returns a known option close to the unknown long option `name`, or "".
std::string Suggestion(absl::string_view name) {
  std::string wanted(name);
  std::replace(wanted.begin(), wanted.end(), '_', '-');
  auto distance = [](absl::string_view a, absl::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  absl::string_view prefix_match;
  int prefix_matches = 0;
  for (const OptionSpec& spec : kSpecs) {
    if (spec.name.size() > wanted.size() && absl::StartsWith(spec.name, wanted)) {
      prefix_match = spec.name;
      ++prefix_matches;
    }
  }
  if (prefix_matches == 1 && wanted.size() > 3) return std::string(prefix_match);
  for (const OptionSpec& spec : kSpecs) {
    if (distance(wanted, spec.name) <= 2) return std::string(spec.name);
  }
  return "";
}

absl::Status UnknownOptionError(absl::string_view token) {
  absl::string_view name = token;
  std::string suggestion;
  if (absl::StartsWith(token, "--")) {
    name = token.substr(0, token.find('='));
    suggestion = Suggestion(name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown option ", Shown(name),
                   suggestion.empty() ? "" : absl::StrCat(" (did you mean ", suggestion, "?)"),
                   "; muster's own options go before the script, see muster --help"));
}

// Each option's value: from the command line when given there, else from its environment variable.
absl::StatusOr<GivenOptions> CollectGiven(const std::array<CLI::Option*, kNumKeys>& options,
                                          const EnvLookup& env) {
  GivenOptions given;
  for (const OptionSpec& spec : kSpecs) {
    const CLI::Option* option = options[static_cast<size_t>(spec.key)];
    // As torchrun's `args.log_line_prefix_template or os.getenv(...)`: an
    // empty template on the command line leaves torch's variable to say.
    const bool empty_template =
        spec.key == Key::kLogLinePrefixTemplate && option->count() > 0 &&
        !option->results().empty() &&
        (option->results().back().empty() || option->results().back() == kEmptyValue);
    if (option->count() > 0 && !option->results().empty() && !empty_template) {
      std::string value = option->results().back();
      if (value == kEmptyValue) value.clear();
      if (!spec.value_name.empty()) {
        // CLI11 takes the next argument as the value whatever it is: catch a forgotten value.
        absl::string_view as_name = absl::string_view(value).substr(0, value.find('='));
        if (const OptionSpec* other = FindSpelling(as_name)) {
          return absl::InvalidArgumentError(
              absl::StrCat(spec.name, " is missing its value (the next argument is the option ",
                           other->name, "); give ", spec.name, " ", spec.value_name));
        }
      }
      given.Set(spec.key, Given{.spec = &spec, .value = std::move(value), .env = ""});
      continue;
    }
    if (!env || spec.env.empty()) continue;
    for (absl::string_view name : {spec.env, FallbackEnv(spec.key)}) {
      if (name.empty()) continue;
      std::optional<std::string> value = env(std::string(name));
      if (value && !value->empty()) {
        given.Set(spec.key, Given{.spec = &spec, .value = *value, .env = std::string(name)});
        break;
      }
    }
  }
  return given;
}

// argparse's abbreviations, which torchrun's command line allows and scripts written for it use:
// before the script, a long option that is no spelling of muster's but the start of the
// spellings of exactly one option is that option (`--redirect 3` is `--redirects 3`). Returns
// `args` with each abbreviation written out, or an error naming the candidates of an ambiguous one.
// Unlike Python 3.11's argparse, the two spellings of one option (`--nproc` matches
// `--nproc-per-node` and `--nproc_per_node`) are not a choice. Stops where the script starts:
// after `--`, or at the first argument that is no option and no option's value.
absl::StatusOr<std::vector<std::string>> ExpandAbbreviations(std::vector<std::string> args) {
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& token = args[i];
    if (token == "--" || token.size() < 2 || token.front() != '-') break;
    if (!absl::StartsWith(token, "--")) {
      // A short option: -r and -t take the next argument unless joined (-r3).
      if (const OptionSpec* spec = FindSpelling(token);
          spec != nullptr && !spec->value_name.empty()) {
        ++i;
      }
      continue;
    }
    const size_t equals = token.find('=');
    const absl::string_view name = absl::string_view(token).substr(0, equals);
    const OptionSpec* spec = FindSpelling(name);
    if (spec == nullptr && name.size() > 2) {
      std::vector<const OptionSpec*> candidates;
      absl::string_view spelling_found;
      for (const OptionSpec& option : kSpecs) {
        for (absl::string_view spelling : absl::StrSplit(option.spellings, ',')) {
          if (!absl::StartsWith(spelling, name)) continue;
          if (std::find(candidates.begin(), candidates.end(), &option) == candidates.end()) {
            candidates.push_back(&option);
          }
          spelling_found = spelling;
        }
      }
      if (candidates.size() > 1) {
        std::vector<absl::string_view> names;
        for (const OptionSpec* candidate : candidates) names.push_back(candidate->name);
        return absl::InvalidArgumentError(absl::StrCat("ambiguous option ", Shown(name),
                                                       ": it could be ", absl::StrJoin(names, ", "),
                                                       "; write more of its name"));
      }
      if (candidates.size() == 1) {
        spec = candidates.front();
        token =
            absl::StrCat(spelling_found, equals == std::string::npos ? "" : token.substr(equals));
      }
    }
    if (spec == nullptr) break;  // unknown: reported as such by the caller
    if (!spec->value_name.empty() && equals == std::string::npos) ++i;
  }
  return args;
}

absl::StatusOr<ParsedCommandLine> ParseOrThrow(const std::vector<std::string>& given_args,
                                               const EnvLookup& env) {
  // An ambiguous abbreviation is refused as an unknown option is, --help after it or not.
  absl::StatusOr<std::vector<std::string>> expanded = ExpandAbbreviations(given_args);
  if (!expanded.ok()) return expanded.status();
  const std::vector<std::string>& args = *expanded;
  CLI::App app("muster: an elastic launcher for distributed training, a drop-in for torchrun.",
               "muster");
  std::array<CLI::Option*, kNumKeys> options = DeclareOptions(app);

  // CLI11 wants the arguments reversed, without the program name.
  std::vector<std::string> reversed;
  if (args.size() > 1) reversed.assign(args.rbegin(), args.rend() - 1);
  for (std::string& token : reversed) {
    if (token.size() > 3 && token.back() == '=') {
      const OptionSpec* spec = FindSpelling(absl::string_view(token).substr(0, token.size() - 1));
      if (spec != nullptr && !spec->value_name.empty()) {
        token.append(kEmptyValue.data(), kEmptyValue.size());
      }
    }
  }
  try {
    app.parse(reversed);
  } catch (const CLI::ArgumentMismatch& error) {
    // Thrown when the arguments end at an option that needs a value; the message starts with the
    // option's name.
    absl::string_view what = error.what();
    const OptionSpec* spec = FindSpelling(what.substr(0, what.find(':')));
    if (spec != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(spec->name, " needs a value; give ",
                                                     spec->name, " ", spec->value_name,
                                                     " before the script"));
    }
    throw;
  }

  ParsedCommandLine parsed;
  if (options[static_cast<size_t>(Key::kHelp)]->count() > 0) {
    parsed.help = app.help();
    return parsed;
  }
  if (const CLI::Option* shell = options[static_cast<size_t>(Key::kPrintCompletion)];
      shell->count() > 0) {
    const std::string name = shell->results().back();
    if (name != "bash" && name != "zsh" && name != "tcsh") {
      return absl::InvalidArgumentError(
          absl::StrCat("--print-completion '", name,
                       "': muster writes completion scripts for bash, zsh and tcsh; give one"));
    }
    parsed.completion_shell = name;
    return parsed;
  }
  if (options[static_cast<size_t>(Key::kVersion)]->count() > 0) {
    parsed.version = true;
    return parsed;
  }

  // remaining() holds, in order: unknown options met before the script, a `--` if one came
  // first, then SCRIPT and everything after it.
  std::vector<std::string> rest = app.remaining();
  size_t script_at = 0;
  if (!rest.empty() && rest.front() == "--") {
    script_at = 1;
  } else if (!rest.empty() && rest.front().size() > 1 && rest.front().front() == '-') {
    return UnknownOptionError(rest.front());
  }
  if (script_at >= rest.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no training script given; ", kUsage));
  }
  // SCRIPT and its args are the last `tail` arguments; take them from `args` as given.
  size_t tail = rest.size() - script_at;
  parsed.config.script = args[args.size() - tail];
  parsed.config.script_args.assign(args.end() - static_cast<std::ptrdiff_t>(tail - 1), args.end());

  absl::StatusOr<GivenOptions> given = CollectGiven(options, env);
  if (!given.ok()) return given.status();
  absl::Status status = Apply(*given, parsed.config, parsed.warnings);
  if (!status.ok()) return status;
  for (const OptionSpec& spec : kSpecs) {
    const Given* from = given->Get(spec.key);
    if (from != nullptr && from->env.empty() && !spec.env.empty()) {
      parsed.flags_given.insert(std::string(spec.env));
    }
  }
  if (parsed.config.rdzv_conf.token_file.empty() && env) {
    std::optional<std::string> token_file = env(std::string(kTokenFileEnv));
    if (token_file) parsed.config.rdzv_conf.token_file = *token_file;
  }
  return parsed;
}

}  // namespace

std::vector<OptionSummary> OptionSummaries() {
  std::vector<OptionSummary> out;
  for (const OptionSpec& spec : kSpecs) {
    out.push_back({absl::StrSplit(spec.spellings, ','), std::string(spec.value_name)});
  }
  return out;
}

absl::StatusOr<ParsedCommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                                   const EnvLookup& env) {
  try {
    return ParseOrThrow(args, env);
  } catch (const CLI::Error& error) {
    return absl::InvalidArgumentError(absl::StrCat("invalid command line: ", OneLine(error.what()),
                                                   "; ", kUsage, ", see muster --help"));
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat("could not parse the command line: ", OneLine(error.what())));
  } catch (...) {
    return absl::InvalidArgumentError("could not parse the command line");
  }
}

}  // namespace muster
