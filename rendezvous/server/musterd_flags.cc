#include "rendezvous/server/musterd_flags.h"

#include <algorithm>
#include <cstdint>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "common/status.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state.h"

namespace muster::rdzv {
namespace {

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

}  // namespace

absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag, const std::string& text,
                                                 bool zero_allowed) {
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

namespace {

// The flags as given, before they are checked into a MusterdConfig.
struct RawFlags {
  std::string listen = "0.0.0.0";
  std::string port = std::to_string(kDefaultRdzvPort);
  std::string ping_interval = "12s";
  std::string ping_timeout = "5s";
  std::string max_join_timeout = "1h";
  std::string drain = "0s";
  int64_t max_jobs = static_cast<int64_t>(StateOptions().max_jobs);
  int metrics_port = -1;
};

// Where musterd listens and who may call: --listen, --port, the token,
// TLS, munge, --state-dir.
void AddServingFlags(CLI::App* app, RawFlags& raw, MusterdConfig& config) {
  app->add_option("--listen", raw.listen,
                  "address to listen on: an IPv4 or IPv6 address of this host, or 0.0.0.0 / :: "
                  "for all of them")
      ->type_name("ADDR")
      ->capture_default_str();
  app->add_option("--port", raw.port,
                  "TCP port to listen on; 0 picks a free one (printed at start)")
      ->type_name("PORT")
      ->capture_default_str();
  app->add_option("--token-file", config.token_file,
                  "a file (mode 600, yours) holding one line of secret: every call must carry "
                  "it, agents give it with --rdzv-conf token_file=PATH; without it anyone who "
                  "reaches the port can join, watch or stop any job")
      ->type_name("PATH");
  app->add_option("--tls-cert", config.tls.cert,
                  "serve TLS with this certificate (PEM), which names the host or address agents "
                  "dial (subjectAltName); needs --tls-key")
      ->type_name("PATH");
  app->add_option("--tls-key", config.tls.key, "the private key of --tls-cert (PEM, mode 600)")
      ->type_name("PATH");
  app->add_option("--tls-cacert", config.tls.cacert,
                  "with --tls-cert: require every agent to present a client certificate this "
                  "authority signed (agents: --rdzv-conf cert=PATH,key=PATH)")
      ->type_name("PATH");
  auto* munge_flag = app->add_flag(
      "--munge", config.munge,
      "trust munge credentials (Slurm's): join, status, reports and leave must carry one; "
      "each uid's jobs are kept apart from other uids'");
  app->add_option("--munge-socket", config.munge_socket,
                  "munged's socket (default: libmunge's, /run/munge/munge.socket.2)")
      ->type_name("PATH")
      ->needs(munge_flag);
  munge_flag->excludes(app->get_option("--token-file"));
  app->add_option("--state-dir", config.state_dir,
                  "keep every job in DIR/journal (made mode 700 if missing): a musterd started "
                  "again with the same DIR continues each job where it was, with no worker "
                  "restarted; without it a restart loses every job")
      ->type_name("DIR");
}

// Bounds, timings and what musterd tells: pings, joins, jobs, the event
// log, the metrics, the drain.
void AddLimitFlags(CLI::App* app, RawFlags& raw, MusterdConfig& config) {
  app->add_option("--ping-interval", raw.ping_interval,
                  "ping an agent's connection once nothing came from it for this long (HTTP/2 "
                  "PING, answered by the agent process itself): an agent that is stopped or hung "
                  "is dropped at most heartbeat_timeout + this after it last answered. Agents "
                  "ping every heartbeat_timeout / 3 (10 s) themselves; keep this longer, and "
                  "musterd sends none while they do (answering costs it less)")
      ->type_name("DURATION")
      ->capture_default_str();
  app->add_option("--ping-timeout", raw.ping_timeout,
                  "close a connection whose ping goes unanswered this long (its node's "
                  "heartbeat_timeout counts from the unanswered ping)")
      ->type_name("DURATION")
      ->capture_default_str();
  app->add_option("--max-join-timeout", raw.max_join_timeout,
                  "a job with no node in it is forgotten after its join_timeout, or after this "
                  "long if shorter, whatever its agents asked for (e.g. 30m, 1h, 2h)")
      ->type_name("DURATION")
      ->capture_default_str();
  app->add_option("--max-jobs", raw.max_jobs,
                  "the most jobs served at once (not yet closed); a join that would open one "
                  "more is refused. As many closed jobs are remembered, the longest closed "
                  "forgotten first")
      ->type_name("N")
      ->capture_default_str();
  app->add_option("--event-log", config.event_log,
                  "append every job's events to FILE (made mode 600), one JSON object a line "
                  "(time, job, round, node, kind, detail): node joined or lost, round started, "
                  "worker failed, job closed; what musterctl watch shows")
      ->type_name("FILE");
  app->add_option("--metrics-port", raw.metrics_port,
                  "serve Prometheus metrics at http://ADDR:PORT/metrics: jobs by state, each "
                  "job's nodes, rounds and restarts, join latency, calls by method and code, "
                  "auth failures (docs/METRICS.md); 0 picks a free port")
      ->type_name("PORT");
  app->add_option("--metrics-listen", config.metrics_listen,
                  "the IPv4 address the metrics listen on; they name jobs, so only this host may "
                  "read them unless you give another (0.0.0.0: every interface)")
      ->type_name("ADDR")
      ->capture_default_str();
  app->add_option("--metrics-password-file", config.metrics_password_file,
                  "the metrics ask for this password (HTTP basic auth, any user name), a mode 600 "
                  "file of one line; without it they ask for --token-file's token, which only "
                  "127.0.0.1 may carry (plain HTTP), and under --munge they need it")
      ->type_name("FILE");
  app->add_option("--drain", raw.drain,
                  "on SIGTERM or SIGINT, keep serving this long while gRPC's health service "
                  "(grpc.health.v1, same port) says NOT_SERVING, so a load balancer or a "
                  "Kubernetes probe sees the stop coming; a second signal ends it at once")
      ->type_name("DURATION")
      ->capture_default_str();
}

// The durations, each above zero (the drain may be zero).
absl::Status CheckDurations(const RawFlags& raw, MusterdConfig* config) {
  absl::StatusOr<absl::Duration> max_join_timeout =
      ParseDurationFlag("--max-join-timeout", raw.max_join_timeout);
  if (!max_join_timeout.ok()) return max_join_timeout.status();
  config->max_join_timeout = *max_join_timeout;
  absl::StatusOr<absl::Duration> ping_interval =
      ParseDurationFlag("--ping-interval", raw.ping_interval);
  if (!ping_interval.ok()) return ping_interval.status();
  config->ping_interval = *ping_interval;
  absl::StatusOr<absl::Duration> ping_timeout =
      ParseDurationFlag("--ping-timeout", raw.ping_timeout);
  if (!ping_timeout.ok()) return ping_timeout.status();
  config->ping_timeout = *ping_timeout;
  absl::StatusOr<absl::Duration> drain = ParseDurationFlag("--drain", raw.drain, true);
  if (!drain.ok()) return drain.status();
  config->drain = *drain;
  return absl::OkStatus();
}

// --listen: an address of this host, without a port; "[v6]" loses its brackets.
absl::StatusOr<std::string> CheckListen(const std::string& listen) {
  if (listen.empty()) {
    return absl::InvalidArgumentError("--listen is empty; give an address, e.g. 0.0.0.0");
  }
  if (std::count(listen.begin(), listen.end(), ':') == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen ", listen, " looks like HOST:PORT; give the port with --port"));
  }
  if (listen.front() != '[') return listen;
  absl::StatusOr<Endpoint> bracketed = ParseEndpoint(listen, /*default_port=*/-1);
  if (!bracketed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", listen, " is not an IPv6 address in brackets; give e.g. [::1], ::1 or ::"));
  }
  if (bracketed->port != -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen ", listen, " looks like HOST:PORT; give the port with --port"));
  }
  return bracketed->host;
}

// What the flags ask for, checked together: ranges, pairs, what needs what.
absl::Status Check(const CLI::App& app, const RawFlags& raw, MusterdConfig* config) {
  if (!absl::SimpleAtoi(raw.port, &config->port) || config->port < 0 || config->port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port ", raw.port, ": give a port number 0..65535"));
  }
  MUSTER_RETURN_IF_ERROR(CheckDurations(raw, config));
  if (raw.max_jobs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-jobs ", raw.max_jobs, ": give at least 1"));
  }
  config->max_jobs = static_cast<size_t>(raw.max_jobs);
  if (raw.metrics_port < -1 || raw.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port ", raw.metrics_port, ": give a port number 0..65535"));
  }
  if (raw.metrics_port == -1 &&
      (app.count("--metrics-listen") > 0 || app.count("--metrics-password-file") > 0)) {
    return absl::InvalidArgumentError(
        "--metrics-listen and --metrics-password-file need --metrics-port, "
        "the port to serve the metrics on");
  }
  if (raw.metrics_port >= 0) config->metrics_port = raw.metrics_port;
  absl::StatusOr<std::string> listen = CheckListen(raw.listen);
  if (!listen.ok()) return listen.status();
  config->listen = *std::move(listen);
  const TlsFiles& tls = config->tls;
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError(
        tls.cert.empty() ? "--tls-key needs --tls-cert: give the certificate it belongs to"
                         : "--tls-cert needs --tls-key: give the certificate's private key");
  }
  if (!tls.cacert.empty() && tls.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cacert needs --tls-cert and --tls-key: the server's own certificate and key come "
        "first");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedMusterdFlags> ParseMusterdFlags(const std::vector<std::string>& args) {
  ParsedMusterdFlags parsed;
  RawFlags raw;
  CLI::App app(
      "musterd: the standalone rendezvous server for muster (and torchrun-style) jobs. It serves "
      "many jobs at once, one per --rdzv-id, and logs a line per round.",
      "musterd");
  AddServingFlags(&app, raw, parsed.config);
  AddLimitFlags(&app, raw, parsed.config);
  app.set_version_flag("--version", std::string("musterd ") + MUSTER_VERSION);
  app.footer(kFooter);
  // CLI11 wants the arguments reversed.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    parsed.print = app.help();
    return parsed;
  } catch (const CLI::CallForVersion& version) {
    parsed.print = absl::StrCat(version.what(), "\n");
    return parsed;
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(absl::StrCat(error.what(), "; see musterd --help"));
  }
  MUSTER_RETURN_IF_ERROR(Check(app, raw, &parsed.config));
  return parsed;
}

}  // namespace muster::rdzv
