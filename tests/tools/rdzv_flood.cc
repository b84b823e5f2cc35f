// rdzv-flood: many junk jobs, made the way an outsider would: for each of
// --jobs ids PREFIX-0 .. PREFIX-(N-1), one Join of a one-node job (the round
// forms at once), on one connection, one after the other. The node never
// speaks again: the rendezvous must drop it after its heartbeat timeout and
// forget the empty job after its join timeout. The integration tests and
// bench/ use it to fill a rendezvous.
//
//   rdzv-flood --target HOST:PORT [--token-file F] --jobs N [--prefix P]
//              [--join-timeout-ms MS] [--timeout S]
//
// Prints one line per status code seen, "CODE<TAB>count<TAB>first message"
// (CODE as gRPC numbers it: 0 OK, 8 RESOURCE_EXHAUSTED), then
// "seconds<TAB>S". Exit 0 iff every join was answered OK; 2 for a usage error.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/protocol.h"
#include "rendezvous/token.h"

namespace muster::rdzv {
namespace {

int Main(int argc, char** argv) {
  std::string target, token_file, prefix = "junk";
  int jobs = 0;
  int64_t join_timeout_ms = 2000;
  double timeout_s = 10;
  CLI::App app("rdzv-flood: many one-node junk jobs, one Join each", "rdzv-flood");
  app.add_option("--target", target, "HOST:PORT of the rendezvous")->required();
  app.add_option("--token-file", token_file, "send the token in this file");
  app.add_option("--jobs", jobs, "how many jobs")->required()->check(CLI::Range(1, 1'000'000));
  app.add_option("--prefix", prefix, "job ids are PREFIX-0, PREFIX-1, ...");
  app.add_option("--join-timeout-ms", join_timeout_ms, "each job's join_timeout_ms");
  app.add_option("--timeout", timeout_s, "deadline of each call in seconds");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "rdzv-flood: error: %s\n", error.what());
    return 2;
  }
  std::string token;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> read = ReadTokenFile(token_file);
    if (!read.ok()) {
      std::fprintf(stderr, "rdzv-flood: error: %s\n", std::string(read.status().message()).c_str());
      return 2;
    }
    token = *read;
  }
  auto stub = Rendezvous::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  JoinRequest request;
  request.set_protocol_version(kProtocolVersion);
  JobConfig* config = request.mutable_config();
  config->set_min_nodes(1);
  config->set_max_nodes(1);
  config->set_join_timeout_ms(join_timeout_ms);
  config->set_heartbeat_timeout_ms(1000);  // the least the rendezvous takes
  NodeInfo* node = request.mutable_node();
  node->set_node_id("junk-node");
  node->set_host("junk");
  node->set_local_world_size(1);
  node->set_node_rank_hint(-1);

  std::map<grpc::StatusCode, int> codes;
  std::map<grpc::StatusCode, std::string> first_message;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < jobs; ++i) {
    request.set_job_id(absl::StrCat(prefix, "-", i));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout_s)));
    if (!token.empty()) {
      context.AddMetadata(std::string(kAuthorizationKey), absl::StrCat(kBearerPrefix, token));
    }
    JoinResponse response;
    const grpc::Status status = stub->Join(&context, request, &response);
    if (codes[status.error_code()]++ == 0)
      first_message[status.error_code()] = status.error_message();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& [code, count] : codes) {
    std::printf("%d\t%d\t%s\n", static_cast<int>(code), count, first_message[code].c_str());
  }
  std::printf("seconds\t%.3f\n", seconds);
  return codes.size() == 1 && codes.begin()->first == grpc::StatusCode::OK ? 0 : 1;
}

}  // namespace
}  // namespace muster::rdzv

int main(int argc, char** argv) { return muster::rdzv::Main(argc, argv); }
