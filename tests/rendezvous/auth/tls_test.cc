// TLS credentials between a real gRPC server and client on loopback, with a
// certificate authority, a server and a client certificate made by openssl
// at test time: skipped where openssl is not installed.
#include "rendezvous/auth/tls.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/server/hub.h"
#include "rendezvous/server/service.h"
#include "tests/support/certificates.h"
#include "tests/support/temp_dir.h"

namespace muster::rdzv {
namespace {

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kOpenssl, X_OK) != 0) GTEST_SKIP() << kOpenssl << " is not installed";
    ASSERT_TRUE(MakeCertificates(dir_)) << "openssl failed; see " << dir_ << "/openssl.log";
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    if (hub_) hub_->Shutdown();
  }
  std::string File(const std::string& name) const { return dir_ + "/" + name; }

  // Starts a rendezvous server on loopback with these server credentials.
  void Serve(std::shared_ptr<grpc::ServerCredentials> credentials) {
    hub_ = std::make_shared<RendezvousHub>();
    service_ = std::make_unique<RendezvousService>(hub_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  // A Status call over `credentials` to `host`:port: NOT_FOUND (no such job)
  // means the call got through.
  grpc::StatusCode Call(std::shared_ptr<grpc::ChannelCredentials> credentials,
                        const std::string& host = "127.0.0.1") {
    auto stub =
        Rendezvous::NewStub(grpc::CreateChannel(host + ":" + std::to_string(port_), credentials));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    StatusRequest request;
    request.set_job_id("no-such-job");
    StatusResponse response;
    return stub->Status(&context, request, &response).error_code();
  }

  support::TempDir temp_{"muster-tls"};
  const std::string dir_ = temp_.path();
  std::shared_ptr<RendezvousHub> hub_;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(TlsTest, ACallGetsThroughWhenTheServerCertificateChecksOut) {
  auto server = ServerTlsCredentials({"", File("server.pem"), File("server.key")});
  ASSERT_TRUE(server.ok()) << server.status();
  Serve(*server);
  auto client = ClientTlsCredentials({File("ca.pem"), "", ""});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(Call(*client), grpc::StatusCode::NOT_FOUND);
}

TEST_F(TlsTest, APlaintextClientAnotherAuthorityAndAnotherNameAreRefused) {
  auto server = ServerTlsCredentials({"", File("server.pem"), File("server.key")});
  ASSERT_TRUE(server.ok()) << server.status();
  Serve(*server);
  EXPECT_EQ(Call(grpc::InsecureChannelCredentials()), grpc::StatusCode::UNAVAILABLE);
  auto other = ClientTlsCredentials({File("other-ca.pem"), "", ""});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(Call(*other), grpc::StatusCode::UNAVAILABLE) << "signed by an authority not trusted";
  auto client = ClientTlsCredentials({File("ca.pem"), "", ""});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(Call(*client, "localhost"), grpc::StatusCode::UNAVAILABLE)
      << "the certificate names 127.0.0.1, not localhost";
}

TEST_F(TlsTest, WithACaTheServerWantsAClientCertificate) {
  auto server = ServerTlsCredentials({File("ca.pem"), File("server.pem"), File("server.key")});
  ASSERT_TRUE(server.ok()) << server.status();
  Serve(*server);
  auto anonymous = ClientTlsCredentials({File("ca.pem"), "", ""});
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_EQ(Call(*anonymous), grpc::StatusCode::UNAVAILABLE);
  auto client = ClientTlsCredentials({File("ca.pem"), File("client.pem"), File("client.key")});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(Call(*client), grpc::StatusCode::NOT_FOUND);
}

TEST_F(TlsTest, BadFilesAreErrorsThatNameTheFileAndTheFix) {
  auto missing = ServerTlsCredentials({"", File("nope.pem"), File("server.key")});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("nope.pem"), std::string::npos) << missing.status();

  ASSERT_EQ(::chmod(File("server.key").c_str(), 0644), 0);
  auto open_key = ServerTlsCredentials({"", File("server.pem"), File("server.key")});
  EXPECT_NE(open_key.status().message().find("chmod 600 " + File("server.key")), std::string::npos)
      << open_key.status();
  EXPECT_NE(open_key.status().message().find("0644"), std::string::npos) << open_key.status();

  auto half = ClientTlsCredentials({File("ca.pem"), File("client.pem"), ""});
  EXPECT_NE(half.status().message().find("cert and key together"), std::string::npos)
      << half.status();
  auto no_ca = ClientTlsCredentials({"", "", ""});
  EXPECT_NE(no_ca.status().message().find("cacert=PATH"), std::string::npos) << no_ca.status();
  auto not_pem = ClientTlsCredentials({File("server.ext"), "", ""});
  EXPECT_NE(not_pem.status().message().find("not PEM"), std::string::npos) << not_pem.status();
}

}  // namespace
}  // namespace muster::rdzv
