// musterctl: an operator's client of a rendezvous (musterd, or an agent
// hosting one). Subcommands:
//   status  every job, or one job with its nodes and last failures; a table,
//           or JSON (--json, the schema in README.md)
//   watch   a job's events, one line each as it happens, until it closes
//   stop    close a job: every agent stops its workers and exits 1
//   health  gRPC's health check (grpc.health.v1) of the server: SERVING,
//           NOT_SERVING (a musterd draining after a stop signal), or why
//           it could not be asked.
// status, watch and stop carry the job's credential as its agents do (a
// token file, munge under Slurm, TLS). Exit status: 0 yes, 1 no (the job
// is not there or failed; not serving, not reachable, refused), 2 usage.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/endpoint.h"
#include "common/json.h"
#include "common/release_mode.h"
#include "proto/health.grpc.pb.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/auth/tls_files.h"
#include "rendezvous/auth/token.h"
#include "rendezvous/grpc/exit.h"
#include "rendezvous/rules/job_events.h"
#include "rendezvous/rules/protocol.h"

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

// The largest answer musterctl takes (a status, a list of jobs).
constexpr int kMaxAnswerBytes = 256 << 20;

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
  // A status of 10,000 nodes with long ids is several MiB, past gRPC's
  // default of 4 MiB for what a client takes.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxAnswerBytes);
  out.channel = grpc::CreateCustomChannel(out.endpoint, credentials, args);
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

// The job's credential, given as its agents give it.
struct Auth {
  std::string token_file;  // --token-file, else MUSTER_TOKEN_FILE
  bool munge = false;
  std::string munge_socket;
};

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

// A client of the rendezvous service that carries the job's credential.
class Operator {
 public:
  static absl::StatusOr<Operator> Create(const Connection& connection, const Auth& auth) {
    Operator out;
    out.connection_ = connection;
    out.stub_ = rdzv::Rendezvous::NewStub(connection.channel);
    std::string token_file = auth.token_file;
    if (token_file.empty()) {
      if (const char* env = std::getenv("MUSTER_TOKEN_FILE")) token_file = env;
    }
    if (!token_file.empty() && auth.munge) {
      return absl::InvalidArgumentError(
          "--munge and a token file (--token-file or MUSTER_TOKEN_FILE) exclude each other; a "
          "rendezvous checks one credential: give the one its agents use");
    }
    if (!token_file.empty()) {
      absl::StatusOr<std::string> token = rdzv::ReadTokenFile(token_file);
      if (!token.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--token-file: ", token.status().message()));
      }
      out.token_ = *std::move(token);
      return out;
    }
    rdzv::MungeOptions munge{auth.munge_socket};
    // As agents choose it: munge inside a Slurm allocation whose host runs munged.
    if (auth.munge || (std::getenv("SLURM_JOB_ID") != nullptr && rdzv::MungeSocketPresent(munge))) {
      out.munge_ = munge;
    }
    return out;
  }

  // Sets the call's deadline (none for a watch) and its credential.
  absl::Status Prepare(grpc::ClientContext& context, bool deadline = true) const {
    if (deadline) context.set_deadline(absl::ToChronoTime(absl::Now() + connection_.timeout));
    if (!token_.empty()) {
      context.AddMetadata(std::string(rdzv::kAuthorizationKey),
                          absl::StrCat(rdzv::kBearerPrefix, token_));
    } else if (munge_) {
      absl::StatusOr<std::string> credential = rdzv::EncodeMungeCredential(*munge_);
      if (!credential.ok()) {
        return absl::UnavailableError(
            absl::StrCat("cannot make a munge credential: ", credential.status().message()));
      }
      context.AddMetadata(std::string(rdzv::kMungeMetadataKey), *std::move(credential));
    }
    return absl::OkStatus();
  }

  // Prints why a call failed; returns kExitNo.
  int Failed(const grpc::Status& status, const std::string& job_id) const {
    switch (status.error_code()) {
      case grpc::StatusCode::NOT_FOUND:
        return No(job_id.empty() ? status.error_message()
                                 : absl::StrCat("no job '", job_id, "' on ", connection_.endpoint));
      case grpc::StatusCode::UNAUTHENTICATED:
        return No(absl::StrCat(
            connection_.endpoint, " refused the call: ", status.error_message(),
            token_.empty() && !munge_
                ? "; give the job's token (--token-file PATH or MUSTER_TOKEN_FILE), or --munge"
                : "; give the credential its agents use"));
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::FAILED_PRECONDITION:
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::RESOURCE_EXHAUSTED: return No(status.error_message());
      case grpc::StatusCode::UNIMPLEMENTED:
        return No(absl::StrCat(connection_.endpoint,
                               " does not serve this call: a muster older than musterctl?"));
      default:
        return No(absl::StrCat(
            "cannot ask ", connection_.endpoint, ": ", status.error_message(), " (",
            status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? "no answer in time"
                                                                       : "not reachable",
            ")"));
    }
  }

  rdzv::Rendezvous::Stub& stub() const { return *stub_; }

 private:
  Connection connection_;
  std::shared_ptr<rdzv::Rendezvous::Stub> stub_;
  std::string token_;
  std::optional<rdzv::MungeOptions> munge_;
};

// "35s", "5m10s", "2h05m", "3d04h": how long ago, for a table.
std::string FormatAge(absl::Duration age) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(age));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string FormatClock(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::LocalTimeZone());
}

// Unix seconds to the millisecond, as the event lines give times.
std::string JsonTime(int64_t unix_ms) { return absl::StrFormat("%.3f", unix_ms / 1000.0); }

std::string JsonBool(bool value) { return value ? "true" : "false"; }

std::string DescribeExit(const rdzv::Failure& failure) {
  return failure.signal() != 0 ? absl::StrCat("signal ", failure.signal())
                               : absl::StrCat("exit code ", failure.exit_code());
}

std::string FailureJson(const rdzv::Failure& failure) {
  return absl::StrCat("{\"rank\": ", failure.rank(), ", \"local_rank\": ", failure.local_rank(),
                      ", \"host\": ", JsonQuote(failure.host()), ", \"pid\": ", failure.pid(),
                      ", \"exit_code\": ", failure.exit_code(), ", \"signal\": ", failure.signal(),
                      ", \"time\": ", JsonTime(failure.time_unix_ms()),
                      ", \"message\": ", JsonQuote(failure.message()), "}");
}

std::string NodeJson(const rdzv::NodeStatus& node) {
  return absl::StrCat(
      "{\"node_id\": ", JsonQuote(node.node_id()), ", \"host\": ", JsonQuote(node.host()),
      ", \"addr\": ", JsonQuote(node.addr()), ", \"state\": ", JsonQuote(node.state()),
      ", \"group_rank\": ", node.group_rank(), ", \"rank_base\": ", node.rank_base(),
      ", \"local_world_size\": ", node.local_world_size(),
      ", \"joined\": ", JsonTime(node.joined_unix_ms()),
      ", \"last_seen\": ", JsonTime(node.last_seen_unix_ms()),
      ", \"watching\": ", JsonBool(node.watching()), "}");
}

// One job as JSON (README.md, "musterctl status --json"); with its nodes
// when the answer has them.
std::string JobJson(const rdzv::StatusResponse& job, bool with_nodes) {
  std::vector<std::string> failures;
  for (const rdzv::Failure& failure : job.recent_failures()) {
    failures.push_back(FailureJson(failure));
  }
  std::vector<std::string> missing;
  for (const std::string& host : job.missing()) missing.push_back(JsonQuote(host));
  const bool closed = job.state() == "closed";
  std::string out = absl::StrCat(
      "{\"job\": ", JsonQuote(job.job_id()), ", \"state\": ", JsonQuote(job.state()),
      ", \"round\": ", job.round(), ", \"round_since\": ", JsonTime(job.round_since_unix_ms()),
      ", \"created\": ", JsonTime(job.created_unix_ms()), ", \"nodes\": ", job.participants(),
      ", \"live_nodes\": ", job.node_count(), ", \"waiting\": ", job.waiting(),
      ", \"min_nodes\": ", job.config().min_nodes(), ", \"max_nodes\": ", job.config().max_nodes(),
      ", \"restarts\": ", job.restart_count(), ", \"max_restarts\": ", job.config().max_restarts(),
      ", \"world_size\": ", job.world_size(), ", \"last_call_remaining\": ",
      job.last_call_remaining_ms() < 0 ? "null" : JsonTime(job.last_call_remaining_ms()),
      ", \"missing\": [", absl::StrJoin(missing, ", "),
      "], \"missing_count\": ", job.missing_count(),
      ", \"succeeded\": ", closed ? JsonBool(job.succeeded()) : "null",
      ", \"close_reason\": ", closed ? JsonQuote(job.close_reason()) : "null",
      ", \"root_cause\": ", job.has_root_cause() ? FailureJson(job.root_cause()) : "null",
      ", \"recent_failures\": [", absl::StrJoin(failures, ", "), "]");
  if (with_nodes) {
    std::vector<std::string> nodes;
    for (const rdzv::NodeStatus& node : job.nodes()) nodes.push_back(NodeJson(node));
    absl::StrAppend(&out, ", \"node_list\": [", absl::StrJoin(nodes, ", "), "]");
  }
  absl::StrAppend(&out, "}");
  return out;
}

// Rows of text in columns, each as wide as its widest cell.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string Restarts(const rdzv::StatusResponse& job) {
  return absl::StrCat(job.restart_count(), "/", job.config().max_restarts());
}

void PrintFailure(const rdzv::Failure& failure, const char* indent) {
  std::printf("%s%s  rank %d (local rank %d, pid %d) on %s: %s\n", indent,
              FormatClock(failure.time_unix_ms()).c_str(), failure.rank(), failure.local_rank(),
              failure.pid(), failure.host().c_str(), DescribeExit(failure).c_str());
  // The message's last lines: a traceback's end says what went wrong.
  std::vector<absl::string_view> lines =
      absl::StrSplit(failure.message(), '\n', absl::SkipWhitespace());
  const size_t first = lines.size() > 6 ? lines.size() - 6 : 0;
  for (size_t i = first; i < lines.size(); ++i) {
    std::printf("%s    %.*s\n", indent, static_cast<int>(lines[i].size()), lines[i].data());
  }
}

void PrintJob(const rdzv::StatusResponse& job) {
  const absl::Time now = absl::Now();
  std::printf("job %s: %s, round %lld since %s (%s ago)\n", job.job_id().c_str(),
              job.state().c_str(), static_cast<long long>(job.round()),
              FormatClock(job.round_since_unix_ms()).c_str(),
              FormatAge(now - absl::FromUnixMillis(job.round_since_unix_ms())).c_str());
  std::printf("  nodes %d (min %d, max %d), %d waiting, world size %d\n", job.participants(),
              job.config().min_nodes(), job.config().max_nodes(), job.waiting(), job.world_size());
  std::printf("  restarts %s, created %s (%s ago)\n", Restarts(job).c_str(),
              FormatClock(job.created_unix_ms()).c_str(),
              FormatAge(now - absl::FromUnixMillis(job.created_unix_ms())).c_str());
  if (job.last_call_remaining_ms() >= 0) {
    std::printf("  last call ends in %s\n",
                FormatAge(absl::Milliseconds(job.last_call_remaining_ms())).c_str());
  }
  if (job.missing_count() > 0) {
    std::printf("  waiting for %d node(s) of the last round: %s%s\n", job.missing_count(),
                absl::StrJoin(job.missing(), ", ").c_str(),
                job.missing_count() > job.missing_size() ? ", ..." : "");
  }
  if (job.state() == "closed") {
    std::printf("  closed, %s: %s\n", job.succeeded() ? "succeeded" : "failed",
                job.close_reason().c_str());
  }
  if (job.has_root_cause()) {
    std::printf("  root cause:\n");
    PrintFailure(job.root_cause(), "    ");
  }
  if (job.recent_failures_size() > 0) {
    std::printf("  last failures (oldest first):\n");
    for (const rdzv::Failure& failure : job.recent_failures()) PrintFailure(failure, "    ");
  }
  if (job.nodes_size() == 0) return;
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "HOST", "STATE", "GROUP_RANK", "RANKS", "LOCAL", "JOINED", "LAST_SEEN"}};
  for (const rdzv::NodeStatus& node : job.nodes()) {
    const std::string ranks =
        node.rank_base() < 0
            ? "-"
            : absl::StrCat(node.rank_base(), "-", node.rank_base() + node.local_world_size() - 1);
    rows.push_back(
        {node.node_id(), node.host(), node.state(),
         node.group_rank() < 0 ? "-" : absl::StrCat(node.group_rank()), ranks,
         absl::StrCat(node.local_world_size()),
         FormatAge(now - absl::FromUnixMillis(node.joined_unix_ms())) + " ago",
         node.watching()
             ? "now (watching)"
             : FormatAge(now - absl::FromUnixMillis(node.last_seen_unix_ms())) + " ago"});
  }
  std::printf("\n%s", Table(rows).c_str());
  if (job.node_count() > job.nodes_size()) {
    std::printf("(%d of %d nodes listed)\n", job.nodes_size(), job.node_count());
  }
}

int Status(const Operator& op, const std::string& job_id, bool json) {
  grpc::ClientContext context;
  if (absl::Status ready = op.Prepare(context); !ready.ok()) return No(ready.message());
  if (!job_id.empty()) {
    rdzv::StatusRequest request;
    request.set_job_id(job_id);
    request.set_nodes(true);
    rdzv::StatusResponse response;
    const grpc::Status status = op.stub().Status(&context, request, &response);
    if (!status.ok()) return op.Failed(status, job_id);
    if (json) {
      std::printf("%s\n", JobJson(response, /*with_nodes=*/true).c_str());
    } else {
      PrintJob(response);
    }
    return response.state() == "closed" && !response.succeeded() ? kExitNo : kExitYes;
  }
  rdzv::ListJobsResponse response;
  const grpc::Status status = op.stub().ListJobs(&context, rdzv::ListJobsRequest(), &response);
  if (!status.ok()) return op.Failed(status, "");
  if (json) {
    std::vector<std::string> jobs;
    for (const rdzv::StatusResponse& job : response.jobs()) jobs.push_back(JobJson(job, false));
    std::printf("{\"jobs\": [%s], \"total\": %d}\n", absl::StrJoin(jobs, ", ").c_str(),
                response.total());
    return kExitYes;
  }
  if (response.jobs_size() == 0) {
    std::printf("no jobs\n");
    return kExitYes;
  }
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "STATE", "ROUND", "NODES", "MIN:MAX", "RESTARTS", "WORLD", "AGE"}};
  for (const rdzv::StatusResponse& job : response.jobs()) {
    std::string state = job.state();
    if (job.state() == "closed") state = job.succeeded() ? "succeeded" : "failed";
    rows.push_back({job.job_id(), state, absl::StrCat(job.round()),
                    absl::StrCat(job.participants()),
                    absl::StrCat(job.config().min_nodes(), ":", job.config().max_nodes()),
                    Restarts(job), absl::StrCat(job.world_size()),
                    FormatAge(now - absl::FromUnixMillis(job.created_unix_ms()))});
  }
  std::printf("%s", Table(rows).c_str());
  if (response.total() > response.jobs_size()) {
    std::printf("(%d of %d jobs listed)\n", response.jobs_size(), response.total());
  }
  return kExitYes;
}

int Watch(const Operator& op, const std::string& job_id, bool json) {
  grpc::ClientContext context;
  if (absl::Status ready = op.Prepare(context, /*deadline=*/false); !ready.ok()) {
    return No(ready.message());
  }
  rdzv::WatchJobRequest request;
  request.set_job_id(job_id);
  std::unique_ptr<grpc::ClientReader<rdzv::JobEvent>> reader =
      op.stub().WatchJob(&context, request);
  rdzv::JobEvent event;
  std::optional<rdzv::JobEvent> last;
  while (reader->Read(&event)) {
    const EventLine line = rdzv::ToEventLine(event);
    if (json) {
      std::fputs(EventJsonLine(line).c_str(), stdout);
    } else {
      std::printf("%s  round %lld  %-13s  %s%s%s\n",
                  absl::FormatTime("%Y-%m-%d %H:%M:%E3S", line.time, absl::LocalTimeZone()).c_str(),
                  static_cast<long long>(line.round), line.kind.c_str(), line.node.c_str(),
                  line.node.empty() ? "" : "  ", line.detail.c_str());
    }
    std::fflush(stdout);  // as it happens, also into a pipe
    last = event;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return op.Failed(status, job_id);
  if (last && last->kind() == rdzv::JobEvent::JOB_CLOSED && last->succeeded()) return kExitYes;
  return kExitNo;
}

int Stop(const Operator& op, const std::string& job_id, const std::string& reason) {
  grpc::ClientContext context;
  if (absl::Status ready = op.Prepare(context); !ready.ok()) return No(ready.message());
  rdzv::StopRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  rdzv::StopResponse response;
  const grpc::Status status = op.stub().Stop(&context, request, &response);
  if (!status.ok()) return op.Failed(status, job_id);
  std::printf("job %s stopped: its agents stop their workers and exit 1\n", job_id.c_str());
  return kExitYes;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "musterctl: an operator's view of a muster rendezvous (musterd, or an agent hosting "
      "one).",
      "musterctl");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("musterctl ") + MUSTER_VERSION);
  app.footer(
      "Exit status: 0 yes, 1 no (the job is not there, or failed; health: not SERVING; not "
      "reachable; refused), 2 usage.\n");

  Target status_target;
  Auth status_auth;
  std::string status_job;
  bool status_json = false;
  CLI::App* status = app.add_subcommand(
      "status",
      "every job the server holds (state, round, nodes, restarts, age), or one JOB with its "
      "nodes and last failures; exits 1 for a job that failed");
  AddTargetOptions(status, status_target);
  AddAuthOptions(status, status_auth);
  status->add_option("job", status_job, "the job's --rdzv-id")->type_name("JOB");
  status->add_flag("--json", status_json, "one JSON object (its schema: README.md)");

  Target watch_target;
  Auth watch_auth;
  std::string watch_job;
  bool watch_json = false;
  CLI::App* watch = app.add_subcommand(
      "watch",
      "the job's events as they happen, starting with its last ones: node joined or lost, "
      "round started, worker failed, job closed; ends when the job closes (exit 0 if it "
      "succeeded, else 1)");
  AddTargetOptions(watch, watch_target);
  AddAuthOptions(watch, watch_auth);
  watch->add_option("job", watch_job, "the job's --rdzv-id")->type_name("JOB")->required();
  watch->add_flag("--json", watch_json,
                  "one JSON object a line, as musterd --event-log writes them");

  Target stop_target;
  Auth stop_auth;
  std::string stop_job, stop_reason;
  CLI::App* stop = app.add_subcommand(
      "stop",
      "close the job: every agent stops its workers (with their grace period) and exits 1, "
      "saying it was stopped and why");
  AddTargetOptions(stop, stop_target);
  AddAuthOptions(stop, stop_auth);
  stop->add_option("job", stop_job, "the job's --rdzv-id")->type_name("JOB")->required();
  stop->add_option("--reason", stop_reason, "why, for every agent's last line (256 bytes kept)")
      ->type_name("TEXT");

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

  struct Operation {
    CLI::App* command;
    const Target* target;
    const Auth* auth;
  };
  for (const Operation& operation :
       {Operation{status, &status_target, &status_auth},
        Operation{watch, &watch_target, &watch_auth}, Operation{stop, &stop_target, &stop_auth}}) {
    if (!operation.command->parsed()) continue;
    absl::StatusOr<Connection> connection = Connect(*operation.target);
    if (!connection.ok()) return Usage(connection.status().message());
    absl::StatusOr<Operator> op = Operator::Create(*connection, *operation.auth);
    if (!op.ok()) return Usage(op.status().message());
    if (operation.command == status) return Status(*op, status_job, status_json);
    if (operation.command == watch) return Watch(*op, watch_job, watch_json);
    return Stop(*op, stop_job, stop_reason);
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
  return muster::rdzv::FinishGrpc(muster::Main(argc, argv));
}
