#include "bench/server_under_test.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "common/unique_handle.h"
#include "rendezvous/server/journal.h"

extern char** environ;

namespace muster::rdzv::scale {
namespace {

// Waits for `pid` to exit, at most `grace`; then kills it and waits.
void Reap(pid_t pid, absl::Duration grace) {
  const absl::Time end = absl::Now() + grace;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// A child server process and the pipes to it.
struct ChildProcess {
  pid_t pid = 0;
  UniqueFd stdin_fd;  // closing it ends the child
  int port = 0;
};

// This binary re-executed with --serve, listening on `port` (0: any) with
// its state in `state_dir` (none if empty); returns once it has printed its
// port, within 10 s.
absl::StatusOr<ChildProcess> SpawnServe(absl::Duration limit, bool deadlock_detection,
                                        absl::Duration keepalive_interval,
                                        absl::Duration ping_interval, int port,
                                        const std::string& state_dir) {
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
  const std::string port_text = absl::StrCat(port);
  const std::string ping = absl::StrCat(absl::ToDoubleSeconds(ping_interval));
  std::vector<const char*> argv = {
      "rdzv_scale",      "--serve",      "--timeout",       seconds.c_str(), "--keepalive-interval",
      keepalive.c_str(), "--serve-port", port_text.c_str(), "--server-ping", ping.c_str()};
  if (deadlock_detection) argv.push_back("--server-deadlock-detection");
  if (!state_dir.empty()) {
    argv.push_back("--state-dir");
    argv.push_back(state_dir.c_str());
  }
  argv.push_back(nullptr);
  // The real path, not /proc/self/exe: profilers then find the binary's symbols.
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  self[length > 0 ? length : 0] = '\0';
  ChildProcess child;
  const int error = posix_spawn(&child.pid, length > 0 ? self : "/proc/self/exe", &actions, nullptr,
                                const_cast<char* const*>(argv.data()), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return ErrnoToStatus(error, "posix_spawn rdzv_scale --serve");
  child_stdin.reset();
  child_stdout.reset();  // so a child that dies gives EOF
  child.stdin_fd = std::move(to_child);

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
  child.port = std::atoi(line.c_str());
  if (child.port <= 0) {
    Reap(child.pid, absl::Seconds(5));
    return absl::UnavailableError("the server child did not report a port");
  }
  return child;
}

class ChildServer final : public ServerUnderTest {
 public:
  static absl::StatusOr<std::unique_ptr<ChildServer>> Spawn(absl::Duration limit,
                                                            bool deadlock_detection,
                                                            absl::Duration keepalive_interval,
                                                            absl::Duration ping_interval,
                                                            const std::string& state_dir) {
    absl::StatusOr<ChildProcess> process =
        SpawnServe(limit, deadlock_detection, keepalive_interval, ping_interval, 0, state_dir);
    if (!process.ok()) return process.status();
    return std::unique_ptr<ChildServer>(new ChildServer(*std::move(process), limit,
                                                        deadlock_detection, keepalive_interval,
                                                        ping_interval, state_dir));
  }

  // Closes the child's stdin, which ends it; kills it if it is still there 5 s later.
  ~ChildServer() override {
    if (child_.pid <= 0) return;
    child_.stdin_fd.reset();
    Reap(child_.pid, absl::Seconds(5));
  }

  std::string target() const override { return absl::StrCat("127.0.0.1:", child_.port); }
  pid_t pid() const override { return child_.pid; }

  absl::Status KillAndRestart(RestartTimes* times) override {
    if (state_dir_.empty()) {
      return absl::FailedPreconditionError(
          "a server restart needs --state-dir: without a journal the job is lost with the server");
    }
    times->killed = std::chrono::steady_clock::now();
    kill(child_.pid, SIGKILL);
    int status = 0;
    waitpid(child_.pid, &status, 0);
    child_.pid = 0;
    child_.stdin_fd.reset();
    times->spawned = std::chrono::steady_clock::now();
    absl::StatusOr<ChildProcess> next = SpawnServe(limit_, deadlock_detection_, keepalive_interval_,
                                                   ping_interval_, child_.port, state_dir_);
    if (!next.ok()) return next.status();
    times->listening = std::chrono::steady_clock::now();
    child_ = *std::move(next);
    return absl::OkStatus();
  }

 private:
  ChildServer(ChildProcess child, absl::Duration limit, bool deadlock_detection,
              absl::Duration keepalive_interval, absl::Duration ping_interval,
              std::string state_dir)
      : child_(std::move(child)), limit_(limit), deadlock_detection_(deadlock_detection),
        keepalive_interval_(keepalive_interval), ping_interval_(ping_interval),
        state_dir_(std::move(state_dir)) {}

  ChildProcess child_;
  const absl::Duration limit_;
  const bool deadlock_detection_;
  const absl::Duration keepalive_interval_;
  const absl::Duration ping_interval_;
  const std::string state_dir_;
};

class InProcessServer final : public ServerUnderTest {
 public:
  explicit InProcessServer(std::unique_ptr<RendezvousServer> server) : server_(std::move(server)) {}
  std::string target() const override { return absl::StrCat("127.0.0.1:", server_->port()); }
  pid_t pid() const override { return getpid(); }
  absl::Status KillAndRestart(RestartTimes*) override {
    return absl::FailedPreconditionError("a server restart needs --server child");
  }

 private:
  std::unique_ptr<RendezvousServer> server_;
};

class ExternalServer final : public ServerUnderTest {
 public:
  ExternalServer(std::string target, pid_t pid) : target_(std::move(target)), pid_(pid) {}
  std::string target() const override { return target_; }
  pid_t pid() const override { return pid_; }
  absl::Status KillAndRestart(RestartTimes*) override {
    return absl::FailedPreconditionError("a server restart needs --server child, not --connect");
  }

 private:
  const std::string target_;
  const pid_t pid_;
};

}  // namespace

absl::Status KeepStateIn(const std::string& dir, ServerOptions* options) {
  Replayed replayed;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(dir, &replayed);
  if (!journal.ok()) return journal.status();
  if (!replayed.dropped_why.empty()) {
    std::fprintf(stderr, "rdzv_scale: %s: %s; %llu bytes dropped\n", (*journal)->path().c_str(),
                 replayed.dropped_why.c_str(),
                 static_cast<unsigned long long>(replayed.dropped_bytes));
  }
  options->hub.restore = std::move(replayed.records);
  options->hub.journal = *std::move(journal);
  options->hub.on_journal_failure = [](const absl::Status& status) {
    std::fprintf(stderr, "rdzv_scale: the journal failed: %s\n", status.ToString().c_str());
  };
  // As musterd: agents keep their workers through its outages.
  options->hub.state.ride_out_outages = true;
  return absl::OkStatus();
}

int ServeMain(absl::Duration limit, bool deadlock_detection, ServerOptions options, int port,
              const std::string& state_dir) {
  if (!deadlock_detection) absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (!state_dir.empty()) {
    if (absl::Status kept = KeepStateIn(state_dir, &options); !kept.ok()) {
      std::fprintf(stderr, "rdzv_scale --serve: --state-dir %s: %s\n", state_dir.c_str(),
                   kept.ToString().c_str());
      return 1;
    }
  }
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start("127.0.0.1", port, options);
  if (!server.ok()) {
    std::fprintf(stderr, "rdzv_scale --serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string port_line = absl::StrCat((*server)->port(), "\n");
  if (write(STDOUT_FILENO, port_line.data(), port_line.size()) !=
      static_cast<ssize_t>(port_line.size())) {
    return 1;
  }
  const absl::Time end = absl::Now() + limit;
  char buffer[64];
  while (absl::Now() < end) {
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    const int ms =
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(end - absl::Now()), 1000));
    if (poll(&fd, 1, std::max(ms, 1)) > 0 && read(STDIN_FILENO, buffer, sizeof buffer) <= 0) break;
  }
  (*server)->Shutdown(absl::ZeroDuration(),
                      state_dir.empty() ? RendezvousHub::Jobs::kLost : RendezvousHub::Jobs::kKept);
  return 0;
}

absl::StatusOr<std::unique_ptr<ServerUnderTest>> StartServerUnderTest(
    const ServerPlace& place, const ServerOptions& options, absl::Duration limit,
    bool deadlock_detection, const std::string& state_dir) {
  if (!place.connect.empty()) {
    return std::make_unique<ExternalServer>(place.connect, place.connect_pid);
  }
  if (place.mode == "in-process") {
    ServerOptions kept = options;
    if (!state_dir.empty()) MUSTER_RETURN_IF_ERROR(KeepStateIn(state_dir, &kept));
    absl::StatusOr<std::unique_ptr<RendezvousServer>> started =
        RendezvousServer::Start("127.0.0.1", 0, kept);
    if (!started.ok()) return started.status();
    return std::make_unique<InProcessServer>(*std::move(started));
  }
  absl::StatusOr<std::unique_ptr<ChildServer>> child = ChildServer::Spawn(
      limit, deadlock_detection, options.keepalive_interval, options.ping_interval, state_dir);
  if (!child.ok()) return child.status();
  return std::unique_ptr<ServerUnderTest>(*std::move(child));
}

absl::StatusOr<ScratchStateDir> ScratchStateDir::Make(const std::string& parent,
                                                      const std::string& prefix) {
  if (mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("mkdir ", parent));
  }
  std::string path = absl::StrCat(parent, "/", prefix, "-XXXXXX");
  if (mkdtemp(path.data()) == nullptr) return ErrnoToStatus(errno, absl::StrCat("mkdtemp ", path));
  return ScratchStateDir(std::move(path));
}

ScratchStateDir::~ScratchStateDir() {
  if (path_.empty()) return;
  // What a journal leaves (rendezvous/server/journal.h): nothing else is made here.
  for (const char* name : {"journal", "journal.new", "lock"}) {
    unlink(absl::StrCat(path_, "/", name).c_str());
  }
  if (rmdir(path_.c_str()) != 0) {
    std::fprintf(stderr, "rdzv_scale: cannot remove %s: %s\n", path_.c_str(), std::strerror(errno));
  }
}

int64_t ScratchStateDir::JournalBytes() const {
  struct stat st {};
  if (stat(absl::StrCat(path_, "/journal").c_str(), &st) != 0) return -1;
  return st.st_size;
}

absl::StatusOr<double> FdatasyncMs(const std::string& dir, int count) {
  absl::StatusOr<ScratchStateDir> scratch = ScratchStateDir::Make(dir, "fdatasync-probe");
  if (!scratch.ok()) return scratch.status();
  // Named as the journal, so that the scratch directory's removal takes it.
  const std::string path = absl::StrCat(scratch->path(), "/journal");
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  const std::string record(256, 'r');
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (write(fd.get(), record.data(), record.size()) != static_cast<ssize_t>(record.size())) {
      return ErrnoToStatus(errno, absl::StrCat("write ", path));
    }
    if (fdatasync(fd.get()) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync ", path));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  if (ms.empty()) return absl::InvalidArgumentError("no appends to time");
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace muster::rdzv::scale
