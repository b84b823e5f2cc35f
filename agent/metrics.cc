#include "agent/metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/prometheus_samples.h"

namespace muster {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily OneSample(std::string name, std::string help, MetricType type,
                       std::vector<ClientMetric::Label> labels, double value) {
  MetricFamily family = EmptyFamily(std::move(name), std::move(help), type);
  AddSample(family, std::move(labels), value);
  return family;
}

}  // namespace

AgentMetrics::AgentMetrics(std::string job_id, Clock& clock)
    : job_id_(std::move(job_id)), clock_(clock) {}

void AgentMetrics::RoundStarted(int64_t round, int32_t restarts, int workers) {
  absl::MutexLock lock(&mu_);
  round_ = round;
  round_started_ = clock_.Now();
  restarts_ = restarts;
  running_ = workers;
}

void AgentMetrics::WorkerExited(int local_rank, int exit_code, bool failed) {
  absl::MutexLock lock(&mu_);
  if (running_ > 0) --running_;
  exit_codes_[local_rank] = exit_code;
  if (failed) ++failures_;
}

void AgentMetrics::GpuChecked(std::vector<GpuFigures> figures) {
  absl::MutexLock lock(&mu_);
  gpus_ = std::move(figures);
}

void AgentMetrics::GpuWarned() {
  absl::MutexLock lock(&mu_);
  ++gpu_warnings_;
}

void AgentMetrics::Progressed(int64_t step, int64_t count, absl::Time written) {
  absl::MutexLock lock(&mu_);
  // A new round starts again from its checkpoint: a rate only within steps that go up.
  if (step_ >= 0 && step > step_ && written > step_time_) {
    steps_per_second_ =
        static_cast<double>(step - step_) / absl::ToDoubleSeconds(written - step_time_);
  }
  step_ = step;
  count_ = count;
  step_time_ = written;
}

std::vector<MetricFamily> AgentMetrics::Collect() const {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  const std::vector<ClientMetric::Label> job{{"job_id", job_id_}};
  std::vector<MetricFamily> out;
  out.push_back(OneSample("muster_agent_workers_running", "This node's workers running now",
                          MetricType::Gauge, job, running_));
  out.push_back(OneSample("muster_agent_restarts_total",
                          "Restarts the job has used, as of this node's last round",
                          MetricType::Counter, job, restarts_));
  out.push_back(OneSample("muster_agent_worker_failures_total",
                          "This node's workers that failed (every round)", MetricType::Counter, job,
                          static_cast<double>(failures_)));
  if (round_) {
    out.push_back(OneSample("muster_agent_round", "The round this node's workers run in",
                            MetricType::Gauge, job, static_cast<double>(*round_)));
    out.push_back(OneSample("muster_agent_round_seconds",
                            "Seconds since this node's workers of the round started",
                            MetricType::Gauge, job, absl::ToDoubleSeconds(now - round_started_)));
  }
  if (step_ >= 0) {
    out.push_back(OneSample("muster_agent_step",
                            "The highest step this node's workers wrote (MUSTER_PROGRESS_FILE)",
                            MetricType::Gauge, job, static_cast<double>(step_)));
    out.push_back(OneSample("muster_agent_step_items",
                            "The count written beside that step (samples, tokens: the script's)",
                            MetricType::Gauge, job, static_cast<double>(count_)));
    out.push_back(OneSample("muster_agent_steps_per_second",
                            "Steps a second between the last two steps read", MetricType::Gauge,
                            job, steps_per_second_));
    out.push_back(OneSample("muster_agent_seconds_since_step",
                            "Seconds since this node's workers wrote their last step",
                            MetricType::Gauge, job, absl::ToDoubleSeconds(now - step_time_)));
  }
  MetricFamily exits = EmptyFamily(
      "muster_agent_worker_exit_code",
      "The last exit code of each local rank's worker, in whichever round it exited (-N: "
      "signal N)",
      MetricType::Gauge);
  for (const auto& [local_rank, code] : exit_codes_) {
    AddSample(exits, {{"job_id", job_id_}, {"local_rank", absl::StrCat(local_rank)}}, code);
  }
  if (!exits.metric.empty()) out.push_back(std::move(exits));
  out.push_back(OneSample("muster_agent_gpu_warnings_total",
                          "Warnings of the GPU check: ranks sharing a GPU while another has none, "
                          "a GPU idle while others work",
                          MetricType::Counter, job, static_cast<double>(gpu_warnings_)));
  if (!gpus_.empty()) {
    MetricFamily utilization = EmptyFamily(
        "muster_agent_gpu_utilization_ratio",
        "Each GPU's utilization (time a kernel ran), the mean over the last check interval",
        MetricType::Gauge);
    MetricFamily used = EmptyFamily("muster_agent_gpu_memory_used_bytes",
                                    "Each GPU's memory in use", MetricType::Gauge);
    MetricFamily total =
        EmptyFamily("muster_agent_gpu_memory_total_bytes", "Each GPU's memory", MetricType::Gauge);
    MetricFamily ranks =
        EmptyFamily("muster_agent_gpu_local_ranks",
                    "How many of this node's local ranks use each GPU", MetricType::Gauge);
    for (const GpuFigures& gpu : gpus_) {
      const std::vector<ClientMetric::Label> labels{{"job_id", job_id_},
                                                    {"gpu", absl::StrCat(gpu.index)}};
      if (gpu.sampled) AddSample(utilization, labels, gpu.utilization / 100.0);
      AddSample(used, labels, static_cast<double>(gpu.memory_used));
      AddSample(total, labels, static_cast<double>(gpu.memory_total));
      AddSample(ranks, labels, static_cast<double>(gpu.local_ranks.size()));
    }
    for (MetricFamily* family : {&utilization, &used, &total, &ranks}) {
      if (!family->metric.empty()) out.push_back(std::move(*family));
    }
  }
  return out;
}

}  // namespace muster
