// A rendezvous server with a token, over real gRPC on loopback: every one
// of its calls, made the way an outsider would (the generated stub, with
// whatever metadata it likes), is refused the same way unless it carries
// the token; the agents' client, given the token, works as before.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/client/client.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/server/service.h"
#include "tests/rendezvous/server/fake_time_hub.h"
#include "tests/rendezvous/server/pending.h"
#include "tests/rendezvous/server/requests.h"

namespace muster::rdzv {
namespace {

ClientOptions WithToken(std::string token, std::string token_file = "") {
  ClientOptions options;
  options.token = std::move(token);
  options.token_file = std::move(token_file);
  return options;
}

using ::testing::HasSubstr;

// What an outsider puts on its call's `authorization` metadata.
struct Credential {
  const char* name;
  std::optional<std::string> value;  // nullopt: no metadata at all
};

const std::vector<Credential>& BadCredentials() {
  static const auto* const kBad = new std::vector<Credential>{
      {"none", std::nullopt},
      {"wrong token", std::string("Bearer ") + "wrong-token-0123456789abcdef"},
      {"Bearer missing", std::string(kToken)},
      {"lower-case scheme", std::string("bearer ") + kToken},
      {"token with a byte more", std::string("Bearer ") + kToken + "x"},
      {"empty", std::string()},
  };
  return *kBad;
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.hub = FakeTimeHub(&clock_);
    options.token = kToken;
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        RendezvousServer::Start("127.0.0.1", 0, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
    stub_ = Rendezvous::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  }

  std::unique_ptr<grpc::ClientContext> Context(const std::optional<std::string>& credential) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
    if (credential) context->AddMetadata("authorization", *credential);
    return context;
  }

  // Each of the seven calls, made with `credential`; their statuses, named.
  std::vector<std::pair<std::string, grpc::Status>> CallEach(
      const std::optional<std::string>& credential, const std::string& job) {
    std::vector<std::pair<std::string, grpc::Status>> out;
    {
      JoinResponse response;
      out.emplace_back("Join",
                       stub_->Join(Context(credential).get(), MakeJoin(job, "x"), &response));
    }
    {
      WatchRequest request;
      request.set_job_id(job);
      request.set_node_id("a");
      request.set_node_secret(secret_a_);  // even the node's own secret
      auto context = Context(credential);
      std::unique_ptr<grpc::ClientReader<WatchEvent>> reader = stub_->Watch(context.get(), request);
      WatchEvent event;
      int events = 0;
      while (reader->Read(&event)) ++events;
      grpc::Status status = reader->Finish();
      // A refused watch sends nothing, not even WatchStarted.
      if (!status.ok() && events != 0) {
        status = grpc::Status(grpc::StatusCode::INTERNAL, "events before the refusal");
      }
      out.emplace_back("Watch", status);
    }
    {
      HeartbeatRequest request;
      request.set_job_id(job);
      request.set_node_id("a");
      request.set_node_secret(secret_a_);  // even the node's own secret
      HeartbeatResponse response;
      out.emplace_back("Heartbeat",
                       stub_->Heartbeat(Context(credential).get(), request, &response));
    }
    {
      ReportFailureRequest request;
      request.set_job_id(job);
      request.set_node_id("a");
      request.set_node_secret(secret_a_);  // even the node's own secret
      request.mutable_failure()->set_exit_code(1);
      ReportFailureResponse response;
      out.emplace_back("ReportFailure",
                       stub_->ReportFailure(Context(credential).get(), request, &response));
    }
    {
      ReportDoneRequest request;
      request.set_job_id(job);
      request.set_node_id("a");
      request.set_node_secret(secret_a_);  // even the node's own secret
      ReportDoneResponse response;
      out.emplace_back("ReportDone",
                       stub_->ReportDone(Context(credential).get(), request, &response));
    }
    {
      LeaveRequest request;
      request.set_job_id(job);
      request.set_node_id("a");
      request.set_node_secret(secret_a_);  // even the node's own secret
      LeaveResponse response;
      out.emplace_back("Leave", stub_->Leave(Context(credential).get(), request, &response));
    }
    {
      StatusRequest request;
      request.set_job_id(job);
      StatusResponse response;
      out.emplace_back("Status", stub_->Status(Context(credential).get(), request, &response));
    }
    return out;
  }

  // The job "job" with node "a" in its round, joined with the token.
  void JoinNodeA() {
    std::unique_ptr<RendezvousClient> client =
        RendezvousClient::Create(target_, WithToken(kToken, "/t"));
    absl::StatusOr<Assignment> joined = client->JoinSync(MakeJoin("job", "a"), kRpc);
    ASSERT_TRUE(joined.ok()) << joined.status();
    secret_a_ = joined->node_secret();
  }

  absl::StatusOr<StatusResponse> StatusWithToken(const std::string& job) {
    std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target_, WithToken(kToken));
    StatusRequest request;
    request.set_job_id(job);
    return client->StatusSync(request, kRpc);
  }

  FakeClock clock_;  // outlives server_, whose hub reads it
  std::unique_ptr<RendezvousServer> server_;
  std::string target_;
  std::unique_ptr<Rendezvous::Stub> stub_;
  // Of each call CallEach makes: a call that is let in may wait (a join
  // for a full round, a watch for events).
  absl::Duration deadline_ = kRpc;
  std::string secret_a_;  // node a's, from its join
};

TEST_F(AuthTest, EveryCallWithoutTheTokenIsRefusedWithOneMessage) {
  JoinNodeA();
  for (const Credential& credential : BadCredentials()) {
    for (const auto& [method, status] : CallEach(credential.value, "job")) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " with " << credential.name << ": " << status.error_message();
      EXPECT_EQ(status.error_message(), kRefusedMessage) << method << " with " << credential.name;
    }
  }
  // Nothing the refused calls asked for happened: no failure, no leave, no
  // done, no node "x" in the round.
  absl::StatusOr<StatusResponse> status = StatusWithToken("job");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->round(), 0);
  EXPECT_EQ(status->restart_count(), 0);
  EXPECT_EQ(status->participants(), 1);
  EXPECT_EQ(status->waiting(), 0);
  EXPECT_EQ(status->state(), "running");
}

TEST_F(AuthTest, RefusalSaysNothingOfWhetherTheJobExists) {
  JoinNodeA();
  for (const Credential& credential : BadCredentials()) {
    const auto real = CallEach(credential.value, "job");
    const auto absent = CallEach(credential.value, "no-such-job");
    for (size_t i = 0; i < real.size(); ++i) {
      EXPECT_EQ(absent[i].second.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << absent[i].first;
      EXPECT_EQ(absent[i].second.error_message(), real[i].second.error_message())
          << absent[i].first;
    }
  }
  // With the token, the absent job is NOT_FOUND: the refusal came first.
  EXPECT_TRUE(absl::IsNotFound(StatusWithToken("no-such-job").status()));
}

TEST_F(AuthTest, EveryCallWithTheTokenIsAnswered) {
  JoinNodeA();
  deadline_ = absl::Seconds(1);
  for (const auto& [method, status] : CallEach(std::string("Bearer ") + kToken, "job")) {
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << ": " << status.error_message();
  }
}

TEST_F(AuthTest, AgentClientWithTheTokenRunsAJob) {
  std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target_, WithToken(kToken));
  absl::StatusOr<Assignment> joined = client->JoinSync(MakeJoin("solo", "a"), kRpc);
  ASSERT_TRUE(joined.ok()) << joined.status();
  HeartbeatRequest beat;
  beat.set_job_id("solo");
  beat.set_node_id("a");
  beat.set_node_secret(joined->node_secret());
  Pending<absl::StatusOr<int64_t>> round;
  client->Heartbeat(beat, kRpc, round.Callback());
  EXPECT_TRUE(round.Wait().ok());
  ReportDoneRequest done;
  done.set_job_id("solo");
  done.set_node_id("a");
  done.set_node_secret(joined->node_secret());
  Pending<absl::Status> reported;
  client->ReportDone(done, kRpc, reported.Callback());
  EXPECT_TRUE(reported.Wait().ok());
}

TEST_F(AuthTest, AgentClientWithAWrongTokenIsToldWhichFileAndWhatToDo) {
  std::unique_ptr<RendezvousClient> client =
      RendezvousClient::Create(target_, WithToken("another-token-0123456789", "/etc/tok"));
  absl::StatusOr<Assignment> joined = client->JoinSync(MakeJoin("job", "a"), kRpc);
  ASSERT_TRUE(absl::IsUnauthenticated(joined.status())) << joined.status();
  EXPECT_THAT(joined.status().message(),
              HasSubstr("the rendezvous at " + target_ + " refused our credential"));
  EXPECT_THAT(joined.status().message(), HasSubstr("the token in /etc/tok is not the one"));

  Pending<absl::Status> watch_end;
  WatchRequest watch;
  watch.set_job_id("job");
  watch.set_node_id("a");
  client->Watch(
      watch, [](const WatchEvent&) {}, watch_end.Callback());
  absl::Status ended = watch_end.Wait();
  EXPECT_TRUE(absl::IsUnauthenticated(ended)) << ended;
  EXPECT_THAT(ended.message(), HasSubstr("refused our credential"));
}

TEST_F(AuthTest, AgentClientWithoutATokenIsToldToGiveOne) {
  std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target_);
  absl::StatusOr<Assignment> joined = client->JoinSync(MakeJoin("job", "a"), kRpc);
  ASSERT_TRUE(absl::IsUnauthenticated(joined.status())) << joined.status();
  EXPECT_THAT(joined.status().message(), HasSubstr("requires a token and this agent has none"));
  EXPECT_THAT(joined.status().message(), HasSubstr("--rdzv-conf token_file=PATH"));
  EXPECT_THAT(joined.status().message(), HasSubstr("MUSTER_TOKEN_FILE"));
}

// No token configured: the server takes every call, with or without
// metadata (what every agent before tokens sends).
TEST(NoTokenTest, ServerWithoutATokenAnswersEveryone) {
  FakeClock clock;
  ServerOptions options;
  options.hub = FakeTimeHub(&clock);
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start("127.0.0.1", 0, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = "127.0.0.1:" + std::to_string((*server)->port());
  for (const ClientOptions& client_options :
       {ClientOptions{}, WithToken("some-token-0123456789")}) {
    std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target, client_options);
    StatusRequest request;
    request.set_job_id("nothing-here");
    EXPECT_TRUE(absl::IsNotFound(client->StatusSync(request, kRpc).status()));
  }
}

}  // namespace
}  // namespace muster::rdzv
