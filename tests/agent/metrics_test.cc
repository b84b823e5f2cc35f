// What an agent tells Prometheus: workers running, the round and its age,
// restarts, failures, each local rank's last exit.
#include "agent/metrics.h"

#include <map>
#include <string>

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace muster {
namespace {

// "name" or "name{local_rank}" → value; every sample carries job_id=job.
std::map<std::string, double> Samples(const AgentMetrics& metrics) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& family : metrics.Collect()) {
    for (const prometheus::ClientMetric& sample : family.metric) {
      std::string key = family.name;
      EXPECT_EQ(sample.label.front().name, "job_id");
      EXPECT_EQ(sample.label.front().value, "job");
      if (sample.label.size() > 1) absl::StrAppend(&key, "{", sample.label[1].value, "}");
      out[key] = family.type == prometheus::MetricType::Counter ? sample.counter.value
                                                                : sample.gauge.value;
    }
  }
  return out;
}

TEST(AgentMetricsTest, RoundsExitsAndFailuresAreTold) {
  FakeClock clock;
  AgentMetrics metrics("job", clock);
  std::map<std::string, double> samples = Samples(metrics);
  EXPECT_EQ(samples.at("muster_agent_workers_running"), 0);
  EXPECT_EQ(samples.count("muster_agent_round"), 0u) << "no round yet";
  EXPECT_EQ(samples.count("muster_agent_round_seconds"), 0u);

  metrics.RoundStarted(0, 0, 4);
  clock.Advance(absl::Seconds(90));
  samples = Samples(metrics);
  EXPECT_EQ(samples.at("muster_agent_workers_running"), 4);
  EXPECT_EQ(samples.at("muster_agent_round"), 0);
  EXPECT_EQ(samples.at("muster_agent_round_seconds"), 90);
  EXPECT_EQ(samples.at("muster_agent_restarts_total"), 0);

  // Local rank 2 fails; the agent stops the others (not failures of theirs).
  metrics.WorkerExited(2, 1, /*failed=*/true);
  metrics.WorkerExited(0, -15, /*failed=*/false);
  samples = Samples(metrics);
  EXPECT_EQ(samples.at("muster_agent_workers_running"), 2);
  EXPECT_EQ(samples.at("muster_agent_worker_failures_total"), 1);
  EXPECT_EQ(samples.at("muster_agent_worker_exit_code{2}"), 1);
  EXPECT_EQ(samples.at("muster_agent_worker_exit_code{0}"), -15);
  EXPECT_EQ(samples.count("muster_agent_worker_exit_code{1}"), 0u) << "still running";

  metrics.RoundStarted(1, 1, 4);
  clock.Advance(absl::Seconds(5));
  samples = Samples(metrics);
  EXPECT_EQ(samples.at("muster_agent_round"), 1);
  EXPECT_EQ(samples.at("muster_agent_round_seconds"), 5);
  EXPECT_EQ(samples.at("muster_agent_restarts_total"), 1);
  EXPECT_EQ(samples.at("muster_agent_workers_running"), 4);
  EXPECT_EQ(samples.at("muster_agent_worker_failures_total"), 1) << "counted over every round";
  EXPECT_EQ(samples.at("muster_agent_worker_exit_code{2}"), 1) << "the last exit stays";

  const std::string text = prometheus::TextSerializer().Serialize(metrics.Collect());
  EXPECT_NE(text.find("muster_agent_worker_exit_code{job_id=\"job\",local_rank=\"2\"} 1\n"),
            std::string::npos)
      << text;
}

TEST(AgentMetricsTest, GpuFiguresAreToldPerGpu) {
  FakeClock clock;
  AgentMetrics metrics("job", clock);
  EXPECT_EQ(Samples(metrics).count("muster_agent_gpu_utilization_ratio{0}"), 0u)
      << "no GPU check has run";
  GpuFigures busy;
  busy.index = 0;
  busy.sampled = true;
  busy.utilization = 97;
  busy.memory_used = 1 << 20;
  busy.memory_total = 2 << 20;
  busy.local_ranks = {0, 1, 2, 3};
  GpuFigures unsampled;
  unsampled.index = 1;
  metrics.GpuChecked({busy, unsampled});
  metrics.GpuWarned();
  std::map<std::string, double> samples = Samples(metrics);
  EXPECT_DOUBLE_EQ(samples.at("muster_agent_gpu_utilization_ratio{0}"), 0.97);
  EXPECT_EQ(samples.count("muster_agent_gpu_utilization_ratio{1}"), 0u)
      << "no samples: no utilization, rather than a false 0";
  EXPECT_EQ(samples.at("muster_agent_gpu_memory_used_bytes{0}"), 1 << 20);
  EXPECT_EQ(samples.at("muster_agent_gpu_memory_total_bytes{1}"), 0);
  EXPECT_EQ(samples.at("muster_agent_gpu_local_ranks{0}"), 4);
  EXPECT_EQ(samples.at("muster_agent_gpu_local_ranks{1}"), 0);
  EXPECT_EQ(samples.at("muster_agent_gpu_warnings_total"), 1);
}

TEST(AgentMetricsTest, TheWorkersStepsAreTold) {
  FakeClock clock;
  AgentMetrics metrics("job", clock);
  EXPECT_EQ(Samples(metrics).count("muster_agent_step"), 0u) << "none written yet";
  metrics.Progressed(10, 320, clock.Now());
  clock.Advance(absl::Seconds(2));
  metrics.Progressed(30, 960, clock.Now());
  clock.Advance(absl::Seconds(3));
  std::map<std::string, double> samples = Samples(metrics);
  EXPECT_EQ(samples.at("muster_agent_step"), 30);
  EXPECT_EQ(samples.at("muster_agent_step_items"), 960);
  EXPECT_EQ(samples.at("muster_agent_steps_per_second"), 10);
  EXPECT_EQ(samples.at("muster_agent_seconds_since_step"), 3);
}

}  // namespace
}  // namespace muster
