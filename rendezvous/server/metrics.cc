#include "rendezvous/server/metrics.h"

#include <array>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/prometheus_samples.h"
#include "rendezvous/rules/job_events.h"

namespace muster::rdzv {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::string CodeLabel(size_t code) {
  const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? "UNKNOWN" : name;
}

}  // namespace

std::vector<double> JoinSecondsBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

RendezvousMetrics::RendezvousMetrics(std::shared_ptr<RendezvousHub> hub)
    : hub_(std::move(hub)), registry_(std::make_shared<prometheus::Registry>()),
      calls_(prometheus::BuildCounter()
                 .Name("muster_rendezvous_rpcs_total")
                 .Help("Calls answered, by method and gRPC status code")
                 .Register(*registry_)),
      auth_failures_(prometheus::BuildCounter()
                         .Name("muster_rendezvous_auth_failures_total")
                         .Help("Calls refused for their credential: no token or the wrong one, "
                               "a bad munge credential, another uid, a wrong node secret")
                         .Register(*registry_)
                         .Add({})),
      join_seconds_(prometheus::BuildHistogram()
                        .Name("muster_rendezvous_join_seconds")
                        .Help("How long a join waited for its round, for joins that got one")
                        .Register(*registry_)
                        .Add({}, JoinSecondsBuckets())) {}

const char* RpcMethodName(RpcMethod method) {
  switch (method) {
    case RpcMethod::kJoin: return "Join";
    case RpcMethod::kWatch: return "Watch";
    case RpcMethod::kHeartbeat: return "Heartbeat";
    case RpcMethod::kReportFailure: return "ReportFailure";
    case RpcMethod::kReportDone: return "ReportDone";
    case RpcMethod::kLeave: return "Leave";
    case RpcMethod::kStatus: return "Status";
    case RpcMethod::kListJobs: return "ListJobs";
    case RpcMethod::kStop: return "Stop";
    case RpcMethod::kWatchJob: return "WatchJob";
    case RpcMethod::kHealthCheck: return "Health/Check";
  }
  return "unknown";
}

void RendezvousMetrics::CountCall(RpcMethod method, grpc::StatusCode code) {
  const size_t code_index = static_cast<size_t>(code) < kCodes
                                ? static_cast<size_t>(code)
                                : static_cast<size_t>(grpc::StatusCode::UNKNOWN);
  std::atomic<prometheus::Counter*>& slot =
      call_counters_[static_cast<size_t>(method) * kCodes + code_index];
  prometheus::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    absl::MutexLock lock(&add_mu_);
    counter = slot.load(std::memory_order_relaxed);
    if (counter == nullptr) {
      counter = &calls_.Add({{"method", RpcMethodName(method)}, {"code", CodeLabel(code_index)}});
      slot.store(counter, std::memory_order_release);
    }
  }
  counter->Increment();
  if (code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::PERMISSION_DENIED) {
    auth_failures_.Increment();
  }
}

void RendezvousMetrics::ObserveJoin(absl::Duration waited) {
  join_seconds_.Observe(absl::ToDoubleSeconds(waited));
}

std::vector<MetricFamily> RendezvousMetrics::Collect() const {
  std::vector<MetricFamily> out = registry_->Collect();
  const std::vector<RendezvousState::JobFigures> jobs = hub_->Figures();
  MetricFamily by_state = EmptyFamily("muster_rendezvous_jobs",
                                      "Jobs the rendezvous holds, by state", MetricType::Gauge);
  std::array<std::pair<const char*, int64_t>, 3> states{
      {{"open", 0}, {"running", 0}, {"closed", 0}}};
  MetricFamily nodes =
      EmptyFamily("muster_rendezvous_nodes", "Live nodes of each job", MetricType::Gauge);
  MetricFamily rounds = EmptyFamily(
      "muster_rendezvous_rounds_total",
      "Rounds formed, by why the round was opened (start: the job's first)", MetricType::Counter);
  MetricFamily restarts = EmptyFamily("muster_rendezvous_restarts_total",
                                      "Restarts each job has used", MetricType::Counter);
  MetricFamily step = EmptyFamily("muster_rendezvous_job_step",
                                  "The highest step each job's workers reported (jobs that report)",
                                  MetricType::Gauge);
  MetricFamily pace = EmptyFamily("muster_rendezvous_job_steps_per_second",
                                  "Steps a second of each job's running round", MetricType::Gauge);
  MetricFamily since =
      EmptyFamily("muster_rendezvous_job_seconds_since_step",
                  "Seconds since each job reached its highest step", MetricType::Gauge);
  MetricFamily goodput = EmptyFamily(
      "muster_rendezvous_job_goodput_ratio",
      "Each job's share of its wall time in rounds that reached a new step", MetricType::Gauge);
  MetricFamily stuck =
      EmptyFamily("muster_rendezvous_job_no_progress_restarts",
                  "Restarts in a row whose round reached no new step", MetricType::Gauge);
  MetricFamily excluded = EmptyFamily("muster_rendezvous_job_excluded_nodes",
                                      "Hosts each job has excluded (bad nodes)", MetricType::Gauge);
  for (const RendezvousState::JobFigures& job : jobs) {
    for (auto& [state, count] : states) {
      if (absl::string_view(state) == job.state) ++count;
    }
    AddSample(nodes, {{"job_id", job.id}}, static_cast<double>(job.nodes));
    for (size_t reason = 0; reason < job.rounds.size(); ++reason) {
      if (job.rounds[reason] == 0) continue;
      AddSample(rounds,
                {{"job_id", job.id},
                 {"reason", RoundReasonName(static_cast<RoundChanged::Reason>(reason))}},
                static_cast<double>(job.rounds[reason]));
    }
    AddSample(restarts, {{"job_id", job.id}}, job.restarts);
    AddSample(goodput, {{"job_id", job.id}}, job.goodput);
    AddSample(excluded, {{"job_id", job.id}}, static_cast<double>(job.excluded));
    AddSample(stuck, {{"job_id", job.id}}, job.no_progress_restarts);
    if (job.step >= 0) {
      AddSample(step, {{"job_id", job.id}}, static_cast<double>(job.step));
      AddSample(pace, {{"job_id", job.id}}, job.steps_per_second);
      AddSample(since, {{"job_id", job.id}}, job.seconds_since_step);
    }
  }
  for (const auto& [state, count] : states) {
    AddSample(by_state, {{"state", state}}, static_cast<double>(count));
  }
  for (MetricFamily* family :
       {&by_state, &nodes, &rounds, &restarts, &step, &pace, &since, &goodput, &stuck, &excluded}) {
    out.push_back(std::move(*family));
  }
  return out;
}

}  // namespace muster::rdzv
