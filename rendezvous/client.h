// The agent's side of the rendezvous: asynchronous calls whose results arrive
// on callbacks, so the agent's event loop never blocks on the network.
#ifndef MUSTER_RENDEZVOUS_CLIENT_H_
#define MUSTER_RENDEZVOUS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/rendezvous.grpc.pb.h"

namespace muster::rdzv {

class RendezvousClient {
 public:
  // `target` is "host:port" (IPv6 in brackets). Connecting is lazy: calls wait
  // for the server to come up until their deadline (agents often start before
  // the host does).
  static std::unique_ptr<RendezvousClient> Create(const std::string& target);

  // Cancels what is in flight and waits until no callback can run any more.
  ~RendezvousClient();

  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  const std::string& target() const { return target_; }

  // Each call runs asynchronously; its callback runs exactly once, on a gRPC
  // thread, within `timeout`.
  void Join(const JoinRequest& request, absl::Duration timeout,
            std::function<void(absl::StatusOr<Assignment>)> done);
  void Heartbeat(const HeartbeatRequest& request, absl::Duration timeout,
                 std::function<void(absl::StatusOr<int64_t>)> done);
  void ReportFailure(const ReportFailureRequest& request, absl::Duration timeout,
                     std::function<void(absl::Status)> done);
  void ReportDone(const ReportDoneRequest& request, absl::Duration timeout,
                  std::function<void(absl::Status)> done);
  void Leave(const LeaveRequest& request, absl::Duration timeout,
             std::function<void(absl::Status)> done);
  void Status(const StatusRequest& request, absl::Duration timeout,
              std::function<void(absl::StatusOr<StatusResponse>)> done);

  // Opens the node's watch stream: `on_event` for each event in order, then
  // `on_end` once with how the stream ended. Ends an earlier watch first.
  void Watch(const WatchRequest& request, std::function<void(const WatchEvent&)> on_event,
             std::function<void(absl::Status)> on_end);

  // Blocking conveniences for tools and tests.
  absl::StatusOr<Assignment> JoinSync(const JoinRequest& request, absl::Duration timeout);
  absl::StatusOr<StatusResponse> StatusSync(const StatusRequest& request, absl::Duration timeout);

 private:
  class WatchStream;

  explicit RendezvousClient(std::string target);
  // A context with the deadline, registered so the destructor can cancel it.
  grpc::ClientContext* NewCall(absl::Duration timeout, bool wait_for_ready);
  void EndCall(grpc::ClientContext* context);
  template <typename Request, typename Response, typename Result>
  void Unary(void (Rendezvous::Stub::async_interface::*method)(grpc::ClientContext*, const Request*,
                                                               Response*,
                                                               std::function<void(grpc::Status)>),
             const Request& request, absl::Duration timeout, bool wait_for_ready,
             std::function<Result(absl::Status, Response&)> convert,
             std::function<void(Result)> done);

  const std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Rendezvous::Stub> stub_;

  absl::Mutex mu_;
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  WatchStream* watch_ ABSL_GUARDED_BY(mu_) = nullptr;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_CLIENT_H_
