// rdzv-call: one rendezvous call, made the way an outsider would: the
// generated stub of proto/rendezvous.proto, the request as JSON, whatever
// credential (or none) the caller gives. The integration tests play the
// attacker with it.
//
//   rdzv-call --target HOST:PORT [--token-file F | --token T | --authorization V]
//             [--cacert CA [--cert C --key K]] [--munge [--munge-socket PATH]]
//             [--timeout S] METHOD 'JSON request'
//
// Plaintext unless --cacert is given (TLS, as an agent's rendezvous/auth/tls.h).
// --munge attaches a fresh munge credential of the caller's uid (and, for
// Heartbeat and Watch, the uid claim an agent sends): run it as another
// user (runuser -u nobody) to be that user.
//
// Prints each response (for Watch, each event) as one JSON line, then a last
// line "CODE_NAME<TAB>message" (OK, UNAUTHENTICATED, ...). Exit status 0 iff
// the call ended OK; 2 for a usage error.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/auth/token.h"

namespace muster::rdzv {
namespace {

constexpr int kExitUsage = 2;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "rdzv-call: error: %s\n", message.c_str());
  return kExitUsage;
}

void PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) json = "{}";
  std::printf("%s\n", json.c_str());
  std::fflush(stdout);
}

int Finish(const grpc::Status& status) {
  std::printf("%s\t%s\n", CodeName(status.error_code()), status.error_message().c_str());
  return status.ok() ? 0 : 1;
}

// A unary call: parses the request, calls, prints.
template <typename Request, typename Response, typename Call>
int Unary(const std::string& json, grpc::ClientContext* context, Call call) {
  Request request;
  if (auto parsed = google::protobuf::util::JsonStringToMessage(json, &request); !parsed.ok()) {
    return Usage(absl::StrCat("the request is not a ", Request::descriptor()->full_name(), ": ",
                              parsed.ToString()));
  }
  Response response;
  grpc::Status status = call(context, request, &response);
  if (status.ok()) PrintJson(response);
  return Finish(status);
}

int Main(int argc, char** argv) {
  std::string target, token_file, token, authorization, munge_socket, method, json = "{}";
  bool munge = false;
  TlsFiles tls;
  double timeout_s = 10;
  CLI::App app("rdzv-call: one rendezvous call, with any credential or none", "rdzv-call");
  app.add_option("--target", target, "HOST:PORT of the rendezvous")->required();
  auto* file_opt = app.add_option("--token-file", token_file, "send the token in this file");
  auto* token_opt = app.add_option("--token", token, "send this token");
  auto* raw_opt = app.add_option("--authorization", authorization,
                                 "send this authorization value as it is (no Bearer added)");
  file_opt->excludes(token_opt)->excludes(raw_opt);
  token_opt->excludes(raw_opt);
  app.add_option("--cacert", tls.cacert, "speak TLS; check the server against this CA");
  app.add_option("--cert", tls.cert, "with --cacert: present this client certificate");
  app.add_option("--key", tls.key, "the key of --cert");
  auto* munge_opt = app.add_flag("--munge", munge, "send a fresh munge credential of this uid");
  app.add_option("--munge-socket", munge_socket, "munged's socket (default: libmunge's)")
      ->needs(munge_opt);
  app.add_option("--timeout", timeout_s, "deadline of the call in seconds (a watch ends then)");
  app.add_option("method", method,
                 "Join, Watch, Heartbeat, ReportFailure, ReportDone, Leave or Status")
      ->required();
  app.add_option("request", json, "the request as JSON (proto3 JSON mapping)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& error) {
    return Usage(error.what());
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(token_file);
    if (!read.ok()) return Usage(std::string(read.status().message()));
    token = *read;
  }

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!tls.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> secure = ClientTlsCredentials(tls);
    if (!secure.ok()) return Usage(std::string(secure.status().message()));
    credentials = *std::move(secure);
  }
  auto stub = Rendezvous::NewStub(grpc::CreateChannel(target, credentials));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout_s)));
  if (!token.empty()) {
    context.AddMetadata(std::string(kAuthorizationKey), absl::StrCat(kBearerPrefix, token));
  } else if (raw_opt->count() > 0) {
    context.AddMetadata(std::string(kAuthorizationKey), authorization);
  }
  if (munge) {
    absl::StatusOr<std::string> credential = EncodeMungeCredential({munge_socket});
    if (!credential.ok()) return Usage(std::string(credential.status().message()));
    context.AddMetadata(std::string(kMungeMetadataKey), *credential);
    context.AddMetadata(std::string(kUidMetadataKey), std::to_string(::getuid()));
  }

  Rendezvous::Stub* s = stub.get();
  if (method == "Join") {
    return Unary<JoinRequest, JoinResponse>(
        json, &context, [s](auto* c, auto& r, auto* out) { return s->Join(c, r, out); });
  }
  if (method == "Heartbeat") {
    return Unary<HeartbeatRequest, HeartbeatResponse>(
        json, &context, [s](auto* c, auto& r, auto* out) { return s->Heartbeat(c, r, out); });
  }
  if (method == "ReportFailure") {
    return Unary<ReportFailureRequest, ReportFailureResponse>(
        json, &context, [s](auto* c, auto& r, auto* out) { return s->ReportFailure(c, r, out); });
  }
  if (method == "ReportDone") {
    return Unary<ReportDoneRequest, ReportDoneResponse>(
        json, &context, [s](auto* c, auto& r, auto* out) { return s->ReportDone(c, r, out); });
  }
  if (method == "Leave") {
    return Unary<LeaveRequest, LeaveResponse>(
        json, &context, [s](auto* c, auto& r, auto* out) { return s->Leave(c, r, out); });
  }
  if (method == "Status") {
    return Unary<StatusRequest, StatusResponse>(
        json, &context, [s](auto* c, auto& r, auto* out) { return s->Status(c, r, out); });
  }
  if (method == "ListJobs") {
    return Unary<ListJobsRequest, ListJobsResponse>(
        json, &context, [s](auto* c, auto& r, auto* out) { return s->ListJobs(c, r, out); });
  }
  if (method == "Stop") {
    return Unary<StopRequest, StopResponse>(
        json, &context, [s](auto* c, auto& r, auto* out) { return s->Stop(c, r, out); });
  }
  if (method == "WatchJob") {
    WatchJobRequest request;
    if (auto parsed = google::protobuf::util::JsonStringToMessage(json, &request); !parsed.ok()) {
      return Usage(
          absl::StrCat("the request is not a muster.rdzv.WatchJobRequest: ", parsed.ToString()));
    }
    std::unique_ptr<grpc::ClientReader<JobEvent>> reader = s->WatchJob(&context, request);
    JobEvent event;
    while (reader->Read(&event)) PrintJson(event);
    return Finish(reader->Finish());
  }
  if (method == "Watch") {
    WatchRequest request;
    if (auto parsed = google::protobuf::util::JsonStringToMessage(json, &request); !parsed.ok()) {
      return Usage(
          absl::StrCat("the request is not a muster.rdzv.WatchRequest: ", parsed.ToString()));
    }
    std::unique_ptr<grpc::ClientReader<WatchEvent>> reader = s->Watch(&context, request);
    WatchEvent event;
    while (reader->Read(&event)) PrintJson(event);
    return Finish(reader->Finish());
  }
  return Usage(absl::StrCat("unknown method '", method,
                            "'; give Join, Watch, Heartbeat, ReportFailure, ReportDone, Leave, "
                            "Status, ListJobs, Stop or WatchJob"));
}

}  // namespace
}  // namespace muster::rdzv

int main(int argc, char** argv) { return muster::rdzv::Main(argc, argv); }
