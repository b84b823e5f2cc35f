// muster: the launcher and node agent. Parses torchrun's command line, checks
// what can be checked before anything starts, sets up the rendezvous (embedded
// when this node hosts it) and runs the agent.
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/agent.h"
#include "agent/child_process.h"
#include "common/log.h"
#include "common/process_env.h"
#include "common/release_mode.h"
#include "launcher/nproc.h"
#include "launcher/slurm.h"
#include "launcher/options.h"
#include "rendezvous/grpc_exit.h"
#include "rendezvous/grpc_log.h"
#include "rendezvous/local_client.h"
#include "rendezvous/service.h"

namespace muster {
namespace {

constexpr int kDefaultRdzvPort = 29400;

int UsageError(absl::string_view message) {
  std::fprintf(stderr, "muster: error: %.*s\n", static_cast<int>(message.size()), message.data());
  return kExitUsage;
}

int UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

bool IsElfFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  char magic[4] = {};
  return file.read(magic, 4) && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' &&
         magic[3] == 'F';
}

// The directory of this muster binary: the bundled muster-allreduce lives
// there, and is found even when that directory is not on PATH.
std::string SelfDirectory() {
  char self[PATH_MAX] = {};
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) return "";
  const std::string path(self, static_cast<size_t>(length));
  return path.substr(0, path.rfind('/'));
}

struct Endpoint {
  std::string host;
  int port = kDefaultRdzvPort;
};

// "host", "host:port", "[v6]", "[v6]:port". The shape was checked by the parser.
Endpoint ParseEndpoint(const std::string& text) {
  Endpoint endpoint;
  std::string rest = text;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    endpoint.host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (absl::StartsWith(rest, ":")) absl::SimpleAtoi(rest.substr(1), &endpoint.port);
    return endpoint;
  }
  size_t colon = rest.rfind(':');
  if (colon != std::string::npos && rest.find(':') == colon) {
    endpoint.host = rest.substr(0, colon);
    absl::SimpleAtoi(rest.substr(colon + 1), &endpoint.port);
  } else {
    endpoint.host = rest;
  }
  return endpoint;
}

std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// Whether `host` (a name or an address) is one of this machine's addresses,
// so that the agent here should host the rendezvous it names.
bool IsLocalAddress(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0) return false;
  ifaddrs* interfaces = nullptr;
  bool local = false;
  if (getifaddrs(&interfaces) == 0) {
    for (addrinfo* a = resolved; a != nullptr && !local; a = a->ai_next) {
      for (ifaddrs* i = interfaces; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != a->ai_family) continue;
        if (a->ai_family == AF_INET) {
          local = reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr ==
                  reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
        } else if (a->ai_family == AF_INET6) {
          local = std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr,
                              &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                              sizeof(in6_addr)) == 0;
        }
      }
    }
    freeifaddrs(interfaces);
  }
  freeaddrinfo(resolved);
  return local;
}

// Inside a Slurm allocation (not --standalone, not MUSTER_IGNORE_SLURM=1):
// what the allocation says, as PET_ variables that fill the options no flag
// and no PET_ variable of the user's gives.
absl::StatusOr<std::optional<SlurmJob>> SlurmDefaults(const std::vector<std::string>& args,
                                                      std::map<std::string, std::string>* pet) {
  const bool standalone = std::find(args.begin(), args.end(), "--standalone") != args.end() ||
                          !GetEnv("PET_STANDALONE").value_or("").empty();
  if (standalone || GetEnv("MUSTER_IGNORE_SLURM").value_or("") == "1") return std::nullopt;
  absl::StatusOr<std::optional<SlurmJob>> job =
      DetectSlurm([](const char* name) { return GetEnv(name); });
  if (!job.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        job.status().message(), " (or set MUSTER_IGNORE_SLURM=1 to launch as if outside Slurm)"));
  }
  if (!*job) return job;
  const SlurmJob& j = **job;
  (*pet)["PET_NNODES"] = std::to_string(j.nnodes);
  (*pet)["PET_NODE_RANK"] = std::to_string(j.node_id);
  (*pet)["PET_RDZV_ID"] = j.job_id;
  (*pet)["PET_RDZV_BACKEND"] = "c10d";
  (*pet)["PET_RDZV_ENDPOINT"] = JoinHostPort(j.rendezvous_host(), j.port);
  (*pet)["PET_NPROC_PER_NODE"] = std::to_string(j.nproc);
  return job;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  std::map<std::string, std::string> slurm_pet;
  absl::StatusOr<std::optional<SlurmJob>> slurm = SlurmDefaults(args, &slurm_pet);
  if (!slurm.ok()) return UsageError(slurm.status().message());
  absl::StatusOr<ParsedCommandLine> parsed =
      ParseCommandLine(args, [&slurm_pet](const std::string& name) -> std::optional<std::string> {
        if (std::optional<std::string> value = GetEnv(name)) return value;
        auto it = slurm_pet.find(name);
        if (it == slurm_pet.end()) return std::nullopt;
        return it->second;
      });
  if (!parsed.ok()) return UsageError(parsed.status().message());
  if (parsed->help) {
    std::fputs(parsed->help->c_str(), stdout);
    return kExitSuccess;
  }
  if (parsed->version) {
    std::printf("muster %s\n", MUSTER_VERSION);
    return kExitSuccess;
  }
  const std::optional<std::string> log_level = GetEnv("MUSTER_LOG_LEVEL");
  if (log_level) SetLogLevel(spdlog::level::from_str(*log_level));
  for (const std::string& warning : parsed->warnings) {
    std::fprintf(stderr, "muster: warning: %s\n", warning.c_str());
  }
  LaunchConfig config = std::move(parsed->config);
  if (*slurm) {
    std::fprintf(stderr, "%s\n", (*slurm)->Describe().c_str());
    // Host names in the node list often differ from the nodes' own names:
    // node 0 hosts the rendezvous Slurm points at, and no other node does.
    if (config.rdzv_endpoint == slurm_pet["PET_RDZV_ENDPOINT"] && !config.rdzv_conf.is_host) {
      config.rdzv_conf.is_host = (*slurm)->node_id == 0;
    }
  }
  if (absl::Status id = rdzv::ValidateJobId(config.rdzv_id); !id.ok()) {
    return UsageError(id.message());
  }

  const int gpus = CountVisibleGpus(GetEnv("CUDA_VISIBLE_DEVICES"));
  absl::StatusOr<int> nproc =
      ResolveNproc(config.nproc_kind, config.nproc_per_node, gpus, UsableCpus());
  if (!nproc.ok()) return UsageError(nproc.status().message());

  const std::string path = GetEnv("PATH").value_or("/usr/bin:/bin");
  // Programs are looked up on PATH, then beside muster (muster-allreduce).
  const std::string program_path = absl::StrCat(path, ":", SelfDirectory());
  std::string program;
  if (!config.module) {
    // A bare name that is no file here is a command: on PATH, or beside muster.
    const bool command = config.script.find('/') == std::string::npos &&
                         access(config.script.c_str(), F_OK) != 0;
    absl::StatusOr<std::string> resolved = config.no_python || command
                                               ? ResolveExecutable(config.script, program_path)
                                               : absl::NotFoundError("a file, not a command");
    if (config.no_python) {
      if (!resolved.ok()) return UsageError(resolved.status().message());
      program = *resolved;
    } else if (resolved.ok() && IsElfFile(*resolved)) {
      // A native program named like a command (muster-allreduce): run it directly.
      config.no_python = true;
      program = *resolved;
    } else if (access(config.script.c_str(), F_OK) != 0) {
      return UsageError(absl::StrCat(config.script,
                                     ": no such file; give the path of a Python script, -m "
                                     "MODULE, or --no-python PROGRAM"));
    } else if (IsElfFile(config.script)) {
      // A native program cannot run under python: run it directly.
      if (access(config.script.c_str(), X_OK) != 0) {
        return UsageError(absl::StrCat(config.script, " is a native program but not executable; chmod +x it"));
      }
      config.no_python = true;
      program = config.script;
    }
  }
  if (!config.no_python) {
    const std::string wanted = GetEnv("PYTHON_EXEC").value_or("python3");
    absl::StatusOr<std::string> resolved = ResolveExecutable(wanted, path);
    if (!resolved.ok()) {
      return UsageError(absl::StrCat("cannot run the Python interpreter: ", resolved.status().message(),
                                     "; set PYTHON_EXEC to its path"));
    }
    program = *resolved;
  }
  const bool static_backend = config.rdzv_backend == RdzvBackend::kStatic && !config.standalone;
  if (static_backend && config.min_nodes != config.max_nodes) {
    return UsageError(absl::StrCat("--nnodes ", config.min_nodes, ":", config.max_nodes,
                                   " needs a rendezvous; the static backend runs a fixed number "
                                   "of nodes: give --nnodes N, or --rdzv-backend c10d"));
  }
  if (*nproc > 1 && !GetEnv("OMP_NUM_THREADS")) {
    std::fprintf(stderr,
                 "muster: setting OMP_NUM_THREADS=1 for each worker (it was unset); set it "
                 "yourself to tune CPU threads\n");
  }

  // From here on other threads exist (gRPC's): block the signals the agent reads first.
  BlockAgentSignals();
  rdzv::RouteGrpcLogsToSpdlog();

  // The node that hosts the rendezvous talks to its hub in-process; the
  // others reach it over gRPC.
  std::shared_ptr<rdzv::RendezvousHub> hub;
  std::unique_ptr<rdzv::RendezvousServer> server;
  std::string target;
  std::string host_addr = "127.0.0.1";  // how the other nodes reach a hosting node
  if (config.standalone || static_backend) {
    // One node: the rendezvous only counts restarts; nobody else needs to
    // reach it, so it gets no port. Its log would repeat the agent's.
    if (!log_level) Logger("rdzv")->set_level(spdlog::level::warn);
    hub = std::make_shared<rdzv::RendezvousHub>();
  } else {
    if (config.rdzv_endpoint.empty()) {
      return UsageError("--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT], the node that hosts the rendezvous");
    }
    const Endpoint endpoint = ParseEndpoint(config.rdzv_endpoint);
    const std::string host_name = HostName();
    const bool may_host = config.rdzv_conf.is_host.value_or(
        IsLoopback(endpoint.host) || endpoint.host == host_name ||
        endpoint.host == config.local_addr || IsLocalAddress(endpoint.host));
    if (may_host) {
      const std::string bind = IsLoopback(endpoint.host) ? endpoint.host : "0.0.0.0";
      absl::StatusOr<std::unique_ptr<rdzv::RendezvousServer>> started =
          rdzv::RendezvousServer::Start(bind == "localhost" ? "127.0.0.1" : bind, endpoint.port);
      if (started.ok()) {
        server = *std::move(started);
        hub = server->hub();
        host_addr = endpoint.host == "localhost" ? "127.0.0.1" : endpoint.host;
        Logger("agent")->info("hosting the rendezvous for job '{}' on port {}", config.rdzv_id,
                              endpoint.port);
      } else if (config.rdzv_conf.is_host.value_or(false)) {
        return UsageError(absl::StrCat("is_host=1, but ", started.status().message()));
      }
      // Else another agent on this host bound it first: be its client.
    }
    target = JoinHostPort(endpoint.host == "localhost" ? "127.0.0.1" : endpoint.host, endpoint.port);
  }

  // How long the agent lets the server be silent (see channel.h); a third of
  // the heartbeat timeout at most, so that after a network outage the agent
  // finds its dropped connection (and reopens its watch) well before the
  // server gives up on it.
  const absl::Duration keepalive =
      std::min(absl::FromChrono(config.rdzv_conf.keep_alive_interval) *
                   config.rdzv_conf.keep_alive_max_attempt,
               absl::FromChrono(config.rdzv_conf.heartbeat_timeout) / 3);
  AgentOptions options;
  options.config = std::move(config);
  options.nproc = *nproc;
  options.program = program;
  options.host = HostName();
  options.advertised_addr = options.config.local_addr;
  options.hosts_rendezvous = hub != nullptr;
  options.static_ranks = static_backend;
  options.base_env = EnvironmentEntries();
  absl::StatusOr<int> code = kExitWorkersFailed;
  {
    Agent agent(std::move(options), hub ? rdzv::NewLocalClient(hub, host_addr)
                                        : rdzv::RendezvousClient::Create(target, keepalive));
    code = agent.Run();
  }
  if (server) server->Shutdown();
  if (hub) hub->Shutdown();
  server.reset();
  hub.reset();
  rdzv::WaitForGrpcShutdown(absl::Seconds(2));
  if (!code.ok()) {
    std::fprintf(stderr, "muster: error: %s\n", std::string(code.status().message()).c_str());
    return kExitWorkersFailed;
  }
  return *code;
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) {
  muster::EnterReleaseMode();
  return muster::Main(argc, argv);
}
