// Munge credentials against a real munged of the test's own (its own key and
// socket, started here, stopped at the end): skipped where munged is not
// installed.
#include "rendezvous/auth/munge.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/private_munged.h"

namespace muster::rdzv {
namespace {

class MungeCredentialTest : public PrivateMungedTest {
 protected:
  void SetUp() override {
    PrivateMungedTest::SetUp();
    if (Ready()) options_.socket = munged_->socket();
  }

  MungeOptions options_;
};

TEST_F(MungeCredentialTest, ACredentialSaysWhoMadeIt) {
  absl::StatusOr<std::string> credential = EncodeMungeCredential(options_);
  ASSERT_TRUE(credential.ok()) << credential.status();
  absl::StatusOr<MungeIdentity> identity = DecodeMungeCredential(*credential, options_);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->uid, ::getuid());
  EXPECT_EQ(identity->gid, ::getgid());
}

TEST_F(MungeCredentialTest, ACredentialDecodesOnlyOnce) {
  absl::StatusOr<std::string> credential = EncodeMungeCredential(options_);
  ASSERT_TRUE(credential.ok()) << credential.status();
  ASSERT_TRUE(DecodeMungeCredential(*credential, options_).ok());
  absl::StatusOr<MungeIdentity> again = DecodeMungeCredential(*credential, options_);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnauthenticated) << again.status();
}

TEST_F(MungeCredentialTest, ForgedAndForeignCredentialsAreRefused) {
  for (const std::string forged : {"", "MUNGE:", "MUNGE:AwQFAAD4ZZZZ:", "not a credential"}) {
    absl::StatusOr<MungeIdentity> identity = DecodeMungeCredential(forged, options_);
    EXPECT_EQ(identity.status().code(), absl::StatusCode::kUnauthenticated)
        << "'" << forged << "': " << identity.status();
  }
  // Made by a munged of another key: another cluster's.
  PrivateMunged other(dir_ + "/b");
  ASSERT_TRUE(other.started()) << other.error();
  absl::StatusOr<std::string> foreign = EncodeMungeCredential({other.socket()});
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  absl::StatusOr<MungeIdentity> identity = DecodeMungeCredential(*foreign, options_);
  EXPECT_EQ(identity.status().code(), absl::StatusCode::kUnauthenticated) << identity.status();
}

TEST_F(MungeCredentialTest, NoMungedIsUnavailableAndNamesTheSocket) {
  const MungeOptions missing{dir_ + "/no-such.sock"};
  EXPECT_FALSE(MungeSocketPresent(missing));
  absl::StatusOr<std::string> credential = EncodeMungeCredential(missing);
  EXPECT_EQ(credential.status().code(), absl::StatusCode::kUnavailable) << credential.status();
  EXPECT_NE(credential.status().message().find(missing.socket), std::string::npos)
      << credential.status();
}

// As root, a child that drops to nobody (65534) makes a credential: it
// decodes as nobody's, which is what the rendezvous keeps jobs apart by.
TEST_F(MungeCredentialTest, AnotherUidsCredentialSaysThatUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a child as nobody";
  absl::StatusOr<std::string> made =
      AsUid(65534, 65534, [this] { return EncodeMungeCredential(options_); });
  ASSERT_TRUE(made.ok()) << made.status();
  const std::string credential = *made;
  absl::StatusOr<MungeIdentity> identity = DecodeMungeCredential(credential, options_);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->uid, 65534u);
  EXPECT_EQ(identity->gid, 65534u);
}

}  // namespace
}  // namespace muster::rdzv
