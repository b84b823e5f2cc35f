// rdzv-flood: many junk jobs, made the way an outsider would: for each of
// --jobs ids PREFIX-0 .. PREFIX-(N-1), one Join. Of a one-node job the round
// forms at once, and the node never speaks again: the rendezvous must drop
// it after its heartbeat timeout (the job closes). Of a two-node job the
// join waits until its deadline and is cancelled: the rendezvous must forget
// the empty job after its join timeout. The integration tests and
// bench/ use it to fill a rendezvous.
//
//   rdzv-flood --target HOST:PORT [--token-file F] --jobs N [--prefix P]
//              [--join-timeout-ms MS] [--timeout S] [--min-nodes 1|2]
//              [--connections C] [--per-connection K] [--expect CODE]
//              [--host-bytes B] [--cacert CA [--cert C --key K]]
//              [--munge [--munge-socket PATH]]
//
// Prints one line per status code seen, "CODE<TAB>count<TAB>first message"
// (CODE as gRPC numbers it: 0 OK, 8 RESOURCE_EXHAUSTED), then
// "seconds<TAB>S". Exit 0 iff every join ended with --expect (OK by
// default); 2 for a usage error.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/auth/token.h"
#include "rendezvous/rules/protocol.h"

namespace muster::rdzv {
namespace {

int Main(int argc, char** argv) {
  std::string target, token_file, prefix = "junk";
  size_t host_bytes = 4;
  int jobs = 0, min_nodes = 1, connections = 1, per_connection = 32, expect = 0;
  int64_t join_timeout_ms = 2000;
  double timeout_s = 10;
  CLI::App app("rdzv-flood: many one-node junk jobs, one Join each", "rdzv-flood");
  app.add_option("--target", target, "HOST:PORT of the rendezvous")->required();
  app.add_option("--token-file", token_file, "send the token in this file");
  TlsFiles tls;
  bool munge = false;
  std::string munge_socket;
  auto* munge_opt = app.add_flag("--munge", munge, "send a fresh munge credential with each join");
  app.add_option("--munge-socket", munge_socket, "munged's socket (default: libmunge's)")
      ->needs(munge_opt);
  app.add_option("--cacert", tls.cacert, "speak TLS; check the server against this CA");
  app.add_option("--cert", tls.cert, "with --cacert: present this client certificate");
  app.add_option("--key", tls.key, "the key of --cert");
  app.add_option("--jobs", jobs, "how many jobs")->required()->check(CLI::Range(1, 1'000'000));
  app.add_option("--prefix", prefix, "job ids are PREFIX-0, PREFIX-1, ...");
  app.add_option("--join-timeout-ms", join_timeout_ms, "each job's join_timeout_ms");
  app.add_option("--timeout", timeout_s, "deadline of each call in seconds");
  app.add_option("--min-nodes", min_nodes,
                 "each job's min_nodes and max_nodes: 1, the round forms at once; 2, the join "
                 "waits until its deadline and is cancelled, leaving an empty job")
      ->check(CLI::Range(1, 2));
  app.add_option("--host-bytes", host_bytes, "each node's host name is this many bytes")
      ->check(CLI::Range(size_t{1}, size_t{4} << 20));
  app.add_option("--connections", connections, "joins in flight on this many connections")
      ->check(CLI::Range(1, 1000));
  app.add_option("--per-connection", per_connection, "joins in flight on each connection at most")
      ->check(CLI::Range(1, 1000));
  app.add_option("--expect", expect,
                 "the status code every join should end with, as gRPC numbers it (0 OK, "
                 "4 DEADLINE_EXCEEDED)");
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
  JoinRequest request;
  request.set_protocol_version(kProtocolVersion);
  JobConfig* config = request.mutable_config();
  config->set_min_nodes(min_nodes);
  config->set_max_nodes(min_nodes);
  config->set_join_timeout_ms(join_timeout_ms);
  config->set_heartbeat_timeout_ms(1000);  // the least the rendezvous takes
  NodeInfo* node = request.mutable_node();
  node->set_node_id("junk-node");
  node->set_host(std::string(host_bytes, 'j'));
  node->set_local_world_size(1);
  node->set_node_rank_hint(-1);

  // Joins in flight on several connections at once (a pending join of a
  // job that waits for more nodes holds its connection's place until its
  // deadline), each connection below the rendezvous's bound per connection.
  struct Call {
    grpc::ClientContext context;
    JoinResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<JoinResponse>> reader;
    int connection = 0;
  };
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!tls.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> secure = ClientTlsCredentials(tls);
    if (!secure.ok()) {
      std::fprintf(stderr, "rdzv-flood: error: %s\n",
                   std::string(secure.status().message()).c_str());
      return 2;
    }
    credentials = *std::move(secure);
  }
  std::vector<std::unique_ptr<Rendezvous::Stub>> stubs;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    stubs.push_back(Rendezvous::NewStub(grpc::CreateCustomChannel(target, credentials, args)));
  }
  std::vector<int> in_flight(connections, 0);
  grpc::CompletionQueue queue;
  std::map<grpc::StatusCode, int> codes;
  std::map<grpc::StatusCode, std::string> first_message;
  const auto start = std::chrono::steady_clock::now();
  int issued = 0, pending = 0, next_connection = 0;
  while (issued < jobs || pending > 0) {
    while (issued < jobs && pending < connections * per_connection) {
      while (in_flight[next_connection] >= per_connection) {
        next_connection = (next_connection + 1) % connections;
      }
      auto* call = new Call;
      call->connection = next_connection;
      request.set_job_id(absl::StrCat(prefix, "-", issued));
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout_s)));
      if (!token.empty()) {
        call->context.AddMetadata(std::string(kAuthorizationKey),
                                  absl::StrCat(kBearerPrefix, token));
      }
      if (munge) {
        absl::StatusOr<std::string> credential = EncodeMungeCredential({munge_socket});
        if (!credential.ok()) {
          // Calls are in flight: no unwinding through the queue that holds them.
          std::fprintf(stderr, "rdzv-flood: error: %s\n",
                       std::string(credential.status().message()).c_str());
          std::fflush(stderr);
          std::_Exit(2);
        }
        call->context.AddMetadata(std::string(kMungeMetadataKey), *credential);
      }
      call->reader = stubs[next_connection]->AsyncJoin(&call->context, request, &queue);
      call->reader->Finish(&call->response, &call->status, call);
      ++in_flight[next_connection];
      next_connection = (next_connection + 1) % connections;
      ++issued;
      ++pending;
    }
    void* tag = nullptr;
    bool ok = false;
    if (!queue.Next(&tag, &ok)) break;
    std::unique_ptr<Call> call(static_cast<Call*>(tag));
    --in_flight[call->connection];
    --pending;
    const grpc::StatusCode code = call->status.error_code();
    if (codes[code]++ == 0) first_message[code] = call->status.error_message();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
  for (const auto& [code, count] : codes) {
    std::printf("%d\t%d\t%s\n", static_cast<int>(code), count, first_message[code].c_str());
  }
  std::printf("seconds\t%.3f\n", seconds);
  return codes.size() == 1 && static_cast<int>(codes.begin()->first) == expect ? 0 : 1;
}

}  // namespace
}  // namespace muster::rdzv

int main(int argc, char** argv) { return muster::rdzv::Main(argc, argv); }
