#include "agent/gpu_watcher.h"

#include <unistd.h>

#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/nvml.h"
#include "common/log.h"

namespace muster {
namespace {

// How long the destructor waits for the thread before leaving it.
constexpr absl::Duration kJoinWait = absl::Seconds(2);

}  // namespace

struct GpuWatcher::Shared {
  GpuWatcherOptions options;
  std::function<void(GpuCheckOutput)> deliver;
  absl::Notification exited;

  absl::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  // What the loop said last, not yet taken by the thread.
  std::optional<std::vector<GpuWorker>> started ABSL_GUARDED_BY(mu);
  bool ended ABSL_GUARDED_BY(mu) = false;
  // The thread's: when its check wants to run next.
  std::optional<absl::Time> due ABSL_GUARDED_BY(mu);
  // AwaitRelease's, not yet taken by the thread.
  std::optional<std::pair<std::vector<pid_t>, absl::Duration>> release ABSL_GUARDED_BY(mu);
  // CheckHealth's, not yet taken by the thread.
  bool health ABSL_GUARDED_BY(mu) = false;
  // The check does not run (no NVML, no GPU): a release is answered at once.
  bool off ABSL_GUARDED_BY(mu) = false;

  void Run();
  // The check will not run: says so to a release asked for, and to later ones.
  void TurnOff();
};

void GpuWatcher::Shared::TurnOff() {
  absl::MutexLock lock(&mu);
  off = true;
  if (release && !stop) {
    release.reset();
    GpuCheckOutput out;
    out.release.emplace();
    deliver(std::move(out));
  }
  if (health && !stop) {
    health = false;
    GpuCheckOutput out;
    out.health_checked = true;
    deliver(std::move(out));
  }
}

void GpuWatcher::Shared::Run() {
  auto logger = Logger("agent");
  absl::StatusOr<std::unique_ptr<GpuSource>> source = OpenNvml(options.library);
  if (!source.ok()) {
    logger->debug("GPU check off: {}", source.status().message());
    TurnOff();
    return;
  }
  absl::StatusOr<std::vector<int>> gpus =
      NodeGpus(options.visible, (*source)->uuids(), options.nproc);
  if (!gpus.ok() || gpus->empty()) {
    logger->info("GPU check off: {}",
                 gpus.ok() ? "no GPU is given to this node" : gpus.status().message());
    TurnOff();
    return;
  }
  options.check.gpus = *std::move(gpus);
  if (options.one_per_gpu) options.check.expected_gpus = options.nproc;
  logger->debug("GPU check: GPUs {} (NVML's indices), every {} s",
                absl::StrJoin(options.check.gpus, ", "),
                absl::ToDoubleSeconds(options.check.interval));
  GpuCheck check(**source, options.check, ParentPid);
  while (true) {
    std::optional<std::vector<GpuWorker>> new_round;
    std::optional<std::pair<std::vector<pid_t>, absl::Duration>> release_asked;
    bool round_ended = false;
    bool health_asked = false;
    {
      absl::MutexLock lock(&mu);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return stop || started.has_value() || ended || release.has_value() || health ||
               (due && absl::Now() >= *due);
      };
      if (due) {
        mu.AwaitWithDeadline(absl::Condition(&wake), *due);
      } else {
        mu.Await(absl::Condition(&wake));
      }
      if (stop) return;
      std::swap(new_round, started);
      std::swap(round_ended, ended);
      std::swap(release_asked, release);
      std::swap(health_asked, health);
    }
    if (health_asked) {
      GpuCheckOutput out = check.CheckHealthNow();
      absl::MutexLock lock(&mu);
      if (stop) return;
      deliver(std::move(out));
    }
    if (round_ended) check.RoundEnded();
    if (new_round) check.RoundStarted(*std::move(new_round), absl::Now());
    if (release_asked) {
      check.AwaitRelease(std::move(release_asked->first), getpid(), absl::Now(),
                         release_asked->second);
    }
    std::optional<absl::Time> next = check.NextDeadline();
    if (next && absl::Now() >= *next) {
      GpuCheckOutput out = check.OnTimer(absl::Now());
      next = check.NextDeadline();
      absl::MutexLock lock(&mu);
      if (stop) return;
      deliver(std::move(out));  // under the lock: the destructor waits for it
    }
    absl::MutexLock lock(&mu);
    due = next;
  }
}

GpuWatcher::GpuWatcher(GpuWatcherOptions options, std::function<void(GpuCheckOutput)> deliver)
    : shared_(std::make_shared<Shared>()) {
  shared_->options = std::move(options);
  shared_->deliver = std::move(deliver);
  std::thread([shared = shared_] {
    shared->Run();
    shared->exited.Notify();
  }).detach();
}

GpuWatcher::~GpuWatcher() {
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->stop = true;
  }
  // Detached from the start: a thread stuck in NVML must not hold the
  // agent's exit. It holds `shared_` for as long as it runs.
  shared_->exited.WaitForNotificationWithTimeout(kJoinWait);
}

void GpuWatcher::RoundStarted(std::vector<GpuWorker> workers) {
  absl::MutexLock lock(&shared_->mu);
  shared_->started = std::move(workers);
  shared_->ended = false;
}

void GpuWatcher::AwaitRelease(std::vector<pid_t> old_workers, absl::Duration limit) {
  absl::MutexLock lock(&shared_->mu);
  if (shared_->off) {
    GpuCheckOutput out;
    out.release.emplace();
    shared_->deliver(std::move(out));
    return;
  }
  shared_->release.emplace(std::move(old_workers), limit);
}

void GpuWatcher::CheckHealth() {
  absl::MutexLock lock(&shared_->mu);
  if (shared_->off) {
    GpuCheckOutput out;
    out.health_checked = true;
    shared_->deliver(std::move(out));
    return;
  }
  shared_->health = true;
}

void GpuWatcher::RoundEnded() {
  absl::MutexLock lock(&shared_->mu);
  shared_->started.reset();
  shared_->ended = true;
}

}  // namespace muster
