// A munged of a test's own: its own key and socket in a directory the test
// gives, started by the constructor, stopped by the destructor. For tests of
// munge credentials that must not depend on (or disturb) the host's munged.
#ifndef MUSTER_TESTS_SUPPORT_PRIVATE_MUNGED_H_
#define MUSTER_TESTS_SUPPORT_PRIVATE_MUNGED_H_

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "rendezvous/auth/munge.h"
#include "tests/support/temp_dir.h"

namespace muster::rdzv {

inline constexpr char kMunged[] = "/usr/sbin/munged";

// A munged with a key of its own, in `dir` (created).
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
  PrivateMunged(const PrivateMunged&) = delete;
  PrivateMunged& operator=(const PrivateMunged&) = delete;

  bool started() const { return started_ && MungeSocketPresent({socket()}); }
  std::string socket() const { return dir_ + "/munge.sock"; }
  std::string error() const { return support::ReadFile(dir_ + "/munged.err"); }

 private:
  std::string dir_;
  bool started_ = false;
};

// A fixture with a private munged in a temporary directory (dir_/m),
// skipped where munged is not installed; both are gone after the test.
class PrivateMungedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kMunged, X_OK) != 0) GTEST_SKIP() << kMunged << " is not installed (munge)";
    ::chmod(dir_.c_str(), 0755);  // nobody reaches the socket below it
    munged_ = std::make_unique<PrivateMunged>(dir_ + "/m");
    ASSERT_TRUE(munged_->started()) << "munged did not start: " << munged_->error();
  }
  void TearDown() override { munged_.reset(); }
  // Whether SetUp got a munged running (else the test is skipped or failed).
  bool Ready() const { return !IsSkipped() && !HasFatalFailure(); }

  support::TempDir temp_{"muster-munge"};
  const std::string dir_ = temp_.path();
  std::unique_ptr<PrivateMunged> munged_;
};

// Runs `make` in a child process that has dropped to `uid` and `gid` (the
// caller must be root) and returns what it wrote: e.g. a credential of
// another user's. The child runs more than async-signal-safe code: call it
// only while the process has one thread (before any gRPC server starts;
// else see MungeCredentialAs). Errors: kInternal, with the child's exit
// status.
inline absl::StatusOr<std::string> AsUid(uid_t uid, gid_t gid,
                                         const std::function<absl::StatusOr<std::string>()>& make) {
  int fds[2];
  if (::pipe(fds) != 0) return absl::InternalError("pipe failed");
  const pid_t child = ::fork();
  if (child < 0) return absl::InternalError("fork failed");
  if (child == 0) {
    ::close(fds[0]);
    if (::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(2);
    absl::StatusOr<std::string> made = make();
    if (!made.ok()) ::_exit(3);
    const ssize_t n = ::write(fds[1], made->data(), made->size());
    ::_exit(n == static_cast<ssize_t>(made->size()) ? 0 : 4);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) {
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError("the child as uid " + std::to_string(uid) + " failed, status " +
                               std::to_string(status));
  }
  return out;
}

// A credential of `uid`'s from the munged at `socket`, made by munge(1) run
// as that uid (setpriv; the caller must be root): safe in a process with
// threads. Errors: kInternal.
inline absl::StatusOr<std::string> MungeCredentialAs(uid_t uid, const std::string& socket) {
  const std::string command = "setpriv --reuid=" + std::to_string(uid) +
                              " --regid=" + std::to_string(uid) +
                              " --clear-groups /usr/bin/munge -n -S " + socket;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen failed: " + command);
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
  const int status = ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (status != 0 || out.empty()) {
    return absl::InternalError(command + " failed, status " + std::to_string(status));
  }
  return out;
}

}  // namespace muster::rdzv

#endif  // MUSTER_TESTS_SUPPORT_PRIVATE_MUNGED_H_
