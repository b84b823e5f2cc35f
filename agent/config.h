// The launch configuration: everything muster's command line (and the PET_*
// environment) can say, after parsing and validation. Pure data.
#ifndef MUSTER_AGENT_CONFIG_H_
#define MUSTER_AGENT_CONFIG_H_

#include <signal.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace muster {

// How --nproc-per-node was given. kCount uses LaunchConfig::nproc_per_node.
enum class NprocKind { kCount, kGpu, kCpu, kAuto };

// What -r/-t ask for, per stream. Values 0..3 as torchrun: 1 stdout, 2 stderr, 3 both.
struct StdRedirect {
  bool out = false;
  bool err = false;
};

// -r / -t: one value for every local rank, or per local rank ("0:1,1:2").
// A local rank not named in a per-rank map gets nothing redirected.
struct RedirectSpec {
  std::optional<StdRedirect> all;
  std::map<int, StdRedirect> per_rank;

  StdRedirect For(int local_rank) const {
    if (all) return *all;
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? StdRedirect{} : it->second;
  }
};

// --numa-binding (agent/numa.h).
enum class NumaBinding { kNone, kNode, kSocket, kExclusive, kCoreComplex };

// c10d is an alias of kMuster; etcd-v2 of kEtcd.
enum class RdzvBackend { kStatic, kMuster, kEtcd };

// How agents and the rendezvous prove who they are (--rdzv-conf auth=):
// kAuto picks (launcher/rdzv_auth.h).
enum class RdzvAuth { kAuto, kNone, kToken, kMunge };

// The --rdzv-conf keys muster understands, with torchrun's defaults.
struct RdzvConf {
  std::chrono::milliseconds join_timeout{600'000};
  std::chrono::milliseconds last_call_timeout{30'000};
  std::chrono::milliseconds close_timeout{30'000};
  std::chrono::milliseconds heartbeat_timeout{30'000};
  std::chrono::milliseconds keep_alive_interval{5'000};
  int keep_alive_max_attempt = 3;
  std::chrono::milliseconds read_timeout{60'000};
  std::optional<bool> is_host;
  // ha=1: host mode keeps the job's rendezvous on an etcd cluster of the
  // job's own nodes (launcher/etcd_member.h), so the job outlives the node
  // that hosts it. Every node of the job gives the same. Unset: off.
  std::optional<bool> ha;
  // The job's shared token file (rendezvous/auth/token.h): token_file=, else
  // MUSTER_TOKEN_FILE. Empty: no authentication.
  std::string token_file;
  // TLS to the rendezvous, torchrun's etcd key names (paths of PEM files,
  // read and checked when the launch starts; rendezvous/auth/tls.h). None: plaintext.
  std::string cacert;
  std::string cert;
  std::string key;
  // auth=none|token|munge; unset: kAuto.
  RdzvAuth auth = RdzvAuth::kAuto;
  // munge_socket=PATH: munged's socket; empty: libmunge's default.
  std::string munge_socket;
  // event_log=PATH: the agent's events (agent/events.h) appended to PATH,
  // one JSON object a line, each written as it happens. Empty: none.
  std::string event_log;
  // metrics_port=PORT: serve Prometheus metrics at
  // http://metrics_listen:PORT/metrics (the agent's, and the rendezvous'
  // when this agent hosts it); 0 picks a free port. Unset: none.
  std::optional<int> metrics_port;
  // metrics_listen=ADDR: the address they listen on (an IP address).
  std::string metrics_listen = "127.0.0.1";
  // metrics_password_file=PATH: the password they ask for (HTTP basic auth);
  // else the job's token, on 127.0.0.1 only (rendezvous/server/metrics.h).
  std::string metrics_password_file;
  // The etcd backend: etcd's user and password (user=, password=), and
  // protocol=http|https (unset: as the endpoints say; https needs cacert).
  std::string etcd_user;
  std::string etcd_password;
  std::optional<std::string> etcd_protocol;
};

struct LaunchConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  NprocKind nproc_kind = NprocKind::kCount;
  int nproc_per_node = 1;  // meaningful when nproc_kind == kCount

  RdzvBackend rdzv_backend = RdzvBackend::kStatic;
  std::string rdzv_endpoint;  // "" or host[:port]; IPv6 in brackets
  std::string rdzv_id = "none";
  RdzvConf rdzv_conf;
  bool standalone = false;
  // Slurm's allocation gave the defaults (launcher/command_line.h): munge
  // is then used with no flag where munged runs.
  bool in_slurm = false;

  int max_restarts = 0;
  // --max-no-progress-restarts: after K restarts in a row whose rounds
  // reached no new step, the job stops (exit code 70); 0: off.
  int max_no_progress_restarts = 0;
  // --max-node-failures: a host whose workers are the root cause of K
  // failures of the job in a row is excluded from it; 0: never.
  int max_node_failures = 3;
  // --on-node-excluded: what an excluded node runs (sh -c), with
  // MUSTER_EXCLUDED_HOST and MUSTER_EXCLUSION_CAUSE; empty: nothing.
  std::string on_node_excluded;
  double monitor_interval_s = 0.1;     // accepted; unused
  std::string start_method = "spawn";  // accepted; unused
  std::string role = "default";
  bool module = false;     // -m
  bool no_python = false;  // --no-python
  // --preload: the modules an interpreter imports once per node, every
  // worker forked from it (agent/preload.h); empty: every worker starts cold.
  std::vector<std::string> preload;
  // --accelerate-config: accelerate's config file ("default": its default
  // path), read by the launcher before the launch (launcher/accelerate_config.h).
  std::string accelerate_config;
  bool run_path = false;  // accepted
  std::string log_dir;    // "" = a fresh temporary directory
  RedirectSpec redirects;
  RedirectSpec tee;
  std::optional<std::set<int>> local_ranks_filter;  // unset = every rank
  // The console prefix of a worker's lines, a string.Template as torchrun's
  // (agent/log_prefix.h); empty: "[rank ${rank}]: ".
  std::string log_line_prefix_template;
  // Lines holding one of these also go to <attempt dir>/filtered_std{out,err}.log.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // --event-log-handler console: the agent's events on stderr, one JSON line each.
  bool console_events = false;
  // Signals that stop the job (forwarded to the workers first); the others
  // the agent catches are only forwarded. As given, for the workers'
  // TORCHELASTIC_SIGNALS_TO_HANDLE.
  std::vector<int> signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  std::string signals_to_handle_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // Each worker sees LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES narrowed to its device.
  bool virtual_local_rank = false;
  NumaBinding numa_binding = NumaBinding::kNone;
  // --preflight allreduce: muster-allreduce across the job before the
  // script, in its first round (agent/elastic_state.h).
  bool preflight = false;
  // --gpu-check-interval: how often the agent maps its workers to the GPUs
  // and looks for shared and idle ones (agent/gpu_check.h); 0: never.
  std::chrono::milliseconds gpu_check_interval{30'000};
  // --gpu-report: a console line of the GPUs' figures every few minutes.
  bool gpu_report = false;
  // --gpu-release-wait: before a restarted round starts, how long the agent
  // waits at most for the last round's processes to free this node's GPUs
  // (NVML's process lists; needs the GPU check); 0: no wait.
  std::chrono::milliseconds gpu_release_wait{50'000};
  int node_rank = 0;
  bool node_rank_given = false;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string local_addr;  // "" = this host's name
  std::chrono::milliseconds shutdown_grace{30'000};

  std::string script;                    // SCRIPT (or module name with -m)
  std::vector<std::string> script_args;  // everything after SCRIPT, untouched
};

}  // namespace muster

#endif  // MUSTER_AGENT_CONFIG_H_
