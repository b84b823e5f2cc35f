// musterd: the standalone rendezvous daemon. One process serves the
// rendezvous of many jobs at once, one per --rdzv-id; agents reach it with
// `muster --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID ...`.
// main parses flags (musterd_flags.h) and runs the server until SIGTERM or
// SIGINT; the rules live in the hub and the state machine.
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
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
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
#include "rendezvous/server/journal.h"
#include "rendezvous/server/metrics.h"
#include "rendezvous/server/musterd_flags.h"
#include "rendezvous/server/service.h"

namespace muster::rdzv {
namespace {

// Pending joins and watches are told at once that the server is going away;
// this only bounds calls that arrive during the shutdown.
constexpr absl::Duration kShutdownGrace = absl::Milliseconds(500);

// Set when the journal can no longer be written: musterd stops, exit 1.
std::atomic<bool> journal_failed{false};

// How a step that cannot go on ends musterd: its exit code and what it says.
struct Failure {
  int code;
  std::string message;
};

int Error(int code, absl::string_view message) {
  std::fprintf(stderr, "musterd: error: %.*s\n", static_cast<int>(message.size()), message.data());
  return code;
}

Failure Usage(absl::string_view message) { return {kMusterdExitUsage, std::string(message)}; }

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

// The server's options from the command line, and what they name read and
// checked: the token, the TLS files, munged's socket.
std::optional<Failure> ServerOptionsFrom(const MusterdConfig& config, ServerOptions* options) {
  options->hub.state.max_join_timeout = config.max_join_timeout;
  options->hub.state.max_jobs = config.max_jobs;
  options->hub.state.max_closed_jobs = config.max_jobs;
  // Agents keep their workers through this server's outages: it is not a node of the job.
  options->hub.state.ride_out_outages = true;
  options->ping_interval = config.ping_interval;
  options->ping_timeout = config.ping_timeout;
  options->metrics = config.metrics_port.has_value();
  if (!config.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(config.token_file);
    if (!token.ok()) return Usage(absl::StrCat("--token-file: ", token.status().message()));
    options->token = *std::move(token);
  }
  if (!config.tls.empty()) {
    if (absl::Status checked = ServerTlsCredentials(config.tls).status(); !checked.ok()) {
      return Usage(absl::StrCat("--tls-*: ", checked.message()));
    }
    options->tls = config.tls;
  }
  if (config.munge) {
    MungeAuth auth;
    auth.munge.socket = config.munge_socket;
    auth.only_own_uid = false;  // every uid, each in its own namespace
    if (!MungeSocketPresent(auth.munge)) {
      return Usage(
          absl::StrCat("--munge: no munged socket at ",
                       config.munge_socket.empty() ? DefaultMungeSocket() : config.munge_socket,
                       "; start munged, or give --munge-socket PATH"));
    }
    options->munge = auth;
  }
  return std::nullopt;
}

// The metrics' password ("" for none), by auth/metrics_password.h's rules,
// and none at all under --munge.
absl::StatusOr<std::string> MetricsPasswordFor(const MusterdConfig& config,
                                               const ServerOptions& options) {
  absl::StatusOr<std::string> password =
      MetricsPassword(config.metrics_password_file, options.token, config.metrics_listen,
                      "--metrics-password-file", "--metrics-listen");
  if (!password.ok()) return password.status();
  if (password->empty() && config.munge) {
    return absl::InvalidArgumentError(
        "--metrics-port with --munge: the metrics would show every uid's jobs to whoever reaches "
        "the port; give --metrics-password-file FILE, a password for the metrics only (a mode "
        "600 file of one line)");
  }
  return password;
}

// --state-dir: the journal, and the jobs it holds for the hub to continue.
std::optional<Failure> OpenStateDir(const std::string& state_dir, HubOptions* hub) {
  Replayed replayed;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(state_dir, &replayed);
  if (!journal.ok()) {
    const bool taken = absl::IsFailedPrecondition(journal.status()) &&
                       absl::StrContains(journal.status().message(), "another process");
    return Failure{taken ? kMusterdExitCannotServe : kMusterdExitUsage,
                   absl::StrCat("--state-dir: ", journal.status().message())};
  }
  if (!replayed.dropped_why.empty()) {
    Logger("musterd")->warn(
        "state: {}: {}; the {} bytes from there on are dropped, the {} records before it kept",
        (*journal)->path(), replayed.dropped_why, replayed.dropped_bytes, replayed.records.size());
  }
  hub->restore = std::move(replayed.records);
  hub->journal = *std::move(journal);
  hub->on_journal_failure = [](const absl::Status&) {
    journal_failed = true;
    kill(getpid(), SIGTERM);  // the main thread stops the server
  };
  return std::nullopt;
}

// --event-log: every job event as a JSON line, written by a thread of its own.
std::optional<Failure> OpenEventLogFor(const std::string& path, HubOptions* hub) {
  absl::StatusOr<OpenedEventLog> opened = OpenEventLog(path, "--event-log");
  if (!opened.ok()) return Usage(opened.status().message());
  if (opened->warning) Logger("musterd")->warn("{}", *opened->warning);
  // Called in order with the hub's lock held: the line is only queued,
  // for the writer's thread (a slow disk does not hold the rendezvous).
  auto writer = std::make_shared<EventLogWriter>(
      std::move(opened->fd), absl::StrCat("--event-log ", path),
      [](const std::string& warning) { Logger("musterd")->warn("{}", warning); });
  hub->on_event = [writer](const JobEvent& event) {
    writer->Append(EventJsonLine(ToEventLine(event)));
  };
  return std::nullopt;
}

// What musterd serves with, said once at the start.
void LogStartLines(const MusterdConfig& config, const ServerOptions& options,
                   const RendezvousServer& server, const MetricsServer* metrics,
                   const std::string& metrics_password) {
  if (options.munge) {
    Logger("musterd")->info(
        "auth: munge (socket {}): calls without a credential are refused; each uid's jobs are "
        "kept apart",
        config.munge_socket.empty() ? DefaultMungeSocket() : config.munge_socket);
  } else if (options.token.empty()) {
    Logger("musterd")->warn(
        "auth: none: anyone who can reach this port can join, watch or stop any job; give "
        "--token-file PATH (a mode 600 file with one line of secret) and the agents "
        "--rdzv-conf token_file=PATH");
  } else {
    Logger("musterd")->info("auth: token from {}: calls without it are refused", config.token_file);
  }
  if (options.hub.journal != nullptr) {
    const RendezvousHub::JobCount jobs = server.hub()->CountJobs();
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
  if (config.tls.empty()) {
    Logger("musterd")->info("tls: off{}", options.token.empty()
                                              ? ""
                                              : " (the token crosses the network in clear text; "
                                                "give --tls-cert and --tls-key to encrypt it)");
  } else {
    Logger("musterd")->info("tls: on (client certificates {}), certificate {}",
                            config.tls.cacert.empty() ? "not required" : "required",
                            config.tls.cert);
  }
  Logger("musterd")->info("health: grpc.health.v1 on the same port, no credential needed: SERVING");
  if (metrics != nullptr) {
    Logger("musterd")->info("metrics: {} ({}; {})", metrics->url(),
                            IsLoopbackListen(config.metrics_listen)
                                ? "this host only"
                                : "every host that reaches this port",
                            metrics_password.empty()
                                ? "no password: whoever reaches them reads the job names"
                                : DescribeMetricsAuth(config.metrics_password_file,
                                                      metrics_password, "--metrics-password-file"));
  }
}

// Waits for SIGTERM or SIGINT (blocked in `signals`); with a drain, serves
// on while health says NOT_SERVING, until it ends or a second signal comes.
// The signal that stops musterd.
int WaitForStop(const sigset_t& signals, absl::Duration drain, RendezvousServer& server) {
  int signal_number = 0;
  if (int rc = sigwait(&signals, &signal_number); rc != 0) {
    Logger("musterd")->error("sigwait: {}; shutting down", std::strerror(rc));
    signal_number = SIGTERM;
  }
  if (drain <= absl::ZeroDuration() || journal_failed) return signal_number;
  server.SetServing(false);
  Logger("musterd")->info(
      "SIG{}: draining for {}: health says NOT_SERVING, everything else is served as before "
      "(a second signal stops at once)",
      sigabbrev_np(signal_number), absl::FormatDuration(drain));
  const absl::Time until = absl::Now() + drain;
  while (true) {
    const timespec wait = absl::ToTimespec(std::max(until - absl::Now(), absl::ZeroDuration()));
    if (int again = sigtimedwait(&signals, nullptr, &wait); again > 0) {
      return again;  // a second stop signal, or the journal's failure
    }
    if (errno != EINTR) return signal_number;  // EAGAIN: the drain is over
  }
}

// Says why it stops, then stops the server: what waits is told it is going
// away (and, with a journal, that its job is kept).
void Stop(int signal_number, const std::string& state_dir, const ServerOptions& options,
          RendezvousServer& server) {
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
  server.Shutdown(kShutdownGrace, kept ? RendezvousHub::Jobs::kKept : RendezvousHub::Jobs::kLost);
}

int Run(const MusterdConfig& config) {
  ServerOptions options;
  if (std::optional<Failure> failed = ServerOptionsFrom(config, &options)) {
    return Error(failed->code, failed->message);
  }
  std::string metrics_password;  // empty: none asked
  if (options.metrics) {
    absl::StatusOr<std::string> password = MetricsPasswordFor(config, options);
    if (!password.ok()) return Error(kMusterdExitUsage, password.status().message());
    metrics_password = *std::move(password);
  }
  if (const char* level = std::getenv("MUSTER_LOG_LEVEL")) {
    SetLogLevel(spdlog::level::from_str(level));
  }
  UseTimestampedLogs();
  if (!config.state_dir.empty()) {
    if (std::optional<Failure> failed = OpenStateDir(config.state_dir, &options.hub)) {
      return Error(failed->code, failed->message);
    }
  }
  if (!config.event_log.empty()) {
    if (std::optional<Failure> failed = OpenEventLogFor(config.event_log, &options.hub)) {
      return Error(failed->code, failed->message);
    }
  }
  RouteGrpcLogsToSpdlog();
  // Each agent keeps a connection open: a daemon for thousands of nodes
  // needs more descriptors than the usual soft limit of 1024.
  if (std::optional<std::string> low = RaiseOpenFileLimit(16384, "agents can connect")) {
    Logger("musterd")->warn("{}", *low);
  }

  // Blocked before gRPC starts its threads, so they inherit the mask and the
  // signals reach only sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  if (int rc = pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); rc != 0) {
    return Error(kMusterdExitCannotServe,
                 absl::StrCat("cannot block signals: ", std::strerror(rc)));
  }

  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start(config.listen, config.port, options);
  if (!server.ok()) {
    return Error(kMusterdExitCannotServe, WhyCannotListen(config.listen, config.port));
  }
  std::unique_ptr<MetricsServer> metrics;
  if (options.metrics) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> started =
        MetricsServer::Start({.listen = config.metrics_listen,
                              .port = *config.metrics_port,
                              .password = metrics_password,
                              .listen_option = "--metrics-listen",
                              .port_option = "--metrics-port"});
    if (!started.ok()) {
      (*server)->Shutdown(absl::ZeroDuration(), options.hub.journal != nullptr
                                                    ? RendezvousHub::Jobs::kKept
                                                    : RendezvousHub::Jobs::kLost);
      return Error(
          absl::IsInvalidArgument(started.status()) ? kMusterdExitUsage : kMusterdExitCannotServe,
          started.status().message());
    }
    metrics = *std::move(started);
    metrics->Add((*server)->metrics());
  }
  LogStartLines(config, options, **server, metrics.get(), metrics_password);
  // Last: whoever waits for this line (a script, the tests) has the ones above.
  std::printf("musterd: serving rendezvous on %s\n",
              FormatEndpoint(config.listen, (*server)->port()).c_str());
  std::fflush(stdout);

  const int signal_number = WaitForStop(stop_signals, config.drain, **server);
  Stop(signal_number, config.state_dir, options, **server);
  if (metrics != nullptr) MetricsServer::LeaveToExit(std::move(metrics));
  server->reset();
  options.hub.journal.reset();
  Logger("musterd")->info("stopped");
  return journal_failed ? kMusterdExitCannotServe : kMusterdExitSuccess;
}

int Main(int argc, char** argv) {
  absl::StatusOr<ParsedMusterdFlags> parsed =
      ParseMusterdFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) return Error(kMusterdExitUsage, parsed.status().message());
  if (parsed->print) {
    std::fputs(parsed->print->c_str(), stdout);
    return kMusterdExitSuccess;
  }
  return Run(parsed->config);
}

}  // namespace
}  // namespace muster::rdzv

int main(int argc, char** argv) {
  muster::EnterReleaseMode();
  return muster::rdzv::FinishGrpc(muster::rdzv::Main(argc, argv));
}
