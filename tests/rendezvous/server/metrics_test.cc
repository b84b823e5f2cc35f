// What a rendezvous tells Prometheus: its jobs' figures as the hub holds
// them at the scrape, every call by a bounded method and code, auth
// failures, join latency; and the text an exposer would serve.
#include "rendezvous/server/metrics.h"

#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "tests/rendezvous/server/fake_time_hub.h"
#include "tests/rendezvous/server/pending.h"
#include "tests/rendezvous/server/requests.h"

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A join of a two-node job with restarts to spare.
JoinRequest TwoNodeJoin(const std::string& job, const std::string& node) {
  JoinRequest request = MakeJoin(job, node, 2);
  request.mutable_config()->set_max_restarts(3);
  return request;
}

// "name{label=value,...}" → value, for every sample collected.
std::map<std::string, double> Samples(const prometheus::Collectable& metrics) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& family : metrics.Collect()) {
    for (const prometheus::ClientMetric& sample : family.metric) {
      std::string key = family.name;
      if (!sample.label.empty()) {
        key += "{";
        for (size_t i = 0; i < sample.label.size(); ++i) {
          absl::StrAppend(&key, i > 0 ? "," : "", sample.label[i].name, "=", sample.label[i].value);
        }
        key += "}";
      }
      switch (family.type) {
        case prometheus::MetricType::Counter: out[key] = sample.counter.value; break;
        case prometheus::MetricType::Gauge: out[key] = sample.gauge.value; break;
        case prometheus::MetricType::Histogram:
          out[key + "_count"] = static_cast<double>(sample.histogram.sample_count);
          out[key + "_sum"] = sample.histogram.sample_sum;
          break;
        default: break;
      }
    }
  }
  return out;
}

class RendezvousMetricsTest : public ::testing::Test {
 protected:
  // Nodes a and b join `job`, with the secrets they were given before.
  std::map<std::string, Assignment> Form(const std::string& job,
                                         const std::map<std::string, Assignment>& before = {}) {
    Pending<absl::StatusOr<Assignment>> a, b;
    for (auto& [node, join] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
      JoinRequest request = TwoNodeJoin(job, node);
      if (auto it = before.find(node); it != before.end()) {
        request.set_node_secret(it->second.node_secret());
      }
      hub_->Join(request, "10.0.0.1", hub_->NewTicket(), join->Callback());
    }
    std::map<std::string, Assignment> out;
    for (auto& [node, join] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
      absl::StatusOr<Assignment> assigned = join->Wait();
      EXPECT_TRUE(assigned.ok()) << assigned.status();
      if (assigned.ok()) out[node] = *assigned;
    }
    return out;
  }

  FakeClock clock_;
  std::shared_ptr<RendezvousHub> hub_ = std::make_shared<RendezvousHub>(FakeTimeHub(&clock_));
  RendezvousMetrics metrics_{hub_};
};

TEST_F(RendezvousMetricsTest, JobsAreToldByStateWithTheirNodesRoundsAndRestarts) {
  std::map<std::string, double> samples = Samples(metrics_);
  EXPECT_EQ(samples.at("muster_rendezvous_jobs{state=running}"), 0);
  EXPECT_EQ(samples.count("muster_rendezvous_nodes{job_id=train}"), 0u);

  std::map<std::string, Assignment> round0 = Form("train");
  Pending<absl::StatusOr<Assignment>> other;
  hub_->Join(TwoNodeJoin("other", "x"), "10.0.0.3", hub_->NewTicket(), other.Callback());
  samples = Samples(metrics_);
  EXPECT_EQ(samples.at("muster_rendezvous_jobs{state=running}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_jobs{state=open}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_jobs{state=closed}"), 0);
  EXPECT_EQ(samples.at("muster_rendezvous_nodes{job_id=train}"), 2);
  EXPECT_EQ(samples.at("muster_rendezvous_nodes{job_id=other}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_rounds_total{job_id=train,reason=start}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_restarts_total{job_id=train}"), 0);
  EXPECT_EQ(samples.count("muster_rendezvous_rounds_total{job_id=other,reason=start}"), 0u)
      << "no round formed yet";

  ReportFailureRequest report;
  report.set_job_id("train");
  report.set_node_id("b");
  report.set_round(0);
  report.set_node_secret(round0["b"].node_secret());
  report.mutable_failure()->set_rank(5);
  report.mutable_failure()->set_exit_code(1);
  ASSERT_TRUE(hub_->ReportFailure(report).ok());
  Form("train", round0);
  samples = Samples(metrics_);
  EXPECT_EQ(samples.at("muster_rendezvous_rounds_total{job_id=train,reason=start}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_rounds_total{job_id=train,reason=worker_failed}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_restarts_total{job_id=train}"), 1);

  ASSERT_TRUE(hub_->Stop("train", "enough").ok());
  samples = Samples(metrics_);
  EXPECT_EQ(samples.at("muster_rendezvous_jobs{state=closed}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_jobs{state=running}"), 0);
  hub_->Shutdown();
}

TEST_F(RendezvousMetricsTest, AJobsStepPaceGoodputAndExclusionsAreTold) {
  std::map<std::string, Assignment> round0 = Form("train");
  std::map<std::string, double> samples = Samples(metrics_);
  EXPECT_EQ(samples.count("muster_rendezvous_job_step{job_id=train}"), 0u) << "none reported";
  EXPECT_EQ(samples.at("muster_rendezvous_job_excluded_nodes{job_id=train}"), 0);
  EXPECT_EQ(samples.at("muster_rendezvous_job_goodput_ratio{job_id=train}"), 0);
  HeartbeatRequest beat;
  beat.set_job_id("train");
  beat.set_node_id("a");
  beat.set_node_secret(round0["a"].node_secret());
  beat.mutable_progress()->set_round(0);
  clock_.Advance(absl::Seconds(10));
  beat.mutable_progress()->set_step(100);
  ASSERT_TRUE(hub_->Heartbeat(beat).ok());
  clock_.Advance(absl::Seconds(5));
  beat.mutable_progress()->set_step(150);
  ASSERT_TRUE(hub_->Heartbeat(beat).ok());
  clock_.Advance(absl::Seconds(5));
  samples = Samples(metrics_);
  EXPECT_EQ(samples.at("muster_rendezvous_job_step{job_id=train}"), 150);
  EXPECT_EQ(samples.at("muster_rendezvous_job_steps_per_second{job_id=train}"), 10);
  EXPECT_EQ(samples.at("muster_rendezvous_job_seconds_since_step{job_id=train}"), 5);
  EXPECT_EQ(samples.at("muster_rendezvous_job_goodput_ratio{job_id=train}"), 1)
      << "every second of it in a round that made progress";
  EXPECT_EQ(samples.at("muster_rendezvous_job_no_progress_restarts{job_id=train}"), 0);
  hub_->Shutdown();
}

TEST_F(RendezvousMetricsTest, CallsAreCountedByMethodAndCode) {
  metrics_.CountCall(RpcMethod::kJoin, grpc::StatusCode::OK);
  metrics_.CountCall(RpcMethod::kJoin, grpc::StatusCode::OK);
  metrics_.CountCall(RpcMethod::kHeartbeat, grpc::StatusCode::PERMISSION_DENIED);
  metrics_.CountCall(RpcMethod::kStop, grpc::StatusCode::UNAUTHENTICATED);
  metrics_.CountCall(RpcMethod::kHealthCheck, grpc::StatusCode::OK);
  metrics_.CountCall(RpcMethod::kWatchJob, grpc::StatusCode::RESOURCE_EXHAUSTED);
  // A code gRPC does not have is UNKNOWN, not a label of its own.
  metrics_.CountCall(RpcMethod::kJoin, static_cast<grpc::StatusCode>(999));
  std::map<std::string, double> samples = Samples(metrics_);
  EXPECT_EQ(samples.at("muster_rendezvous_rpcs_total{code=OK,method=Join}"), 2);
  EXPECT_EQ(samples.at("muster_rendezvous_rpcs_total{code=PERMISSION_DENIED,method=Heartbeat}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_rpcs_total{code=UNAUTHENTICATED,method=Stop}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_rpcs_total{code=OK,method=Health/Check}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_rpcs_total{code=RESOURCE_EXHAUSTED,method=WatchJob}"), 1);
  EXPECT_EQ(samples.at("muster_rendezvous_rpcs_total{code=UNKNOWN,method=Join}"), 1);
  int series = 0;
  for (const auto& [key, value] : samples) {
    series += key.starts_with("muster_rendezvous_rpcs_total") ? 1 : 0;
  }
  EXPECT_EQ(series, 6) << "only the pairs seen";
  EXPECT_EQ(samples.at("muster_rendezvous_auth_failures_total"), 2);
  for (size_t method = 0; method < kRpcMethods; ++method) {
    EXPECT_STRNE(RpcMethodName(static_cast<RpcMethod>(method)), "unknown") << method;
  }
}

TEST_F(RendezvousMetricsTest, JoinsAreTimedInBuckets) {
  metrics_.ObserveJoin(absl::Milliseconds(3));
  metrics_.ObserveJoin(absl::Seconds(40));
  std::map<std::string, double> samples = Samples(metrics_);
  EXPECT_EQ(samples.at("muster_rendezvous_join_seconds_count"), 2);
  EXPECT_DOUBLE_EQ(samples.at("muster_rendezvous_join_seconds_sum"), 40.003);
  const std::string text = prometheus::TextSerializer().Serialize(metrics_.Collect());
  EXPECT_THAT(text, HasSubstr("muster_rendezvous_join_seconds_bucket{le=\"0.005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muster_rendezvous_join_seconds_bucket{le=\"30\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("muster_rendezvous_join_seconds_bucket{le=\"60\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE muster_rendezvous_join_seconds histogram\n"));
  EXPECT_THAT(text, Not(HasSubstr("exposer_")));  // the exposer adds its own
}

}  // namespace
}  // namespace muster::rdzv
