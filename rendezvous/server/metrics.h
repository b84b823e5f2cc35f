// What a rendezvous tells Prometheus (musterd --metrics-port, an agent's
// --rdzv-conf metrics_port= when it hosts the rendezvous): its jobs, their
// rounds and restarts, how long joins wait, every call's outcome. The names
// and labels are in docs/METRICS.md; every label's values are bounded (a
// job's id, a method, a gRPC code, a state), none is per rank or per node.
#ifndef MUSTER_RENDEZVOUS_SERVER_METRICS_H_
#define MUSTER_RENDEZVOUS_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/status.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rendezvous/server/hub.h"

namespace muster::rdzv {

// The calls counted in muster_rendezvous_rpcs_total, by method: the
// Rendezvous service's, and the health service's Check. (A call of a method
// the server does not have is answered by gRPC itself, and not counted.)
enum class RpcMethod {
  kJoin,
  kWatch,
  kHeartbeat,
  kReportFailure,
  kReportDone,
  kLeave,
  kStatus,
  kListJobs,
  kStop,
  kWatchJob,
  kHealthCheck,
};
inline constexpr size_t kRpcMethods = static_cast<size_t>(RpcMethod::kHealthCheck) + 1;
// Its label: "Join", ..., "Health/Check".
const char* RpcMethodName(RpcMethod method);

class RendezvousMetrics final : public prometheus::Collectable {
 public:
  explicit RendezvousMetrics(std::shared_ptr<RendezvousHub> hub);

  // A call of `method` was answered with `code`. One refused for its
  // credential (kUnauthenticated, kPermissionDenied) is an auth failure too.
  // Lock-free once the (method, code) pair has been seen.
  void CountCall(RpcMethod method, grpc::StatusCode code);
  // A join that got its assignment, `waited` after it came.
  void ObserveJoin(absl::Duration waited);

  // The registry's families, then the jobs' (taken from the hub now).
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  static constexpr size_t kCodes = 17;  // gRPC's, OK to UNAUTHENTICATED

  const std::shared_ptr<RendezvousHub> hub_;
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& calls_;
  prometheus::Counter& auth_failures_;
  prometheus::Histogram& join_seconds_;
  // calls_' counter of each (method, code), made at its first call.
  std::array<std::atomic<prometheus::Counter*>, kRpcMethods * kCodes> call_counters_{};
  absl::Mutex add_mu_;  // orders the making
};

// The bounds of muster_rendezvous_join_seconds' buckets, in seconds: from a
// join that finds its round ready to one that waits out a long last call.
std::vector<double> JoinSecondsBuckets();

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVER_METRICS_H_
