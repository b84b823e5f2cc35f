// The rendezvous server and the agents' client over TLS on loopback, with
// certificates openssl makes at test time (skipped where it is missing): a
// job forms over TLS, plaintext is refused, and a client that cannot
// connect says what of its certificates to check.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/client/client.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/server/service.h"
#include "tests/rendezvous/server/requests.h"
#include "tests/support/certificates.h"
#include "tests/support/temp_dir.h"

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

StatusRequest StatusOf(const std::string& job) {
  StatusRequest request;
  request.set_job_id(job);
  return request;
}

class ServiceTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kOpenssl, X_OK) != 0) GTEST_SKIP() << kOpenssl << " is not installed";
    ASSERT_TRUE(MakeCertificates(dir_)) << "openssl failed; see " << dir_ << "/openssl.log";
  }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::ZeroDuration());
  }
  std::string File(const std::string& name) const { return dir_ + "/" + name; }

  // A server with the token; with `mutual`, it requires client certificates.
  void Serve(bool mutual) {
    ServerOptions options;
    options.token = kToken;
    options.tls = {mutual ? File("ca.pem") : "", File("server.pem"), File("server.key")};
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        RendezvousServer::Start("127.0.0.1", 0, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  std::unique_ptr<RendezvousClient> Client(TlsFiles tls, const std::string& host = "127.0.0.1") {
    ClientOptions options;
    options.token = kToken;
    options.tls = std::move(tls);
    return RendezvousClient::Create(host + ":" + std::to_string(server_->port()), options);
  }
  TlsFiles ClientCertificate() const {
    return {File("ca.pem"), File("client.pem"), File("client.key")};
  }

  support::TempDir temp_{"muster-service-tls"};
  const std::string dir_ = temp_.path();
  std::unique_ptr<RendezvousServer> server_;
  std::string target_;
};

TEST_F(ServiceTlsTest, AJobFormsOverMutualTls) {
  Serve(/*mutual=*/true);
  absl::StatusOr<Assignment> joined =
      Client(ClientCertificate())->JoinSync(MakeJoin("j", "a"), kRpc);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->world_size(), 1);
}

TEST_F(ServiceTlsTest, AJobFormsWhenOnlyTheServerHasACertificate) {
  Serve(/*mutual=*/false);
  absl::StatusOr<Assignment> joined =
      Client({File("ca.pem"), "", ""})->JoinSync(MakeJoin("j", "a"), kRpc);
  ASSERT_TRUE(joined.ok()) << joined.status();
}

TEST_F(ServiceTlsTest, PlaintextClientsAreRefusedBeforeAnyCall) {
  Serve(/*mutual=*/true);
  // The agents' client without TLS, token and all.
  ClientOptions plaintext;
  plaintext.token = kToken;
  std::unique_ptr<RendezvousClient> client = RendezvousClient::Create(target_, plaintext);
  absl::StatusOr<StatusResponse> status = client->StatusSync(StatusOf("j"), kRpc);
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable) << status.status();
  EXPECT_THAT(status.status().message(), Not(HasSubstr("TLS:")))
      << "a client without TLS has no certificates to check";

  // An outsider's stub, a join that does not wait for the connection.
  auto stub = Rendezvous::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpc));
  context.AddMetadata("authorization", std::string("Bearer ") + kToken);
  JoinResponse response;
  grpc::Status joined = stub->Join(&context, MakeJoin("j", "a"), &response);
  EXPECT_EQ(joined.error_code(), grpc::StatusCode::UNAVAILABLE) << joined.error_message();
  EXPECT_EQ(server_->hub()->Status("j").status().code(), absl::StatusCode::kNotFound)
      << "the refused join opened a job";
}

TEST_F(ServiceTlsTest, AFailedHandshakeSaysWhatToCheck) {
  Serve(/*mutual=*/true);
  const absl::Status other_ca =
      Client({File("other-ca.pem"), File("client.pem"), File("client.key")})
          ->StatusSync(StatusOf("j"), kRpc)
          .status();
  EXPECT_EQ(other_ca.code(), absl::StatusCode::kUnavailable) << other_ca;
  EXPECT_THAT(other_ca.message(),
              HasSubstr("TLS: check that " + File("other-ca.pem") +
                        " signed the server's certificate and that it names 127.0.0.1"));

  const absl::Status other_name =
      Client(ClientCertificate(), "localhost")->StatusSync(StatusOf("j"), kRpc).status();
  EXPECT_EQ(other_name.code(), absl::StatusCode::kUnavailable) << other_name;
  EXPECT_THAT(other_name.message(), HasSubstr("that it names localhost"));

  const absl::Status no_certificate =
      Client({File("ca.pem"), "", ""})->StatusSync(StatusOf("j"), kRpc).status();
  EXPECT_EQ(no_certificate.code(), absl::StatusCode::kUnavailable) << no_certificate;
  EXPECT_THAT(no_certificate.message(), HasSubstr("give cert=PATH,key=PATH"));
}

TEST_F(ServiceTlsTest, AServerThatIsNotThereGetsNoTlsHint) {
  Serve(/*mutual=*/true);
  const int port = server_->port();
  server_->Shutdown(absl::ZeroDuration());
  server_.reset();
  ClientOptions options;
  options.tls = ClientCertificate();
  const absl::Status status = RendezvousClient::Create("127.0.0.1:" + std::to_string(port), options)
                                  ->StatusSync(StatusOf("j"), kRpc)
                                  .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), Not(HasSubstr("TLS:")));
}

TEST_F(ServiceTlsTest, UnusableFilesFailEveryCallAndNeverFallBackToPlaintext) {
  Serve(/*mutual=*/false);
  std::unique_ptr<RendezvousClient> client = Client({File("ca.pem"), File("client.pem"), ""});
  const absl::Status status = client->StatusSync(StatusOf("j"), kRpc).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("cert and key together"));
  EXPECT_EQ(client->JoinSync(MakeJoin("j", "a"), kRpc).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ServiceTlsTest, AServerWithUnusableFilesDoesNotStart) {
  ASSERT_EQ(::chmod(File("server.key").c_str(), 0644), 0);
  ServerOptions options;
  options.tls = {"", File("server.pem"), File("server.key")};
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start("127.0.0.1", 0, options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("chmod 600 " + File("server.key")));
}

}  // namespace
}  // namespace muster::rdzv
