#include "ctl/flags.h"

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "rendezvous/rules/protocol.h"

namespace muster::ctl {
namespace {

// How to reach the server, as given: its endpoint, TLS, the timeout.
struct Target {
  std::string endpoint;
  rdzv::TlsFiles tls;
  std::string timeout = "5";
};

void AddTargetOptions(CLI::App* command, Target& target) {
  command
      ->add_option("--endpoint", target.endpoint,
                   "the rendezvous, HOST[:PORT] (port 29400 if omitted), as agents' "
                   "--rdzv-endpoint names it")
      ->type_name("HOST:PORT")
      ->required();
  command
      ->add_option("--cacert", target.tls.cacert,
                   "TLS: check the server's certificate against this authority (PEM)")
      ->type_name("PATH");
  command->add_option("--cert", target.tls.cert, "TLS: this client's certificate, with --key")
      ->type_name("PATH");
  command->add_option("--key", target.tls.key, "TLS: the private key of --cert")->type_name("PATH");
  command->add_option("--timeout", target.timeout, "seconds to wait for an answer")
      ->type_name("SECONDS")
      ->capture_default_str();
}

void AddAuthOptions(CLI::App* command, Auth& auth) {
  command
      ->add_option("--token-file", auth.token_file,
                   "the job's token file, as its agents' --rdzv-conf token_file= (default: "
                   "MUSTER_TOKEN_FILE)")
      ->type_name("PATH");
  CLI::Option* munge =
      command->add_flag("--munge", auth.munge,
                        "carry a munge credential (a musterd --munge; the default inside a "
                        "Slurm allocation whose host runs munged)");
  command->add_option("--munge-socket", auth.munge_socket, "munged's socket")
      ->type_name("PATH")
      ->needs(munge);
}

// The target checked, into *config.
absl::Status CheckTarget(const Target& target, Config* config) {
  absl::StatusOr<Endpoint> endpoint =
      ParseEndpoint(target.endpoint, rdzv::kDefaultRdzvPort, "--endpoint");
  if (!endpoint.ok()) return endpoint.status();
  double seconds = 0;
  if (!absl::SimpleAtod(target.timeout, &seconds) || !(seconds > 0) || seconds > 3600) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout ", target.timeout, ": give seconds above 0, e.g. 5"));
  }
  if (!target.tls.empty() && target.tls.cacert.empty()) {
    return absl::InvalidArgumentError(
        "--cert and --key need --cacert, the authority that signed the server's certificate");
  }
  config->endpoint = FormatEndpoint(*endpoint);
  config->tls = target.tls;
  config->timeout = absl::Seconds(seconds);
  return absl::OkStatus();
}

// Each command's flags as given.
struct Commands {
  CLI::App* status = nullptr;
  Target status_target;
  Auth status_auth;
  std::string status_job;
  bool status_json = false;
  CLI::App* watch = nullptr;
  Target watch_target;
  Auth watch_auth;
  std::string watch_job;
  bool watch_json = false;
  CLI::App* stop = nullptr;
  Target stop_target;
  Auth stop_auth;
  std::string stop_job, stop_reason;
  CLI::App* health = nullptr;
  Target health_target;
  std::string service;
};

void AddCommands(CLI::App& app, Commands& c) {
  c.status = app.add_subcommand(
      "status",
      "every job the server holds (state, round, nodes, restarts, age), or one JOB with its "
      "nodes and last failures; exits 1 for a job that failed");
  AddTargetOptions(c.status, c.status_target);
  AddAuthOptions(c.status, c.status_auth);
  c.status->add_option("job", c.status_job, "the job's --rdzv-id")->type_name("JOB");
  c.status->add_flag("--json", c.status_json,
                     "one JSON object (its schema: docs/metrics-and-musterctl.md)");

  c.watch = app.add_subcommand(
      "watch",
      "the job's events as they happen, starting with its last ones: node joined or lost, "
      "round started, worker failed, job closed; ends when the job closes (exit 0 if it "
      "succeeded, else 1)");
  AddTargetOptions(c.watch, c.watch_target);
  AddAuthOptions(c.watch, c.watch_auth);
  c.watch->add_option("job", c.watch_job, "the job's --rdzv-id")->type_name("JOB")->required();
  c.watch->add_flag("--json", c.watch_json,
                    "one JSON object a line, as musterd --event-log writes them");

  c.stop = app.add_subcommand(
      "stop",
      "close the job: every agent stops its workers (with their grace period) and exits 1, "
      "saying it was stopped and why");
  AddTargetOptions(c.stop, c.stop_target);
  AddAuthOptions(c.stop, c.stop_auth);
  c.stop->add_option("job", c.stop_job, "the job's --rdzv-id")->type_name("JOB")->required();
  c.stop->add_option("--reason", c.stop_reason, "why, for every agent's last line (256 bytes kept)")
      ->type_name("TEXT");

  c.health = app.add_subcommand(
      "health",
      "gRPC's health check (grpc.health.v1) of the server; needs no credential. Prints "
      "SERVING, or NOT_SERVING while a musterd drains after a stop signal (musterd --drain)");
  AddTargetOptions(c.health, c.health_target);
  c.health->add_option("--service", c.service, "a service's health instead of the server's")
      ->type_name("NAME");
}

}  // namespace

absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args) {
  ParsedFlags parsed;
  CLI::App app(
      "musterctl: an operator's view of a muster rendezvous (musterd, or an agent hosting "
      "one).",
      "musterctl");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("musterctl ") + MUSTER_VERSION);
  app.footer(
      "Exit status: 0 yes, 1 no (the job is not there, or failed; health: not SERVING; not "
      "reachable; refused), 2 usage.\n");

  Commands c;
  AddCommands(app, c);
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
    return absl::InvalidArgumentError(absl::StrCat(error.what(), "; see musterctl --help"));
  }

  Config& config = parsed.config;
  const Target* target = &c.health_target;
  if (c.status->parsed()) {
    config.command = Command::kStatus;
    config.auth = c.status_auth;
    config.job = c.status_job;
    config.json = c.status_json;
    target = &c.status_target;
  } else if (c.watch->parsed()) {
    config.command = Command::kWatch;
    config.auth = c.watch_auth;
    config.job = c.watch_job;
    config.json = c.watch_json;
    target = &c.watch_target;
  } else if (c.stop->parsed()) {
    config.command = Command::kStop;
    config.auth = c.stop_auth;
    config.job = c.stop_job;
    config.reason = c.stop_reason;
    target = &c.stop_target;
  } else if (c.health->parsed()) {
    config.command = Command::kHealth;
    config.service = c.service;
  } else {
    return absl::InvalidArgumentError("give a command; see musterctl --help");
  }
  if (absl::Status checked = CheckTarget(*target, &config); !checked.ok()) return checked;
  return parsed;
}

}  // namespace muster::ctl
