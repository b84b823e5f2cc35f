// The GPU check (gpu_check.h) on a thread of its own, so that NVML, whose
// calls can take seconds (nvmlInit without persistence mode, a GPU that
// fell off the bus), never holds the agent's loop: its heartbeats, signals
// and worker exits. The thread opens NVML, runs the checks on the real
// clock, and hands each check's findings to `deliver`; the agent's loop
// tells it when a round's workers start and stop.
#ifndef MUSTER_AGENT_GPU_WATCHER_H_
#define MUSTER_AGENT_GPU_WATCHER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/gpu_check.h"

namespace muster {

struct GpuWatcherOptions {
  std::string library;                 // nvml.h's kNvmlLibrary, or the tests' fake
  std::optional<std::string> visible;  // CUDA_VISIBLE_DEVICES
  int nproc = 1;                       // this node's workers
  bool one_per_gpu = false;            // --nproc-per-node gpu: nproc GPUs are expected
  GpuCheckOptions check;               // its `gpus` are filled from NVML
};

class GpuWatcher {
 public:
  // Starts the thread. `deliver` runs on it, with each check's findings
  // (never after the destructor returned); it must not block for long.
  GpuWatcher(GpuWatcherOptions options, std::function<void(GpuCheckOutput)> deliver);
  // Stops the thread; waits a moment for it, then leaves it to end by
  // itself when an NVML call holds it (the process is exiting).
  ~GpuWatcher();
  GpuWatcher(const GpuWatcher&) = delete;
  GpuWatcher& operator=(const GpuWatcher&) = delete;

  // The round's workers started now / are stopping. Any thread.
  void RoundStarted(std::vector<GpuWorker> workers);
  void RoundEnded();
  // Before the next round starts: waits, at most `limit`, until no process
  // of the last round (`old_workers`, or what they started) holds memory on
  // this node's GPUs (GpuCheck::AwaitRelease); `deliver` then gets a
  // GpuCheckOutput with `release` set. Where there is no NVML or no GPU,
  // that comes at once, with nothing waited. Any thread.
  void AwaitRelease(std::vector<pid_t> old_workers, absl::Duration limit);
  // The health check before the node is seated (GpuCheck::CheckHealthNow):
  // `deliver` gets its answer (health_checked set); at once, with no fault,
  // where there is no NVML or no GPU. Any thread.
  void CheckHealth();

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

}  // namespace muster

#endif  // MUSTER_AGENT_GPU_WATCHER_H_
