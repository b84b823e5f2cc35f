#include "launcher/run.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/agent.h"
#include "agent/child_process.h"
#include "agent/worker_env.h"
#include "common/endpoint.h"
#include "common/event_log.h"
#include "common/log.h"
#include "common/metrics_server.h"
#include "common/open_files.h"
#include "common/process_env.h"
#include "common/status.h"
#include "launcher/etcd_member.h"
#include "launcher/local_address.h"
#include "launcher/nproc.h"
#include "launcher/program.h"
#include "launcher/rdzv_auth.h"
#include "launcher/rendezvous_host.h"
#include "rendezvous/auth/metrics_password.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/auth/token.h"
#include "rendezvous/etcd/backend.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/grpc/log.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state.h"
#include "rendezvous/server/hosted.h"

namespace muster {
namespace {

// Every check before the start is a usage error, whatever its own code.
absl::Status Usage(const absl::Status& status) {
  return absl::InvalidArgumentError(status.message());
}

int UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
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

// The rendezvous this node's agent uses. The node that hosts it talks to its
// hub in-process; the others reach it over gRPC.
struct Rendezvous {
  std::unique_ptr<rdzv::HostedRendezvous> hosted;  // set when it runs in this process
  std::unique_ptr<rdzv::RendezvousClient> client;
  // The address no server sees: this node's own, when the rendezvous knows
  // it (ha=1: the one on the way to the endpoint). Empty: as the server sees.
  std::string own_address;
  // A member of the job's own etcd cluster may run in this process (ha=1).
  bool stays_until_closed = false;

  // The hosted rendezvous ends first (HostedRendezvous::Shutdown), then the
  // client; all on the main thread, never in a gRPC callback, and main then
  // waits for gRPC's clean-up (FinishGrpc; the order is callback_ticker.h's
  // "The end"). Call after the agent that used `client` is gone.
  void Shutdown() {
    if (hosted) hosted->Shutdown();
    hosted.reset();
    client.reset();
  }
};

// How long the agent lets the server be silent (see channel.h); a third of
// the heartbeat timeout at most, so that after a network outage the agent
// finds its dropped connection (and reopens its watch) well before the
// server gives up on it.
absl::Duration ClientKeepalive(const RdzvConf& conf) {
  return std::min(absl::FromChrono(conf.keep_alive_interval) * conf.keep_alive_max_attempt,
                  absl::FromChrono(conf.heartbeat_timeout) / 3);
}

// Said once, at the start, by an agent whose rendezvous others can reach.
void WarnNoToken(const std::string& where) {
  Logger("agent")->warn(
      "no rendezvous token: anyone who can reach {} can join, watch or stop this job; give "
      "every agent --rdzv-conf token_file=PATH (or MUSTER_TOKEN_FILE=PATH), a mode 600 file "
      "with one line of secret (musterd: --token-file PATH)",
      where);
}

// The credential the rendezvous and its agents use: the job's shared token
// ("" for none), or munge (a token wins, see ChooseRdzvAuth).
struct RdzvCredential {
  std::string token;
  std::optional<rdzv::MungeOptions> munge;
  // Checked already (ClientTlsCredentials); empty for plaintext.
  rdzv::TlsFiles tls;

  // For the start line: "none", "token", "munge, uid 1000", "token, tls".
  std::string Describe() const {
    std::string out = !token.empty() ? "token"
                      : munge        ? absl::StrCat("munge, uid ", getuid())
                                     : "none";
    if (!tls.empty()) absl::StrAppend(&out, ", tls");
    return out;
  }
};

// What the launch authenticates with. Errors are usage errors: a token
// file that cannot be used, an auth= that cannot be had.
absl::StatusOr<RdzvCredential> ReadRdzvCredential(const LaunchConfig& config) {
  RdzvCredential out;
  const RdzvConf& conf = config.rdzv_conf;
  rdzv::MungeOptions munge{conf.munge_socket};
  AuthFacts facts;
  facts.asked = conf.auth;
  facts.token_file = !conf.token_file.empty();
  facts.in_slurm = config.in_slurm;
  facts.munge_socket = conf.munge_socket.empty() ? rdzv::DefaultMungeSocket() : conf.munge_socket;
  facts.munge_socket_present = rdzv::MungeSocketPresent(munge);
  absl::StatusOr<RdzvAuth> auth = ChooseRdzvAuth(facts);
  if (!auth.ok()) return auth.status();
  if (*auth == RdzvAuth::kMunge) out.munge = munge;
  if (*auth != RdzvAuth::kToken) return out;
  absl::StatusOr<std::string> read = rdzv::ReadTokenFile(conf.token_file);
  if (!read.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous token (--rdzv-conf token_file / MUSTER_TOKEN_FILE): ",
                     read.status().message()));
  }
  out.token = *std::move(read);
  return out;
}

// The etcd backend's options, over a client of `options` (`target` names
// it in messages). Errors are usage errors.
absl::StatusOr<etcd::EtcdRendezvousOptions> EtcdBackendOptions(const LaunchConfig& config,
                                                               etcd::EtcdOptions options,
                                                               std::string target) {
  // The leader's writes carry a round's answers: they wait longer per member.
  etcd::EtcdOptions leader_options = options;
  leader_options.attempt_timeout = absl::Seconds(5);
  leader_options.call_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client =
      etcd::EtcdClient::Create(std::move(options));
  if (!client.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd: ", client.status().message()));
  }
  etcd::EtcdRendezvousOptions out;
  out.etcd = std::shared_ptr<etcd::EtcdClient>(*std::move(client));
  out.leader_etcd = std::move(leader_options);
  out.job_id = config.rdzv_id;
  out.lease_ttl = absl::FromChrono(config.rdzv_conf.heartbeat_timeout);
  out.target = std::move(target);
  return out;
}

// Turns on the authentication of the job's first etcd member, before any
// other node reaches it: root, with the job's token as its password. No
// token: nothing to turn on.
absl::Status EnableEtcdAuth(const std::string& member, const std::string& token) {
  if (token.empty()) return absl::OkStatus();
  etcd::EtcdOptions options;
  options.endpoints = {member};
  options.call_timeout = absl::Seconds(10);  // the first election included
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  if (!client.ok()) return client.status();
  return (*client)->EnableRootAuth(token);
}

// How often an agent of host mode's own etcd cluster asks it for its
// members: a replaced member is followed within this.
constexpr absl::Duration kMemberSync = absl::Seconds(2);

// This node's member of the job's own etcd cluster, not started: on
// `port` (0: a free one), in a new directory of its own. Errors are usage
// errors.
absl::StatusOr<std::unique_ptr<EtcdMember>> NewEtcdMember(const LaunchConfig& config,
                                                          const std::string& etcd_path,
                                                          const std::string& address, int port) {
  std::string pattern =
      absl::StrCat(GetEnv("TMPDIR").value_or("/tmp"), "/muster-etcd-", config.rdzv_id, "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ha: cannot make a directory for the job's etcd member: ",
                     ErrnoToStatus(errno, "mkdtemp " + pattern).message()));
  }
  EtcdMemberOptions options;
  options.etcd = etcd_path;
  options.name = absl::StrCat(HostName(), "-", getpid());
  options.directory = pattern;
  options.host = address;
  options.client_port = port;
  options.cluster_token = absl::StrCat("muster-", config.rdzv_id);
  options.lock_directory = GetEnv("TMPDIR").value_or("/tmp");
  absl::StatusOr<std::unique_ptr<EtcdMember>> member = EtcdMember::Create(std::move(options));
  if (!member.ok()) return absl::InvalidArgumentError(member.status().message());
  return member;
}

// The member this node offers (nullptr: it has no etcd), the first of the
// cluster when it hosts. AlreadyExists: it hosts, but another process of
// this host took the endpoint's port first (is_host not given: another
// agent, which this one joins). Other errors are usage errors.
absl::StatusOr<std::shared_ptr<etcd::MemberHost>> SetUpOwnEtcdMember(const LaunchConfig& config,
                                                                     const Endpoint& endpoint,
                                                                     const std::string& address,
                                                                     const std::string& token,
                                                                     bool hosts) {
  const std::string path = GetEnv("PATH").value_or("/usr/bin:/bin");
  absl::StatusOr<std::string> etcd_path = ResolveExecutable("etcd", path);
  if (!etcd_path.ok() && hosts) {
    return absl::InvalidArgumentError(
        "ha=1: this node hosts the rendezvous and must start the job's etcd, but etcd is not on "
        "PATH: install etcd-server, or give ha=0 to every node");
  }
  if (!etcd_path.ok()) {
    Logger("agent")->info(
        "ha: etcd is not on PATH, so this node runs no member of the job's etcd cluster (it "
        "still uses it); install etcd-server to let it stand in for a lost member");
    return std::shared_ptr<etcd::MemberHost>();
  }
  absl::StatusOr<std::unique_ptr<EtcdMember>> member =
      NewEtcdMember(config, *etcd_path, address, hosts ? endpoint.port : 0);
  if (!member.ok()) return member.status();
  if (!hosts) return NewMemberHost(*std::move(member), HostName());
  if (absl::Status started = (*member)->Start("", absl::Seconds(20)); !started.ok()) {
    if (absl::IsAlreadyExists(started) && !config.rdzv_conf.is_host.value_or(false)) {
      return started;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("ha: this node hosts the rendezvous, but its etcd: ", started.message()));
  }
  if (absl::Status locked = EnableEtcdAuth((*member)->endpoint(), token); !locked.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ha: turning on the authentication of the job's etcd: ", locked.message()));
  }
  return NewMemberHost(*std::move(member), HostName());
}

// Host mode with ha: the job's rendezvous on an etcd cluster of its own
// nodes. The hosting node starts its first member at the endpoint; every
// node that has etcd offers to run one (launcher/etcd_member.h), and the
// agent elected keeps three (rendezvous/etcd/members.h). AlreadyExists:
// another agent of this host took the endpoint's port first. Other errors
// are usage errors.
absl::StatusOr<Rendezvous> SetUpOwnEtcdRendezvous(const LaunchConfig& config,
                                                  const Endpoint& endpoint, bool hosts,
                                                  const std::string& token) {
  const std::string dial_host = NumericLoopback(endpoint.host);
  const std::optional<std::string> address = SourceAddressTo(dial_host);
  if (!address) {
    return absl::InvalidArgumentError(
        absl::StrCat("ha: no route from this node to the rendezvous host ", endpoint.host,
                     "; check --rdzv-endpoint"));
  }
  absl::StatusOr<std::shared_ptr<etcd::MemberHost>> member_host =
      SetUpOwnEtcdMember(config, endpoint, *address, token, hosts);
  if (!member_host.ok()) return member_host.status();
  etcd::EtcdOptions options;
  options.endpoints = {FormatEndpoint(dial_host, endpoint.port)};
  options.auto_sync_interval = kMemberSync;
  if (!token.empty()) {
    options.user = "root";
    options.password = token;
  }
  absl::StatusOr<etcd::EtcdRendezvousOptions> backend = EtcdBackendOptions(
      config, std::move(options),
      absl::StrCat("the job's etcd at ", FormatEndpoint(dial_host, endpoint.port)));
  if (!backend.ok()) return backend.status();
  etcd::EtcdRendezvousOptions rendezvous = *std::move(backend);
  rendezvous.keep_members = true;
  const bool has_member = *member_host != nullptr;
  rendezvous.member_host = *std::move(member_host);
  const std::string auth = token.empty() ? "none" : "token";
  if (hosts) {
    Logger("agent")->info(
        "hosting the rendezvous for job '{}' on port {} (auth: {}), on the job's own etcd "
        "cluster (ha: the job outlives the node that hosts it; ha=0 keeps it there alone)",
        config.rdzv_id, endpoint.port, auth);
  } else {
    Logger("agent")->info(
        "rendezvous for job '{}' at {} (auth: {}), on the job's own etcd cluster (ha: the job "
        "outlives the node that hosts it)",
        config.rdzv_id, FormatEndpoint(dial_host, endpoint.port), auth);
  }
  if (token.empty()) {
    Logger("agent")->warn(
        "ha without a token: the job's etcd takes no credential, so anyone who can reach its "
        "members can read and change this job; give every agent --rdzv-conf token_file=PATH (or "
        "MUSTER_TOKEN_FILE=PATH), a mode 600 file with one line of secret");
  }
  Rendezvous out;
  out.client = etcd::NewEtcdRendezvousClient(std::move(rendezvous));
  out.own_address = *address;
  out.stays_until_closed = has_member;
  return out;
}

// Whether this c10d node runs the job on its own etcd cluster (ha). The
// hosting node chooses (ChooseHa: why_not is for it to say once it hosts);
// a joining node asks the endpoint what its host chose, until it answers
// (join_timeout at most), and follows it. TLS: host mode, the endpoint not
// asked (its members serve no TLS yet). DeadlineExceeded: no answer within
// join_timeout; other errors are usage errors.
absl::StatusOr<HaChoice> ChooseOwnEtcd(const LaunchConfig& config, const RdzvCredential& credential,
                                       bool hosts, const std::string& target) {
  const std::string path = GetEnv("PATH").value_or("/usr/bin:/bin");
  const HaFacts facts{.ha = config.rdzv_conf.ha,
                      .max_nodes = config.max_nodes,
                      .etcd_on_path = ResolveExecutable("etcd", path).ok(),
                      .tls = !credential.tls.empty(),
                      .munge_only = credential.munge.has_value() && credential.token.empty()};
  absl::StatusOr<HaChoice> choice = ChooseHa(facts);
  if (!choice.ok() || hosts) return choice;
  auto follow = [&](bool host_serves_etcd) -> absl::StatusOr<HaChoice> {
    absl::StatusOr<bool> on = FollowHostsHa(config.rdzv_conf.ha, host_serves_etcd, target);
    if (!on.ok()) return on.status();
    return HaChoice{.on = *on, .why_not = ""};
  };
  if (facts.tls) return HaChoice{.on = false, .why_not = ""};
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::FromChrono(config.rdzv_conf.join_timeout);
  bool said = false;
  for (;;) {
    switch (etcd::ProbeEndpoint(target, absl::Seconds(2))) {
      case etcd::EndpointServes::kEtcd: return follow(true);
      case etcd::EndpointServes::kOther: return follow(false);
      case etcd::EndpointServes::kNothingYet: break;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no rendezvous answered at ", target, " within join_timeout (",
          absl::FormatDuration(deadline - start),
          "): is the node that hosts it (or musterd) running, and is --rdzv-endpoint right?"));
    }
    if (!said && absl::Now() - start > absl::Seconds(5)) {
      Logger("agent")->info("waiting for the rendezvous host at {} to answer", target);
      said = true;
    }
    TakePendingAgentSignal(config);
    absl::SleepFor(absl::Milliseconds(250));
  }
}

// The server a hosting node runs: its credential, TLS and pings. Errors are
// usage errors.
absl::StatusOr<rdzv::ServerOptions> HostServerOptions(const LaunchConfig& config,
                                                      const std::string& endpoint_host,
                                                      const RdzvCredential& credential) {
  const std::string& token = credential.token;
  const rdzv::TlsFiles& tls = credential.tls;
  rdzv::ServerOptions server_options;
  server_options.token = token;  // the same as its agents': they call with it
  // Shorter than the agents' own pings (heartbeat_timeout / 3), so this
  // server does the pinging: a few hundred nodes at most. A stopped agent
  // is dropped at most heartbeat_timeout plus a sixth of it (5 s at most)
  // after it last answered (ServerOptions::ping_interval).
  const absl::Duration heartbeat = absl::FromChrono(config.rdzv_conf.heartbeat_timeout);
  server_options.ping_interval = std::clamp(heartbeat / 6, absl::Seconds(1), absl::Seconds(5));
  server_options.ping_timeout = server_options.ping_interval;
  if (!tls.empty()) {
    // The same files as its agents': they check its certificate against
    // cacert, and it requires theirs.
    if (tls.cert.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this node hosts the rendezvous (", endpoint_host,
          " is its address) and TLS is on, but it has no certificate to serve with: give "
          "--rdzv-conf cert=PATH,key=PATH (a certificate that cacert signed, naming ",
          endpoint_host, "), or run musterd --tls-cert/--tls-key and is_host=0"));
    }
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> checked =
        rdzv::ServerTlsCredentials(tls);
    if (!checked.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous TLS (--rdzv-conf cert, key) for the server this node hosts: ",
                       checked.status().message()));
    }
    server_options.tls = tls;
  }
  if (credential.munge && token.empty()) {
    // The job is its user's: no other uid may join, watch or stop it.
    rdzv::MungeAuth munge_auth;
    munge_auth.munge = *credential.munge;
    munge_auth.only_own_uid = true;
    server_options.munge = munge_auth;
  }
  server_options.metrics = config.rdzv_conf.metrics_port.has_value();
  return server_options;
}

// `one_node`: standalone or static, where nobody else needs to reach the
// rendezvous (it listens on no port). Errors are usage errors.
absl::StatusOr<Rendezvous> SetUpRendezvous(const LaunchConfig& config, bool one_node, bool quiet,
                                           const RdzvCredential& credential) {
  const std::string& token = credential.token;
  const rdzv::TlsFiles& tls = credential.tls;
  Rendezvous out;
  if (one_node) {
    // The rendezvous only counts restarts; it gets no port. Its log would
    // repeat the agent's.
    if (quiet) Logger("rdzv")->set_level(spdlog::level::warn);
    out.hosted = rdzv::HostedRendezvous::InProcess();
    out.client = out.hosted->NewClient("127.0.0.1");
    return out;
  }
  if (config.rdzv_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT], the node that hosts the "
        "rendezvous");
  }
  absl::StatusOr<Endpoint> endpoint =
      ParseEndpoint(config.rdzv_endpoint, rdzv::kDefaultRdzvPort, "--rdzv-endpoint");
  if (!endpoint.ok()) return endpoint.status();
  const std::string dial_host = NumericLoopback(endpoint->host);
  const HostingFacts facts{endpoint->host, HostName(), config.local_addr, config.rdzv_conf.is_host};
  const std::string auth = credential.Describe();
  // With client certificates the server lets in only holders of one.
  const bool unauthenticated = token.empty() && !credential.munge && tls.cert.empty();
  const std::string target = FormatEndpoint(dial_host, endpoint->port);
  const bool hosts = ShouldHostRendezvous(facts, IsLocalAddress);
  absl::StatusOr<HaChoice> ha = ChooseOwnEtcd(config, credential, hosts, target);
  if (!ha.ok()) return ha.status();
  if (ha->on) {
    absl::StatusOr<Rendezvous> own = SetUpOwnEtcdRendezvous(config, *endpoint, hosts, token);
    if (!absl::IsAlreadyExists(own.status())) return own;
  } else if (hosts) {
    // Every other node keeps a connection to this one open; the workers get
    // the limit back (ChildProcess::Spawn).
    if (std::optional<std::string> low = RaiseOpenFileLimit(4096, "nodes can connect")) {
      Logger("agent")->warn("{}", *low);
    }
    absl::StatusOr<rdzv::ServerOptions> server_options =
        HostServerOptions(config, endpoint->host, credential);
    if (!server_options.ok()) return server_options.status();
    absl::StatusOr<std::unique_ptr<rdzv::HostedRendezvous>> started =
        rdzv::HostedRendezvous::Serve(BindHost(endpoint->host), endpoint->port, *server_options);
    if (started.ok()) {
      out.hosted = *std::move(started);
      // The other nodes reach this one at the endpoint's host.
      out.client = out.hosted->NewClient(dial_host);
      if (!ha->why_not.empty()) Logger("agent")->warn("{}", ha->why_not);
      Logger("agent")->info("hosting the rendezvous for job '{}' on port {} (auth: {})",
                            config.rdzv_id, endpoint->port, auth);
      if (unauthenticated) WarnNoToken(FormatEndpoint(BindHost(endpoint->host), endpoint->port));
      return out;
    }
    if (config.rdzv_conf.is_host.value_or(false)) {
      return absl::InvalidArgumentError(
          absl::StrCat("is_host=1, but ", started.status().message()));
    }
  }
  if (hosts) {
    // Another agent of this host took the port first (for etcd or for its
    // own server): join what it chose.
    ha = ChooseOwnEtcd(config, credential, /*hosts=*/false, target);
    if (!ha.ok()) return ha.status();
    if (ha->on) return SetUpOwnEtcdRendezvous(config, *endpoint, /*hosts=*/false, token);
  }
  rdzv::ClientOptions client_options;
  client_options.keepalive = ClientKeepalive(config.rdzv_conf);
  client_options.token = token;
  client_options.token_file = config.rdzv_conf.token_file;
  if (token.empty()) client_options.munge = credential.munge;
  client_options.tls = tls;
  out.client = rdzv::RendezvousClient::Create(target, client_options);
  Logger("agent")->info("rendezvous for job '{}' at {} (auth: {})", config.rdzv_id, target, auth);
  if (unauthenticated) WarnNoToken(target);
  return out;
}

// --rdzv-backend etcd: every agent is a client of the etcd cluster, and one
// of them, elected there, runs the job's state machine. Errors are usage
// errors. `tls`: checked already; empty for plaintext.
absl::StatusOr<Rendezvous> SetUpEtcdRendezvous(const LaunchConfig& config,
                                               const rdzv::TlsFiles& tls) {
  const RdzvConf& conf = config.rdzv_conf;
  if (config.rdzv_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv-backend etcd needs --rdzv-endpoint HOST[:PORT],..., the members of the etcd "
        "cluster (port 2379 where none is given)");
  }
  absl::StatusOr<etcd::EtcdEndpoints> endpoints = etcd::ParseEtcdEndpoints(config.rdzv_endpoint);
  if (!endpoints.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rdzv-endpoint for etcd: ", endpoints.status().message()));
  }
  const bool https = conf.etcd_protocol ? *conf.etcd_protocol == "https" : endpoints->tls;
  if (https && tls.cacert.empty()) {
    return absl::InvalidArgumentError(
        "etcd over https needs --rdzv-conf cacert=PATH (ca_cert=), the authority that signed "
        "the etcd members' certificates");
  }
  if (conf.auth == RdzvAuth::kToken || conf.auth == RdzvAuth::kMunge) {
    return absl::InvalidArgumentError(
        "--rdzv-conf auth=token and auth=munge are for muster's own rendezvous; etcd checks its "
        "own users (--rdzv-conf user=NAME,password=TEXT) or client certificates (cert=, key=)");
  }
  if (!conf.etcd_password.empty() && conf.etcd_user.empty()) {
    return absl::InvalidArgumentError(
        "--rdzv-conf password= needs user=NAME, the etcd user it belongs to");
  }
  if (!conf.token_file.empty()) {
    Logger("agent")->warn(
        "the rendezvous token (token_file, MUSTER_TOKEN_FILE) is not used with --rdzv-backend "
        "etcd, which checks etcd's own users or client certificates");
  }
  etcd::EtcdOptions options;
  options.endpoints = endpoints->endpoints;
  // Each agent starts at a member of its own: the calls of a thousand
  // agents are spread over the cluster.
  std::shuffle(options.endpoints.begin(), options.endpoints.end(),
               std::mt19937(std::random_device()()));
  options.user = conf.etcd_user;
  options.password = conf.etcd_password;
  options.tls = tls;
  const std::string target = absl::StrCat("etcd at ", absl::StrJoin(endpoints->endpoints, ","));
  absl::StatusOr<etcd::EtcdRendezvousOptions> rendezvous =
      EtcdBackendOptions(config, std::move(options), target);
  if (!rendezvous.ok()) return rendezvous.status();
  Rendezvous out;
  out.client = etcd::NewEtcdRendezvousClient(*std::move(rendezvous));
  const std::string auth =
      absl::StrCat(conf.etcd_user.empty() ? "none" : absl::StrCat("etcd user ", conf.etcd_user),
                   tls.empty()        ? ""
                   : tls.cert.empty() ? ", tls"
                                      : ", tls with a client certificate");
  Logger("agent")->info("rendezvous for job '{}' on {} (auth: {})", config.rdzv_id, target, auth);
  if (conf.etcd_user.empty() && tls.cert.empty()) {
    Logger("agent")->warn(
        "etcd without authentication: anyone who can reach it can read and change this job; "
        "give etcd users (--rdzv-conf user=NAME,password=TEXT) or client certificates (cert=, "
        "key=)");
  }
  return out;
}

// What a launch settles before any thread starts: the workers, their
// program, the pre-flight check, the event log, the rendezvous' kind and
// credential. Errors are usage errors.
struct LaunchPlan {
  int nproc = 0;
  Program program;
  std::string allreduce;  // --preflight: muster-allreduce's path
  UniqueFd event_log;
  bool static_backend = false;
  bool one_node = false;  // standalone or static: nobody else reaches the rendezvous
  bool on_etcd = false;
  RdzvCredential credential;
};

// How many workers, what they run, and the pre-flight checker.
absl::Status PlanWorkers(LaunchConfig& config, LaunchPlan* plan) {
  const int gpus = CountVisibleGpus(GetEnv("CUDA_VISIBLE_DEVICES"));
  absl::StatusOr<int> nproc =
      ResolveNproc(config.nproc_kind, config.nproc_per_node, gpus, UsableCpus());
  if (!nproc.ok()) return Usage(nproc.status());
  plan->nproc = *nproc;
  if (config.virtual_local_rank) {
    const std::string problem = VirtualLocalRankProblem(GetEnv("CUDA_VISIBLE_DEVICES"), *nproc);
    if (!problem.empty()) return absl::InvalidArgumentError(problem);
  }
  const std::string path = GetEnv("PATH").value_or("/usr/bin:/bin");
  absl::StatusOr<Program> program = ResolveProgram({config.script, config.module, config.no_python,
                                                    path, SelfDirectory(), GetEnv("PYTHON_EXEC")});
  if (!program.ok()) return program.status();
  config.no_python = program->no_python;
  plan->program = *std::move(program);
  if (!config.preflight) return absl::OkStatus();
  // muster's own first: the one built with it.
  absl::StatusOr<std::string> found =
      ResolveExecutable("muster-allreduce", absl::StrCat(SelfDirectory(), ":", path));
  if (!found.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--preflight allreduce: muster-allreduce is neither beside muster (", SelfDirectory(),
        ") nor on PATH; install it with muster, or drop --preflight"));
  }
  plan->allreduce = *found;
  return absl::OkStatus();
}

// The event log, the rendezvous' kind, and the credential and TLS files it
// is reached with, read and checked.
absl::Status PlanRendezvous(const LaunchConfig& config, const LaunchPlan& workers,
                            LaunchPlan* plan) {
  if (!config.rdzv_conf.event_log.empty()) {
    absl::StatusOr<OpenedEventLog> opened =
        OpenEventLog(config.rdzv_conf.event_log, "--rdzv-conf event_log");
    if (!opened.ok()) return opened.status();
    if (opened->warning) std::fprintf(stderr, "muster: warning: %s\n", opened->warning->c_str());
    plan->event_log = std::move(opened->fd);
  }
  plan->static_backend = config.rdzv_backend == RdzvBackend::kStatic && !config.standalone;
  if (plan->static_backend && config.min_nodes != config.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nnodes ", config.min_nodes, ":", config.max_nodes,
        " needs a rendezvous; the static backend runs a fixed number of nodes: give --nnodes N, "
        "or --rdzv-backend c10d"));
  }
  if (workers.nproc > 1 && !GetEnv("OMP_NUM_THREADS")) {
    std::fprintf(stderr,
                 "muster: setting OMP_NUM_THREADS=1 for each worker (it was unset); set it "
                 "yourself to tune CPU threads\n");
  }
  plan->one_node = config.standalone || plan->static_backend;
  plan->on_etcd = config.rdzv_backend == RdzvBackend::kEtcd && !config.standalone;
  if (!plan->on_etcd && (!plan->one_node || !config.rdzv_conf.token_file.empty())) {
    // One node listens on no port: munge has nothing to prove there.
    absl::StatusOr<RdzvCredential> read = ReadRdzvCredential(config);
    if (!read.ok()) return read.status();
    plan->credential = *std::move(read);
  }
  const rdzv::TlsFiles tls{config.rdzv_conf.cacert, config.rdzv_conf.cert, config.rdzv_conf.key};
  if (!plan->one_node && !tls.empty()) {
    if (absl::Status checked = rdzv::ClientTlsCredentials(tls).status(); !checked.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous TLS (--rdzv-conf cacert, cert, key): ", checked.message()));
    }
    plan->credential.tls = tls;
  }
  return absl::OkStatus();
}

// The agent's /metrics (--rdzv-conf metrics_port=), when asked for.
struct AgentMetricsEndpoint {
  std::unique_ptr<MetricsServer> server;
  std::shared_ptr<AgentMetrics> metrics;
  std::string auth;  // how it asks for its password, for the start line
};

absl::StatusOr<AgentMetricsEndpoint> StartAgentMetrics(const LaunchConfig& config,
                                                       const RdzvCredential& credential) {
  AgentMetricsEndpoint out;
  if (!config.rdzv_conf.metrics_port) return out;
  absl::StatusOr<std::string> password = rdzv::MetricsPassword(
      config.rdzv_conf.metrics_password_file, credential.token, config.rdzv_conf.metrics_listen,
      "--rdzv-conf metrics_password_file", "--rdzv-conf metrics_listen");
  if (!password.ok()) return password.status();
  out.auth = rdzv::DescribeMetricsAuth(config.rdzv_conf.metrics_password_file, *password,
                                       "metrics_password_file");
  absl::StatusOr<std::unique_ptr<MetricsServer>> started =
      MetricsServer::Start({.listen = config.rdzv_conf.metrics_listen,
                            .port = *config.rdzv_conf.metrics_port,
                            .password = *password,
                            .listen_option = "--rdzv-conf metrics_listen",
                            .port_option = "--rdzv-conf metrics_port"});
  if (!started.ok()) return started.status();
  out.server = *std::move(started);
  out.metrics = std::make_shared<AgentMetrics>(config.rdzv_id, Clock::Real());
  out.server->Add(out.metrics);
  return out;
}

}  // namespace

absl::StatusOr<int> RunLaunch(LaunchConfig config) {
  const std::optional<std::string> log_level = GetEnv("MUSTER_LOG_LEVEL");
  if (log_level) SetLogLevel(spdlog::level::from_str(*log_level));
  if (absl::Status id = rdzv::ValidateJobId(config.rdzv_id); !id.ok()) return Usage(id);
  LaunchPlan plan;
  MUSTER_RETURN_IF_ERROR(PlanWorkers(config, &plan));
  MUSTER_RETURN_IF_ERROR(PlanRendezvous(config, plan, &plan));

  // From here on other threads exist (gRPC's, the metrics'): block the
  // signals the agent reads first.
  BlockAgentSignals(config);
  absl::StatusOr<AgentMetricsEndpoint> metrics = StartAgentMetrics(config, plan.credential);
  if (!metrics.ok()) return metrics.status();
  rdzv::RouteGrpcLogsToSpdlog();
  absl::StatusOr<Rendezvous> rendezvous =
      plan.on_etcd ? SetUpEtcdRendezvous(config, plan.credential.tls)
                   : SetUpRendezvous(config, plan.one_node, !log_level, plan.credential);
  if (!rendezvous.ok()) {
    if (metrics->server != nullptr) MetricsServer::LeaveToExit(std::move(metrics->server));
    if (absl::IsDeadlineExceeded(rendezvous.status())) {
      // No host answered: the job's failure, as the agent's own join's.
      std::fprintf(stderr, "muster: error: %s\n",
                   std::string(rendezvous.status().message()).c_str());
      return kExitWorkersFailed;
    }
    return rendezvous.status();
  }
  if (metrics->server != nullptr) {
    // A hosting agent tells what its rendezvous holds too (a standalone
    // one's takes no calls: only its jobs' figures).
    if (rendezvous->hosted != nullptr) metrics->server->Add(rendezvous->hosted->Metrics());
    Logger("agent")->info(
        "metrics: {} ({}{})", metrics->server->url(),
        rendezvous->hosted != nullptr ? "this agent's and its rendezvous'" : "this agent's",
        metrics->auth.empty() ? "" : "; ", metrics->auth);
  }

  AgentOptions options;
  options.config = std::move(config);
  options.nproc = plan.nproc;
  options.program = plan.program.path;
  options.host = HostName();
  options.advertised_addr = options.config.local_addr;
  // No server sees an etcd agent's address: its host name stands for it.
  if (options.advertised_addr.empty()) options.advertised_addr = rendezvous->own_address;
  if (plan.on_etcd && options.advertised_addr.empty()) options.advertised_addr = options.host;
  options.hosts_rendezvous = rendezvous->hosted != nullptr;
  options.stays_until_closed = rendezvous->stays_until_closed;
  options.static_ranks = plan.static_backend;
  options.base_env = EnvironmentEntries();
  options.event_log = std::move(plan.event_log);
  options.metrics = metrics->metrics;
  options.allreduce = plan.allreduce;
  absl::StatusOr<int> code = kExitWorkersFailed;
  {
    Agent agent(std::move(options), std::move(rendezvous->client));
    code = agent.Run();
  }
  if (metrics->server != nullptr) MetricsServer::LeaveToExit(std::move(metrics->server));
  rendezvous->Shutdown();
  if (!code.ok()) {
    std::fprintf(stderr, "muster: error: %s\n", std::string(code.status().message()).c_str());
    return kExitWorkersFailed;
  }
  return *code;
}

}  // namespace muster
