// musterctl: an operator's client of a rendezvous (musterd, or an agent
// hosting one). Subcommands:
//   status  every job, or one job with its nodes and last failures; a table,
//           or JSON (--json, the schema in docs/metrics-and-musterctl.md)
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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/endpoint.h"
#include "common/json.h"
#include "common/release_mode.h"
#include "ctl/flags.h"
#include "proto/health.grpc.pb.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/auth/tls_files.h"
#include "rendezvous/auth/token.h"
#include "rendezvous/grpc/exit.h"
#include "rendezvous/rules/job_events.h"
#include "rendezvous/rules/protocol.h"

namespace muster::ctl {
namespace {

int Usage(absl::string_view message) {
  std::fprintf(stderr, "musterctl: error: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return kExitUsage;
}

int No(absl::string_view message) {
  std::fprintf(stderr, "musterctl: %.*s\n", static_cast<int>(message.size()), message.data());
  return kExitNo;
}

// The largest answer musterctl takes (a status, a list of jobs).
constexpr int kMaxAnswerBytes = 256 << 20;

struct Connection {
  std::string endpoint;  // as dialled: host:port
  std::shared_ptr<grpc::Channel> channel;
  absl::Duration timeout;
};

// The channel to the server, or a usage error's message (TLS files that
// cannot be used).
absl::StatusOr<Connection> Connect(const Config& config) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!config.tls.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls =
        rdzv::ClientTlsCredentials(config.tls);
    if (!tls.ok()) return tls.status();
    credentials = *std::move(tls);
  }
  Connection out;
  out.endpoint = config.endpoint;
  // A status of 10,000 nodes with long ids is several MiB, past gRPC's
  // default of 4 MiB for what a client takes.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxAnswerBytes);
  out.channel = grpc::CreateCustomChannel(out.endpoint, credentials, args);
  out.timeout = config.timeout;
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
        return No(absl::StrCat(
            connection_.endpoint,
            " does not serve this call: it is a job's own etcd cluster (ha, host mode's default "
            "where etcd is installed), which musterctl does not read yet (start the job with "
            "--rdzv-conf ha=0 to use musterctl on it), or a muster older than musterctl"));
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
      ", \"watching\": ", JsonBool(node.watching()),
      ", \"step\": ", node.step() < 0 ? "null" : absl::StrCat(node.step()),
      ", \"step_time\": ", node.step() < 0 ? "null" : JsonTime(node.step_unix_ms()),
      ", \"steps_per_second\": ", node.steps_per_second(), "}");
}

std::string ExclusionJson(const rdzv::Exclusion& exclusion) {
  return absl::StrCat("{\"host\": ", JsonQuote(exclusion.host()),
                      ", \"node_id\": ", JsonQuote(exclusion.node_id()),
                      ", \"cause\": ", JsonQuote(exclusion.cause()),
                      ", \"time\": ", JsonTime(exclusion.time_unix_ms()), "}");
}

// One job as JSON (docs/metrics-and-musterctl.md, "musterctl status --json"); with its nodes
// when the answer has them.
std::string JobJson(const rdzv::StatusResponse& job, bool with_nodes) {
  std::vector<std::string> failures;
  for (const rdzv::Failure& failure : job.recent_failures()) {
    failures.push_back(FailureJson(failure));
  }
  std::vector<std::string> missing;
  for (const std::string& host : job.missing()) missing.push_back(JsonQuote(host));
  std::vector<std::string> excluded;
  for (const rdzv::Exclusion& exclusion : job.excluded()) {
    excluded.push_back(ExclusionJson(exclusion));
  }
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
      ", \"recent_failures\": [", absl::StrJoin(failures, ", "), "]",
      ", \"step\": ", job.step() < 0 ? "null" : absl::StrCat(job.step()),
      ", \"step_time\": ", job.step() < 0 ? "null" : JsonTime(job.step_unix_ms()),
      ", \"steps_per_second\": ", job.steps_per_second(), ", \"goodput\": ", job.goodput(),
      ", \"no_progress_restarts\": ", job.no_progress_restarts(),
      ", \"max_no_progress_restarts\": ", job.config().max_no_progress_restarts(),
      ", \"excluded\": [", absl::StrJoin(excluded, ", "), "]");
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

// The job's step, its pace, the time since it, the goodput and the hosts
// kept out (none of it when nothing was reported or excluded).
void PrintProgress(const rdzv::StatusResponse& job, absl::Time now) {
  if (job.step() >= 0) {
    std::printf("  step %lld, %.3g steps/s, last step %s ago; goodput %.0f%%",
                static_cast<long long>(job.step()), job.steps_per_second(),
                FormatAge(now - absl::FromUnixMillis(job.step_unix_ms())).c_str(),
                100 * job.goodput());
    if (job.config().max_no_progress_restarts() > 0) {
      std::printf(", restarts without a new step %d/%d", job.no_progress_restarts(),
                  job.config().max_no_progress_restarts());
    }
    std::printf("\n");
  }
  for (const rdzv::Exclusion& exclusion : job.excluded()) {
    std::printf("  excluded: %s (%s ago): %s\n", exclusion.host().c_str(),
                FormatAge(now - absl::FromUnixMillis(exclusion.time_unix_ms())).c_str(),
                exclusion.cause().c_str());
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
  PrintProgress(job, now);
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
      {"NODE", "HOST", "STATE", "GROUP_RANK", "RANKS", "LOCAL", "STEP", "JOINED", "LAST_SEEN"}};
  for (const rdzv::NodeStatus& node : job.nodes()) {
    const std::string ranks =
        node.rank_base() < 0
            ? "-"
            : absl::StrCat(node.rank_base(), "-", node.rank_base() + node.local_world_size() - 1);
    rows.push_back(
        {node.node_id(), node.host(), node.state(),
         node.group_rank() < 0 ? "-" : absl::StrCat(node.group_rank()), ranks,
         absl::StrCat(node.local_world_size()), node.step() < 0 ? "-" : absl::StrCat(node.step()),
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
      {"JOB", "STATE", "ROUND", "NODES", "MIN:MAX", "RESTARTS", "WORLD", "STEP", "AGE"}};
  for (const rdzv::StatusResponse& job : response.jobs()) {
    std::string state = job.state();
    if (job.state() == "closed") state = job.succeeded() ? "succeeded" : "failed";
    rows.push_back(
        {job.job_id(), state, absl::StrCat(job.round()), absl::StrCat(job.participants()),
         absl::StrCat(job.config().min_nodes(), ":", job.config().max_nodes()), Restarts(job),
         absl::StrCat(job.world_size()), job.step() < 0 ? "-" : absl::StrCat(job.step()),
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

int Run(const Config& config) {
  absl::StatusOr<Connection> connection = Connect(config);
  if (!connection.ok()) return Usage(connection.status().message());
  if (config.command == Command::kHealth) return Health(*connection, config.service);
  absl::StatusOr<Operator> op = Operator::Create(*connection, config.auth);
  if (!op.ok()) return Usage(op.status().message());
  switch (config.command) {
    case Command::kStatus: return Status(*op, config.job, config.json);
    case Command::kWatch: return Watch(*op, config.job, config.json);
    case Command::kStop: return Stop(*op, config.job, config.reason);
    case Command::kHealth: break;
  }
  return kExitUsage;
}

int Main(int argc, char** argv) {
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) return Usage(parsed.status().message());
  if (parsed->print) {
    std::fputs(parsed->print->c_str(), stdout);
    return kExitYes;
  }
  return Run(parsed->config);
}

}  // namespace
}  // namespace muster::ctl

int main(int argc, char** argv) {
  muster::EnterReleaseMode();
  return muster::rdzv::FinishGrpc(muster::ctl::Main(argc, argv));
}
