#include "agent/agent.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/child_process.h"
#include "agent/error_file.h"
#include "agent/failure_report.h"
#include "agent/output.h"
#include "agent/worker_env.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_fd.h"

extern char** environ;

namespace muster {
namespace {

using Clock = std::chrono::steady_clock;
using rdzv::Assignment;
using rdzv::WatchEvent;

constexpr int kForwardedSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
constexpr size_t kReadChunk = 64 * 1024;
// Extra time a join RPC gets beyond join_timeout: the server's own timer should fire first.
constexpr auto kJoinSlack = std::chrono::seconds(5);
constexpr auto kRpcTimeout = std::chrono::seconds(10);
constexpr auto kWatchRetry = std::chrono::seconds(1);
constexpr auto kProgressInterval = std::chrono::seconds(5);
constexpr auto kFirstProgress = std::chrono::seconds(2);

absl::Duration ToAbsl(Clock::duration d) { return absl::FromChrono(d); }

bool IsStopSignal(int sig) { return sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT; }

// A port that was free a moment ago, for MASTER_PORT. PyTorch's rank 0 binds
// it itself (TORCHELASTIC_USE_AGENT_STORE=False), so it is picked as late as possible.
int PickFreePort() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return 0;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 0;
  socklen_t len = sizeof(addr);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(addr.sin_port);
}

std::string RandomSuffix() {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device device;
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(kChars[device() % (sizeof(kChars) - 1)]);
  return out;
}

std::string RankRange(int first, int count) {
  return count == 1 ? absl::StrCat(first) : absl::StrCat(first, "-", first + count - 1);
}

}  // namespace

void BlockAgentSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int sig : kForwardedSignals) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // Console writes to a closed pipe must fail with EPIPE, not end the agent.
  signal(SIGPIPE, SIG_IGN);
}

class Agent::Impl {
 public:
  Impl(AgentOptions options, std::unique_ptr<rdzv::RendezvousClient> client)
      : options_(std::move(options)), config_(options_.config), client_(std::move(client)),
        logger_(Logger("agent")) {
    node_id_ = absl::StrCat(options_.host, ":", getpid(), ":", RandomSuffix());
  }

  ~Impl() {
    workers_.clear();    // kills and reaps any worker still running
    client_.reset();     // no callback runs after this
  }

  absl::StatusOr<int> Run();

 private:
  enum class Phase { kJoining, kRunning, kStopping, kFinishing, kExiting };
  // What to do once every worker of the attempt has stopped.
  enum class AfterStop { kAwaitDecision, kRejoin, kExitFailed, kExitSignal };

  struct Worker {
    int local_rank = 0;
    int rank = 0;
    std::unique_ptr<ChildProcess> process;
    std::string error_file;
    UniqueFd out_fd, err_fd;
    std::optional<WorkerOutput> out, err;
  };

  // A result from a gRPC thread, handled on the loop thread.
  struct RdzvEvent {
    enum class Kind {
      kJoined, kPushed, kWatchEnded, kFailureReported, kDoneReported, kHeartbeat, kJobStatus
    };
    explicit RdzvEvent(Kind k) : kind(k) {}
    Kind kind;
    absl::StatusOr<Assignment> assignment = absl::UnknownError("unset");
    WatchEvent event;
    absl::Status status;
    int64_t round = -1;
    rdzv::StatusResponse job_status;
  };

  absl::Status SetUp();
  absl::Status Watch(int fd, uint32_t events);
  void Post(RdzvEvent event);
  void Loop();
  void ArmTimer();

  void OnSignal(const signalfd_siginfo& info);
  void ReapChildren();
  void OnOutput(int fd);
  void DrainAndCloseOutput(Worker& worker);
  void OnRdzvEvents();
  void OnTimer();

  void StartJoin();
  void OnJoined(absl::StatusOr<Assignment> assignment);
  void StartWorkers(const Assignment& assignment);
  void OnWorkerExit(Worker& worker, ExitStatus status);
  void RecordFailure(const Worker& worker, ExitStatus status, const std::string& message);
  // Tells the rendezvous (which decides: restart or close) and stops the
  // rest of this node's workers.
  void ReportFailureAndStop(const WorkerFailure& failure);
  void StopWorkers(int sig);
  void OnAllStopped();
  void OnPushed(const WatchEvent& event);
  void OnRoundChanged(const rdzv::RoundChanged& changed);
  void OnHeartbeat(const absl::Status& status, int64_t round);
  // One line, every few seconds while this node waits for its round: who
  // is there, and who is not.
  void ReportProgress(const absl::Status& status, const rdzv::StatusResponse& job);
  void OnJobClosed(const rdzv::JobClosed& closed);
  void OpenWatch();
  void SendHeartbeat();
  void ExitFailed(const std::string& why);
  void Finish(int code);

  const AgentOptions options_;
  const LaunchConfig& config_;
  std::unique_ptr<rdzv::RendezvousClient> client_;
  std::shared_ptr<spdlog::logger> logger_;
  std::string node_id_;

  UniqueFd epoll_, signal_fd_, event_fd_, timer_fd_;
  absl::Mutex mu_;
  std::deque<RdzvEvent> inbox_ ABSL_GUARDED_BY(mu_);

  Phase phase_ = Phase::kJoining;
  AfterStop after_stop_ = AfterStop::kAwaitDecision;
  int exit_code_ = 0;
  int stop_signal_ = 0;  // the signal that is ending the agent, if any
  bool in_job_ = false;  // joined once: heartbeats and the watch run
  bool watch_open_ = false;
  // The server said the open watch stream counts as this node's heartbeat
  // (WatchStarted): no Heartbeat calls while it stays open. The channel's
  // keepalive pings find a server that vanished; that ends the stream.
  bool watch_started_ = false;
  int64_t round_ = -1;
  int attempts_ = 0;
  std::optional<rdzv::JobClosed> closed_;
  int heartbeat_failures_ = 0;  // in a row
  int64_t round_seen_ = -1;     // the newest round announced to this node
  uint64_t watch_generation_ = 0;  // tells the current watch from replaced ones

  std::string log_root_;  // --log-dir, or a temporary directory we made
  bool log_root_is_temp_ = false;
  std::string run_dir_;
  std::vector<Worker> workers_;
  int live_ = 0;
  std::vector<WorkerFailure> failures_;  // of the latest failed attempt

  std::optional<Clock::time_point> kill_at_, heartbeat_at_, watch_retry_at_, progress_at_;
};

absl::Status Agent::Impl::SetUp() {
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return ErrnoToStatus(errno, "epoll_create1");

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int sig : kForwardedSignals) sigaddset(&set, sig);
  signal_fd_.reset(signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_.valid()) return ErrnoToStatus(errno, "signalfd");
  event_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!event_fd_.valid()) return ErrnoToStatus(errno, "eventfd");
  timer_fd_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer_fd_.valid()) return ErrnoToStatus(errno, "timerfd_create");
  for (int fd : {signal_fd_.get(), event_fd_.get(), timer_fd_.get()}) {
    MUSTER_RETURN_IF_ERROR(Watch(fd, EPOLLIN));
  }

  // Orphaned grandchildren (a worker's own children) are reparented to us and reaped.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return ErrnoToStatus(errno, "PR_SET_CHILD_SUBREAPER");

  if (config_.log_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/muster-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp " + pattern);
    log_root_ = pattern;
    log_root_is_temp_ = true;
  } else {
    log_root_ = config_.log_dir;
    MUSTER_RETURN_IF_ERROR(MakeDirs(log_root_));
  }
  // <run_id>_<x> as torchrun names it; a long id is cut to keep within NAME_MAX.
  constexpr size_t kMaxIdInName = 64;
  std::string run_dir = absl::StrCat(
      log_root_, "/", absl::StrReplaceAll(config_.rdzv_id.substr(0, kMaxIdInName), {{"/", "_"}}),
      "_XXXXXX");
  if (mkdtemp(run_dir.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp " + run_dir);
  run_dir_ = run_dir;
  return absl::OkStatus();
}

absl::Status Agent::Impl::Watch(int fd, uint32_t events) {
  epoll_event ev = {};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return ErrnoToStatus(errno, "epoll_ctl");
  return absl::OkStatus();
}

void Agent::Impl::Post(RdzvEvent event) {
  {
    absl::MutexLock lock(&mu_);
    inbox_.push_back(std::move(event));
  }
  const uint64_t one = 1;
  ssize_t ignored = write(event_fd_.get(), &one, sizeof(one));
  (void)ignored;
}

absl::StatusOr<int> Agent::Impl::Run() {
  MUSTER_RETURN_IF_ERROR(SetUp());
  StartJoin();
  Loop();
  if (stop_signal_ != 0 && in_job_) {
    // Tell the job we left on purpose, so it does not wait out a heartbeat.
    // Shared: the answer may come after we stopped waiting for it.
    auto left = std::make_shared<absl::Notification>();
    rdzv::LeaveRequest request;
    request.set_job_id(config_.rdzv_id);
    request.set_node_id(node_id_);
    request.set_reason(absl::StrCat("agent stopped by ", SignalName(stop_signal_)));
    client_->Leave(request, absl::Seconds(1), [left](absl::Status) { left->Notify(); });
    left->WaitForNotificationWithTimeout(absl::Seconds(2));
  }
  if (exit_code_ == kExitSuccess && log_root_is_temp_) {
    std::error_code ignored;
    std::filesystem::remove_all(log_root_, ignored);
  }
  return exit_code_;
}

void Agent::Impl::Loop() {
  epoll_event events[32];
  while (phase_ != Phase::kExiting) {
    ArmTimer();
    int n = epoll_wait(epoll_.get(), events, 32, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      logger_->critical("epoll_wait: {}", std::strerror(errno));
      Finish(kExitWorkersFailed);
      return;
    }
    for (int i = 0; i < n && phase_ != Phase::kExiting; ++i) {
      const int fd = events[i].data.fd;
      if (fd == signal_fd_.get()) {
        signalfd_siginfo info;
        while (read(signal_fd_.get(), &info, sizeof(info)) == sizeof(info)) OnSignal(info);
      } else if (fd == event_fd_.get()) {
        uint64_t count;
        ssize_t ignored = read(event_fd_.get(), &count, sizeof(count));
        (void)ignored;
        OnRdzvEvents();
      } else if (fd == timer_fd_.get()) {
        uint64_t expirations;
        ssize_t ignored = read(timer_fd_.get(), &expirations, sizeof(expirations));
        (void)ignored;
        OnTimer();
      } else {
        OnOutput(fd);
      }
    }
  }
}

void Agent::Impl::ArmTimer() {
  std::optional<Clock::time_point> next;
  for (const auto& t : {kill_at_, heartbeat_at_, watch_retry_at_, progress_at_}) {
    if (t && (!next || *t < *next)) next = t;
  }
  itimerspec spec = {};
  if (next) {
    auto since_epoch = next->time_since_epoch();
    auto secs = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    spec.it_value.tv_sec = secs.count();
    spec.it_value.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch - secs).count();
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  }
  timerfd_settime(timer_fd_.get(), TFD_TIMER_ABSTIME, &spec, nullptr);
}

void Agent::Impl::OnTimer() {
  const auto now = Clock::now();
  if (kill_at_ && now >= *kill_at_) {
    kill_at_.reset();
    if (live_ > 0) {
      logger_->warn("{} worker(s) still running {:.1f} s after the stop signal; sending SIGKILL",
                    live_, std::chrono::duration<double>(config_.shutdown_grace).count());
      for (Worker& worker : workers_) {
        if (!worker.process->exited()) worker.process->SignalGroup(SIGKILL);
      }
    }
  }
  if (heartbeat_at_ && now >= *heartbeat_at_) {
    heartbeat_at_ = now + config_.rdzv_conf.keep_alive_interval;
    if (!watch_started_) SendHeartbeat();  // the open watch stream is the heartbeat otherwise
  }
  if (progress_at_ && now >= *progress_at_) {
    progress_at_ = now + kProgressInterval;
    rdzv::StatusRequest request;
    request.set_job_id(config_.rdzv_id);
    client_->Status(request, ToAbsl(kRpcTimeout),
                    [this](absl::StatusOr<rdzv::StatusResponse> status) {
                      RdzvEvent event(RdzvEvent::Kind::kJobStatus);
                      event.status = status.status();
                      if (status.ok()) event.job_status = *std::move(status);
                      Post(std::move(event));
                    });
  }
  if (watch_retry_at_ && now >= *watch_retry_at_) {
    watch_retry_at_.reset();
    OpenWatch();
  }
}

void Agent::Impl::OnSignal(const signalfd_siginfo& info) {
  const int sig = static_cast<int>(info.ssi_signo);
  if (sig == SIGCHLD) {
    ReapChildren();
    return;
  }
  for (Worker& worker : workers_) {
    if (!worker.process->exited()) worker.process->SignalGroup(sig);
  }
  if (!IsStopSignal(sig)) {
    logger_->info("forwarded {} to {} worker(s)", SignalName(sig), live_);
    return;
  }
  if (stop_signal_ != 0) {
    // A second stop signal (Ctrl-C twice): do not wait out the grace period.
    logger_->warn("{} again: killing the workers now", SignalName(sig));
    for (Worker& worker : workers_) {
      if (!worker.process->exited()) worker.process->SignalGroup(SIGKILL);
    }
    return;
  }
  stop_signal_ = sig;
  logger_->warn("received {}: stopping {} worker(s) (grace {:.1f} s)", SignalName(sig), live_,
                std::chrono::duration<double>(config_.shutdown_grace).count());
  if (phase_ == Phase::kRunning || phase_ == Phase::kStopping) {
    after_stop_ = AfterStop::kExitSignal;
    if (phase_ == Phase::kRunning) {
      phase_ = Phase::kStopping;
      kill_at_ = Clock::now() + config_.shutdown_grace;
    }
    // Stopped already, waiting for the rendezvous to decide: nothing to wait for.
    if (live_ == 0) OnAllStopped();
    return;
  }
  Finish(128 + sig);
}

void Agent::Impl::ReapChildren() {
  for (;;) {
    // Look before reaping: while a worker is a zombie its pid, and so its
    // process group id, cannot be reused, so its group can still be killed
    // without hitting somebody else's.
    siginfo_t info = {};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    const pid_t pid = info.si_pid;
    Worker* exited = nullptr;
    for (Worker& worker : workers_) {
      if (worker.process->pid() == pid && !worker.process->exited()) exited = &worker;
    }
    const bool failed = info.si_code != CLD_EXITED || info.si_status != 0;
    if (exited != nullptr && (phase_ != Phase::kRunning || failed)) {
      // The group is being stopped: what the worker left behind goes with it.
      exited->process->SignalGroup(SIGKILL);
    }
    int wait_status = 0;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    // Any other pid was an orphaned grandchild: reaping it is all there is to do.
    if (exited != nullptr) OnWorkerExit(*exited, DecodeWaitStatus(wait_status));
  }
}

void Agent::Impl::OnOutput(int fd) {
  for (Worker& worker : workers_) {
    for (auto [pipe, output] : {std::pair{&worker.out_fd, &worker.out},
                                std::pair{&worker.err_fd, &worker.err}}) {
      if (pipe->get() != fd) continue;
      char buffer[kReadChunk];
      for (;;) {
        ssize_t n = read(fd, buffer, sizeof(buffer));
        if (n > 0) {
          (*output)->Append(std::string_view(buffer, static_cast<size_t>(n)));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        // EOF or a hard error: this stream is over.
        (*output)->Finish();
        epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
        pipe->reset();
        return;
      }
    }
  }
}

void Agent::Impl::DrainAndCloseOutput(Worker& worker) {
  for (auto [pipe, output] : {std::pair{&worker.out_fd, &worker.out},
                              std::pair{&worker.err_fd, &worker.err}}) {
    if (!pipe->valid()) continue;
    char buffer[kReadChunk];
    ssize_t n;
    while ((n = read(pipe->get(), buffer, sizeof(buffer))) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) (*output)->Append(std::string_view(buffer, static_cast<size_t>(n)));
    }
    (*output)->Finish();
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, pipe->get(), nullptr);
    pipe->reset();
  }
}

void Agent::Impl::OnRdzvEvents() {
  std::deque<RdzvEvent> events;
  {
    absl::MutexLock lock(&mu_);
    events.swap(inbox_);
  }
  for (RdzvEvent& event : events) {
    if (phase_ == Phase::kExiting) return;
    switch (event.kind) {
      case RdzvEvent::Kind::kJoined:
        OnJoined(std::move(event.assignment));
        break;
      case RdzvEvent::Kind::kPushed:
        if (event.event.has_watch_started()) {
          if (static_cast<uint64_t>(event.round) == watch_generation_) {
            watch_started_ = true;
            heartbeat_failures_ = 0;  // the server answered: failures so far are not in a row
          }
          break;
        }
        OnPushed(event.event);
        break;
      case RdzvEvent::Kind::kWatchEnded:
        if (static_cast<uint64_t>(event.round) != watch_generation_) break;  // a replaced watch
        watch_open_ = false;
        if (watch_started_ && heartbeat_at_ && !closed_ && !event.status.ok()) {
          // The server's heartbeat timeout for this node starts now: beat at once.
          heartbeat_at_ = Clock::now();
        }
        watch_started_ = false;
        if (!closed_ && !event.status.ok() && !absl::IsCancelled(event.status) &&
            !absl::IsAborted(event.status)) {
          // Heartbeats say whether the rendezvous is gone for good; the watch just retries.
          logger_->debug("lost the rendezvous watch stream ({}); reconnecting",
                         event.status.message());
          watch_retry_at_ = Clock::now() + kWatchRetry;
        }
        break;
      case RdzvEvent::Kind::kFailureReported:
        if (!event.status.ok()) {
          logger_->error("could not report the failure to the rendezvous at {}: {}",
                         client_->target(), event.status.message());
          if (phase_ == Phase::kStopping && after_stop_ == AfterStop::kAwaitDecision) {
            after_stop_ = AfterStop::kExitFailed;
            if (live_ == 0) OnAllStopped();
          }
        }
        break;
      case RdzvEvent::Kind::kDoneReported:
        if (phase_ != Phase::kFinishing) break;
        if (event.status.ok()) {
          if (!options_.hosts_rendezvous) Finish(kExitSuccess);
          // A host stays until the job closes: the other nodes still need it.
        } else if (absl::IsAborted(event.status)) {
          logger_->info("the job moved on while this node finished: {}", event.status.message());
        } else {
          logger_->warn("workers succeeded but the rendezvous could not be told: {}",
                        event.status.message());
          Finish(kExitSuccess);
        }
        break;
      case RdzvEvent::Kind::kHeartbeat:
        OnHeartbeat(event.status, event.round);
        break;
      case RdzvEvent::Kind::kJobStatus:
        if (phase_ == Phase::kJoining) ReportProgress(event.status, event.job_status);
        break;
    }
  }
}

void Agent::Impl::StartJoin() {
  phase_ = Phase::kJoining;
  progress_at_ = Clock::now() + kFirstProgress;
  rdzv::JoinRequest request;
  request.set_job_id(config_.rdzv_id);
  rdzv::JobConfig* job = request.mutable_config();
  // The static backend's rendezvous is this node's own: it only counts restarts.
  job->set_min_nodes(options_.static_ranks ? 1 : config_.min_nodes);
  job->set_max_nodes(options_.static_ranks ? 1 : config_.max_nodes);
  job->set_max_restarts(config_.max_restarts);
  job->set_last_call_timeout_ms(config_.rdzv_conf.last_call_timeout.count());
  job->set_join_timeout_ms(config_.rdzv_conf.join_timeout.count());
  job->set_heartbeat_timeout_ms(config_.rdzv_conf.heartbeat_timeout.count());
  rdzv::NodeInfo* node = request.mutable_node();
  node->set_node_id(node_id_);
  node->set_host(options_.host);
  node->set_advertised_addr(options_.advertised_addr);
  node->set_local_world_size(options_.nproc);
  node->set_node_rank_hint(config_.node_rank_given ? config_.node_rank : -1);
  node->set_master_port_candidate(PickFreePort());
  logger_->debug("joining job '{}' at {}", config_.rdzv_id, client_->target());
  client_->Join(request, ToAbsl(config_.rdzv_conf.join_timeout + kJoinSlack),
                [this](absl::StatusOr<Assignment> assignment) {
                  RdzvEvent event(RdzvEvent::Kind::kJoined);
                  event.assignment = std::move(assignment);
                  Post(std::move(event));
                });
}

void Agent::Impl::OnJoined(absl::StatusOr<Assignment> assignment) {
  if (phase_ != Phase::kJoining) return;
  if (!assignment.ok()) {
    const absl::Status& status = assignment.status();
    if (!in_job_ && (absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status)) &&
        !options_.hosts_rendezvous) {
      ExitFailed(absl::StrCat(
          "no rendezvous answered at ", client_->target(), " within join_timeout (",
          std::chrono::duration<double>(config_.rdzv_conf.join_timeout).count(),
          " s): is the node that hosts it (or musterd) running, and is --rdzv-endpoint right? (",
          status.message(), ")"));
    } else {
      ExitFailed(absl::StrCat("rendezvous at ", client_->target(), " failed: ", status.message()));
    }
    return;
  }
  progress_at_.reset();
  round_ = assignment->round();
  if (!in_job_) {
    in_job_ = true;
    heartbeat_at_ = Clock::now() + config_.rdzv_conf.keep_alive_interval;
  }
  if (!watch_open_) OpenWatch();
  StartWorkers(*assignment);
}

void Agent::Impl::SendHeartbeat() {
  rdzv::HeartbeatRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  client_->Heartbeat(request, ToAbsl(kRpcTimeout), [this](absl::StatusOr<int64_t> round) {
    RdzvEvent event(RdzvEvent::Kind::kHeartbeat);
    event.status = round.status();
    if (round.ok()) event.round = *round;
    Post(std::move(event));
  });
}

void Agent::Impl::OpenWatch() {
  watch_open_ = true;
  watch_retry_at_.reset();
  const uint64_t generation = ++watch_generation_;
  rdzv::WatchRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  request.set_known_round(round_);
  client_->Watch(
      request,
      [this, generation](const WatchEvent& pushed) {
        RdzvEvent event(RdzvEvent::Kind::kPushed);
        event.event = pushed;
        event.round = static_cast<int64_t>(generation);
        Post(std::move(event));
      },
      [this, generation](absl::Status status) {
        RdzvEvent event(RdzvEvent::Kind::kWatchEnded);
        event.status = std::move(status);
        event.round = static_cast<int64_t>(generation);
        Post(std::move(event));
      });
}

void Agent::Impl::StartWorkers(const Assignment& assignment) {
  NodePlacement placement;
  placement.group_rank = assignment.group_rank();
  placement.group_world_size = assignment.group_world_size();
  placement.rank_base = assignment.rank_base();
  placement.world_size = assignment.world_size();
  placement.master_addr = assignment.master_addr();
  placement.master_port = assignment.master_port();
  placement.restart_count = assignment.restart_count();
  placement.max_restarts = assignment.max_restarts();
  if (options_.static_ranks) {
    placement.group_rank = config_.node_rank;
    placement.group_world_size = config_.max_nodes;
    placement.rank_base = config_.node_rank * options_.nproc;
    placement.world_size = config_.max_nodes * options_.nproc;
    placement.master_addr = config_.master_addr;
    placement.master_port = config_.master_port;
  }

  const std::string attempt_dir = absl::StrCat(run_dir_, "/attempt_", attempts_);
  ++attempts_;
  failures_.clear();
  workers_.clear();
  workers_.reserve(options_.nproc);
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) base_env.emplace_back(*e);

  const int console_out = STDOUT_FILENO;
  const int console_err = STDERR_FILENO;
  for (int local_rank = 0; local_rank < options_.nproc; ++local_rank) {
    Worker& worker = workers_.emplace_back();
    worker.local_rank = local_rank;
    worker.rank = placement.rank_base + local_rank;
    const std::string rank_dir = absl::StrCat(attempt_dir, "/", local_rank);
    worker.error_file = rank_dir + "/error.json";
    absl::Status dir = MakeDirs(rank_dir);
    if (!dir.ok()) logger_->warn("cannot create {}: {}", rank_dir, dir.message());

    const StdRedirect redirect = config_.redirects.For(local_rank);
    const StdRedirect tee = config_.tee.For(local_rank);
    const bool shown = !config_.local_ranks_filter ||
                       config_.local_ranks_filter->contains(local_rank);
    auto make_output = [&](bool redirected, bool teed, int console, const char* file) {
      UniqueFd log;
      if (redirected || teed) {
        absl::StatusOr<UniqueFd> opened = OpenLogFile(absl::StrCat(rank_dir, "/", file));
        if (opened.ok()) {
          log = *std::move(opened);
        } else {
          logger_->warn("{}", opened.status().message());
        }
      }
      const bool to_console = shown && (teed || !redirected);
      return WorkerOutput(absl::StrCat("[rank ", worker.rank, "]: "), to_console ? console : -1,
                          std::move(log));
    };
    worker.out.emplace(make_output(redirect.out, tee.out, console_out, "stdout.log"));
    worker.err.emplace(make_output(redirect.err, tee.err, console_err, "stderr.log"));

    WorkerIdentity identity;
    identity.local_rank = local_rank;
    identity.local_world_size = options_.nproc;
    identity.run_id = config_.rdzv_id;
    identity.role = config_.role;
    identity.error_file = worker.error_file;
    SpawnOptions spawn;
    spawn.path = options_.program;
    spawn.argv = WorkerCommand(config_, options_.program, local_rank);
    spawn.env = WorkerEnvironment(base_env, placement, identity);
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(spawn);
    if (!child.ok()) {
      // Nothing to supervise for this rank: it counts as a failed worker.
      workers_.pop_back();
      Worker failed;
      failed.local_rank = local_rank;
      failed.rank = placement.rank_base + local_rank;
      RecordFailure(failed, ExitStatus{127, 0}, std::string(child.status().message()));
      break;
    }
    worker.process = *std::move(child);
    worker.out_fd = worker.process->TakeStdout();
    worker.err_fd = worker.process->TakeStderr();
    for (int fd : {worker.out_fd.get(), worker.err_fd.get()}) {
      absl::Status watched = Watch(fd, EPOLLIN);
      if (!watched.ok()) logger_->warn("{}", watched.message());
    }
    ++live_;
  }

  logger_->info("round {}: started {} worker(s), ranks {} of world size {} (node {} of {}), master {}:{}, restarts {}/{}",
                assignment.round(), live_, RankRange(placement.rank_base, options_.nproc),
                placement.world_size, placement.group_rank, placement.group_world_size,
                placement.master_addr, placement.master_port, placement.restart_count,
                placement.max_restarts);
  phase_ = Phase::kRunning;
  if (!failures_.empty()) {
    const WorkerFailure& failure = failures_.front();
    logger_->error("rank {} could not start: {}", failure.rank,
                   failure.error ? failure.error->message : "");
    ReportFailureAndStop(failure);
  }
}

void Agent::Impl::ReportFailureAndStop(const WorkerFailure& failure) {
  rdzv::ReportFailureRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  request.set_round(round_);
  rdzv::Failure* reported = request.mutable_failure();
  reported->set_rank(failure.rank);
  reported->set_local_rank(failure.local_rank);
  reported->set_host(failure.host);
  reported->set_pid(failure.pid);
  reported->set_exit_code(failure.exit_code);
  reported->set_signal(failure.signal);
  reported->set_time_unix_ms(absl::ToUnixMillis(failure.time));
  if (failure.error) reported->set_message(failure.error->message);
  client_->ReportFailure(request, ToAbsl(kRpcTimeout), [this](absl::Status status) {
    RdzvEvent event(RdzvEvent::Kind::kFailureReported);
    event.status = std::move(status);
    Post(std::move(event));
  });
  after_stop_ = AfterStop::kAwaitDecision;
  StopWorkers(SIGTERM);
}

void Agent::Impl::RecordFailure(const Worker& worker, ExitStatus status,
                                const std::string& message) {
  WorkerFailure failure;
  failure.rank = worker.rank;
  failure.local_rank = worker.local_rank;
  failure.host = options_.host;
  failure.pid = worker.process ? worker.process->pid() : 0;
  failure.exit_code = status.exit_code;
  failure.signal = status.signal;
  failure.time = absl::Now();
  failure.error_file = worker.error_file;
  if (!message.empty()) {
    failure.error = WorkerError{message, "", std::nullopt};
  } else if (!worker.error_file.empty()) {
    absl::StatusOr<WorkerError> error = ReadErrorFile(worker.error_file);
    if (error.ok()) {
      failure.error = *std::move(error);
    } else if (!absl::IsNotFound(error.status())) {
      logger_->warn("rank {}: unreadable error file: {}", worker.rank, error.status().message());
    }
  }
  failures_.push_back(std::move(failure));
}

void Agent::Impl::OnWorkerExit(Worker& worker, ExitStatus status) {
  worker.process->MarkExited(status);
  --live_;
  DrainAndCloseOutput(worker);
  if (phase_ == Phase::kRunning) {
    if (!status.success()) {
      RecordFailure(worker, status, "");
      const WorkerFailure& failure = failures_.back();
      logger_->error("rank {} (local rank {}, pid {}) failed: {}; stopping the other workers",
                     failure.rank, failure.local_rank, failure.pid, DescribeExit(failure));
      ReportFailureAndStop(failure);
      return;
    }
    if (live_ == 0) {
      phase_ = Phase::kFinishing;
      rdzv::ReportDoneRequest request;
      request.set_job_id(config_.rdzv_id);
      request.set_node_id(node_id_);
      request.set_round(round_);
      client_->ReportDone(request, ToAbsl(kRpcTimeout), [this](absl::Status status) {
        RdzvEvent event(RdzvEvent::Kind::kDoneReported);
        event.status = std::move(status);
        Post(std::move(event));
      });
    }
    return;
  }
  if (phase_ == Phase::kStopping) {
    // A worker that failed on its own while we were stopping the group is
    // worth reporting; one that died of our stop signal is not.
    if (!status.success() && status.signal != SIGTERM && status.signal != SIGKILL &&
        status.signal != stop_signal_ && after_stop_ != AfterStop::kExitSignal) {
      RecordFailure(worker, status, "");
    }
    if (live_ == 0) OnAllStopped();
  }
}

void Agent::Impl::StopWorkers(int sig) {
  phase_ = Phase::kStopping;
  for (Worker& worker : workers_) {
    if (!worker.process->exited()) worker.process->SignalGroup(sig);
  }
  kill_at_ = Clock::now() + config_.shutdown_grace;
  if (live_ == 0) OnAllStopped();
}

void Agent::Impl::OnAllStopped() {
  kill_at_.reset();
  // (Each worker's group was killed as its leader was reaped: ReapChildren.)
  for (Worker& worker : workers_) DrainAndCloseOutput(worker);
  switch (after_stop_) {
    case AfterStop::kAwaitDecision:
      break;  // the rendezvous decides: a new round, or the end of the job
    case AfterStop::kRejoin:
      StartJoin();
      break;
    case AfterStop::kExitFailed:
      ExitFailed(closed_ ? closed_->reason() : "");
      break;
    case AfterStop::kExitSignal:
      Finish(128 + stop_signal_);
      break;
  }
}

void Agent::Impl::OnPushed(const WatchEvent& event) {
  if (event.has_round_changed()) {
    OnRoundChanged(event.round_changed());
  } else if (event.has_job_closed()) {
    OnJobClosed(event.job_closed());
  }
}

void Agent::Impl::OnRoundChanged(const rdzv::RoundChanged& changed) {
  // Old news, or already being acted on (a push and a heartbeat may both tell).
  if (changed.new_round() <= std::max(round_, round_seen_)) return;
  round_seen_ = changed.new_round();
  logger_->info("job moves to round {}: {}", changed.new_round(), changed.detail());
  switch (phase_) {
    case Phase::kRunning:
      after_stop_ = AfterStop::kRejoin;
      StopWorkers(SIGTERM);
      break;
    case Phase::kStopping:
      if (after_stop_ == AfterStop::kAwaitDecision) {
        after_stop_ = AfterStop::kRejoin;
        if (live_ == 0) OnAllStopped();
      }
      break;
    case Phase::kFinishing:
      StartJoin();
      break;
    case Phase::kJoining:
    case Phase::kExiting:
      break;
  }
}

void Agent::Impl::OnHeartbeat(const absl::Status& status, int64_t round) {
  if (absl::IsCancelled(status) || phase_ == Phase::kExiting) return;
  const bool answered = status.ok() || absl::IsNotFound(status) || absl::IsFailedPrecondition(status);
  if (answered) {
    if (heartbeat_failures_ > 0) logger_->info("the rendezvous at {} answers again", client_->target());
    heartbeat_failures_ = 0;
  }
  if (status.ok()) {
    if (round > round_ && phase_ != Phase::kJoining) {
      // A push was lost: the heartbeat answer says the job moved on.
      rdzv::RoundChanged changed;
      changed.set_new_round(round);
      changed.set_detail("the job moved on (seen in a heartbeat)");
      OnRoundChanged(changed);
    }
    return;
  }
  if (absl::IsNotFound(status)) {
    if (phase_ == Phase::kRunning) {
      // The rendezvous dropped this node (it was silent too long): these
      // workers are no longer part of the job.
      logger_->warn("the rendezvous dropped this node ({}); stopping the workers and rejoining",
                    status.message());
      after_stop_ = AfterStop::kRejoin;
      StopWorkers(SIGTERM);
    }
    return;  // stopping or joining already
  }
  if (absl::IsFailedPrecondition(status)) {
    // The pushed JobClosed, when it came first, says more (the root cause).
    if (closed_) return;
    rdzv::JobClosed closed;
    closed.set_reason(std::string(status.message()));
    OnJobClosed(closed);
    return;
  }
  ++heartbeat_failures_;
  if (heartbeat_failures_ == 1) {
    logger_->warn("heartbeat to the rendezvous at {} failed: {}", client_->target(),
                  status.message());
  }
  if (heartbeat_failures_ < config_.rdzv_conf.keep_alive_max_attempt) return;
  if (phase_ == Phase::kFinishing) return;  // the pending ReportDone decides
  const std::string why = absl::StrCat(
      "the rendezvous at ", client_->target(), " did not answer ", heartbeat_failures_,
      " heartbeats in a row (keep_alive_max_attempt); the job cannot go on without it");
  heartbeat_at_.reset();
  if (phase_ == Phase::kRunning || phase_ == Phase::kStopping) {
    logger_->error("{}; stopping the workers", why);
    rdzv::JobClosed closed;
    closed.set_reason(why);
    closed_ = closed;
    if (after_stop_ != AfterStop::kExitSignal) after_stop_ = AfterStop::kExitFailed;
    if (phase_ == Phase::kRunning) {
      StopWorkers(SIGTERM);
    } else if (live_ == 0) {
      OnAllStopped();
    }
    return;
  }
  ExitFailed(why);
}

void Agent::Impl::ReportProgress(const absl::Status& status, const rdzv::StatusResponse& job) {
  if (!status.ok()) {
    logger_->info("waiting for the rendezvous at {} ({})", client_->target(), status.message());
    return;
  }
  std::string line = absl::StrCat("waiting for nodes: ", job.participants(), "/",
                                  job.config().max_nodes(), " joined (min ",
                                  job.config().min_nodes(), ", max ", job.config().max_nodes(),
                                  ")");
  if (job.last_call_remaining_ms() >= 0) {
    absl::StrAppend(&line, ", last call ends in ", (job.last_call_remaining_ms() + 999) / 1000, " s");
  }
  if (job.missing_count() > 0) {
    absl::StrAppend(&line, "; not back yet: ", absl::StrJoin(job.missing(), ", "));
    if (job.missing_count() > job.missing_size()) {
      absl::StrAppend(&line, " and ", job.missing_count() - job.missing_size(), " more");
    }
  }
  logger_->info("{}", line);
}

void Agent::Impl::OnJobClosed(const rdzv::JobClosed& closed) {
  closed_ = closed;
  switch (phase_) {
    case Phase::kRunning:
      // Even a job that closed as succeeded cannot use this node's workers any more.
      logger_->warn("the job closed while this node's workers run: {}", closed.reason());
      after_stop_ = AfterStop::kExitFailed;
      StopWorkers(SIGTERM);
      break;
    case Phase::kStopping:
      if (after_stop_ != AfterStop::kExitSignal) {
        after_stop_ = AfterStop::kExitFailed;
        if (live_ == 0) OnAllStopped();
      }
      break;
    case Phase::kFinishing:
    case Phase::kJoining:
      if (closed.succeeded()) {
        Finish(kExitSuccess);
      } else {
        ExitFailed(closed.reason());
      }
      break;
    case Phase::kExiting:
      break;
  }
}

void Agent::Impl::ExitFailed(const std::string& why) {
  std::string report;
  if (!failures_.empty()) {
    report = FormatFailureReport(config_.script, attempts_, failures_);
  }
  // The root cause is another node's when none of this node's failures is
  // it (host names alone cannot tell: several agents may share a host).
  const bool root_is_remote =
      closed_ && closed_->has_root_cause() &&
      std::none_of(failures_.begin(), failures_.end(), [this](const WorkerFailure& f) {
        return f.rank == closed_->root_cause().rank();
      });
  if (root_is_remote) {
    const rdzv::Failure& root = closed_->root_cause();
    absl::StrAppend(&report, "Root cause on another node: rank ", root.rank(), " on ", root.host(),
                    root.signal() != 0 ? absl::StrCat(" (signal ", root.signal(), ")")
                                       : absl::StrCat(" (exit code ", root.exit_code(), ")"),
                    root.message().empty() ? "" : ": ", root.message(), "\n");
  }
  if (!report.empty()) {
    ssize_t ignored = write(STDERR_FILENO, report.data(), report.size());
    (void)ignored;
  }
  if (!why.empty()) logger_->error("{}", why);
  if (!log_root_is_temp_ || !failures_.empty()) {
    logger_->info("worker logs and error files: {}", run_dir_);
  }
  Finish(kExitWorkersFailed);
}

void Agent::Impl::Finish(int code) {
  exit_code_ = code;
  phase_ = Phase::kExiting;
}

Agent::Agent(AgentOptions options, std::unique_ptr<rdzv::RendezvousClient> client)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(client))) {}

Agent::~Agent() = default;

absl::StatusOr<int> Agent::Run() { return impl_->Run(); }

}  // namespace muster
