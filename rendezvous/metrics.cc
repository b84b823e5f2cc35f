#include "rendezvous/metrics.h"

#include <array>
#include <utility>

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/interceptor.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/prometheus_samples.h"
#include "proto/rendezvous.pb.h"
#include "rendezvous/job_events.h"

namespace muster::rdzv {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

// How a call's method is labelled: the Rendezvous service's by its name
// ("Join"), the health service's as "Health/Check". Any other path (a
// caller may send any) is "unknown", so the label's values stay bounded.
std::string MethodLabel(absl::string_view path) {
  static const google::protobuf::ServiceDescriptor* const rendezvous =
      JoinRequest::descriptor()->file()->FindServiceByName("Rendezvous");
  absl::string_view method = path;
  if (absl::ConsumePrefix(&method, "/muster.rdzv.Rendezvous/") && rendezvous != nullptr &&
      rendezvous->FindMethodByName(std::string(method)) != nullptr) {
    return std::string(method);
  }
  method = path;
  if (absl::ConsumePrefix(&method, "/grpc.health.v1.Health/") &&
      (method == "Check" || method == "Watch")) {
    return absl::StrCat("Health/", method);
  }
  return "unknown";
}

std::string CodeLabel(grpc::StatusCode code) {
  const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? "UNKNOWN" : name;
}

// Counts each call once, as its status goes out.
class CallCounting final : public grpc::experimental::Interceptor {
 public:
  CallCounting(RendezvousMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method == nullptr ? "" : method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->CountCall(method_, methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  RendezvousMetrics* const metrics_;
  const absl::string_view method_;  // gRPC's, alive as long as the call
};

class CallCountingFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCountingFactory(RendezvousMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallCounting(metrics_, info->method());
  }

 private:
  RendezvousMetrics* const metrics_;
};

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

void RendezvousMetrics::CountCall(absl::string_view method, grpc::StatusCode code) {
  // Family::Add gives back the counter of these labels when it exists.
  calls_.Add({{"method", MethodLabel(method)}, {"code", CodeLabel(code)}}).Increment();
  if (code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::PERMISSION_DENIED) {
    auth_failures_.Increment();
  }
}

void RendezvousMetrics::ObserveJoin(absl::Duration waited) {
  join_seconds_.Observe(absl::ToDoubleSeconds(waited));
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RendezvousMetrics::CallCounter() {
  return std::make_unique<CallCountingFactory>(this);
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
  }
  for (const auto& [state, count] : states) {
    AddSample(by_state, {{"state", state}}, static_cast<double>(count));
  }
  for (MetricFamily* family : {&by_state, &nodes, &rounds, &restarts}) {
    out.push_back(std::move(*family));
  }
  return out;
}

}  // namespace muster::rdzv
