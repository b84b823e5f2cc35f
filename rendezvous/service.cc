#include "rendezvous/service.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/log.h"
#include "rendezvous/grpc_status.h"

namespace muster::rdzv {
namespace {

// The timer thread wakes at least this often, so a clock jump cannot stall it.
constexpr absl::Duration kMaxTimerSleep = absl::Seconds(1);

void LogEffects(const Effects& effects) {
  static const auto logger = Logger("rdzv");
  for (const std::string& line : effects.log) logger->info("{}", line);
}

}  // namespace

std::string PeerHost(const std::string& raw_peer) {
  std::string peer = absl::StrReplaceAll(raw_peer, {{"%5B", "["}, {"%5D", "]"}});
  size_t colon = peer.find(':');
  if (colon == std::string::npos) return peer;
  std::string rest = peer.substr(colon + 1);  // drop "ipv4:" / "ipv6:"
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    return close == std::string::npos ? rest : rest.substr(1, close - 1);
  }
  size_t port = rest.rfind(':');
  return port == std::string::npos ? rest : rest.substr(0, port);
}

// A join waiting for its round. Finished exactly once, by whoever removes it
// from pending_joins_ (a completed round, a cancel, or shutdown).
class RendezvousService::JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(RendezvousService* service, NodeKey key, JoinResponse* response)
      : service_(service), key_(std::move(key)), response_(response) {}

  const NodeKey& key() const { return key_; }

  void Complete(const absl::StatusOr<Assignment>& result) {
    if (result.ok()) {
      *response_->mutable_assignment() = *result;
      Finish(grpc::Status::OK);
    } else {
      Finish(ToGrpcStatus(result.status()));
    }
  }

  void OnCancel() override { service_->DropJoin(key_, this); }
  void OnDone() override { delete this; }

 private:
  RendezvousService* const service_;
  const NodeKey key_;
  JoinResponse* const response_;
};

// A node's watch stream: events are written one at a time, in order. A
// JobClosed event is the last; the stream finishes after it. No gRPC call is
// made while a lock is held: gRPC may run a reaction inline.
//
// Lifetime: shared by watches_ and by pushes in flight; `self_` is gRPC's
// reference, dropped in OnDone.
class RendezvousService::WatchReactor final : public grpc::ServerWriteReactor<WatchEvent> {
 public:
  static std::shared_ptr<WatchReactor> Create(RendezvousService* service, NodeKey key) {
    std::shared_ptr<WatchReactor> reactor(new WatchReactor(service, std::move(key)));
    reactor->self_ = reactor;
    return reactor;
  }

  void Push(const WatchEvent& event) {
    const WatchEvent* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      queue_.push_back(event);  // a deque: the element being written stays put
      next = NextWriteLocked();
    }
    if (next != nullptr) StartWrite(next);
  }

  void End(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream broken"));
      return;
    }
    const WatchEvent* next = nullptr;
    bool was_last = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      was_last = queue_.front().has_job_closed();
      queue_.pop_front();
      if (!was_last) next = NextWriteLocked();
    }
    if (was_last) {
      End(grpc::Status::OK);
    } else if (next != nullptr) {
      StartWrite(next);
    }
  }

  void OnCancel() override { End(grpc::Status::CANCELLED); }

  void OnDone() override {
    service_->DropWatch(key_, this);
    self_.reset();  // may delete this: nothing after it
  }

 private:
  WatchReactor(RendezvousService* service, NodeKey key) : service_(service), key_(std::move(key)) {}

  const WatchEvent* NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || queue_.empty()) return nullptr;
    writing_ = true;
    return &queue_.front();
  }

  RendezvousService* const service_;
  const NodeKey key_;
  std::shared_ptr<WatchReactor> self_;
  absl::Mutex mu_;
  std::deque<WatchEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

RendezvousService::RendezvousService() : timer_([this] { TimerLoop(); }) {}

RendezvousService::~RendezvousService() { Shutdown(); }

void RendezvousService::Shutdown() {
  Deliveries deliveries;
  std::map<NodeKey, std::shared_ptr<WatchReactor>> watches;
  {
    absl::MutexLock lock(&mu_);
    if (!shutting_down_) {
      shutting_down_ = true;
      const absl::Status gone = absl::UnavailableError("the rendezvous server is shutting down");
      for (auto& [key, reactor] : pending_joins_) deliveries.joins.push_back({reactor, gone});
      pending_joins_.clear();
      watches.swap(watches_);
    }
  }
  Deliver(deliveries);
  for (auto& [key, reactor] : watches) {
    reactor->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the rendezvous server is shutting down"));
  }
  if (timer_.joinable()) timer_.join();
}

void RendezvousService::ApplyLocked(Effects& effects, Deliveries* out) {
  LogEffects(effects);
  for (auto& [key, assignment] : effects.assigned) {
    auto it = pending_joins_.find(key);
    if (it == pending_joins_.end()) continue;  // its caller went away; it will rejoin
    out->joins.push_back({it->second, std::move(assignment)});
    pending_joins_.erase(it);
  }
  for (auto& [key, status] : effects.join_failed) {
    auto it = pending_joins_.find(key);
    if (it == pending_joins_.end()) continue;
    out->joins.push_back({it->second, std::move(status)});
    pending_joins_.erase(it);
  }
  for (const auto& [key, event] : effects.pushed) {
    auto it = watches_.find(key);
    if (it != watches_.end()) out->pushes.emplace_back(it->second, event);
  }
  if (!effects.empty()) state_changed_ = true;
}

void RendezvousService::Deliver(Deliveries& deliveries) {
  for (JoinCompletion& completion : deliveries.joins) {
    completion.reactor->Complete(completion.result);
  }
  for (auto& [reactor, event] : deliveries.pushes) reactor->Push(event);
  deliveries = Deliveries();
}

void RendezvousService::DropJoin(const NodeKey& key, JoinReactor* reactor) {
  Deliveries deliveries;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_joins_.find(key);
    if (it == pending_joins_.end() || it->second != reactor) return;  // finishing elsewhere
    pending_joins_.erase(it);
    // Nobody waits for this join any more: the node is gone (its agent ended
    // or gave up), and must not be put into a round, where it could even be
    // everyone's master. A pending join has no heartbeat timer to catch this.
    Effects effects;
    state_.Leave(key, "cancelled its join", absl::Now(), &effects).IgnoreError();
    ApplyLocked(effects, &deliveries);
  }
  reactor->Complete(absl::CancelledError("join cancelled by the caller"));
  Deliver(deliveries);
}

void RendezvousService::DropWatch(const NodeKey& key, WatchReactor* reactor) {
  std::shared_ptr<WatchReactor> dropped;  // released after the lock
  absl::MutexLock lock(&mu_);
  auto it = watches_.find(key);
  if (it != watches_.end() && it->second.get() == reactor) {
    dropped = std::move(it->second);
    watches_.erase(it);
  }
}

void RendezvousService::TimerLoop() {
  Deliveries deliveries;
  absl::MutexLock lock(&mu_);
  while (!shutting_down_) {
    const absl::Time now = absl::Now();
    std::optional<absl::Time> next = state_.NextDeadline();
    absl::Time wake = now + kMaxTimerSleep;
    if (next && *next < wake) wake = *next;
    if (wake > now) {
      state_changed_ = false;
      // Wakes early when a call changed the state (it may have set an earlier deadline).
      mu_.AwaitWithDeadline(
          absl::Condition(
              +[](RendezvousService* self) { return self->state_changed_ || self->shutting_down_; },
              this),
          wake);
      continue;
    }
    Effects effects;
    state_.Advance(now, &effects);
    ApplyLocked(effects, &deliveries);
    if (!deliveries.empty()) {
      mu_.Unlock();
      Deliver(deliveries);
      mu_.Lock();
    }
  }
}

grpc::ServerUnaryReactor* RendezvousService::Join(grpc::CallbackServerContext* context,
                                                  const JoinRequest* request,
                                                  JoinResponse* response) {
  NodeKey key{request->job_id(), request->node().node_id()};
  auto* reactor = new JoinReactor(this, key, response);
  Deliveries deliveries;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      status = absl::UnavailableError("the rendezvous server is shutting down");
    } else {
      Effects effects;
      status = state_.Join(*request, PeerHost(context->peer()), absl::Now(), &effects);
      if (status.ok()) {
        auto [it, inserted] = pending_joins_.try_emplace(key, reactor);
        if (!inserted) {
          deliveries.joins.push_back(
              {it->second, absl::AbortedError("superseded by a newer join of the same node")});
          it->second = reactor;
        }
      }
      ApplyLocked(effects, &deliveries);
    }
  }
  if (!status.ok()) reactor->Complete(status);
  Deliver(deliveries);
  return reactor;
}

grpc::ServerWriteReactor<WatchEvent>* RendezvousService::Watch(grpc::CallbackServerContext* context,
                                                               const WatchRequest* request) {
  NodeKey key{request->job_id(), request->node_id()};
  std::shared_ptr<WatchReactor> reactor = WatchReactor::Create(this, key);
  std::shared_ptr<WatchReactor> replaced;
  absl::StatusOr<std::optional<WatchEvent>> missed;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      missed = absl::UnavailableError("the rendezvous server is shutting down");
    } else {
      missed = state_.CatchUp(key, request->known_round());
    }
    if (missed.ok()) {
      std::shared_ptr<WatchReactor>& slot = watches_[key];
      replaced = std::exchange(slot, reactor);
    }
  }
  if (replaced) replaced->End(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a newer watch"));
  if (!missed.ok()) {
    reactor->End(ToGrpcStatus(missed.status()));
  } else if (*missed) {
    reactor->Push(**missed);
  }
  return reactor.get();
}

grpc::ServerUnaryReactor* RendezvousService::Heartbeat(grpc::CallbackServerContext* context,
                                                       const HeartbeatRequest* request,
                                                       HeartbeatResponse* response) {
  absl::StatusOr<int64_t> round;
  {
    absl::MutexLock lock(&mu_);
    round = state_.Heartbeat({request->job_id(), request->node_id()}, absl::Now());
  }
  if (round.ok()) response->set_round(*round);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(round.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::ReportFailure(grpc::CallbackServerContext* context,
                                                           const ReportFailureRequest* request,
                                                           ReportFailureResponse* response) {
  Deliveries deliveries;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    Effects effects;
    status = state_.ReportFailure({request->job_id(), request->node_id()}, request->round(),
                                  request->failure(), absl::Now(), &effects);
    ApplyLocked(effects, &deliveries);
  }
  Deliver(deliveries);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::ReportDone(grpc::CallbackServerContext* context,
                                                        const ReportDoneRequest* request,
                                                        ReportDoneResponse* response) {
  Deliveries deliveries;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    Effects effects;
    status = state_.ReportDone({request->job_id(), request->node_id()}, request->round(),
                               absl::Now(), &effects);
    ApplyLocked(effects, &deliveries);
  }
  Deliver(deliveries);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* context,
                                                   const LeaveRequest* request,
                                                   LeaveResponse* response) {
  Deliveries deliveries;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    Effects effects;
    status = state_.Leave({request->job_id(), request->node_id()}, request->reason(), absl::Now(),
                          &effects);
    ApplyLocked(effects, &deliveries);
  }
  Deliver(deliveries);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Status(grpc::CallbackServerContext* context,
                                                    const StatusRequest* request,
                                                    StatusResponse* response) {
  absl::StatusOr<StatusResponse> status;
  {
    absl::MutexLock lock(&mu_);
    status = state_.Status(request->job_id());
  }
  if (status.ok()) *response = *std::move(status);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status.status()));
  return reactor;
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(const std::string& host,
                                                                          int port) {
  std::unique_ptr<RendezvousServer> server(new RendezvousServer());
  server->service_ = std::make_unique<RendezvousService>();
  grpc::ServerBuilder builder;
  // Without this, gRPC sets SO_REUSEPORT and a second server on the same port
  // would silently share it instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  const std::string address =
      host.find(':') != std::string::npos && host.front() != '['
          ? absl::StrCat("[", host, "]:", port)
          : absl::StrCat(host, ":", port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->service_->Shutdown();
    if (port != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("cannot listen on ", address,
                       ": the port is in use or the address is not this host's"));
    }
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", address));
  }
  return server;
}

RendezvousServer::~RendezvousServer() { Shutdown(absl::ZeroDuration()); }

void RendezvousServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  service_->Shutdown();
  if (server_ == nullptr) return;  // Start failed: nothing listens
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace muster::rdzv
