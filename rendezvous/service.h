// The rendezvous gRPC service on the callback API, and a server that hosts it.
// A pending join or an open watch costs a reactor, not a thread.
#ifndef MUSTER_RENDEZVOUS_SERVICE_H_
#define MUSTER_RENDEZVOUS_SERVICE_H_

#include <map>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/state.h"

namespace muster::rdzv {

class RendezvousService final : public Rendezvous::CallbackService {
 public:
  RendezvousService();
  ~RendezvousService() override;
  RendezvousService(const RendezvousService&) = delete;
  RendezvousService& operator=(const RendezvousService&) = delete;

  // Fails every pending join and ends every watch with kUnavailable, and
  // stops the timer thread. Call before the grpc::Server shuts down.
  void Shutdown();

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context, const JoinRequest* request,
                                 JoinResponse* response) override;
  grpc::ServerWriteReactor<WatchEvent>* Watch(grpc::CallbackServerContext* context,
                                              const WatchRequest* request) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext* context,
                                          const ReportFailureRequest* request,
                                          ReportFailureResponse* response) override;
  grpc::ServerUnaryReactor* ReportDone(grpc::CallbackServerContext* context,
                                       const ReportDoneRequest* request,
                                       ReportDoneResponse* response) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const LeaveRequest* request, LeaveResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const StatusRequest* request,
                                   StatusResponse* response) override;

 private:
  class JoinReactor;
  class WatchReactor;
  struct JoinCompletion {
    JoinReactor* reactor;
    absl::StatusOr<Assignment> result;
  };
  // What a state change sends out. Delivered after mu_ is released: gRPC may
  // run a reaction inline, and reactions take mu_.
  struct Deliveries {
    std::vector<JoinCompletion> joins;
    std::vector<std::pair<std::shared_ptr<WatchReactor>, WatchEvent>> pushes;
    bool empty() const { return joins.empty() && pushes.empty(); }
  };

  // Turns `effects` into deliveries: completed joins leave pending_joins_.
  void ApplyLocked(Effects& effects, Deliveries* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Deliver(Deliveries& deliveries);
  void DropJoin(const NodeKey& key, JoinReactor* reactor);
  void DropWatch(const NodeKey& key, WatchReactor* reactor);
  void TimerLoop();

  absl::Mutex mu_;
  RendezvousState state_ ABSL_GUARDED_BY(mu_);
  std::map<NodeKey, JoinReactor*> pending_joins_ ABSL_GUARDED_BY(mu_);
  std::map<NodeKey, std::shared_ptr<WatchReactor>> watches_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool state_changed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

// A gRPC server hosting one RendezvousService.
class RendezvousServer {
 public:
  // Listens on host:port; port 0 picks a free port. kAlreadyExists when the
  // port is taken, kInvalidArgument for an address gRPC cannot bind.
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(const std::string& host, int port);
  ~RendezvousServer();

  int port() const { return port_; }
  // Stops accepting calls and ends the ones in flight within `grace`.
  void Shutdown(absl::Duration grace = absl::Seconds(1));

 private:
  RendezvousServer() = default;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

// The host part of a gRPC peer string ("ipv4:10.0.0.2:5000" → "10.0.0.2",
// "ipv6:[::1]:5000" → "::1").
std::string PeerHost(const std::string& peer);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVICE_H_
