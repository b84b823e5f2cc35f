#include "agent/agent.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "agent/elastic_state.h"
#include "agent/event_loop.h"
#include "agent/events.h"
#include "agent/file_timer.h"
#include "agent/gpu_watcher.h"
#include "agent/numa.h"
#include "agent/nvml.h"
#include "agent/output.h"
#include "agent/peer_endpoint.h"
#include "agent/preload.h"
#include "agent/progress.h"
#include "agent/site_command.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "common/free_port.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_handle.h"
#include "rendezvous/auth/node_secret.h"
#include "rendezvous/rules/protocol.h"

namespace muster {
namespace {

// Signals the agent catches, unless --signals-to-handle names them, only to
// send them on to its workers (a checkpoint request, say). Those it names
// stop the job (ElasticOptions::stop_signals); any other keeps its default
// action, as under torchrun: SIGTERM left out of the list ends the agent at
// once, and its workers with it (they die with their parent).
constexpr int kForwardedSignals[] = {SIGUSR1, SIGUSR2};

// What the agent reads from its signalfd: the forwarded signals, the stop
// signals of `config`, and SIGCHLD.
std::vector<int> AgentSignals(const LaunchConfig& config) {
  std::vector<int> signals(std::begin(kForwardedSignals), std::end(kForwardedSignals));
  for (int sig : config.signals_to_handle) {
    if (std::find(signals.begin(), signals.end(), sig) == signals.end()) signals.push_back(sig);
  }
  signals.push_back(SIGCHLD);
  return signals;
}
// Extra time a join RPC gets beyond join_timeout: the server's own timer should fire first.
constexpr absl::Duration kJoinSlack = absl::Seconds(5);
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
// How long taking a hung worker's stacks may hold its kill (stack_capture.h):
// the grace ran out already; a file timer's kill should follow its expiry
// within about a second and a half.
constexpr absl::Duration kStackLimit = absl::Seconds(2);
constexpr absl::Duration kTimerStackLimit = absl::Milliseconds(1350);
// How long --on-node-excluded may run before it is killed.
constexpr absl::Duration kSiteCommandLimit = absl::Seconds(60);

std::string RandomSuffix() {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device device;
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(kChars[device() % (sizeof(kChars) - 1)]);
  return out;
}

// What --preflight allreduce runs on every rank: small sizes, a few seconds
// (NCCL's set-up is most of it), checked as any run of muster-allreduce.
WorkerGroup::Instead PreflightCommand(const std::string& allreduce) {
  return {{allreduce, "-b", "1K", "-e", "1M", "-f", "8", "-n", "5", "-w", "1", "--timeout", "60"},
          "preflight"};
}

std::string RankRange(int first, int count) {
  return count == 1 ? absl::StrCat(first) : absl::StrCat(first, "-", first + count - 1);
}

ElasticOptions ElasticOptionsFor(const AgentOptions& options, const rdzv::RendezvousClient& client,
                                 bool ask_peers) {
  const LaunchConfig& config = options.config;
  ElasticOptions elastic;
  elastic.ask_peers = ask_peers;
  elastic.heartbeat_with_watch = client.WatchOutlivesOutages();
  elastic.heartbeat_timeout = absl::FromChrono(config.rdzv_conf.heartbeat_timeout);
  elastic.script = config.script;
  elastic.rdzv_target = client.target();
  elastic.hosts_rendezvous = options.hosts_rendezvous;
  elastic.stays_until_closed = options.stays_until_closed;
  elastic.join_timeout = absl::FromChrono(config.rdzv_conf.join_timeout);
  elastic.keep_alive_interval = absl::FromChrono(config.rdzv_conf.keep_alive_interval);
  elastic.keep_alive_max_attempt = config.rdzv_conf.keep_alive_max_attempt;
  elastic.shutdown_grace = absl::FromChrono(config.shutdown_grace);
  elastic.stop_signals = config.signals_to_handle;
  elastic.preflight = config.preflight;
  // The GPU watcher answers it; on a node with no NVIDIA driver (and no
  // NVML library named) there is nothing to check, and no wait for it.
  elastic.health_check =
      config.gpu_check_interval.count() > 0 &&
      (FindEnv(options.base_env, kNvmlLibraryEnv) || access("/dev/nvidiactl", F_OK) == 0);
  return elastic;
}

// This node's place in the round; the static backend's comes from the command line.
NodePlacement PlacementFor(const rdzv::Assignment& assignment, const AgentOptions& options) {
  const LaunchConfig& config = options.config;
  NodePlacement placement;
  placement.group_rank = assignment.group_rank();
  placement.group_world_size = assignment.group_world_size();
  placement.rank_base = assignment.rank_base();
  placement.world_size = assignment.world_size();
  placement.master_addr = assignment.master_addr();
  placement.master_port = assignment.master_port();
  placement.restart_count = assignment.restart_count();
  placement.max_restarts = assignment.max_restarts();
  if (options.static_ranks) {
    placement.group_rank = config.node_rank;
    placement.group_world_size = config.max_nodes;
    placement.rank_base = config.node_rank * options.nproc;
    placement.world_size = config.max_nodes * options.nproc;
    placement.master_addr = config.master_addr;
    placement.master_port = config.master_port;
  }
  return placement;
}

}  // namespace

void BlockAgentSignals(const LaunchConfig& config) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : AgentSignals(config)) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // Console writes to a closed pipe must fail with EPIPE, not end the agent.
  signal(SIGPIPE, SIG_IGN);
}

void TakePendingAgentSignal(const LaunchConfig& config) {
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  for (int sig : AgentSignals(config)) {
    if (sigismember(&pending, sig) != 1) continue;
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    signal(sig, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);  // delivered here, and the end
  }
}

class Agent::Impl {
 public:
  Impl(AgentOptions options, std::unique_ptr<rdzv::RendezvousClient> client, ProcessRunner* runner,
       Clock& clock)
      : options_(std::move(options)), config_(options_.config), client_(std::move(client)),
        runner_(runner), clock_(clock), logger_(Logger("agent")),
        node_id_(absl::StrCat(options_.host, ":", getpid(), ":", RandomSuffix())),
        peers_(OpenPeers()), state_(ElasticOptionsFor(options_, *client_, peers_ != nullptr)),
        join_key_(rdzv::NewNodeSecret().value_or("")) {}

  ~Impl() {
    gpu_watcher_.reset();  // posts nothing after this
    workers_.reset();      // kills and reaps any worker still running
    preloader_.reset();    // before the loop it is watched on
    client_.reset();       // no callback runs after this
    if (!progress_dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(progress_dir_, ignored);
    }
  }

  absl::StatusOr<int> Run();

 private:
  absl::Status SetUp();
  // Carries out the actions, in order.
  void Do(Actions actions);
  void Do(const action::Join& join);
  void Do(const action::StartWorkers& start);
  void Do(const action::CheckHealth&);
  // Starts them now; Do waits first, after a round, for the GPUs to be
  // freed, and for --preload's imports.
  void StartNow(const action::StartWorkers& start);
  // The pending start goes once nothing holds it back any more.
  void StartWhenReady();
  // The wait for the last round's GPU memory is over.
  void OnGpuRelease(const GpuRelease& release);
  // --preload: the interpreter that imports the modules once for every worker.
  void StartPreloader(const WorkerGroupOptions& group);
  void Do(const action::SignalWorkers& signal);
  void Do(const action::AbandonWorkers&);
  void Do(const action::ReportFailure& report);
  void Do(const action::ReportDone& report);
  void Do(const action::SendHeartbeat& heartbeat);
  void Do(const action::ReadProgress&);
  void Do(const action::OpenWatch& watch);
  void Do(const action::QueryStatus&);
  void Do(const action::AskPeers& ask);
  std::unique_ptr<PeerEndpoint> OpenPeers();
  // What the peers answered, once all did or their time is up.
  void TakePeerAnswers();
  void Do(const action::ExcludeSelf& exclude);
  void Do(const action::Log& log);
  void Do(const action::Exit& exit);

  void OnSignal(int sig);
  void ReapChildren();
  // --event-log-handler console: a pushed event, told as an event.
  void Observe(const rdzv::WatchEvent& event);
  // Prints one event (events.h) when --event-log-handler console asks for them.
  void Emit(std::string kind, int64_t round, std::string detail);
  // --numa-binding: each local rank's binding, or none (said once, why).
  std::vector<CpuBinding> PlanNuma() const;
  // torch's file timer (file_timer.h), when TORCHELASTIC_ENABLE_FILE_TIMER=1.
  absl::Status StartFileTimer(std::vector<std::string>& worker_env);
  void ReadFileTimer();
  void ExpireFileTimers(absl::Time now);
  void NoSignal(const TimerExpiry& expiry, absl::Time now);
  // --gpu-check-interval: what a check found (gpu_watcher.h), on the loop.
  void OnGpuCheck(GpuCheckOutput out);
  std::optional<absl::Time> NextDeadline() const;
  // Hands a rendezvous result to the loop thread. Any thread.
  void Post(RdzvEvent event);
  void Leave(const std::string& reason);
  // The highest step this round's workers wrote (agent/progress.h).
  NodeProgress ReadWorkerProgress() const;
  // What a report of `round` tells of the workers' progress; nullopt: none written.
  std::optional<rdzv::Progress> ProgressOf(int64_t round) const;
  // --on-node-excluded, once this node's host was excluded.
  void RunExcludedCommand(const rdzv::Exclusion& exclusion);

  const AgentOptions options_;
  const LaunchConfig& config_;
  std::unique_ptr<rdzv::RendezvousClient> client_;
  ProcessRunner* runner_;
  Clock& clock_;
  std::shared_ptr<spdlog::logger> logger_;
  const std::string node_id_;
  // Where the other nodes of its round ask this one (peer_endpoint.h); null
  // for the static backend's ranks, or where no UDP socket could be had.
  std::unique_ptr<PeerEndpoint> peers_;
  ElasticState state_;
  // What the rendezvous gave this node on its last join; every call for the
  // node carries it. Loop thread only.
  std::string node_secret_;
  // Sent with every join (JoinRequest.join_key): this process's, so that a
  // join again before any seat is known for its own.
  const std::string join_key_;
  // What Emit told already.
  int64_t last_round_told_ = -1;
  bool closed_told_ = false;
  bool event_log_failed_ = false;  // said once
  // The last "progress" event told: its round, and when.
  int64_t progress_told_round_ = -1;
  absl::Time progress_told_at_ = absl::InfinitePast();

  std::unique_ptr<EventLoop> loop_;
  // --preload; the runner of the workers when it is on. Null: off.
  std::unique_ptr<Preloader> preloader_;
  std::unique_ptr<WorkerGroup> workers_;
  std::optional<TimerPipe> timer_pipe_;
  FileTimers file_timers_;
  std::unique_ptr<GpuWatcher> gpu_watcher_;  // null: the check is off
  std::string log_root_;                     // --log-dir, or a temporary directory we made
  bool log_root_is_temp_ = false;
  std::string run_dir_;
  std::string progress_dir_;  // on /dev/shm, removed at the end; empty: none made
  int exit_code_ = kExitWorkersFailed;
  // The pids of the last round's workers, for the wait for its GPU memory;
  // the start that waits for it.
  std::vector<pid_t> last_workers_;
  std::optional<action::StartWorkers> pending_start_;
  bool awaiting_release_ = false;
};

// How long the first round waits for --preload's imports before its
// workers start cold. A cold worker would import as long: this only
// bounds an interpreter that hangs.
constexpr absl::Duration kPreloadImportLimit = absl::Seconds(300);

absl::Status Agent::Impl::SetUp() {
  absl::StatusOr<std::unique_ptr<EventLoop>> loop =
      EventLoop::Create(clock_, AgentSignals(config_));
  if (!loop.ok()) return loop.status();
  loop_ = *std::move(loop);
  if (runner_ == nullptr) {
    absl::StatusOr<ProcessRunner*> real = ProcessRunner::Real();
    if (!real.ok()) return real.status();
    runner_ = *real;
  }

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

  WorkerGroupOptions group;
  group.config = &config_;
  group.nproc = options_.nproc;
  group.program = options_.program;
  group.host = options_.host;
  group.run_dir = run_dir_;
  group.base_env = options_.base_env;
  // The workers' progress files on a tmpfs when there is one; else beside their logs.
  std::string progress_dir = "/dev/shm/muster-progress-XXXXXX";
  if (mkdtemp(progress_dir.data()) != nullptr) progress_dir_ = group.progress_dir = progress_dir;
  if (config_.numa_binding != NumaBinding::kNone) group.numa = PlanNuma();
  if (FindEnv(group.base_env, kEnableFileTimerEnv) == "1") {
    MUSTER_RETURN_IF_ERROR(StartFileTimer(group.base_env));
  }
  if (!config_.preload.empty()) StartPreloader(group);
  if (peers_) {
    MUSTER_RETURN_IF_ERROR(loop_->Add(peers_->fd(), [this] {
      peers_->Read([this] { return state_.AnswerPeer(); });
      TakePeerAnswers();
    }));
    logger_->debug("the other nodes of its round ask this node on UDP port {}", peers_->port());
  }
  ProcessRunner& worker_runner = preloader_ ? *preloader_ : *runner_;
  workers_ = std::make_unique<WorkerGroup>(std::move(group), worker_runner, *loop_, clock_);
  if (config_.gpu_check_interval.count() > 0) {
    GpuWatcherOptions gpu;
    gpu.library = FindEnv(options_.base_env, kNvmlLibraryEnv).value_or(kNvmlLibrary);
    gpu.visible = FindEnv(options_.base_env, "CUDA_VISIBLE_DEVICES");
    gpu.nproc = options_.nproc;
    gpu.one_per_gpu = config_.nproc_kind == NprocKind::kGpu;
    gpu.check.interval = absl::FromChrono(config_.gpu_check_interval);
    gpu.check.report = config_.gpu_report;
    gpu_watcher_ = std::make_unique<GpuWatcher>(std::move(gpu), [this](GpuCheckOutput out) {
      loop_->Post([this, out = std::move(out)]() mutable { OnGpuCheck(std::move(out)); });
    });
  }
  return absl::OkStatus();
}

void Agent::Impl::StartPreloader(const WorkerGroupOptions& group) {
  const std::string modules = absl::StrJoin(config_.preload, ",");
  if (config_.no_python) {
    logger_->warn("--preload {}: not used, as --no-python workers are not Python", modules);
    return;
  }
  const std::vector<std::string> command = WorkerCommand(config_, options_.program, 0);
  PreloadOptions preload;
  preload.interpreter = {command[0], command[1]};  // python -u
  preload.module = config_.module;
  preload.target = command[config_.module ? 3 : 2];
  preload.modules = config_.preload;
  preload.env = PreloadEnvironment(group.base_env, options_.nproc);
  preload.dir = run_dir_;
  absl::StatusOr<std::unique_ptr<Preloader>> started = Preloader::Start(
      std::move(preload), *runner_, *loop_,
      [this](Preloader::State state, const std::string& detail) {
        Emit(state == Preloader::State::kReady ? "preload_ready" : "preload_broken", state_.round(),
             detail);
        StartWhenReady();
      });
  if (!started.ok()) {
    logger_->warn("--preload {}: cannot start the interpreter ({}); workers start cold", modules,
                  started.status().message());
    return;
  }
  preloader_ = *std::move(started);
}

void Agent::Impl::OnGpuCheck(GpuCheckOutput out) {
  if (out.release) OnGpuRelease(*out.release);
  if (out.health_checked) {
    Do(state_.OnHealthChecked(out.faults, clock_.Now()));
    return;
  }
  if (!out.faults.empty()) {
    for (const std::string& fault : out.faults) Emit("gpu_fault", state_.round(), fault);
    Do(state_.OnNodeFault(absl::StrJoin(out.faults, "; "), clock_.Now()));
  }
  // Found while the round ran; told only while it still does.
  if (state_.phase() != AgentPhase::kRunning || state_.in_preflight()) return;
  for (const std::string& error : out.errors) logger_->warn("{}", error);
  for (const std::string& warning : out.warnings) {
    logger_->warn("{}", warning);
    Emit("gpu_warning", state_.round(), warning);
    if (options_.metrics != nullptr) options_.metrics->GpuWarned();
  }
  for (const std::string& cleared : out.cleared) {
    logger_->info("{}", cleared);
    Emit("gpu_cleared", state_.round(), cleared);
  }
  if (out.report) logger_->info("{}", *out.report);
  if (out.figures) {
    Emit("gpu_sample", state_.round(), out.figures_line);
    if (options_.metrics != nullptr) options_.metrics->GpuChecked(*std::move(out.figures));
  }
}

absl::StatusOr<int> Agent::Impl::Run() {
  MUSTER_RETURN_IF_ERROR(SetUp());
  Do(state_.Start(clock_.Now()));
  EventLoop::Handlers handlers;
  handlers.on_signal = [this](int sig) { OnSignal(sig); };
  handlers.on_timer = [this] {
    if (preloader_ && preloader_->state() == Preloader::State::kImporting && pending_start_ &&
        absl::Now() - preloader_->started() >= kPreloadImportLimit) {
      preloader_->Break(
          absl::StrCat("was still importing after ", absl::FormatDuration(kPreloadImportLimit)));
    }
    Do(state_.OnTimer(clock_.Now()));
    TakePeerAnswers();
    if (!state_.done()) ExpireFileTimers(clock_.Now());
  };
  handlers.next_deadline = [this] { return NextDeadline(); };
  handlers.done = [this] { return state_.done(); };
  absl::Status looped = loop_->Run(handlers);
  if (preloader_) {
    logger_->info("--preload: {} worker(s) forked from the preloaded interpreter, {} started cold",
                  preloader_->forked(), preloader_->cold_started());
  }
  if (!looped.ok()) {
    logger_->critical("{}", looped.message());
    return kExitWorkersFailed;
  }
  if (file_timers_.bad_lines() > 0 || file_timers_.foreign_lines() > 0) {
    logger_->warn(
        "the file timer pipe got {} line(s) it could not read and {} for a pid that is "
        "not one of this node's workers; all were ignored",
        file_timers_.bad_lines(), file_timers_.foreign_lines());
  }
  if (exit_code_ == kExitSuccess && log_root_is_temp_) {
    std::error_code ignored;
    std::filesystem::remove_all(log_root_, ignored);
  }
  return exit_code_;
}

void Agent::Impl::OnSignal(int sig) {
  if (sig == SIGCHLD) {
    ReapChildren();
  } else {
    Do(state_.OnSignal(sig, clock_.Now()));
  }
}

void Agent::Impl::ReapChildren() {
  while (std::optional<ChildExit> exit = runner_->NextExit()) {
    WorkerGroup::Worker* worker = workers_->Find(exit->pid);
    if (worker != nullptr && (state_.stopping() || !exit->status.success())) {
      // The group is being stopped: what the worker left behind goes with it.
      // (Not reaped yet, so its group id cannot have been reused.)
      worker->process->SignalGroup(SIGKILL);
    }
    runner_->Reap(exit->pid);
    file_timers_.Forget(exit->pid);
    if (worker == nullptr && preloader_ && preloader_->OnExit(exit->pid, exit->status)) continue;
    // Any other pid was an orphaned grandchild, or a worker given up on:
    // reaping it is all there is to do.
    if (worker == nullptr) {
      if (workers_->ReapedAbandoned(exit->pid)) {
        logger_->info("pid {}, a worker left behind as unkillable, exited after all", exit->pid);
      }
      continue;
    }
    if (options_.metrics != nullptr) {
      options_.metrics->WorkerExited(
          worker->local_rank,
          exit->status.signal != 0 ? -exit->status.signal : exit->status.exit_code,
          // Not those this agent is stopping (after another's failure).
          !exit->status.success() && !state_.stopping());
    }
    WorkerFailure failure = workers_->Exited(*worker, exit->status);
    Do(state_.OnWorkerExit(exit->status, failure, clock_.Now()));
    if (state_.done()) return;
  }
}

std::vector<CpuBinding> Agent::Impl::PlanNuma() const {
  const absl::string_view mode = NumaBindingName(config_.numa_binding);
  std::set<int> allowed;
  cpu_set_t own;
  if (sched_getaffinity(0, sizeof(own), &own) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &own)) allowed.insert(cpu);
    }
  }
  // MUSTER_SYSFS: a fake sysfs tree, for the tests.
  const std::string sysfs = FindEnv(options_.base_env, "MUSTER_SYSFS").value_or("/sys");
  absl::StatusOr<NumaPlan> plan =
      PlanNumaBinding(config_.numa_binding, sysfs, allowed,
                      FindEnv(options_.base_env, "CUDA_VISIBLE_DEVICES"), options_.nproc);
  if (!plan.ok() || plan->per_rank.empty()) {
    logger_->warn("--numa-binding {}: {}; the workers run unbound", mode,
                  plan.ok() ? plan->unbound_reason : std::string(plan.status().message()));
    return {};
  }
  std::vector<std::string> ranks;
  for (size_t rank = 0; rank < plan->per_rank.size(); ++rank) {
    const CpuBinding& bound = plan->per_rank[rank];
    ranks.push_back(absl::StrCat("local rank ", rank, " CPUs ", FormatCpuList(bound.cpus),
                                 ", memory of node(s) ", FormatCpuList(bound.memory_nodes)));
  }
  logger_->info("--numa-binding {}: {}", mode, absl::StrJoin(ranks, "; "));
  return plan->per_rank;
}

absl::Status Agent::Impl::StartFileTimer(std::vector<std::string>& worker_env) {
  absl::StatusOr<TimerPipe> pipe =
      TimerPipe::Create(FindEnv(worker_env, kTimerFileEnv).value_or(""));
  if (!pipe.ok()) return pipe.status();
  timer_pipe_.emplace(*std::move(pipe));
  SetEnv(worker_env, kTimerFileEnv, timer_pipe_->path());
  MUSTER_RETURN_IF_ERROR(loop_->Add(timer_pipe_->fd(), [this] { ReadFileTimer(); }));
  logger_->info("{}=1: serving torch's file timer at {} (workers find it in {})",
                kEnableFileTimerEnv, timer_pipe_->path(), kTimerFileEnv);
  return absl::OkStatus();
}

void Agent::Impl::ReadFileTimer() {
  timer_pipe_->Read([this](std::string_view line) {
    pid_t pid = 0;
    const FileTimers::Outcome outcome = file_timers_.Take(line, [&](pid_t candidate) {
      pid = candidate;
      return workers_->FindByGroup(candidate) != nullptr;
    });
    if (outcome == FileTimers::Outcome::kBadLine && file_timers_.bad_lines() == 1) {
      absl::StatusOr<FileTimerRequest> parsed = ParseFileTimerRequest(line);
      logger_->warn(
          "the file timer pipe {} got a line it cannot read ({}); ignored, as later ones "
          "will be (counted)",
          timer_pipe_->path(),
          line.empty() ? std::string("longer than a pipe write")
                       : std::string(parsed.status().message()));
    } else if (outcome == FileTimers::Outcome::kForeignPid && file_timers_.foreign_lines() == 1) {
      logger_->warn(
          "the file timer pipe {} got a timer for pid {}, which is not one of this "
          "node's workers; ignored, as later ones will be (counted)",
          timer_pipe_->path(), pid);
    }
  });
  // A timer set in the past expires now, not at the next event.
  ExpireFileTimers(clock_.Now());
}

void Agent::Impl::ExpireFileTimers(absl::Time now) {
  if (file_timers_.DueBy(now).empty()) {
    for (const TimerExpiry& expiry : file_timers_.Expire(now)) NoSignal(expiry, now);
    return;
  }
  // Where they hung, before they die: the stacks of every worker whose
  // timer runs out while they are taken, all at once. The signals wait for
  // it (the kill stays within about a second and a half of the expiry).
  std::vector<WorkerGroup::Worker*> hung;
  for (pid_t pid : file_timers_.DueBy(now + kTimerStackLimit)) {
    WorkerGroup::Worker* worker = workers_->FindByGroup(pid);
    if (worker != nullptr && std::find(hung.begin(), hung.end(), worker) == hung.end()) {
      hung.push_back(worker);
    }
  }
  workers_->CaptureStacks(hung, kTimerStackLimit);
  const absl::Time after = clock_.Now();
  for (const TimerExpiry& expiry : file_timers_.Expire(after)) {
    WorkerGroup::Worker* worker = workers_->FindByGroup(expiry.pid);
    if (worker == nullptr) continue;  // exited meanwhile
    if (expiry.signal <= 0) {
      NoSignal(expiry, after);
      continue;
    }
    const std::string late =
        absl::StrFormat("%.2f s ago", absl::ToDoubleSeconds(after - expiry.expired_at));
    worker->killed_for =
        absl::StrCat("its file timer '", expiry.scope_id, "' expired ", late, " (pid ", expiry.pid,
                     ", killed with ", SignalName(expiry.signal), ")");
    logger_->error("rank {} (local rank {}): file timer '{}' of pid {} expired {}; sending {}",
                   worker->rank, worker->local_rank, expiry.scope_id, expiry.pid, late,
                   SignalName(expiry.signal));
    kill(expiry.pid, expiry.signal);
  }
}

void Agent::Impl::NoSignal(const TimerExpiry& expiry, absl::Time now) {
  const WorkerGroup::Worker* worker = workers_->FindByGroup(expiry.pid);
  if (worker == nullptr) return;
  logger_->info(
      "rank {}: file timer '{}' of pid {} expired {:.2f} s ago; it names no signal, so it is "
      "not acted on (as torch does)",
      worker->rank, expiry.scope_id, expiry.pid, absl::ToDoubleSeconds(now - expiry.expired_at));
}

std::optional<absl::Time> Agent::Impl::NextDeadline() const {
  std::optional<absl::Time> next = state_.NextDeadline();
  if (std::optional<absl::Time> peers =
          peers_ ? peers_->NextDeadline(clock_.Now()) : std::nullopt) {
    if (!next || *peers < *next) next = peers;
  }
  if (std::optional<absl::Time> timer = file_timers_.NextExpiry()) {
    if (!next || *timer < *next) next = timer;
  }
  if (preloader_ && preloader_->state() == Preloader::State::kImporting && pending_start_) {
    // The loop's clock: the limit is counted on the real one.
    const absl::Time limit =
        clock_.Now() + (preloader_->started() + kPreloadImportLimit - absl::Now());
    if (!next || limit < *next) next = limit;
  }
  return next;
}

void Agent::Impl::Post(RdzvEvent event) {
  loop_->Post([this, event = std::move(event)]() mutable {
    if (const auto* pushed = std::get_if<rdzv_event::Pushed>(&event)) Observe(pushed->event);
    if (const auto* beat = std::get_if<rdzv_event::HeartbeatAnswered>(&event)) {
      if (std::optional<rdzv::RoundChanged> missed = state_.MissedRound(beat->round)) {
        rdzv::WatchEvent seen;
        *seen.mutable_round_changed() = *std::move(missed);
        Observe(seen);
      }
    }
    Do(state_.OnRdzv(std::move(event), clock_.Now()));
  });
}

void Agent::Impl::Observe(const rdzv::WatchEvent& event) {
  if (event.has_round_changed()) {
    const rdzv::RoundChanged& changed = event.round_changed();
    // A new round may be pushed again (a watch reopened): told once.
    if (changed.new_round() <= last_round_told_) return;
    last_round_told_ = changed.new_round();
    Emit(RoundChangedKind(changed), changed.new_round(), changed.detail());
  } else if (event.has_job_closed() && !closed_told_) {
    closed_told_ = true;
    Emit("job_closed", state_.round(), event.job_closed().reason());
  } else if (event.has_node_excluded()) {
    Emit("node_excluded", state_.round(), event.node_excluded().exclusion().cause());
  }
}

void Agent::Impl::Emit(std::string kind, int64_t round, std::string detail) {
  if (!config_.console_events && !options_.event_log.valid()) return;
  const std::string line = EventJsonLine(AgentEvent{.time = clock_.Now(),
                                                    .job = config_.rdzv_id,
                                                    .round = round,
                                                    .node = node_id_,
                                                    .kind = std::move(kind),
                                                    .detail = std::move(detail)});
  if (config_.console_events) {
    ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  }
  // One write per line: on a local file system O_APPEND keeps lines whole
  // when other agents write the same file.
  if (options_.event_log.valid() && !event_log_failed_ &&
      write(options_.event_log.get(), line.data(), line.size()) !=
          static_cast<ssize_t>(line.size())) {
    event_log_failed_ = true;
    logger_->warn("event_log {}: cannot write ({}); no more events go there",
                  config_.rdzv_conf.event_log, std::strerror(errno));
  }
}

void Agent::Impl::Do(Actions actions) {
  for (Action& action : actions) {
    std::visit([this](auto& a) { Do(a); }, action);
  }
}

void Agent::Impl::Do(const action::Join& join) {
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
  job->set_preflight(config_.preflight);
  job->set_max_no_progress_restarts(config_.max_no_progress_restarts);
  job->set_max_node_failures(config_.max_node_failures);
  rdzv::NodeInfo* node = request.mutable_node();
  node->set_node_id(node_id_);
  node->set_host(options_.host);
  node->set_advertised_addr(options_.advertised_addr);
  node->set_local_world_size(options_.nproc);
  node->set_node_rank_hint(config_.node_rank_given ? config_.node_rank : -1);
  // For MASTER_PORT: PyTorch's rank 0 binds it itself
  // (TORCHELASTIC_USE_AGENT_STORE=False), so it is picked as late as possible.
  node->set_master_port_candidate(PickFreePort());
  node->set_stop_allowance_ms(absl::ToInt64Milliseconds(
      ElasticState::StopAllowance(absl::FromChrono(config_.shutdown_grace))));
  node->set_peer_port(peers_ ? peers_->port() : 0);
  request.set_node_secret(node_secret_);  // empty on the first join
  request.set_join_key(join_key_);
  request.set_protocol_version(rdzv::kProtocolVersion);
  request.set_health_fault(join.health_fault);
  logger_->debug("joining job '{}' at {} as node {}", config_.rdzv_id, client_->target(), node_id_);
  client_->Join(request, join.timeout + kJoinSlack,
                [this](absl::StatusOr<rdzv::Assignment> assignment) {
                  loop_->Post([this, assignment = std::move(assignment)]() mutable {
                    // The server's word for this node from now on, whatever
                    // the elastic rules make of the answer.
                    if (assignment.ok()) node_secret_ = assignment->node_secret();
                    Do(state_.OnRdzv(rdzv_event::Joined{std::move(assignment)}, clock_.Now()));
                  });
                });
}

void Agent::Impl::Do(const action::CheckHealth&) {
  if (gpu_watcher_) {
    gpu_watcher_->CheckHealth();
  } else {
    Do(state_.OnHealthChecked({}, clock_.Now()));
  }
}

void Agent::Impl::Do(const action::StartWorkers& start) {
  // Its peers may ask about this round from now on, and it them.
  if (peers_) peers_->Remember(start.assignment);
  pending_start_ = start;
  if (gpu_watcher_ && !last_workers_.empty() && config_.gpu_release_wait.count() > 0) {
    awaiting_release_ = true;
    gpu_watcher_->AwaitRelease(std::exchange(last_workers_, {}),
                               absl::FromChrono(config_.gpu_release_wait));
  }
  StartWhenReady();
}

void Agent::Impl::StartWhenReady() {
  if (!pending_start_ || state_.done() || awaiting_release_) return;
  // Its imports end, or fail, soon: the preloader says so (OnChange).
  if (preloader_ && preloader_->state() == Preloader::State::kImporting) return;
  action::StartWorkers start = *std::move(pending_start_);
  pending_start_.reset();
  StartNow(start);
}

void Agent::Impl::OnGpuRelease(const GpuRelease& release) {
  if (!pending_start_ || state_.done()) return;
  awaiting_release_ = false;
  if (!release.holders.empty()) {
    std::vector<std::string> held;
    for (const GpuHolder& holder : release.holders) {
      held.push_back(absl::StrCat("pid ", holder.pid, " on GPU ", holder.gpu));
    }
    logger_->warn(
        "{:.1f} s after the last round ended, its processes still hold memory on this node's "
        "GPUs ({}); starting the round anyway (--gpu-release-wait)",
        absl::ToDoubleSeconds(release.waited), absl::StrJoin(held, ", "));
  } else if (release.waited >= absl::Milliseconds(100)) {
    logger_->info("waited {:.1f} s for the last round's processes to free this node's GPUs",
                  absl::ToDoubleSeconds(release.waited));
  }
  StartWhenReady();
}

void Agent::Impl::StartNow(const action::StartWorkers& start) {
  const NodePlacement placement = PlacementFor(start.assignment, options_);
  const WorkerGroup::Instead preflight = PreflightCommand(options_.allreduce);
  WorkerGroup::Started started =
      workers_->Start(placement, start.attempt, start.preflight ? &preflight : nullptr);
  logger_->info(
      "round {}: started {} {}, ranks {} of world size {} (node {} of {}), master {}:{}, "
      "restarts {}/{}",
      start.assignment.round(), started.count,
      start.preflight ? "pre-flight all-reduce worker(s) (muster-allreduce)" : "worker(s)",
      RankRange(placement.rank_base, options_.nproc), placement.world_size, placement.group_rank,
      placement.group_world_size, placement.master_addr, placement.master_port,
      placement.restart_count, placement.max_restarts);
  last_round_told_ = std::max(last_round_told_, start.assignment.round());
  if (options_.metrics != nullptr) {
    options_.metrics->RoundStarted(start.assignment.round(), placement.restart_count,
                                   started.count);
  }
  Emit(start.preflight ? "preflight_started" : "round_started", start.assignment.round(),
       absl::StrCat("group rank ", placement.group_rank, " of ", placement.group_world_size,
                    ", ranks ", RankRange(placement.rank_base, started.count), " of ",
                    placement.world_size, ", restarts ", placement.restart_count, "/",
                    placement.max_restarts));
  for (const WorkerGroup::Worker& worker : workers_->workers()) {
    if (worker.process) last_workers_.push_back(worker.process->pid());
  }
  Do(state_.OnWorkersStarted(started.count, std::move(started.failure), clock_.Now()));
  if (gpu_watcher_ && !start.preflight && state_.phase() == AgentPhase::kRunning) {
    std::vector<GpuWorker> running;
    for (const WorkerGroup::Worker& worker : workers_->workers()) {
      if (worker.process)
        running.push_back({worker.process->pid(), worker.rank, worker.local_rank});
    }
    gpu_watcher_->RoundStarted(std::move(running));
  }
}

void Agent::Impl::Do(const action::SignalWorkers& signal) {
  // The group is being stopped: its GPUs are no longer the round's picture.
  if (gpu_watcher_ && state_.stopping()) gpu_watcher_->RoundEnded();
  if (signal.stacks_first) {
    std::vector<WorkerGroup::Worker*> hung = workers_->Running();
    if (!hung.empty()) {
      workers_->CaptureStacks(hung, kStackLimit);
      for (const WorkerGroup::Worker* worker : hung) {
        logger_->warn("rank {} (pid {}) did not stop: its stacks are in {}", worker->rank,
                      worker->process->pid(), worker->stack_file);
      }
    }
  }
  workers_->SignalAll(signal.sig);
}

void Agent::Impl::Do(const action::AbandonWorkers&) { workers_->AbandonRunning(); }

void Agent::Impl::Do(const action::ReportFailure& report) {
  const WorkerFailure& failure = report.failure;
  Emit("worker_failed", report.round,
       absl::StrCat("rank ", failure.rank, " (local rank ", failure.local_rank, ", pid ",
                    failure.pid, ") on ", failure.host, ": ", DescribeExit(failure),
                    failure.killed_for.empty() ? "" : ": ", failure.killed_for));
  rdzv::ReportFailureRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  request.set_node_secret(node_secret_);
  request.set_round(report.round);
  rdzv::Failure* reported = request.mutable_failure();
  reported->set_rank(failure.rank);
  reported->set_local_rank(failure.local_rank);
  reported->set_host(failure.host);
  reported->set_pid(failure.pid);
  reported->set_exit_code(failure.exit_code);
  reported->set_signal(failure.signal);
  reported->set_time_unix_ms(absl::ToUnixMillis(failure.time));
  reported->set_no_restart(failure.preflight);
  if (failure.error) {
    reported->set_message(failure.error->message);
  } else if (!failure.killed_for.empty()) {
    reported->set_message(absl::StrCat("muster killed it: ", failure.killed_for));
  }
  // Read now: a step written just before the failure counts.
  if (std::optional<rdzv::Progress> progress = ProgressOf(report.round)) {
    *request.mutable_progress() = *std::move(progress);
  }
  client_->ReportFailure(request, kRpcTimeout, [this](absl::Status status) {
    Post(rdzv_event::FailureReported{std::move(status)});
  });
}

void Agent::Impl::Do(const action::ReportDone& report) {
  rdzv::ReportDoneRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  request.set_node_secret(node_secret_);
  request.set_round(report.round);
  if (std::optional<rdzv::Progress> progress = ProgressOf(report.round)) {
    *request.mutable_progress() = *std::move(progress);
  }
  client_->ReportDone(request, kRpcTimeout, [this](absl::Status status) {
    Post(rdzv_event::DoneReported{std::move(status)});
  });
}

void Agent::Impl::Do(const action::SendHeartbeat& heartbeat) {
  rdzv::HeartbeatRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  request.set_node_secret(node_secret_);
  if (heartbeat.progress) {
    *request.mutable_progress() = *heartbeat.progress;
    const int64_t round = heartbeat.progress->round();
    if (round != progress_told_round_ || clock_.Now() - progress_told_at_ >= absl::Minutes(1)) {
      progress_told_round_ = round;
      progress_told_at_ = clock_.Now();
      Emit("progress", round,
           absl::StrCat("step ", heartbeat.progress->step(),
                        heartbeat.progress->count() > 0
                            ? absl::StrCat(" (count ", heartbeat.progress->count(), ")")
                            : std::string()));
    }
  }
  client_->Heartbeat(request, kRpcTimeout,
                     [this, seq = heartbeat.seq](absl::StatusOr<int64_t> round) {
                       Post(rdzv_event::HeartbeatAnswered{std::move(round), seq});
                     });
}

void Agent::Impl::Do(const action::ReadProgress&) {
  const NodeProgress progress = ReadWorkerProgress();
  if (progress.step < 0) return;
  const int64_t before = state_.progress().step;
  Do(state_.OnProgress(progress, clock_.Now()));
  if (options_.metrics != nullptr && progress.step > before) {
    options_.metrics->Progressed(progress.step, progress.count, progress.written);
  }
}

NodeProgress Agent::Impl::ReadWorkerProgress() const {
  NodeProgress best;
  for (const WorkerGroup::Worker& worker : workers_->workers()) {
    if (worker.progress_file.empty()) continue;
    std::optional<NodeProgress> read = ReadProgressFile(worker.progress_file);
    if (read && read->step > best.step) best = *read;
  }
  return best;
}

std::optional<rdzv::Progress> Agent::Impl::ProgressOf(int64_t round) const {
  NodeProgress progress = ReadWorkerProgress();
  if (progress.step < state_.progress().step) progress = state_.progress();
  if (progress.step < 0) return std::nullopt;
  rdzv::Progress report;
  report.set_step(progress.step);
  report.set_count(progress.count);
  report.set_age_ms(
      std::max<int64_t>(0, absl::ToInt64Milliseconds(clock_.Now() - progress.written)));
  report.set_round(round);
  return report;
}

void Agent::Impl::Do(const action::OpenWatch& watch) {
  rdzv::WatchRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  request.set_node_secret(node_secret_);
  request.set_known_round(watch.known_round);
  const uint64_t generation = watch.generation;
  client_->Watch(
      request,
      [this, generation](const rdzv::WatchEvent& pushed) {
        Post(rdzv_event::Pushed{generation, pushed});
      },
      [this, generation](absl::Status status) {
        Post(rdzv_event::WatchEnded{generation, std::move(status)});
      });
}

void Agent::Impl::Do(const action::QueryStatus&) {
  rdzv::StatusRequest request;
  request.set_job_id(config_.rdzv_id);
  client_->Status(request, kRpcTimeout, [this](absl::StatusOr<rdzv::StatusResponse> status) {
    Post(rdzv_event::JobStatusAnswered{std::move(status)});
  });
}

std::unique_ptr<PeerEndpoint> Agent::Impl::OpenPeers() {
  // Static ranks have no rendezvous to lose; a rendezvous hosted here (host
  // mode, --standalone) is never ridden out, so nobody asks.
  if (options_.static_ranks || options_.hosts_rendezvous) return nullptr;
  absl::StatusOr<std::unique_ptr<PeerEndpoint>> peers =
      PeerEndpoint::Create(config_.rdzv_id, node_id_);
  if (!peers.ok()) {
    // Its port goes out as 0: a peer that asks it counts it as silent.
    logger_->warn(
        "{}; this node can neither ask the other nodes of its round nor answer them: while the "
        "rendezvous does not answer, its workers keep running until it answers again, and the "
        "other nodes of its round, finding it silent, stop theirs",
        peers.status().message());
    return nullptr;
  }
  return *std::move(peers);
}

void Agent::Impl::Do(const action::AskPeers& ask) {
  if (!peers_) return;
  peers_->Ask(ask.round, clock_.Now() + ask.timeout);
  logger_->debug("asking the other nodes of round {} whether they reach the rendezvous", ask.round);
}

void Agent::Impl::TakePeerAnswers() {
  if (!peers_) return;
  const absl::Time now = clock_.Now();
  if (std::optional<PeerEndpoint::Answers> got = peers_->TakeAnswers(now)) {
    logger_->debug("{} node(s) of round {} asked, {} answered; {} datagram(s) dropped so far",
                   got->answers.size(), got->round,
                   std::count_if(got->answers.begin(), got->answers.end(),
                                 [](const PeerAnswer& a) { return a.answered; }),
                   peers_->dropped());
    Do(state_.OnPeersAnswered(got->round, got->answers, now));
  }
}

void Agent::Impl::Do(const action::ExcludeSelf& exclude) {
  rdzv::LeaveRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  request.set_node_secret(node_secret_);
  request.set_reason(exclude.cause);
  request.set_exclude(true);
  client_->Leave(request, kRpcTimeout, [this](absl::Status status) {
    if (!status.ok()) {
      loop_->Post([this, status] {
        logger_->warn(
            "could not tell the rendezvous that this node is bad: {}; it drops the "
            "node when its heartbeats stop",
            status.message());
      });
    }
  });
}

void Agent::Impl::Do(const action::Log& log) {
  switch (log.level) {
    case action::Log::Level::kDebug: logger_->debug("{}", log.text); break;
    case action::Log::Level::kInfo: logger_->info("{}", log.text); break;
    case action::Log::Level::kWarn: logger_->warn("{}", log.text); break;
    case action::Log::Level::kError: logger_->error("{}", log.text); break;
  }
}

void Agent::Impl::Do(const action::Exit& exit) {
  Emit("agent_exited", state_.round(),
       absl::StrCat("exit code ", exit.code, exit.why.empty() ? "" : ": ", exit.why));
  if (!exit.report.empty()) {
    ssize_t ignored = write(STDERR_FILENO, exit.report.data(), exit.report.size());
    (void)ignored;
  }
  if (!exit.why.empty()) logger_->error("{}", exit.why);
  if (!exit.summary.empty()) logger_->info("{}", exit.summary);
  if (exit.excluded) RunExcludedCommand(*exit.excluded);
  // Workers that hung while being stopped are no failure of their own, but
  // where they hung may be why the job did not end cleanly.
  bool hung = false;
  for (const WorkerGroup::Worker& worker : workers_->workers()) {
    if (worker.stack_file.empty() || !worker.killed_for.empty()) continue;
    logger_->warn("rank {} (local rank {}) did not stop within the grace; its stacks: {}",
                  worker.rank, worker.local_rank, worker.stack_file);
    hung = true;
  }
  const bool failed = exit.code != kExitSuccess && exit.code < 128;
  if (failed && (!log_root_is_temp_ || exit.failures_seen || hung)) {
    logger_->info("worker logs and error files: {}", run_dir_);
  }
  if (exit.leave_reason) Leave(*exit.leave_reason);
  exit_code_ = exit.code;
}

void Agent::Impl::RunExcludedCommand(const rdzv::Exclusion& exclusion) {
  if (config_.on_node_excluded.empty()) return;
  const std::string host = exclusion.host().empty() ? options_.host : exclusion.host();
  logger_->info("--on-node-excluded: running '{}' for host {}", config_.on_node_excluded, host);
  absl::StatusOr<std::string> ended =
      RunSiteCommand(config_.on_node_excluded,
                     {absl::StrCat("MUSTER_EXCLUDED_HOST=", host),
                      absl::StrCat("MUSTER_EXCLUSION_CAUSE=", exclusion.cause()),
                      absl::StrCat("MUSTER_JOB_ID=", config_.rdzv_id)},
                     kSiteCommandLimit);
  if (!ended.ok()) {
    logger_->warn("--on-node-excluded could not run: {}", ended.status().message());
  } else {
    logger_->info("--on-node-excluded ended: {}", *ended);
  }
}

void Agent::Impl::Leave(const std::string& reason) {
  // Shared: the answer may come after we stopped waiting for it.
  auto left = std::make_shared<absl::Notification>();
  rdzv::LeaveRequest request;
  request.set_job_id(config_.rdzv_id);
  request.set_node_id(node_id_);
  request.set_node_secret(node_secret_);
  request.set_reason(reason);
  client_->Leave(request, absl::Seconds(1), [left](absl::Status) { left->Notify(); });
  left->WaitForNotificationWithTimeout(absl::Seconds(2));
}

Agent::Agent(AgentOptions options, std::unique_ptr<rdzv::RendezvousClient> client,
             ProcessRunner* runner, Clock& clock)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(client), runner, clock)) {}

Agent::~Agent() = default;

absl::StatusOr<int> Agent::Run() { return impl_->Run(); }

}  // namespace muster
