#include "launcher/etcd_member.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "common/free_port.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_handle.h"

namespace muster {
namespace {

constexpr absl::Duration kStopGrace = absl::Seconds(5);
constexpr absl::Duration kPoll = absl::Milliseconds(20);
constexpr size_t kLogTailBytes = 2000;

// Whether something accepts connections at host:port.
bool Listening(const std::string& host, int port) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* a = found; a != nullptr && !ok; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0));
    ok = fd.valid() && connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0;
  }
  freeaddrinfo(found);
  return ok;
}

// Whether another process listens on host:port (a bind there fails).
bool PortTaken(const std::string& host, int port) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool taken = false;
  for (addrinfo* a = found; a != nullptr && !taken; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0));
    const int on = 1;
    // A socket in TIME_WAIT is no owner; only a listening one is.
    if (fd.valid()) setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    taken = fd.valid() && bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE;
  }
  freeaddrinfo(found);
  return taken;
}

// The URL of `host`:`port` (IPv6 in brackets).
std::string Url(const std::string& host, int port) {
  return absl::StrCat("http://", FormatEndpoint(host, port));
}

// In the child, between clone and exec: async-signal-safe calls only.
[[noreturn]] void ExecEtcd(char* const* argv, int log_fd, pid_t parent) {
  setpgid(0, 0);  // a Ctrl-C to the terminal is the agent's to handle
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the agent died already
  const int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  dup2(log_fd, STDOUT_FILENO);
  dup2(log_fd, STDERR_FILENO);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execv(argv[0], argv);
  _exit(127);
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdMember>> EtcdMember::Create(EtcdMemberOptions options) {
  options.fixed_port = options.client_port != 0;
  for (int* port : {&options.client_port, &options.peer_port}) {
    if (*port == 0) *port = PickFreePort();
    if (*port == 0) return absl::UnavailableError("no free port for the job's etcd member");
  }
  return std::unique_ptr<EtcdMember>(new EtcdMember(std::move(options)));
}

std::string EtcdMember::client_url() const { return Url(options_.host, options_.client_port); }
std::string EtcdMember::peer_url() const { return Url(options_.host, options_.peer_port); }
std::string EtcdMember::endpoint() const {
  return FormatEndpoint(options_.host, options_.client_port);
}

absl::Status EtcdMember::Start(const std::string& initial_cluster, absl::Duration timeout) {
  if (thread_.joinable()) {
    return absl::FailedPreconditionError("the job's etcd member was started once already");
  }
  std::error_code error;
  std::filesystem::create_directories(options_.directory, error);
  if (error || chmod(options_.directory.c_str(), 0700) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot make ", options_.directory, " (mode 0700) for the job's etcd member"));
  }
  // A port given (the endpoint's): one agent of this host takes it; the
  // others, waiting on the lock meanwhile, then find it taken.
  UniqueFd port_lock;
  if (options_.fixed_port) {
    const std::string path =
        absl::StrCat(options_.lock_directory, "/muster-etcd-port-", options_.client_port, ".lock");
    port_lock = UniqueFd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (port_lock.valid()) {
      while (flock(port_lock.get(), LOCK_EX) != 0 && errno == EINTR) {
      }
    }
    if (PortTaken(options_.host, options_.client_port)) {
      return absl::AlreadyExistsError(absl::StrCat("port ", options_.client_port, " of ",
                                                   options_.host, " is taken by another process"));
    }
  }
  const bool fresh = initial_cluster.empty();
  std::vector<std::string> argv = {
      options_.etcd,
      "--name=" + options_.name,
      "--data-dir=" + options_.directory + "/data",
      "--listen-client-urls=" + client_url(),
      "--advertise-client-urls=" + client_url(),
      "--listen-peer-urls=" + peer_url(),
      "--initial-advertise-peer-urls=" + peer_url(),
      "--initial-cluster=" +
          (fresh ? absl::StrCat(options_.name, "=", peer_url()) : initial_cluster),
      absl::StrCat("--initial-cluster-state=", fresh ? "new" : "existing"),
      "--initial-cluster-token=" + options_.cluster_token,
      // A lost leader is replaced in about half a second (etcd's defaults,
      // 100 and 1000 ms, take a second or two), and the leases etcd renews
      // on each election (a lost node's included) start over that much
      // sooner: the members are on one job's network, not across regions.
      "--heartbeat-interval=100",
      "--election-timeout=500",
      // The leader rewrites the job's state key: keep its history short.
      "--auto-compaction-mode=revision",
      "--auto-compaction-retention=1000",
  };

  thread_ = std::thread([this, argv = std::move(argv)]() mutable { Supervise(std::move(argv)); });
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&spawned_));
      if (!spawn_error_.empty()) return absl::InternalError(spawn_error_);
      if (exited_) {
        return absl::UnavailableError(
            absl::StrCat("the job's etcd member exited as it started; the end of its log (",
                         options_.directory, "/etcd.log):\n", LogTail()));
      }
    }
    if (Listening(options_.host, options_.client_port)) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the job's etcd member does not listen on ", endpoint(), " after ",
                       absl::FormatDuration(timeout), "; the end of its log:\n", LogTail()));
    }
    absl::SleepFor(kPoll);
  }
}

void EtcdMember::Supervise(std::vector<std::string> argv) {
  std::vector<char*> args;
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  const std::string log = options_.directory + "/etcd.log";
  UniqueFd log_fd(open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  const pid_t parent = getpid();
  int pidfd = -1;
  pid_t pid = -1;
  if (log_fd.valid()) {
    // fork's clone, with a pidfd: signals and waits through it name this
    // child even once the agent's reaper (which reaps every child) took it.
    pid =
        static_cast<pid_t>(syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, nullptr, &pidfd, nullptr, 0));
    if (pid == 0) ExecEtcd(args.data(), log_fd.get(), parent);
  }
  const int spawn_errno = errno;
  {
    absl::MutexLock lock(&mu_);
    spawned_ = true;
    if (!log_fd.valid()) {
      spawn_error_ = ErrnoToStatus(spawn_errno, "open " + log).ToString();
    } else if (pid < 0) {
      spawn_error_ = ErrnoToStatus(spawn_errno, "clone for etcd").ToString();
    }
    pidfd_ = UniqueFd(pid > 0 ? pidfd : -1);
    if (pid <= 0) {
      exited_ = true;
      return;
    }
    pid_ = pid;
  }
  Logger("agent")->info("the job's etcd member {} started (pid {}), listening on {}", options_.name,
                        pid, endpoint());
  pollfd wait = {pidfd, POLLIN, 0};
  while (poll(&wait, 1, -1) < 0 && errno == EINTR) {
  }
  absl::MutexLock lock(&mu_);
  exited_ = true;
  // Reaped here unless the agent's reaper was first.
  siginfo_t info = {};
  waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG);
}

void EtcdMember::Signal(int sig) const {
  absl::MutexLock lock(&mu_);
  if (pidfd_.valid()) syscall(SYS_pidfd_send_signal, pidfd_.get(), sig, nullptr, 0);
}

bool EtcdMember::running() const {
  absl::MutexLock lock(&mu_);
  return spawned_ && !exited_;
}

bool EtcdMember::exited() const {
  absl::MutexLock lock(&mu_);
  return spawned_ && exited_;
}

std::string EtcdMember::LogTail() const {
  std::ifstream in(options_.directory + "/etcd.log");
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  return text.size() > kLogTailBytes ? text.substr(text.size() - kLogTailBytes) : text;
}

EtcdMember::~EtcdMember() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&spawned_));
    }
    Signal(SIGTERM);
    bool gone = false;
    {
      absl::MutexLock lock(&mu_);
      gone = mu_.AwaitWithTimeout(absl::Condition(&exited_), kStopGrace);
    }
    if (!gone) Signal(SIGKILL);
    thread_.join();
  }
  std::error_code ignored;
  std::filesystem::remove_all(options_.directory, ignored);
}

namespace {

class LaunchedMemberHost final : public etcd::MemberHost {
 public:
  LaunchedMemberHost(std::unique_ptr<EtcdMember> member, std::string host_name)
      : member_(std::move(member)), host_name_(std::move(host_name)) {}

  ~LaunchedMemberHost() override {
    std::thread starting;
    {
      absl::MutexLock lock(&mu_);
      starting = std::move(thread_);
    }
    if (starting.joinable()) starting.join();
    member_.reset();
  }

  etcd::MemberOffer Offer() const override {
    etcd::MemberOffer offer;
    offer.name = member_->name();
    offer.host = host_name_;
    offer.peer_url = member_->peer_url();
    offer.client_url = member_->client_url();
    return offer;
  }

  bool Seated() const override { return member_->running(); }
  bool Exited() const override { return member_->exited(); }

  void Join(const std::string& initial_cluster, std::function<void(absl::Status)> done) override {
    absl::MutexLock lock(&mu_);
    if (thread_.joinable()) return done(absl::AlreadyExistsError("its member was started once"));
    thread_ = std::thread([this, initial_cluster, done = std::move(done)] {
      done(member_->Start(initial_cluster, kJoinTimeout));
    });
  }

 private:
  // A learner catches up from the leader's snapshot: more than a new member.
  static constexpr absl::Duration kJoinTimeout = absl::Seconds(30);

  std::unique_ptr<EtcdMember> member_;
  const std::string host_name_;
  absl::Mutex mu_;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<etcd::MemberHost> NewMemberHost(std::unique_ptr<EtcdMember> member,
                                                std::string host_name) {
  return std::make_shared<LaunchedMemberHost>(std::move(member), std::move(host_name));
}

}  // namespace muster
