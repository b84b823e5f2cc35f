// What an agent tells Prometheus (--rdzv-conf metrics_port=): its workers
// running, the round and how long it has run, the job's restarts, each
// local rank's last exit, its GPUs' figures (--gpu-check-interval). Labelled with the job's id; the
// only other label are local_rank and gpu, bounded by the node's workers and GPUs (no global rank,
// no host: Prometheus' own instance label tells the node). docs/METRICS.md lists them.
#ifndef MUSTER_AGENT_METRICS_H_
#define MUSTER_AGENT_METRICS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/gpu_check.h"
#include "common/clock.h"

namespace muster {

// Told by the agent's loop thread as things happen; read by the exposer's
// threads at each scrape.
class AgentMetrics final : public prometheus::Collectable {
 public:
  // `clock` (the agent's) outlives this.
  AgentMetrics(std::string job_id, Clock& clock);

  // `workers` of this node started for `round`, the job having used
  // `restarts` restarts.
  void RoundStarted(int64_t round, int32_t restarts, int workers);
  // A worker of the round exited: `exit_code`, or -N when signal N ended it
  // (as torchrun reports it). `failed` when that is a failure.
  void WorkerExited(int local_rank, int exit_code, bool failed);
  // The GPU check's figures of this node's GPUs (gpu_check.h), as of its
  // last full check; and a warning it gave.
  void GpuChecked(std::vector<GpuFigures> figures);
  void GpuWarned();
  // This node's workers wrote `step` (with `count`) at `written`.
  void Progressed(int64_t step, int64_t count, absl::Time written);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::string job_id_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  std::optional<int64_t> round_ ABSL_GUARDED_BY(mu_);  // none before the first
  absl::Time round_started_ ABSL_GUARDED_BY(mu_);
  int32_t restarts_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int> exit_codes_ ABSL_GUARDED_BY(mu_);  // the last, by local rank
  std::vector<GpuFigures> gpus_ ABSL_GUARDED_BY(mu_);
  int64_t gpu_warnings_ ABSL_GUARDED_BY(mu_) = 0;
  // Progress: the last step, its count and time, and the steps a second
  // between the last two steps read.
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time step_time_ ABSL_GUARDED_BY(mu_);
  double steps_per_second_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace muster

#endif  // MUSTER_AGENT_METRICS_H_
