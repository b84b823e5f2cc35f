#include "bench/server_under_test.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/unique_handle.h"

extern char** environ;

namespace muster::rdzv::scale {
namespace {

class ChildServer final : public ServerUnderTest {
 public:
  static absl::StatusOr<std::unique_ptr<ChildServer>> Spawn(absl::Duration limit,
                                                            bool deadlock_detection,
                                                            absl::Duration keepalive_interval) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2");
    UniqueFd child_stdin(fds[0]), to_child(fds[1]);
    if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2");
    UniqueFd from_child(fds[0]), child_stdout(fds[1]);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // dup2 clears O_CLOEXEC on the copies: the child keeps exactly these two.
    posix_spawn_file_actions_adddup2(&actions, child_stdin.get(), STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, child_stdout.get(), STDOUT_FILENO);
    const std::string seconds = absl::StrCat(absl::ToInt64Seconds(limit) + 1);
    const std::string keepalive = absl::StrCat(absl::ToDoubleSeconds(keepalive_interval));
    const char* argv[] = {"rdzv_scale",
                          "--serve",
                          "--timeout",
                          seconds.c_str(),
                          "--keepalive-interval",
                          keepalive.c_str(),
                          deadlock_detection ? "--server-deadlock-detection" : nullptr,
                          nullptr};
    // The real path, not /proc/self/exe: profilers then find the binary's symbols.
    char self[4096];
    const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
    self[length > 0 ? length : 0] = '\0';
    pid_t pid = 0;
    const int error = posix_spawn(&pid, length > 0 ? self : "/proc/self/exe", &actions, nullptr,
                                  const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) return ErrnoToStatus(error, "posix_spawn rdzv_scale --serve");
    child_stdin.reset();
    child_stdout.reset();  // so a child that dies gives EOF
    std::unique_ptr<ChildServer> child(new ChildServer(pid, std::move(to_child)));

    // The port, within 10 s.
    std::string line;
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (line.find('\n') == std::string::npos && absl::Now() < end) {
      pollfd fd{from_child.get(), POLLIN, 0};
      if (poll(&fd, 1, 100) <= 0) continue;
      char buffer[32];
      const ssize_t n = read(from_child.get(), buffer, sizeof buffer);
      if (n <= 0) break;
      line.append(buffer, n);
    }
    child->port_ = std::atoi(line.c_str());
    if (child->port_ <= 0) return absl::UnavailableError("the server child did not report a port");
    return child;
  }

  // Closes the child's stdin, which ends it; kills it if it is still there 5 s later.
  ~ChildServer() override {
    stdin_.reset();
    const absl::Time end = absl::Now() + absl::Seconds(5);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (absl::Now() > end) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  std::string target() const override { return absl::StrCat("127.0.0.1:", port_); }
  pid_t pid() const override { return pid_; }

 private:
  ChildServer(pid_t pid, UniqueFd stdin_fd) : pid_(pid), stdin_(std::move(stdin_fd)) {}
  const pid_t pid_;
  UniqueFd stdin_;
  int port_ = 0;
};

class InProcessServer final : public ServerUnderTest {
 public:
  explicit InProcessServer(std::unique_ptr<RendezvousServer> server) : server_(std::move(server)) {}
  std::string target() const override { return absl::StrCat("127.0.0.1:", server_->port()); }
  pid_t pid() const override { return getpid(); }

 private:
  std::unique_ptr<RendezvousServer> server_;
};

class ExternalServer final : public ServerUnderTest {
 public:
  ExternalServer(std::string target, pid_t pid) : target_(std::move(target)), pid_(pid) {}
  std::string target() const override { return target_; }
  pid_t pid() const override { return pid_; }

 private:
  const std::string target_;
  const pid_t pid_;
};

}  // namespace

int ServeMain(absl::Duration limit, bool deadlock_detection, const ServerOptions& options) {
  if (!deadlock_detection) absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start("127.0.0.1", 0, options);
  if (!server.ok()) {
    std::fprintf(stderr, "rdzv_scale --serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string port = absl::StrCat((*server)->port(), "\n");
  if (write(STDOUT_FILENO, port.data(), port.size()) != static_cast<ssize_t>(port.size())) return 1;
  const absl::Time end = absl::Now() + limit;
  char buffer[64];
  while (absl::Now() < end) {
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    const int ms =
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(end - absl::Now()), 1000));
    if (poll(&fd, 1, std::max(ms, 1)) > 0 && read(STDIN_FILENO, buffer, sizeof buffer) <= 0) break;
  }
  (*server)->Shutdown(absl::ZeroDuration());
  return 0;
}

absl::StatusOr<std::unique_ptr<ServerUnderTest>> StartServerUnderTest(const ServerPlace& place,
                                                                      const ServerOptions& options,
                                                                      absl::Duration limit,
                                                                      bool deadlock_detection) {
  if (!place.connect.empty()) {
    return std::make_unique<ExternalServer>(place.connect, place.connect_pid);
  }
  if (place.mode == "in-process") {
    absl::StatusOr<std::unique_ptr<RendezvousServer>> started =
        RendezvousServer::Start("127.0.0.1", 0, options);
    if (!started.ok()) return started.status();
    return std::make_unique<InProcessServer>(*std::move(started));
  }
  absl::StatusOr<std::unique_ptr<ChildServer>> child =
      ChildServer::Spawn(limit, deadlock_detection, options.keepalive_interval);
  if (!child.ok()) return child.status();
  return std::unique_ptr<ServerUnderTest>(*std::move(child));
}

}  // namespace muster::rdzv::scale
