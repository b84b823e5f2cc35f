// Munge credentials against a real munged of the test's own (its own key and
// socket, started here, stopped at the end): skipped where munged is not
// installed.
#include "rendezvous/munge_credential.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace muster::rdzv {
namespace {

constexpr char kMunged[] = "/usr/sbin/munged";

// A munged with a key of its own, in a temporary directory.
class PrivateMunged {
 public:
  explicit PrivateMunged(const std::string& dir) : dir_(dir) {
    std::filesystem::create_directories(dir_ + "/key");
    std::filesystem::permissions(dir_ + "/key", std::filesystem::perms::owner_all);
    // The socket's directory: reachable by every uid, writable by none but its owner.
    ::chmod(dir_.c_str(), 0755);
    {
      std::ofstream key(dir_ + "/key/munge.key", std::ios::binary);
      std::ifstream random("/dev/urandom", std::ios::binary);
      char bytes[1024];
      random.read(bytes, sizeof(bytes));
      key.write(bytes, sizeof(bytes));
    }
    ::chmod((dir_ + "/key/munge.key").c_str(), 0400);
    const std::string command =
        std::string(kMunged) + " --key-file=" + dir_ + "/key/munge.key --socket=" + socket() +
        " --pid-file=" + dir_ + "/munged.pid --log-file=" + dir_ +
        "/munged.log --seed-file=" + dir_ + "/key/seed --force 2>" + dir_ + "/munged.err";
    started_ = std::system(command.c_str()) == 0;
    for (int i = 0; started_ && i < 500 && !MungeSocketPresent({socket()}); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~PrivateMunged() {
    std::ifstream pid_file(dir_ + "/munged.pid");
    pid_t pid = 0;
    if (!(pid_file >> pid) || pid <= 0) return;
    // Waited for: it removes its own files as it goes.
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 500 && ::kill(pid, 0) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  bool started() const { return started_ && MungeSocketPresent({socket()}); }
  std::string socket() const { return dir_ + "/munge.sock"; }
  std::string error() const {
    std::ifstream err(dir_ + "/munged.err");
    return std::string(std::istreambuf_iterator<char>(err), {});
  }

 private:
  std::string dir_;
  bool started_ = false;
};

class MungeCredentialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kMunged, X_OK) != 0) GTEST_SKIP() << kMunged << " is not installed (munge)";
    char pattern[] = "/tmp/muster-munge-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    ::chmod(dir_.c_str(), 0755);  // nobody reaches the socket below it
    munged_ = std::make_unique<PrivateMunged>(dir_ + "/a");
    ASSERT_TRUE(munged_->started()) << "munged did not start: " << munged_->error();
    options_.socket = munged_->socket();
  }
  void TearDown() override {
    munged_.reset();
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  std::string dir_;
  std::unique_ptr<PrivateMunged> munged_;
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
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    absl::StatusOr<std::string> credential = EncodeMungeCredential(options_);
    if (!credential.ok()) ::_exit(3);
    const ssize_t n = ::write(fds[1], credential->data(), credential->size());
    ::_exit(n == static_cast<ssize_t>(credential->size()) ? 0 : 4);
  }
  ::close(fds[1]);
  std::string credential;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) credential.append(buffer, n);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  absl::StatusOr<MungeIdentity> identity = DecodeMungeCredential(credential, options_);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->uid, 65534u);
  EXPECT_EQ(identity->gid, 65534u);
}

}  // namespace
}  // namespace muster::rdzv
