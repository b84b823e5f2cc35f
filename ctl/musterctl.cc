// musterctl: an operator's client of a rendezvous (musterd, or an agent
// hosting one). Subcommands:
//   health  gRPC's health check (grpc.health.v1) of the server: SERVING,
//           NOT_SERVING (a musterd draining after a stop signal), or why
//           it could not be asked.
// Exit status: 0 yes (SERVING), 1 no (not serving, not reachable, not
// known), 2 usage.
#include <cstdio>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/endpoint.h"
#include "common/release_mode.h"
#include "proto/health.grpc.pb.h"
#include "rendezvous/protocol.h"
#include "rendezvous/tls.h"
#include "rendezvous/tls_files.h"

namespace muster {
namespace {

constexpr int kExitYes = 0;
constexpr int kExitNo = 1;
constexpr int kExitUsage = 2;

int Usage(absl::string_view message) {
  std::fprintf(stderr, "musterctl: error: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return kExitUsage;
}

int No(absl::string_view message) {
  std::fprintf(stderr, "musterctl: %.*s\n", static_cast<int>(message.size()), message.data());
  return kExitNo;
}

// How to reach the server: its endpoint, and TLS when a CA is given.
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

struct Connection {
  std::string endpoint;  // as dialled: host:port
  std::shared_ptr<grpc::Channel> channel;
  absl::Duration timeout;
};

// The channel to the target, or a usage error's message.
absl::StatusOr<Connection> Connect(const Target& target) {
  absl::StatusOr<Endpoint> endpoint =
      ParseEndpoint(target.endpoint, rdzv::kDefaultRdzvPort, "--endpoint");
  if (!endpoint.ok()) return endpoint.status();
  double seconds = 0;
  if (!absl::SimpleAtod(target.timeout, &seconds) || !(seconds > 0) || seconds > 3600) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout ", target.timeout, ": give seconds above 0, e.g. 5"));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!target.tls.empty()) {
    if (target.tls.cacert.empty()) {
      return absl::InvalidArgumentError(
          "--cert and --key need --cacert, the authority that signed the server's certificate");
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls =
        rdzv::ClientTlsCredentials(target.tls);
    if (!tls.ok()) return tls.status();
    credentials = *std::move(tls);
  }
  Connection out;
  out.endpoint = FormatEndpoint(*endpoint);
  out.channel = grpc::CreateChannel(out.endpoint, credentials);
  out.timeout = absl::Seconds(seconds);
  return out;
}

int Health(const Connection& connection, const std::string& service) {
  std::unique_ptr<grpc::health::v1::Health::Stub> stub =
      grpc::health::v1::Health::NewStub(connection.channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + connection.timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  const std::string what = service.empty()
                               ? connection.endpoint
                               : absl::StrCat(connection.endpoint, " service ", service);
  switch (status.error_code()) {
    case grpc::StatusCode::OK: {
      const std::string& name =
          grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
      std::printf("%s: %s\n", what.c_str(), name.c_str());
      return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitYes
                                                                                 : kExitNo;
    }
    case grpc::StatusCode::NOT_FOUND:
      return No(absl::StrCat(connection.endpoint, " knows no service '", service,
                             "'; leave out --service to ask about the server"));
    case grpc::StatusCode::UNIMPLEMENTED:
      return No(absl::StrCat(connection.endpoint,
                             " answers gRPC but serves no health checks: not a musterd?"));
    default:
      return No(absl::StrCat("cannot ask ", connection.endpoint, ": ", status.error_message(), " (",
                             status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                 ? "no answer in time"
                                 : "not reachable",
                             ")"));
  }
}

int Main(int argc, char** argv) {
  CLI::App app(
      "musterctl: an operator's view of a muster rendezvous (musterd, or an agent hosting "
      "one).",
      "musterctl");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("musterctl ") + MUSTER_VERSION);
  app.footer(
      "Exit status: 0 yes (health: SERVING), 1 no (not serving, not reachable, not known), "
      "2 usage.\n");

  Target health_target;
  std::string service;
  CLI::App* health = app.add_subcommand(
      "health",
      "gRPC's health check (grpc.health.v1) of the server; needs no credential. Prints "
      "SERVING, or NOT_SERVING while a musterd drains after a stop signal (musterd --drain)");
  AddTargetOptions(health, health_target);
  health->add_option("--service", service, "a service's health instead of the server's")
      ->type_name("NAME");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitYes;
  } catch (const CLI::CallForVersion& version) {
    std::printf("%s\n", version.what());
    return kExitYes;
  } catch (const CLI::ParseError& error) {
    return Usage(absl::StrCat(error.what(), "; see musterctl --help"));
  }

  if (health->parsed()) {
    absl::StatusOr<Connection> connection = Connect(health_target);
    if (!connection.ok()) return Usage(connection.status().message());
    return Health(*connection, service);
  }
  return Usage("give a command; see musterctl --help");
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) {
  muster::EnterReleaseMode();
  return muster::Main(argc, argv);
}
