// musterd: the standalone rendezvous daemon. One process serves the
// rendezvous of many jobs at once, one per --rdzv-id; agents reach it with
// `muster --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID ...`.
// main parses flags, starts the server and waits for SIGTERM or SIGINT; the
// rules live in the hub and the state machine.
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/constant_time.h"
#include "common/endpoint.h"
#include "common/event_log.h"
#include "common/json.h"
#include "common/log.h"
#include "common/metrics_server.h"
#include "common/open_files.h"
#include "common/release_mode.h"
#include "common/unique_handle.h"
#include "rendezvous/auth/metrics_password.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/auth/token.h"
#include "rendezvous/grpc/exit.h"
#include "rendezvous/grpc/log.h"
#include "rendezvous/rules/job_events.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/server/journal.h"
#include "rendezvous/server/metrics.h"
#include "rendezvous/server/service.h"

namespace muster {
namespace {

constexpr int kExitSuccess = 0;
constexpr int kExitCannotServe = 1;
constexpr int kExitUsage = 2;
// Pending joins and watches are told at once that the server is going away;
// this only bounds calls that arrive during the shutdown.
constexpr absl::Duration kShutdownGrace = absl::Milliseconds(500);

constexpr const char* kFooter = R"(Exit status:
  0  stopped by SIGTERM or SIGINT; pending joins were told the server is going away (with
     --state-dir: that it keeps their jobs, which its next start continues)
  1  cannot serve: the port is in use, --listen is not an address of this host, another
     musterd uses the --state-dir, or the journal there cannot be written any more
  2  usage error, a --token-file or --tls-* file that cannot be used (its mode, owner or
     contents), --munge with no munged socket, or a --state-dir that cannot be used

With --state-dir DIR, every job's rounds, ranks, restart count, node secrets and result are
written to DIR/journal (and synced) before the answers that depend on them; a musterd
started again with the same DIR continues every job where it was, and its agents, which
keep their workers running while it is away, carry on with no worker restarted. Run it
as a service: examples/musterd.service.

gRPC's health service (grpc.health.v1) answers on the same port with no credential:
SERVING while musterd serves, NOT_SERVING from a stop signal on (see --drain). Check it
with: musterctl health --endpoint THIS_HOST:PORT

Agents connect with:
  muster --rdzv-backend c10d --rdzv-endpoint THIS_HOST:PORT --rdzv-id JOB --nnodes N ...
With --token-file, every agent needs the same token: --rdzv-conf token_file=PATH (or
MUSTER_TOKEN_FILE=PATH); calls without it are refused.
With --tls-cert and --tls-key, agents need --rdzv-conf cacert=CA (the authority that signed
--tls-cert, which must name the host or address they dial); with --tls-cacert too, they also
need cert=PATH,key=PATH, a client certificate that authority signed. With --munge (inside a Slurm
cluster), agents under Slurm send munge credentials with no flag; each uid's jobs are
its own (another uid's job of the same id is another job).
Set MUSTER_LOG_LEVEL=debug for more detail (with GRPC_VERBOSITY=debug, gRPC's own log).)";

// Set when the journal can no longer be written: musterd stops, exit 1.
std::atomic<bool> journal_failed{false};

int Error(int code, absl::string_view message) {
  std::fprintf(stderr, "musterd: error: %.*s\n", static_cast<int>(message.size()), message.data());
  return code;
}

// Why gRPC could not listen, in words a user can act on: gRPC's own failure
// says neither which nor why, so bind a socket of our own and read errno.
std::string WhyCannotListen(const std::string& host, int port) {
  const std::string where = FormatEndpoint(host, port);
  addrinfo hints = {};
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list); rc != 0) {
    return absl::StrCat("cannot listen on ", where, ": cannot resolve ", host, " (",
                        gai_strerror(rc),
                        "); give --listen an address of this host, or 0.0.0.0 "
                        "or :: for all of them");
  }
  const UniqueAddrInfo found(list);
  int error = 0;
  for (const addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      error = errno;
      continue;
    }
    const int one = 1;  // as gRPC does, so a port in TIME_WAIT is not "in use"
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    error = bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error != 0) break;
  }
  switch (error) {
    case EADDRINUSE:
      return absl::StrCat("cannot listen on ", where, ": port ", port,
                          " is in use (another musterd, or a muster agent hosting a rendezvous "
                          "there?); stop that process, or give --port another port (0 picks a "
                          "free one) and point the agents' --rdzv-endpoint at it");
    case EADDRNOTAVAIL:
      return absl::StrCat("cannot listen on ", where, ": ", host,
                          " is not an address of this host; give --listen one of its addresses, "
                          "or 0.0.0.0 or :: for all of them");
    case EACCES:
      return absl::StrCat("cannot listen on ", where, ": port ", port,
                          " needs privileges; give --port 1024 or above");
    case 0:
      return absl::StrCat(
          "cannot listen on ", where,
          "; run with MUSTER_LOG_LEVEL=debug GRPC_VERBOSITY=debug for gRPC's reason");
    default: return absl::StrCat("cannot listen on ", where, ": ", std::strerror(error));
  }
}

// Daemon logs outlive a terminal: every line gets a time.
void UseTimestampedLogs() {
  for (const char* component : {"musterd", "rdzv", "grpc"}) {
    Logger(component)->set_pattern("%Y-%m-%d %H:%M:%S.%e [%n] %^%l%$: %v");
  }
}

// A duration as a user writes it: "90s", "30m", "1h", "1h30m", or plain
// seconds ("3600"); more than zero, or zero too when `zero_allowed`.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag, const std::string& text,
                                                 bool zero_allowed = false) {
  absl::Duration duration;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &duration)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", text, ": give a duration such as 90s, 30m or 1h (or seconds)"));
  }
  if (zero_allowed && duration == absl::ZeroDuration()) return duration;
  if (duration <= absl::ZeroDuration() || duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", text, ": give a duration above zero, such as 30m or 1h"));
  }
  return duration;
}

int Main(int argc, char** argv) {
  std::string listen = "0.0.0.0";
  std::string port_text = std::to_string(rdzv::kDefaultRdzvPort);
  rdzv::ServerOptions options;
  std::string max_join_timeout_text = "1h";
  int64_t max_jobs = static_cast<int64_t>(options.hub.state.max_jobs);
  std::string token_file;
  rdzv::TlsFiles tls;
  bool munge = false;
  std::string munge_socket;
  std::string state_dir;
  CLI::App app(
      "musterd: the standalone rendezvous server for muster (and torchrun-style) jobs. It serves "
      "many jobs at once, one per --rdzv-id, and logs a line per round.",
      "musterd");
  app.add_option("--listen", listen,
                 "address to listen on: an IPv4 or IPv6 address of this host, or 0.0.0.0 / :: "
                 "for all of them")
      ->type_name("ADDR")
      ->capture_default_str();
  app.add_option("--port", port_text,
                 "TCP port to listen on; 0 picks a free one (printed at start)")
      ->type_name("PORT")
      ->capture_default_str();
  app.add_option("--token-file", token_file,
                 "a file (mode 600, yours) holding one line of secret: every call must carry "
                 "it, agents give it with --rdzv-conf token_file=PATH; without it anyone who "
                 "reaches the port can join, watch or stop any job")
      ->type_name("PATH");
  app.add_option("--tls-cert", tls.cert,
                 "serve TLS with this certificate (PEM), which names the host or address agents "
                 "dial (subjectAltName); needs --tls-key")
      ->type_name("PATH");
  app.add_option("--tls-key", tls.key, "the private key of --tls-cert (PEM, mode 600)")
      ->type_name("PATH");
  app.add_option("--tls-cacert", tls.cacert,
                 "with --tls-cert: require every agent to present a client certificate this "
                 "authority signed (agents: --rdzv-conf cert=PATH,key=PATH)")
      ->type_name("PATH");
  auto* munge_flag = app.add_flag(
      "--munge", munge,
      "trust munge credentials (Slurm's): join, status, reports and leave must carry one; "
      "each uid's jobs are kept apart from other uids'");
  app.add_option("--munge-socket", munge_socket,
                 "munged's socket (default: libmunge's, /run/munge/munge.socket.2)")
      ->type_name("PATH")
      ->needs(munge_flag);
  munge_flag->excludes(app.get_option("--token-file"));
  app.add_option("--state-dir", state_dir,
                 "keep every job in DIR/journal (made mode 700 if missing): a musterd started "
                 "again with the same DIR continues each job where it was, with no worker "
                 "restarted; without it a restart loses every job")
      ->type_name("DIR");
  std::string ping_interval_text = "12s", ping_timeout_text = "5s";
  app.add_option("--ping-interval", ping_interval_text,
                 "ping an agent's connection once nothing came from it for this long (HTTP/2 "
                 "PING, answered by the agent process itself): an agent that is stopped or hung "
                 "is dropped at most heartbeat_timeout + this after it last answered. Agents "
                 "ping every heartbeat_timeout / 3 (10 s) themselves; keep this longer, and "
                 "musterd sends none while they do (answering costs it less)")
      ->type_name("DURATION")
      ->capture_default_str();
  app.add_option("--ping-timeout", ping_timeout_text,
                 "close a connection whose ping goes unanswered this long (its node's "
                 "heartbeat_timeout counts from the unanswered ping)")
      ->type_name("DURATION")
      ->capture_default_str();
  app.add_option("--max-join-timeout", max_join_timeout_text,
                 "a job with no node in it is forgotten after its join_timeout, or after this "
                 "long if shorter, whatever its agents asked for (e.g. 30m, 1h, 2h)")
      ->type_name("DURATION")
      ->capture_default_str();
  app.add_option("--max-jobs", max_jobs,
                 "the most jobs served at once (not yet closed); a join that would open one "
                 "more is refused. As many closed jobs are remembered, the longest closed "
                 "forgotten first")
      ->type_name("N")
      ->capture_default_str();
  std::string event_log_path;
  app.add_option("--event-log", event_log_path,
                 "append every job's events to FILE (made mode 600), one JSON object a line "
                 "(time, job, round, node, kind, detail): node joined or lost, round started, "
                 "worker failed, job closed; what musterctl watch shows")
      ->type_name("FILE");
  int metrics_port = -1;
  app.add_option("--metrics-port", metrics_port,
                 "serve Prometheus metrics at http://ADDR:PORT/metrics: jobs by state, each "
                 "job's nodes, rounds and restarts, join latency, calls by method and code, "
                 "auth failures (docs/METRICS.md); 0 picks a free port")
      ->type_name("PORT");
  std::string metrics_listen = "127.0.0.1";
  app.add_option("--metrics-listen", metrics_listen,
                 "the IPv4 address the metrics listen on; they name jobs, so only this host may "
                 "read them unless you give another (0.0.0.0: every interface)")
      ->type_name("ADDR")
      ->capture_default_str();
  std::string metrics_password_file;
  app.add_option("--metrics-password-file", metrics_password_file,
                 "the metrics ask for this password (HTTP basic auth, any user name), a mode 600 "
                 "file of one line; without it they ask for --token-file's token, which only "
                 "127.0.0.1 may carry (plain HTTP), and under --munge they need it")
      ->type_name("FILE");
  std::string drain_text = "0s";
  app.add_option("--drain", drain_text,
                 "on SIGTERM or SIGINT, keep serving this long while gRPC's health service "
                 "(grpc.health.v1, same port) says NOT_SERVING, so a load balancer or a "
                 "Kubernetes probe sees the stop coming; a second signal ends it at once")
      ->type_name("DURATION")
      ->capture_default_str();
  app.set_version_flag("--version", std::string("musterd ") + MUSTER_VERSION);
  app.footer(kFooter);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitSuccess;
  } catch (const CLI::CallForVersion& version) {
    std::printf("%s\n", version.what());
    return kExitSuccess;
  } catch (const CLI::ParseError& error) {
    return Error(kExitUsage, absl::StrCat(error.what(), "; see musterd --help"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return Error(kExitUsage, absl::StrCat("--port ", port_text, ": give a port number 0..65535"));
  }
  absl::StatusOr<absl::Duration> max_join_timeout =
      ParseDurationFlag("--max-join-timeout", max_join_timeout_text);
  if (!max_join_timeout.ok()) return Error(kExitUsage, max_join_timeout.status().message());
  options.hub.state.max_join_timeout = *max_join_timeout;
  absl::StatusOr<absl::Duration> ping_interval =
      ParseDurationFlag("--ping-interval", ping_interval_text);
  if (!ping_interval.ok()) return Error(kExitUsage, ping_interval.status().message());
  absl::StatusOr<absl::Duration> ping_timeout =
      ParseDurationFlag("--ping-timeout", ping_timeout_text);
  if (!ping_timeout.ok()) return Error(kExitUsage, ping_timeout.status().message());
  absl::StatusOr<absl::Duration> drain = ParseDurationFlag("--drain", drain_text, true);
  if (!drain.ok()) return Error(kExitUsage, drain.status().message());
  options.ping_interval = *ping_interval;
  options.ping_timeout = *ping_timeout;
  if (max_jobs < 1) {
    return Error(kExitUsage, absl::StrCat("--max-jobs ", max_jobs, ": give at least 1"));
  }
  options.hub.state.max_jobs = static_cast<size_t>(max_jobs);
  if (metrics_port < -1 || metrics_port > 65535) {
    return Error(kExitUsage,
                 absl::StrCat("--metrics-port ", metrics_port, ": give a port number 0..65535"));
  }
  if (metrics_port == -1 &&
      (app.count("--metrics-listen") > 0 || app.count("--metrics-password-file") > 0)) {
    return Error(kExitUsage,
                 "--metrics-listen and --metrics-password-file need --metrics-port, "
                 "the port to serve the metrics on");
  }
  options.metrics = metrics_port >= 0;
  options.hub.state.max_closed_jobs = static_cast<size_t>(max_jobs);
  if (listen.empty()) return Error(kExitUsage, "--listen is empty; give an address, e.g. 0.0.0.0");
  if (std::count(listen.begin(), listen.end(), ':') == 1) {
    return Error(kExitUsage, absl::StrCat("--listen ", listen,
                                          " looks like HOST:PORT; give the port with --port"));
  }
  if (listen.front() == '[') {  // "[v6]": the address without its brackets
    absl::StatusOr<Endpoint> bracketed = ParseEndpoint(listen, /*default_port=*/-1);
    if (!bracketed.ok()) {
      return Error(kExitUsage, absl::StrCat("--listen ", listen,
                                            " is not an IPv6 address in brackets; give e.g. "
                                            "[::1], ::1 or ::"));
    }
    if (bracketed->port != -1) {
      return Error(kExitUsage, absl::StrCat("--listen ", listen,
                                            " looks like HOST:PORT; give the port with --port"));
    }
    listen = bracketed->host;
  }

  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = rdzv::ReadTokenFile(token_file);
    if (!token.ok())
      return Error(kExitUsage, absl::StrCat("--token-file: ", token.status().message()));
    options.token = *std::move(token);
  }
  if (tls.cert.empty() != tls.key.empty()) {
    return Error(kExitUsage,
                 tls.cert.empty()
                     ? "--tls-key needs --tls-cert: give the certificate it belongs to"
                     : "--tls-cert needs --tls-key: give the certificate's private key");
  }
  if (!tls.cacert.empty() && tls.cert.empty()) {
    return Error(kExitUsage,
                 "--tls-cacert needs --tls-cert and --tls-key: the server's own certificate "
                 "and key come first");
  }
  if (!tls.empty()) {
    if (absl::Status checked = rdzv::ServerTlsCredentials(tls).status(); !checked.ok()) {
      return Error(kExitUsage, absl::StrCat("--tls-*: ", checked.message()));
    }
    options.tls = tls;
  }
  if (munge) {
    rdzv::MungeAuth auth;
    auth.munge.socket = munge_socket;
    auth.only_own_uid = false;  // every uid, each in its own namespace
    if (!rdzv::MungeSocketPresent(auth.munge)) {
      return Error(kExitUsage,
                   absl::StrCat("--munge: no munged socket at ",
                                munge_socket.empty() ? rdzv::DefaultMungeSocket() : munge_socket,
                                "; start munged, or give --munge-socket PATH"));
    }
    options.munge = auth;
  }
  std::string metrics_password;  // empty: none asked
  if (options.metrics) {
    absl::StatusOr<std::string> password =
        rdzv::MetricsPassword(metrics_password_file, options.token, metrics_listen,
                              "--metrics-password-file", "--metrics-listen");
    if (!password.ok()) return Error(kExitUsage, password.status().message());
    if (password->empty() && munge) {
      return Error(kExitUsage,
                   "--metrics-port with --munge: the metrics would show every uid's jobs to "
                   "whoever reaches the port; give --metrics-password-file FILE, a password for "
                   "the metrics only (a mode 600 file of one line)");
    }
    metrics_password = *std::move(password);
  }

  if (const char* level = std::getenv("MUSTER_LOG_LEVEL")) {
    SetLogLevel(spdlog::level::from_str(level));
  }
  UseTimestampedLogs();
  // Agents keep their workers through this server's outages: it is not a node of the job.
  options.hub.state.ride_out_outages = true;
  if (!state_dir.empty()) {
    rdzv::Replayed replayed;
    absl::StatusOr<std::unique_ptr<rdzv::Journal>> journal =
        rdzv::Journal::Open(state_dir, &replayed);
    if (!journal.ok()) {
      const bool taken = absl::IsFailedPrecondition(journal.status()) &&
                         absl::StrContains(journal.status().message(), "another process");
      return Error(taken ? kExitCannotServe : kExitUsage,
                   absl::StrCat("--state-dir: ", journal.status().message()));
    }
    if (!replayed.dropped_why.empty()) {
      Logger("musterd")->warn(
          "state: {}: {}; the {} bytes from there on are dropped, the {} records before it kept",
          (*journal)->path(), replayed.dropped_why, replayed.dropped_bytes,
          replayed.records.size());
    }
    options.hub.restore = std::move(replayed.records);
    options.hub.journal = *std::move(journal);
    options.hub.on_journal_failure = [](const absl::Status&) {
      journal_failed = true;
      kill(getpid(), SIGTERM);  // the main thread stops the server
    };
  }
  if (!event_log_path.empty()) {
    absl::StatusOr<OpenedEventLog> opened = OpenEventLog(event_log_path, "--event-log");
    if (!opened.ok()) return Error(kExitUsage, opened.status().message());
    if (opened->warning) Logger("musterd")->warn("{}", *opened->warning);
    // Called in order with the hub's lock held: the line is only queued,
    // for the writer's thread (a slow disk does not hold the rendezvous).
    auto writer = std::make_shared<EventLogWriter>(
        std::move(opened->fd), absl::StrCat("--event-log ", event_log_path),
        [](const std::string& warning) { Logger("musterd")->warn("{}", warning); });
    options.hub.on_event = [writer](const rdzv::JobEvent& event) {
      writer->Append(EventJsonLine(rdzv::ToEventLine(event)));
    };
  }
  rdzv::RouteGrpcLogsToSpdlog();
  // Each agent keeps a connection open: a daemon for thousands of nodes
  // needs more descriptors than the usual soft limit of 1024.
  if (std::optional<std::string> low = RaiseOpenFileLimit(16384, "agents can connect")) {
    Logger("musterd")->warn("{}", *low);
  }

  // Blocked before gRPC starts its threads, so they inherit the mask and the
  // signals reach only sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  if (int rc = pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); rc != 0) {
    return Error(kExitCannotServe, absl::StrCat("cannot block signals: ", std::strerror(rc)));
  }

  absl::StatusOr<std::unique_ptr<rdzv::RendezvousServer>> server =
      rdzv::RendezvousServer::Start(listen, port, options);
  if (!server.ok()) return Error(kExitCannotServe, WhyCannotListen(listen, port));
  std::unique_ptr<MetricsServer> metrics;
  const rdzv::RendezvousHub::Jobs on_failure = options.hub.journal != nullptr
                                                   ? rdzv::RendezvousHub::Jobs::kKept
                                                   : rdzv::RendezvousHub::Jobs::kLost;
  if (options.metrics) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> started =
        MetricsServer::Start(metrics_listen, metrics_port, "--metrics-listen", "--metrics-port");
    if (!started.ok()) {
      (*server)->Shutdown(absl::ZeroDuration(), on_failure);
      return Error(absl::IsInvalidArgument(started.status()) ? kExitUsage : kExitCannotServe,
                   started.status().message());
    }
    metrics = *std::move(started);
    if (!metrics_password.empty()) {
      metrics->RequireAuth(
          [password = metrics_password](const std::string&, const std::string& given) {
            return ConstantTimeEquals(given, password);
          });
    }
    metrics->Add((*server)->metrics());
  }
  if (options.munge) {
    Logger("musterd")->info(
        "auth: munge (socket {}): calls without a credential are refused; each uid's jobs are "
        "kept apart",
        munge_socket.empty() ? rdzv::DefaultMungeSocket() : munge_socket);
  } else if (options.token.empty()) {
    Logger("musterd")->warn(
        "auth: none: anyone who can reach this port can join, watch or stop any job; give "
        "--token-file PATH (a mode 600 file with one line of secret) and the agents "
        "--rdzv-conf token_file=PATH");
  } else {
    Logger("musterd")->info("auth: token from {}: calls without it are refused", token_file);
  }
  if (options.hub.journal != nullptr) {
    const rdzv::RendezvousHub::JobCount jobs = (*server)->hub()->CountJobs();
    if (jobs.all == 0) {
      Logger("musterd")->info("state: kept in {} (no job in it yet)", options.hub.journal->path());
    } else {
      Logger("musterd")->info(
          "state: kept in {}: {} job(s) continued from it ({} not closed), their timers "
          "started afresh",
          options.hub.journal->path(), jobs.all, jobs.open);
    }
  } else {
    Logger("musterd")->info(
        "state: not kept: a restart of musterd loses every job (give --state-dir DIR to keep "
        "them)");
  }
  if (tls.empty()) {
    Logger("musterd")->info("tls: off{}", options.token.empty()
                                              ? ""
                                              : " (the token crosses the network in clear text; "
                                                "give --tls-cert and --tls-key to encrypt it)");
  } else {
    Logger("musterd")->info("tls: on (client certificates {}), certificate {}",
                            tls.cacert.empty() ? "not required" : "required", tls.cert);
  }
  Logger("musterd")->info("health: grpc.health.v1 on the same port, no credential needed: SERVING");
  if (metrics != nullptr) {
    Logger("musterd")->info("metrics: {} ({}; {})", metrics->url(),
                            rdzv::IsLoopbackListen(metrics_listen)
                                ? "this host only"
                                : "every host that reaches this port",
                            metrics_password.empty()
                                ? "no password: whoever reaches them reads the job names"
                                : rdzv::DescribeMetricsAuth(metrics_password_file, metrics_password,
                                                            "--metrics-password-file"));
  }
  // Last: whoever waits for this line (a script, the tests) has the ones above.
  std::printf("musterd: serving rendezvous on %s\n",
              FormatEndpoint(listen, (*server)->port()).c_str());
  std::fflush(stdout);

  int signal_number = 0;
  if (int rc = sigwait(&stop_signals, &signal_number); rc != 0) {
    Logger("musterd")->error("sigwait: {}; shutting down", std::strerror(rc));
    signal_number = SIGTERM;
  }
  if (*drain > absl::ZeroDuration() && !journal_failed) {
    (*server)->SetServing(false);
    Logger("musterd")->info(
        "SIG{}: draining for {}: health says NOT_SERVING, everything else is served as before "
        "(a second signal stops at once)",
        sigabbrev_np(signal_number), absl::FormatDuration(*drain));
    const absl::Time until = absl::Now() + *drain;
    while (true) {
      const timespec wait = absl::ToTimespec(std::max(until - absl::Now(), absl::ZeroDuration()));
      if (int again = sigtimedwait(&stop_signals, nullptr, &wait); again > 0) {
        signal_number = again;  // a second stop signal, or the journal's failure
        break;
      }
      if (errno != EINTR) break;  // EAGAIN: the drain is over
    }
  }
  const bool kept = options.hub.journal != nullptr;
  if (journal_failed) {
    Logger("musterd")->error(
        "stopping: the journal in {} cannot be written; the jobs are kept as far as it holds "
        "them",
        state_dir);
  } else if (kept) {
    Logger("musterd")->info(
        "SIG{}: stopping; every job is kept in {} for the next start (agents keep their workers "
        "and wait for it)",
        sigabbrev_np(signal_number), options.hub.journal->path());
  } else {
    Logger("musterd")->info("SIG{}: shutting down; pending joins are told the server is going away",
                            sigabbrev_np(signal_number));
  }
  (*server)->Shutdown(kShutdownGrace,
                      kept ? rdzv::RendezvousHub::Jobs::kKept : rdzv::RendezvousHub::Jobs::kLost);
  if (metrics != nullptr) MetricsServer::LeaveToExit(std::move(metrics));
  server->reset();
  options.hub.journal.reset();
  Logger("musterd")->info("stopped");
  return journal_failed ? kExitCannotServe : kExitSuccess;
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) {
  muster::EnterReleaseMode();
  return muster::rdzv::FinishGrpc(muster::Main(argc, argv));
}
