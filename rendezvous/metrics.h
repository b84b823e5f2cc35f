// What a rendezvous tells Prometheus (musterd --metrics-port, an agent's
// --rdzv-conf metrics_port= when it hosts the rendezvous): its jobs, their
// rounds and restarts, how long joins wait, every call's outcome. The names
// and labels are in docs/METRICS.md; every label's values are bounded (a
// job's id, a method, a gRPC code, a state), none is per rank or per node.
#ifndef MUSTER_RENDEZVOUS_METRICS_H_
#define MUSTER_RENDEZVOUS_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "rendezvous/hub.h"

namespace muster::rdzv {

class RendezvousMetrics final : public prometheus::Collectable {
 public:
  explicit RendezvousMetrics(std::shared_ptr<RendezvousHub> hub);

  // A call of the rendezvous' (or its health service's) `method`, as gRPC
  // names it ("/muster.rdzv.Rendezvous/Join"), ended with `code`. A call
  // refused for its credential (kUnauthenticated, kPermissionDenied) is an
  // auth failure too.
  void CountCall(absl::string_view method, grpc::StatusCode code);
  // A join that got its assignment, `waited` after it came.
  void ObserveJoin(absl::Duration waited);

  // A factory of interceptors that count every call (CountCall), for
  // grpc::ServerBuilder::experimental().SetInterceptorCreators.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CallCounter();

  // The registry's families, then the jobs' (taken from the hub now).
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::shared_ptr<RendezvousHub> hub_;
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& calls_;
  prometheus::Counter& auth_failures_;
  prometheus::Histogram& join_seconds_;
};

// The bounds of muster_rendezvous_join_seconds' buckets, in seconds: from a
// join that finds its round ready to one that waits out a long last call.
std::vector<double> JoinSecondsBuckets();

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_METRICS_H_
