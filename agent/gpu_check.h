// The GPU check: while a round runs, the agent maps its workers (and the
// processes they started) to this node's GPUs from NVML's process lists,
// and says so when the picture is wrong:
//   - two or more local ranks share a GPU while another GPU given to this
//     node runs none of them: the script never called
//     torch.cuda.set_device(LOCAL_RANK), the most common silent DDP fault;
//   - a GPU given to this node stayed idle (0% for the whole interval)
//     while the others worked.
// Each warning is said once a round, and again only when the picture
// changes; a cleared one is said too. The same check samples each GPU's utilization
// and memory, for the metrics, the event log and --gpu-report.
//
// GpuSource is the seam: NVML (nvml.h) or the tests' fake. GpuCheck is the
// rules, on the caller's time; gpu_watcher.h runs them on a thread of their own.
#ifndef MUSTER_AGENT_GPU_CHECK_H_
#define MUSTER_AGENT_GPU_CHECK_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

// What the check reads of the GPUs. Indices are NVML's (PCI order).
class GpuSource {
 public:
  struct Memory {
    uint64_t used = 0;  // bytes
    uint64_t total = 0;
  };
  // Utilization samples (percent of time a kernel ran) taken after `since`.
  struct Utilization {
    int samples = 0;
    int max_percent = 0;
    double sum_percent = 0;
    uint64_t last = 0;  // the newest sample's timestamp: the next `since`
  };

  // What the driver says of a device's health; each field false or 0 where
  // the device does not report it.
  struct Health {
    bool lost = false;                   // NVML_ERROR_GPU_IS_LOST: fallen off the bus, or gone
    uint64_t ecc_uncorrected = 0;        // volatile: since the driver loaded
    bool retired_pages_pending = false;  // pages to retire at the next reset
    bool row_remap_pending = false;      // rows to remap at the next reset
    bool row_remap_failed = false;       // a row could not be remapped
  };
  // A critical Xid the driver reported (NVML's nvmlEventTypeXidCriticalError).
  struct Xid {
    int index = 0;
    uint64_t xid = 0;
  };

  virtual ~GpuSource() = default;
  // The devices' UUIDs ("GPU-..."), by index; fixed for the source's life.
  virtual const std::vector<std::string>& uuids() const = 0;
  // `since`: a timestamp in microseconds since the Unix epoch (NVML's).
  virtual absl::StatusOr<Utilization> ReadUtilization(int index, uint64_t since) = 0;
  virtual absl::StatusOr<Memory> ReadMemory(int index) = 0;
  // The pids of the processes that use the device (compute and graphics).
  virtual absl::StatusOr<std::vector<pid_t>> ReadProcesses(int index) = 0;
  // The device's health; a source that cannot tell says all is well.
  virtual absl::StatusOr<Health> ReadHealth(int index) { return Health{}; }
  // The critical Xids reported since the last call, oldest first.
  virtual std::vector<Xid> TakeXids() { return {}; }
};

// The Xids that tell of the hardware, not of the program that ran (an
// illegal address, a page fault: Xid 13, 31, 43), with NVIDIA's names for
// them; nullptr for any other.
const char* HardwareXidName(uint64_t xid);

// What is wrong with a GPU, from its health now and the uncorrected ECC
// count it had when the agent first looked (`ecc_baseline`); nullopt: nothing.
std::optional<std::string> HealthFault(const GpuSource::Health& health, uint64_t ecc_baseline);

// The NVML indices of the GPUs given to this node's `nproc` local ranks,
// local rank i's being the i-th (mod their count): CUDA_VISIBLE_DEVICES's
// when set (indices, or UUIDs and their unique prefixes, as CUDA reads
// them), else every device; the first `nproc` of them. Empty: none.
// Errors (kInvalidArgument, naming the entry): an entry that names no
// device, or a MIG instance (NVML's process lists do not tell instances).
absl::StatusOr<std::vector<int>> NodeGpus(const std::optional<std::string>& visible,
                                          const std::vector<std::string>& uuids, int nproc);

struct GpuCheckOptions {
  // --gpu-check-interval: between checks, and the span a GPU must idle
  // through to be called idle.
  absl::Duration interval = absl::Seconds(30);
  // From a round's start to its first check (at most `interval`).
  absl::Duration first_check = absl::Seconds(5);
  // A new picture of shared GPUs is looked at again this soon before it is
  // said (a rank that has not moved to its own GPU yet is no fault).
  absl::Duration confirm = absl::Seconds(5);
  // --gpu-report: a line of every GPU's figures at the round's first full
  // check, then every `report_every`.
  bool report = false;
  absl::Duration report_every = absl::Minutes(5);
  // NodeGpus' answer.
  std::vector<int> gpus;
  // The GPUs the node must have (--nproc-per-node gpu: one a worker);
  // fewer is a fault of the health check. 0: any number.
  int expected_gpus = 0;
};

// One worker of the running round.
struct GpuWorker {
  pid_t pid = 0;
  int rank = 0;
  int local_rank = 0;
};

// One GPU given to this node, as the last full check saw it.
struct GpuFigures {
  int index = 0;
  double utilization = 0;  // percent, the mean over the interval
  int max_utilization = 0;
  bool sampled = false;  // NVML gave utilization samples
  uint64_t memory_used = 0;
  uint64_t memory_total = 0;
  std::vector<int> local_ranks;  // of this node's, those that use it
};

// A process of the last round that holds memory on one of this node's GPUs.
struct GpuHolder {
  pid_t pid = 0;
  int gpu = 0;
};

// How the wait for the last round's GPU memory ended (GpuCheck::AwaitRelease).
struct GpuRelease {
  absl::Duration waited = absl::ZeroDuration();
  // Still holding memory when the bound ran out; empty: every GPU was freed.
  std::vector<GpuHolder> holders;
};

// What a check found; all empty most of the time.
struct GpuCheckOutput {
  std::vector<std::string> warnings;  // new: to log as warnings
  std::vector<std::string> cleared;   // a warned picture that is gone
  std::optional<std::string> report;  // the --gpu-report line
  // Set for the health check before the node's first join
  // (GpuCheck::CheckHealthNow): `faults` is its answer.
  bool health_checked = false;
  // Set at each full check: every GPU's figures, and the same in one line
  // (the event log's gpu_sample).
  std::optional<std::vector<GpuFigures>> figures;
  std::string figures_line;
  // A GPU that could not be read, said once (NVML errors are per device
  // and per feature).
  std::vector<std::string> errors;
  // The wait AwaitRelease began is over.
  std::optional<GpuRelease> release;
  // Hardware faults of this node's GPUs, each said once ("GPU 1
  // (GPU-...): Xid 79, the GPU has fallen off the bus"): the node is bad.
  std::vector<std::string> faults;
};

class GpuCheck {
 public:
  // `parent_of(pid)`: the parent of a process, 0 when it is gone (reads
  // /proc; the tests' fake otherwise). `source` outlives the check.
  GpuCheck(GpuSource& source, GpuCheckOptions options, std::function<pid_t(pid_t)> parent_of);

  // The round's workers started at `now`: checks begin.
  void RoundStarted(std::vector<GpuWorker> workers, absl::Time now);
  // The workers are stopping or gone: no checks until the next round.
  void RoundEnded();

  // Before the next round's workers start: waits until no process of the
  // last round holds memory on this node's GPUs (NVML's process lists: a
  // CUDA context can take seconds to go after its process was killed).
  // Of the last round: a pid of `old_workers`, or a process whose parents
  // lead to `agent_pid` (what a worker started, reparented to the agent).
  // Looks now, then every kReleasePoll, until `limit` from `now`; OnTimer
  // then gives GpuCheckOutput::release, with the holders left if any.
  void AwaitRelease(std::vector<pid_t> old_workers, pid_t agent_pid, absl::Time now,
                    absl::Duration limit);
  static constexpr absl::Duration kReleasePoll = absl::Milliseconds(100);

  // The health check before a node is seated: its GPUs' faults (as the
  // checks in a round find them), and too few GPUs (options.expected_gpus).
  GpuCheckOutput CheckHealthNow();

  // When OnTimer must next run; nullopt: nothing to do.
  std::optional<absl::Time> NextDeadline() const;
  GpuCheckOutput OnTimer(absl::Time now);

  const GpuCheckOptions& options() const { return options_; }

 private:
  struct Window {  // utilization since the last full check, per GPU
    int samples = 0;
    int max_percent = 0;
    double sum_percent = 0;
    uint64_t since = 0;
    double mean() const { return samples > 0 ? sum_percent / samples : 0; }
  };
  // What one check saw of this node's GPUs.
  struct Look {
    std::map<int, int> rank_of_local;  // local rank -> rank
    std::set<int> node_gpus;
    std::map<int, std::set<int>> on;  // GPU -> local ranks that use it; unreadable ones left out
    bool any_on_gpu = false;
    std::map<int, GpuSource::Memory> memory;  // full checks only
    std::vector<int> unused;                  // GPUs no local rank uses
    std::string shared_key;                   // GPUs shared while others are unused; empty: none
  };
  void Sample(GpuCheckOutput& out);
  // One check: who uses which GPU, GPUs shared while others are unused,
  // and on a full check idle GPUs, the figures and the report.
  void Check(absl::Time now, bool full, GpuCheckOutput& out);
  Look ReadGpus(bool full, GpuCheckOutput& out);
  void CheckShared(absl::Time now, Look& look, GpuCheckOutput& out);
  std::string SharedWarning(Look& look, const std::vector<int>& shared);
  void CheckIdle(absl::Time now, Look& look, GpuCheckOutput& out);
  std::string IdleWarning(absl::Time now, Look& look, int gpu, const std::vector<int>& working);
  void Report(absl::Time now, Look& look, GpuCheckOutput& out);
  // A GPU's mean utilization in the window ("37%"), or "n/a" unsampled.
  std::string Busy(int gpu);
  // The worker a process belongs to (itself or an ancestor); -1: none.
  int LocalRankOf(pid_t pid) const;
  void ReadError(int gpu, const absl::Status& status, GpuCheckOutput& out);
  // Looks for hardware faults of this node's GPUs (HealthFault, critical
  // Xids); each GPU's first is added to out.faults.
  void CheckHealth(GpuCheckOutput& out);
  // AwaitRelease's look: the last round's processes on this node's GPUs.
  std::vector<GpuHolder> OldRoundHolders(GpuCheckOutput& out);
  void LookForRelease(absl::Time now, GpuCheckOutput& out);

  // AwaitRelease's wait, while one runs.
  struct ReleaseWait {
    std::set<pid_t> old_workers;
    pid_t agent_pid = 0;
    absl::Time started, deadline, next_look;
  };
  std::optional<ReleaseWait> release_;

  GpuSource& source_;
  const GpuCheckOptions options_;
  const std::function<pid_t(pid_t)> parent_of_;
  std::map<pid_t, GpuWorker> workers_;  // by pid; empty between rounds
  std::map<int, Window> windows_;       // by NVML index
  absl::Time window_start_;
  std::optional<absl::Time> next_check_, next_sample_;
  std::optional<absl::Time> next_report_;  // unset: at the next full check
  // What was said, so that it is said again only when it changes.
  std::string shared_said_, shared_seen_;
  std::set<int> idle_said_;
  std::set<int> errors_said_;
  // CheckHealth's: each GPU's uncorrected ECC count when first read, and
  // the GPUs whose fault was said.
  std::map<int, uint64_t> ecc_baseline_;
  std::set<int> faults_said_;
};

}  // namespace muster

#endif  // MUSTER_AGENT_GPU_CHECK_H_
