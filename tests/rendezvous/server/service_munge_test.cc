// A rendezvous server that trusts munge, over real gRPC on loopback, with a
// munged of the test's own (private_munged.h): the agents' client with a
// credential runs a job; a call without one, with a forged or a replayed
// one, is refused; another uid is refused by a hosting agent's server and
// kept in a job of its own by musterd's. Skipped where munged is not
// installed; the other-uid cases need root.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/client/client.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/server/service.h"
#include "tests/rendezvous/server/pending.h"
#include "tests/rendezvous/server/requests.h"
#include "tests/support/private_munged.h"

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kNobody = 65534;

class MungeServiceTest : public PrivateMungedTest {
 protected:
  void SetUp() override {
    PrivateMungedTest::SetUp();
    if (Ready()) munge_.socket = munged_->socket();
  }
  void TearDown() override {
    server_.reset();
    PrivateMungedTest::TearDown();
  }

  // A server as a hosting agent's (only_own_uid) or as musterd's (false).
  void Serve(bool only_own_uid) {
    ServerOptions options;
    options.hub.clock = &clock_;
    options.hub.timer_thread = false;
    MungeAuth auth;
    auth.munge = munge_;
    auth.only_own_uid = only_own_uid;
    options.munge = auth;
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        RendezvousServer::Start("127.0.0.1", 0, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
    stub_ = Rendezvous::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  }

  std::unique_ptr<RendezvousClient> MungeClient() {
    ClientOptions options;
    options.munge = munge_;
    return RendezvousClient::Create(target_, options);
  }

  // A context whose call carries `credential` (nullopt: none).
  static std::unique_ptr<grpc::ClientContext> Context(
      const std::optional<std::string>& credential) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + kRpc));
    if (credential) context->AddMetadata(std::string(kMungeMetadataKey), *credential);
    return context;
  }

  // Join, Status, ReportFailure, ReportDone, Leave, ListJobs, Stop and
  // WatchJob for node "a" of `job`, each with `credential`: their statuses,
  // named.
  std::vector<std::pair<std::string, grpc::Status>> CallEachNeedingACredential(
      const std::optional<std::string>& credential, const std::string& job) {
    std::vector<std::pair<std::string, grpc::Status>> out;
    JoinResponse joined;
    out.emplace_back("Join", stub_->Join(Context(credential).get(), MakeJoin(job, "x"), &joined));
    StatusRequest status;
    status.set_job_id(job);
    StatusResponse state;
    out.emplace_back("Status", stub_->Status(Context(credential).get(), status, &state));
    ReportFailureRequest failure;
    failure.set_job_id(job);
    failure.set_node_id("a");
    failure.set_node_secret(secret_a_);
    ReportFailureResponse failed;
    out.emplace_back("ReportFailure",
                     stub_->ReportFailure(Context(credential).get(), failure, &failed));
    ReportDoneRequest done;
    done.set_job_id(job);
    done.set_node_id("a");
    done.set_node_secret(secret_a_);
    ReportDoneResponse reported;
    out.emplace_back("ReportDone", stub_->ReportDone(Context(credential).get(), done, &reported));
    LeaveRequest leave;
    leave.set_job_id(job);
    leave.set_node_id("a");
    leave.set_node_secret(secret_a_);
    LeaveResponse left;
    out.emplace_back("Leave", stub_->Leave(Context(credential).get(), leave, &left));
    ListJobsResponse jobs;
    out.emplace_back("ListJobs",
                     stub_->ListJobs(Context(credential).get(), ListJobsRequest(), &jobs));
    StopRequest stop;
    stop.set_job_id(job);
    StopResponse stopped;
    out.emplace_back("Stop", stub_->Stop(Context(credential).get(), stop, &stopped));
    WatchJobRequest watch;
    watch.set_job_id(job);
    std::unique_ptr<grpc::ClientContext> context = Context(credential);
    std::unique_ptr<grpc::ClientReader<JobEvent>> reader = stub_->WatchJob(context.get(), watch);
    JobEvent event;
    EXPECT_FALSE(reader->Read(&event)) << "a refused watch sent an event";
    out.emplace_back("WatchJob", reader->Finish());
    return out;
  }

  void JoinNodeA(const std::string& job = "job") {
    absl::StatusOr<Assignment> joined = MungeClient()->JoinSync(MakeJoin(job, "a"), kRpc);
    ASSERT_TRUE(joined.ok()) << joined.status();
    secret_a_ = joined->node_secret();
  }

  MungeOptions munge_;
  FakeClock clock_;  // outlives server_, whose hub reads it
  std::unique_ptr<RendezvousServer> server_;
  std::string target_;
  std::unique_ptr<Rendezvous::Stub> stub_;
  std::string secret_a_;
};

TEST_F(MungeServiceTest, AgentClientWithMungeRunsAJobOnAHostingAgentsServer) {
  Serve(/*only_own_uid=*/true);
  std::unique_ptr<RendezvousClient> client = MungeClient();
  absl::StatusOr<Assignment> joined = client->JoinSync(MakeJoin("solo", "a"), kRpc);
  ASSERT_TRUE(joined.ok()) << joined.status();
  // No namespace on a hosting agent's: its in-process agent joins as "solo".
  EXPECT_TRUE(server_->hub()->Status("solo").ok());
  HeartbeatRequest beat;
  beat.set_job_id("solo");
  beat.set_node_id("a");
  beat.set_node_secret(joined->node_secret());
  Pending<absl::StatusOr<int64_t>> round;
  client->Heartbeat(beat, kRpc, round.Callback());
  EXPECT_TRUE(round.Wait().ok());
  StatusRequest status;
  status.set_job_id("solo");
  absl::StatusOr<StatusResponse> state = client->StatusSync(status, kRpc);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->job_id(), "solo");
  ReportDoneRequest done;
  done.set_job_id("solo");
  done.set_node_id("a");
  done.set_node_secret(joined->node_secret());
  Pending<absl::Status> reported;
  client->ReportDone(done, kRpc, reported.Callback());
  EXPECT_TRUE(reported.Wait().ok());
}

TEST_F(MungeServiceTest, OnMusterdAJobIsKeptInItsUidsNamespace) {
  Serve(/*only_own_uid=*/false);
  std::unique_ptr<RendezvousClient> client = MungeClient();
  absl::StatusOr<Assignment> joined = client->JoinSync(MakeJoin("job", "a"), kRpc);
  ASSERT_TRUE(joined.ok()) << joined.status();
  const std::string own = absl::StrCat(::getuid(), "/job");
  EXPECT_TRUE(server_->hub()->Status(own).ok()) << own;
  EXPECT_TRUE(absl::IsNotFound(server_->hub()->Status("job").status()));
  // The caller sees its own id.
  StatusRequest status;
  status.set_job_id("job");
  absl::StatusOr<StatusResponse> state = client->StatusSync(status, kRpc);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->job_id(), "job");
  // Heartbeat and watch find the job by their uid claim; the secret does the rest.
  HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_node_id("a");
  beat.set_node_secret(joined->node_secret());
  Pending<absl::StatusOr<int64_t>> round;
  client->Heartbeat(beat, kRpc, round.Callback());
  EXPECT_TRUE(round.Wait().ok()) << round.Wait().status();
  WatchRequest watch;
  watch.set_job_id("job");
  watch.set_node_id("a");
  watch.set_node_secret(joined->node_secret());
  Pending<absl::Status> started;
  auto on_event = started.Callback();
  bool first = true;
  client->Watch(
      watch,
      [&first, on_event](const WatchEvent& event) {
        if (first && event.has_watch_started()) on_event(absl::OkStatus());
        first = false;
      },
      [](absl::Status) {});
  EXPECT_TRUE(started.Wait().ok());
  // A claim of another uid's namespace finds no such job there.
  HeartbeatRequest elsewhere = beat;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpc));
  context.AddMetadata(std::string(kUidMetadataKey), "4242");
  HeartbeatResponse answer;
  EXPECT_EQ(stub_->Heartbeat(&context, elsewhere, &answer).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // No claim at all is refused like a missing credential.
  grpc::ClientContext unclaimed;
  unclaimed.set_deadline(absl::ToChronoTime(absl::Now() + kRpc));
  grpc::Status refused = stub_->Heartbeat(&unclaimed, beat, &answer);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(refused.error_message(), kRefusedMessage);
}

TEST_F(MungeServiceTest, CallsWithoutAValidCredentialAreRefusedWithOneMessage) {
  for (bool only_own_uid : {true, false}) {
    SCOPED_TRACE(only_own_uid ? "hosting agent" : "musterd");
    Serve(only_own_uid);
    JoinNodeA();
    const std::vector<std::optional<std::string>> bad = {
        std::nullopt, std::string(), std::string("garbage"), std::string("MUNGE:AwQFAAD4ZZZZ:")};
    for (const std::optional<std::string>& credential : bad) {
      for (const char* job : {"job", "no-such-job"}) {
        for (const auto& [method, status] : CallEachNeedingACredential(credential, job)) {
          EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
              << method << " with '" << credential.value_or("(none)") << "' for " << job << ": "
              << status.error_message();
          EXPECT_EQ(status.error_message(), kRefusedMessage) << method;
        }
      }
    }
    // Nothing the refused calls asked for happened.
    absl::StatusOr<StatusResponse> state = server_->hub()->Status(
        only_own_uid ? std::string("job") : absl::StrCat(::getuid(), "/job"));
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->participants(), 1);
    EXPECT_EQ(state->state(), "running");
    server_.reset();
  }
}

TEST_F(MungeServiceTest, AReplayedCredentialIsRefused) {
  Serve(/*only_own_uid=*/true);
  JoinNodeA();
  absl::StatusOr<std::string> credential = EncodeMungeCredential(munge_);
  ASSERT_TRUE(credential.ok()) << credential.status();
  StatusRequest request;
  request.set_job_id("job");
  StatusResponse response;
  EXPECT_TRUE(stub_->Status(Context(*credential).get(), request, &response).ok());
  grpc::Status again = stub_->Status(Context(*credential).get(), request, &response);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(again.error_message(), kRefusedMessage);
}

TEST_F(MungeServiceTest, AHostingAgentsServerDeniesAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to make a credential as nobody";
  Serve(/*only_own_uid=*/true);
  JoinNodeA();
  for (const char* method : {"Join", "Status"}) {
    absl::StatusOr<std::string> credential = MungeCredentialAs(kNobody, munge_.socket);
    ASSERT_TRUE(credential.ok()) << credential.status();
    grpc::Status status;
    if (std::string(method) == "Join") {
      JoinResponse response;
      status = stub_->Join(Context(*credential).get(), MakeJoin("job", "intruder"), &response);
    } else {
      StatusRequest request;
      request.set_job_id("job");
      StatusResponse response;
      status = stub_->Status(Context(*credential).get(), request, &response);
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << method;
    EXPECT_EQ(
        status.error_message(),
        absl::StrCat("uid 65534 may not use this rendezvous: it serves uid ", ::getuid(), "'s job"))
        << method;
  }
  absl::StatusOr<StatusResponse> state = server_->hub()->Status("job");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->participants(), 1);
}

TEST_F(MungeServiceTest, OnMusterdAnotherUidsJobOfTheSameIdIsAnotherJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to make a credential as nobody";
  Serve(/*only_own_uid=*/false);
  JoinNodeA();  // root's "job": one node, running
  // nobody cannot see root's job...
  absl::StatusOr<std::string> credential = MungeCredentialAs(kNobody, munge_.socket);
  ASSERT_TRUE(credential.ok()) << credential.status();
  StatusRequest request;
  request.set_job_id("job");
  StatusResponse response;
  EXPECT_EQ(stub_->Status(Context(*credential).get(), request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // ...and its join of "job", with other rules, opens a job of its own.
  credential = MungeCredentialAs(kNobody, munge_.socket);
  ASSERT_TRUE(credential.ok()) << credential.status();
  JoinResponse joined;
  grpc::Status status =
      stub_->Join(Context(*credential).get(), MakeJoin("job", "a", /*nodes=*/1), &joined);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_NE(joined.assignment().node_secret(), secret_a_);
  absl::StatusOr<StatusResponse> mine = server_->hub()->Status(absl::StrCat(::getuid(), "/job"));
  absl::StatusOr<StatusResponse> theirs = server_->hub()->Status("65534/job");
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_EQ(mine->participants(), 1);
  EXPECT_EQ(theirs->participants(), 1);
  // Its node "a" is not root's node "a": root's secret does not work there.
  HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_node_id("a");
  beat.set_node_secret(secret_a_);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpc));
  context.AddMetadata(std::string(kUidMetadataKey), "65534");
  HeartbeatResponse answer;
  EXPECT_EQ(stub_->Heartbeat(&context, beat, &answer).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(MungeServiceTest, OnMusterdAnOperatorSeesAndStopsOnlyItsOwnUidsJobs) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to make a credential as nobody";
  Serve(/*only_own_uid=*/false);
  JoinNodeA();  // root's "job": one node, running
  auto as_nobody = [&]() {
    absl::StatusOr<std::string> credential = MungeCredentialAs(kNobody, munge_.socket);
    EXPECT_TRUE(credential.ok()) << credential.status();
    return Context(credential.value_or("none"));
  };
  ListJobsResponse listed;
  ASSERT_TRUE(stub_->ListJobs(as_nobody().get(), ListJobsRequest(), &listed).ok());
  EXPECT_EQ(listed.total(), 0) << "nobody sees none of root's jobs";
  StopRequest stop;
  stop.set_job_id("job");
  StopResponse stopped;
  EXPECT_EQ(stub_->Stop(as_nobody().get(), stop, &stopped).error_code(),
            grpc::StatusCode::NOT_FOUND);
  WatchJobRequest watch;
  watch.set_job_id("job");
  std::unique_ptr<grpc::ClientContext> context = as_nobody();
  std::unique_ptr<grpc::ClientReader<JobEvent>> reader = stub_->WatchJob(context.get(), watch);
  JobEvent event;
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  absl::StatusOr<StatusResponse> still = server_->hub()->Status(absl::StrCat(::getuid(), "/job"));
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), "running");

  // Root itself sees its job under the id it gave, and its events name it so.
  absl::StatusOr<std::string> mine = EncodeMungeCredential(munge_);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(stub_->ListJobs(Context(*mine).get(), ListJobsRequest(), &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).job_id(), "job");
  mine = EncodeMungeCredential(munge_);
  ASSERT_TRUE(mine.ok()) << mine.status();
  std::unique_ptr<grpc::ClientContext> own = Context(*mine);
  own->set_deadline(absl::ToChronoTime(absl::Now() + kRpc));
  reader = stub_->WatchJob(own.get(), watch);
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.kind(), JobEvent::NODE_JOINED);
  EXPECT_EQ(event.job_id(), "job");
  mine = EncodeMungeCredential(munge_);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(stub_->Stop(Context(*mine).get(), stop, &stopped).ok());
  while (reader->Read(&event)) {
  }
  EXPECT_EQ(event.kind(), JobEvent::JOB_CLOSED) << "the watch ends with the close";
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(MungeServiceTest, TheJobIdBoundIsOnTheCallersId) {
  Serve(/*only_own_uid=*/false);
  std::unique_ptr<RendezvousClient> client = MungeClient();
  EXPECT_TRUE(client->JoinSync(MakeJoin(std::string(kMaxJobIdLength, 'j'), "a"), kRpc).ok());
  absl::StatusOr<Assignment> long_id =
      client->JoinSync(MakeJoin(std::string(kMaxJobIdLength + 1, 'j'), "a"), kRpc);
  EXPECT_TRUE(absl::IsInvalidArgument(long_id.status())) << long_id.status();
}

TEST_F(MungeServiceTest, AClientWhoseMungedIsDownFailsNamingTheSocket) {
  Serve(/*only_own_uid=*/true);
  ClientOptions options;
  options.munge = MungeOptions{dir_ + "/no-such.sock"};
  std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target_, options);
  absl::StatusOr<Assignment> joined = client->JoinSync(MakeJoin("job", "a"), kRpc);
  EXPECT_TRUE(absl::IsFailedPrecondition(joined.status())) << joined.status();
  EXPECT_THAT(joined.status().message(), HasSubstr(dir_ + "/no-such.sock"));
  EXPECT_TRUE(absl::IsNotFound(server_->hub()->Status("job").status()));
}

}  // namespace
}  // namespace muster::rdzv
