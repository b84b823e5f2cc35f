#include "rendezvous/server/service.h"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "common/endpoint.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_handle.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/auth/token.h"
#include "rendezvous/grpc/channel.h"
#include "rendezvous/grpc/status.h"
#include "rendezvous/rules/protocol.h"

namespace muster::rdzv {

std::string PeerHost(const std::string& raw_peer) {
  std::string peer = absl::StrReplaceAll(raw_peer, {{"%5B", "["}, {"%5D", "]"}});
  size_t colon = peer.find(':');
  if (colon == std::string::npos) return peer;
  std::string rest = peer.substr(colon + 1);  // drop "ipv4:" / "ipv6:"
  absl::StatusOr<Endpoint> endpoint = ParseEndpoint(rest, 0);
  return endpoint.ok() ? endpoint->host : rest;  // not host:port ("unix:/path"): as it is
}

RendezvousService::RendezvousService(std::shared_ptr<RendezvousHub> hub, std::string token,
                                     PeerBounds bounds, std::optional<MungeAuth> munge,
                                     std::shared_ptr<RendezvousMetrics> metrics)
    : hub_(std::move(hub)), token_(std::move(token)), munge_(std::move(munge)),
      own_uid_(::getuid()), peers_(bounds.pending_joins, bounds.open_watches),
      metrics_(std::move(metrics)) {}

bool RendezvousService::Authenticated(grpc::CallbackServerContext* context, const char* method) {
  if (token_.empty()) return true;
  const auto& metadata = context->client_metadata();
  const auto [first, last] =
      metadata.equal_range(grpc::string_ref(kAuthorizationKey.data(), kAuthorizationKey.size()));
  const char* why = nullptr;
  if (first == last) {
    why = "no authorization metadata";
  } else if (std::next(first) != last) {
    why = "more than one authorization value";
  } else {
    const absl::string_view value(first->second.data(), first->second.size());
    if (BearerMatches(value, token_)) return true;
    why = absl::StartsWith(value, kBearerPrefix) ? "wrong token" : "not a Bearer credential";
  }
  LogRefusal("unauthenticated",
             absl::StrCat("refused a ", method, " call from ", ForLog(context->peer()), ": ", why));
  return false;
}

namespace {

// The one value of metadata `key`, if the call carries exactly one.
std::optional<absl::string_view> OneValue(grpc::CallbackServerContext* context,
                                          absl::string_view key, const char** why) {
  const auto [first, last] =
      context->client_metadata().equal_range(grpc::string_ref(key.data(), key.size()));
  if (first == last) {
    *why = "none";
    return std::nullopt;
  }
  if (std::next(first) != last) {
    *why = "more than one";
    return std::nullopt;
  }
  return absl::string_view(first->second.data(), first->second.size());
}

}  // namespace

absl::StatusOr<RendezvousService::Caller> RendezvousService::Admit(
    grpc::CallbackServerContext* context, const char* method, bool credential) {
  if (!Authenticated(context, method)) return absl::UnauthenticatedError(kRefusedMessage);
  if (!munge_ || !token_.empty()) return Caller{};
  if (!credential) {
    // The node's secret authorizes the call; a hosting agent has one
    // namespace, musterd needs the claim to find the job.
    if (munge_->only_own_uid) return Caller{};
    const char* why = nullptr;
    std::optional<absl::string_view> claim = OneValue(context, kUidMetadataKey, &why);
    uint32_t uid = 0;
    if (claim && !absl::SimpleAtoi(*claim, &uid)) why = "not a uid";
    if (why != nullptr) {
      LogRefusal("unauthenticated",
                 absl::StrCat("refused a ", method, " call from ", ForLog(context->peer()), ": ",
                              why, " in ", kUidMetadataKey));
      return absl::UnauthenticatedError(kRefusedMessage);
    }
    return Caller{absl::StrCat(uid, "/"), std::nullopt};
  }
  const char* why = nullptr;
  std::optional<absl::string_view> value = OneValue(context, kMungeMetadataKey, &why);
  if (!value) {
    LogRefusal("unauthenticated",
               absl::StrCat("refused a ", method, " call from ", ForLog(context->peer()), ": ", why,
                            " in ", kMungeMetadataKey));
    return absl::UnauthenticatedError(kRefusedMessage);
  }
  absl::StatusOr<MungeIdentity> identity =
      DecodeMungeCredential(std::string(*value), munge_->munge);
  if (!identity.ok()) {
    LogRefusal("unauthenticated",
               absl::StrCat("refused a ", method, " call from ", ForLog(context->peer()), ": ",
                            ForLog(identity.status().message())));
    if (absl::IsUnauthenticated(identity.status())) {
      return absl::UnauthenticatedError(kRefusedMessage);
    }
    // Of the server, not the caller: munged is down (the agent retries).
    return absl::UnavailableError(
        "this rendezvous cannot check munge credentials now (its munged does not answer)");
  }
  if (munge_->only_own_uid && identity->uid != own_uid_) {
    LogRefusal("denied", absl::StrCat("refused a ", method, " from ", ForLog(context->peer()),
                                      ": uid ", identity->uid, " is not uid ", own_uid_,
                                      ", whose job this rendezvous serves"));
    return absl::PermissionDeniedError(absl::StrCat(
        "uid ", identity->uid, " may not use this rendezvous: it serves uid ", own_uid_, "'s job"));
  }
  return Caller{munge_->only_own_uid ? "" : absl::StrCat(identity->uid, "/"), identity->uid};
}

// A join waiting for its round. The hub runs its callback exactly once,
// which finishes the call; a cancel from the caller goes to the hub.
class RendezvousService::JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(std::shared_ptr<RendezvousHub> hub, NodeKey key, uint64_t ticket,
              JoinResponse* response, PeerLimits::Slot slot, RendezvousMetrics* metrics)
      : hub_(std::move(hub)), key_(std::move(key)), ticket_(ticket), response_(response),
        slot_(std::move(slot)), metrics_(metrics),
        start_(metrics != nullptr ? absl::Now() : absl::InfinitePast()) {}

  void Complete(absl::StatusOr<Assignment> result) {
    // No longer pending: the connection's place is free now, not once gRPC
    // gets round to OnDone (which can be dozens of calls later).
    slot_.reset();
    if (metrics_ != nullptr) {
      if (result.ok()) metrics_->ObserveJoin(absl::Now() - start_);
      metrics_->CountCall(RpcMethod::kJoin, static_cast<grpc::StatusCode>(result.status().code()));
    }
    if (result.ok()) {
      *response_->mutable_assignment() = *std::move(result);
      response_->set_protocol_version(kProtocolVersion);
      Finish(grpc::Status::OK);
    } else {
      Finish(ToGrpcStatus(result.status()));
    }
  }

  void OnCancel() override { hub_->CancelJoin(key_, ticket_); }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<RendezvousHub> hub_;
  const NodeKey key_;
  const uint64_t ticket_;
  JoinResponse* const response_;
  std::optional<PeerLimits::Slot> slot_;  // given back as the join completes
  RendezvousMetrics* const metrics_;      // null: none
  const absl::Time start_;
};

// A server stream of events: queued in order, written one at a time, and
// finished after the last one (IsLast), or when ended. No gRPC call is made
// while mu_ is held (gRPC may run a reaction inline), and at most one call
// is in flight: only the holder of busy_ may start a write or the Finish,
// so a Finish never races a StartWrite.
//
// Lifetime: `self_` is gRPC's reference, dropped in OnDone; the hub holds
// another while the stream follows it.
template <typename Event>
class RendezvousService::QueuedStream : public grpc::ServerWriteReactor<Event> {
 public:
  // Queues `event`. Ignored once the stream is ending; past max_queued
  // events not yet written, the stream ends (kResourceExhausted) rather than
  // the server holding more for a reader that does not read.
  void Queue(Event event) {
    absl::MutexLock lock(&mu_);
    if (ending_ || overflowed_) return;
    if (queue_.size() >= max_queued_) {
      overflowed_ = true;
      return;
    }
    queue_.push_back(std::move(event));  // a deque: the one being written stays put
  }

  // Starts writing what is queued, unless a write is in flight already.
  void Flush() { Run(TakeStep(/*done_writing=*/false, std::nullopt)); }

  // Ends the stream with `status`; what is still queued is not sent.
  void End(const grpc::Status& status) { Run(TakeStep(/*done_writing=*/false, status)); }

  void OnWriteDone(bool ok) override {
    Run(TakeStep(
        /*done_writing=*/true,
        ok ? std::nullopt
           : std::optional(grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream broken"))));
  }

  void OnCancel() override { End(grpc::Status::CANCELLED); }

  void OnDone() override {
    Leave();
    slot_.reset();  // the stream is over, whoever still holds this
    self_.reset();  // may delete this: nothing after it
  }

 protected:
  QueuedStream(size_t max_queued, PeerLimits::Slot slot, RendezvousMetrics* metrics,
               RpcMethod method)
      : max_queued_(max_queued), slot_(std::move(slot)), metrics_(metrics), method_(method) {}
  virtual ~QueuedStream() = default;

  // Set by the creator, right after construction.
  void set_self(std::shared_ptr<QueuedStream> self) { self_ = std::move(self); }

 private:
  // The last event of a stream: it finishes once this is written.
  virtual bool IsLast(const Event& event) const = 0;
  // Stops the hub from sending more (idempotent).
  virtual void Leave() = 0;

  struct Step {
    bool leave = false;  // the stream is ending: the hub need send no more
    const Event* write = nullptr;
    std::optional<grpc::Status> finish;
  };

  Step TakeStep(bool done_writing, std::optional<grpc::Status> end) {
    absl::MutexLock lock(&mu_);
    if (done_writing) {
      busy_ = false;
      if (!end && IsLast(queue_.front())) end = grpc::Status::OK;
      queue_.pop_front();
    }
    if (end && !ending_) ending_ = std::move(end);
    if (overflowed_ && !ending_) {
      ending_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             "this watch reads its events too slowly; watch again");
    }
    Step step;
    if (ending_ && !left_) {
      // At once, even while a write waits on a reader that does not read.
      left_ = step.leave = true;
    }
    if (busy_ || finished_) return step;
    if (ending_) {
      busy_ = finished_ = true;
      step.finish = *ending_;
      return step;
    }
    if (queue_.empty()) return step;
    busy_ = true;
    step.write = &queue_.front();
    return step;
  }

  void Run(const Step& step) {
    if (step.leave) Leave();
    if (step.write != nullptr) {
      this->StartWrite(step.write);
    } else if (step.finish) {
      if (metrics_ != nullptr) metrics_->CountCall(method_, step.finish->error_code());
      this->Finish(*step.finish);
    }
  }

  const size_t max_queued_;
  std::optional<PeerLimits::Slot> slot_;  // OnDone only
  RendezvousMetrics* const metrics_;      // null: none
  const RpcMethod method_;
  std::shared_ptr<QueuedStream> self_;
  absl::Mutex mu_;
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> ending_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a write or the Finish is started
  bool left_ ABSL_GUARDED_BY(mu_) = false;  // Leave is called (or about to be)
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
};

// A node's watch stream (Watch): its job's events for it; a JobClosed event
// is the last.
class RendezvousService::WatchReactor final : public QueuedStream<WatchEvent> {
 public:
  // Far more than a live node's agent ever lets pile up (a few per round).
  static constexpr size_t kMaxQueued = 1024;

  static std::shared_ptr<WatchReactor> Create(std::shared_ptr<RendezvousHub> hub, NodeKey key,
                                              uint64_t ticket, PeerLimits::Slot slot,
                                              RendezvousMetrics* metrics) {
    std::shared_ptr<WatchReactor> reactor(
        new WatchReactor(std::move(hub), std::move(key), ticket, std::move(slot), metrics));
    reactor->set_self(reactor);
    return reactor;
  }

  void Push(const WatchEvent& event) {
    Queue(event);
    Flush();
  }

 private:
  WatchReactor(std::shared_ptr<RendezvousHub> hub, NodeKey key, uint64_t ticket,
               PeerLimits::Slot slot, RendezvousMetrics* metrics)
      : QueuedStream(kMaxQueued, std::move(slot), metrics, RpcMethod::kWatch), hub_(std::move(hub)),
        key_(std::move(key)), ticket_(ticket) {}

  bool IsLast(const WatchEvent& event) const override { return event.has_job_closed(); }
  void Leave() override { hub_->CancelWatch(key_, ticket_); }

  const std::shared_ptr<RendezvousHub> hub_;
  const NodeKey key_;
  const uint64_t ticket_;
};

// An operator's watch of a job (WatchJob): the job's events, in order,
// until its final one. The hub queues each event with its lock held
// (Queue); the writes start outside it (Flush).
class RendezvousService::JobWatchReactor final : public QueuedStream<JobEvent> {
 public:
  // An event is at most about 1.3 KiB (its detail is cut to 1 KiB), so a
  // watch holds at most about 330 KiB, 21 MiB for a connection's 64 watches.
  static constexpr size_t kMaxQueued = 256;

  static std::shared_ptr<JobWatchReactor> Create(std::shared_ptr<RendezvousHub> hub,
                                                 std::string hub_job_id, size_t prefix_length,
                                                 uint64_t ticket, PeerLimits::Slot slot,
                                                 RendezvousMetrics* metrics) {
    std::shared_ptr<JobWatchReactor> reactor(new JobWatchReactor(
        std::move(hub), std::move(hub_job_id), prefix_length, ticket, std::move(slot), metrics));
    reactor->set_self(reactor);
    return reactor;
  }

  void QueueEvent(const JobEvent& event) {
    JobEvent told = event;
    told.set_job_id(event.job_id().substr(prefix_length_));  // the caller's id
    Queue(std::move(told));
  }

 private:
  JobWatchReactor(std::shared_ptr<RendezvousHub> hub, std::string hub_job_id, size_t prefix_length,
                  uint64_t ticket, PeerLimits::Slot slot, RendezvousMetrics* metrics)
      : QueuedStream(kMaxQueued, std::move(slot), metrics, RpcMethod::kWatchJob),
        hub_(std::move(hub)), hub_job_id_(std::move(hub_job_id)), prefix_length_(prefix_length),
        ticket_(ticket) {}

  bool IsLast(const JobEvent& event) const override { return IsFinalEvent(event); }
  void Leave() override { hub_->CancelObserve(hub_job_id_, ticket_); }

  const std::shared_ptr<RendezvousHub> hub_;
  const std::string hub_job_id_;
  const size_t prefix_length_;
  const uint64_t ticket_;
};

// A watch refused before it opened.
template <typename Event>
class RendezvousService::RefusedStream final : public grpc::ServerWriteReactor<Event> {
 public:
  RefusedStream(const grpc::Status& status, RendezvousMetrics* metrics, RpcMethod method) {
    if (metrics != nullptr) metrics->CountCall(method, status.error_code());
    this->Finish(status);
  }
  void OnDone() override { delete this; }
};

namespace {

// Refusals worth an operator's line: someone sent what cannot be served.
bool IsRefusal(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted: return true;
    default: return false;
  }
}

// Our own messages quote client strings (each within the field limits); a
// line shows this much of one.
constexpr size_t kMaxLoggedMessageBytes = 1024;

int Milliseconds(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT32_MAX));
}

int Seconds(absl::Duration d) {
  return std::max(1, static_cast<int>(absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1)))));
}

// Kernel TCP keepalive on the server's listening sockets, which Linux copies
// to every connection they accept (and on the connections accepted before).
// gRPC does not hand out its sockets, so they are found among this
// process's descriptors by their local port. The kernel
// probes idle connections itself: liveness for thousands of agents at no
// cost to this process (gRPC's HTTP/2 keepalive pings cost 40 us of server
// CPU per ping at 10,000 connections; see docs/BENCHMARKS.md).
absl::Status EnableKeepalive(int port, const ServerOptions& options) {
  const int idle = Seconds(options.keepalive_interval);
  const int probes = std::max(1, options.keepalive_probes);
  // Unacknowledged data (a push to a vanished host) gives up as soon.
  const unsigned user_timeout_ms = static_cast<unsigned>(1000 * idle * (probes + 1));
  const UniqueDir dir(opendir("/proc/self/fd"));
  if (!dir.valid()) return ErrnoToStatus(errno, "opendir /proc/self/fd");
  int found = 0;
  absl::Status status;
  while (const dirent* entry = readdir(dir.get())) {
    const int fd = std::atoi(entry->d_name);
    if (fd <= 2 || fd == dirfd(dir.get())) continue;
    // The listeners, and the connections they accepted before this ran
    // (agents retry while the server starts): both have the port locally.
    int listening = 0;
    socklen_t length = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0) continue;
    sockaddr_storage addr{};
    length = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) continue;
    const int bound = addr.ss_family == AF_INET
                          ? ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port)
                      : addr.ss_family == AF_INET6
                          ? ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port)
                          : -1;
    if (bound != port) continue;
    const int on = 1;
    const bool set = setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) == 0 &&
                     setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) == 0 &&
                     setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof idle) == 0 &&
                     setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) == 0 &&
                     setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
                                sizeof user_timeout_ms) == 0;
    if (!listening) continue;  // a connection may close under us: no matter
    if (!set) {
      status = ErrnoToStatus(errno, absl::StrCat("TCP keepalive on the listener of port ", port));
      break;
    }
    ++found;
  }
  if (!status.ok()) return status;
  if (found == 0) {
    return absl::InternalError(absl::StrCat("cannot find the listening socket of port ", port,
                                            " to turn TCP keepalive on"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const grpc::health::v1::HealthCheckRequest* request,
                                               grpc::health::v1::HealthCheckResponse* response) {
  if (!request->service().empty() && request->service() != Rendezvous::service_full_name()) {
    if (metrics_ != nullptr) metrics_->CountCall(RpcMethod::kHealthCheck, grpc::NOT_FOUND);
    return FinishNow(context, absl::NotFoundError("unknown service"));
  }
  response->set_status(serving_.load(std::memory_order_relaxed)
                           ? grpc::health::v1::HealthCheckResponse::SERVING
                           : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  if (metrics_ != nullptr) metrics_->CountCall(RpcMethod::kHealthCheck, grpc::OK);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RendezvousService::Answer(grpc::CallbackServerContext* context,
                                                    RpcMethod method, const absl::Status& status) {
  if (metrics_ != nullptr) {
    metrics_->CountCall(method, static_cast<grpc::StatusCode>(status.code()));
  }
  return FinishNow(context, status);
}

void RendezvousService::LogRefusal(absl::string_view kind, const std::string& line) {
  static const auto logger = Logger("rdzv");
  LogLimiter::Verdict verdict;
  {
    absl::MutexLock lock(&log_mu_);
    verdict = log_limiter_.Allow(kind, absl::Now());
  }
  if (verdict.dropped > 0) {
    logger->warn("{} more lines of kind '{}' left out (at most 10 a second)", verdict.dropped,
                 kind);
  }
  if (verdict.log) logger->warn("{}", line);
}

void RendezvousService::LogIfDenied(absl::string_view call, const std::string& peer,
                                    const std::string& job_id, const std::string& node_id,
                                    const absl::Status& status) {
  if (!absl::IsPermissionDenied(status)) return;
  LogRefusal("denied", absl::StrCat("refused ", call, " for node ", ForLog(node_id), " of job '",
                                    ForLog(job_id), "' from ", ForLog(peer),
                                    ": it does not carry the node's secret"));
}

namespace {

// `request` with the job id the hub knows it by (the caller's namespace put
// before the caller's id), or `request` itself in no namespace.
template <typename Request>
const Request& InNamespace(const Request& request, const std::string& prefix, Request* copy) {
  if (prefix.empty()) return request;
  *copy = request;
  copy->set_job_id(absl::StrCat(prefix, request.job_id()));
  return *copy;
}

}  // namespace

grpc::ServerUnaryReactor* RendezvousService::Join(grpc::CallbackServerContext* context,
                                                  const JoinRequest* raw_request,
                                                  JoinResponse* response) {
  absl::StatusOr<Caller> caller = Admit(context, "Join", /*credential=*/true);
  if (!caller.ok()) return Answer(context, RpcMethod::kJoin, caller.status());
  // The bounds are on the caller's id, whatever namespace it goes in.
  if (absl::Status id = ValidateJobId(raw_request->job_id()); !id.ok()) {
    return Answer(context, RpcMethod::kJoin, id);
  }
  JoinRequest copy;
  const JoinRequest* request = &InNamespace(*raw_request, caller->job_prefix, &copy);
  const std::string peer = context->peer();
  absl::StatusOr<PeerLimits::Slot> slot = peers_.Acquire(peer, PeerLimits::Kind::kJoin);
  if (!slot.ok()) {
    LogRefusal("peer-limit",
               absl::StrCat("refused a join from ", ForLog(peer), ": ", slot.status().message()));
    return Answer(context, RpcMethod::kJoin, slot.status());
  }
  const uint64_t ticket = hub_->NewTicket();
  auto* reactor = new JoinReactor(hub_, {request->job_id(), request->node().node_id()}, ticket,
                                  response, *std::move(slot), metrics_.get());
  hub_->Join(
      *request, PeerHost(peer), ticket,
      [this, reactor, peer, uid = caller->uid, job_id = request->job_id(),
       node_id = request->node().node_id()](absl::StatusOr<Assignment> result) {
        if (!result.ok() && IsRefusal(result.status())) {
          LogRefusal("join",
                     absl::StrCat("refused the join of node ", ForLog(node_id), " to job '",
                                  ForLog(job_id), "' from ", ForLog(peer), ": ",
                                  ForLog(result.status().message(), kMaxLoggedMessageBytes)));
        }
        if (result.ok() && uid) {
          static const auto logger = Logger("rdzv");
          logger->info("job '{}': node {} joined as uid {}", ForLog(job_id), ForLog(node_id), *uid);
        }
        reactor->Complete(std::move(result));
      });
  return reactor;
}

grpc::ServerWriteReactor<WatchEvent>* RendezvousService::Watch(grpc::CallbackServerContext* context,
                                                               const WatchRequest* raw_request) {
  absl::StatusOr<Caller> caller = Admit(context, "Watch", /*credential=*/false);
  if (!caller.ok())
    return new RefusedStream<WatchEvent>(ToGrpcStatus(caller.status()), metrics_.get(),
                                         RpcMethod::kWatch);
  WatchRequest copy;
  const WatchRequest* request = &InNamespace(*raw_request, caller->job_prefix, &copy);
  const std::string peer = context->peer();
  absl::StatusOr<PeerLimits::Slot> slot = peers_.Acquire(peer, PeerLimits::Kind::kWatch);
  if (!slot.ok()) {
    LogRefusal("peer-limit",
               absl::StrCat("refused a watch from ", ForLog(peer), ": ", slot.status().message()));
    return new RefusedStream<WatchEvent>(ToGrpcStatus(slot.status()), metrics_.get(),
                                         RpcMethod::kWatch);
  }
  const uint64_t ticket = hub_->NewTicket();
  std::shared_ptr<WatchReactor> reactor = WatchReactor::Create(
      hub_, {request->job_id(), request->node_id()}, ticket, *std::move(slot), metrics_.get());
  hub_->Watch(*request, ticket,
              RendezvousHub::Watcher{[reactor](const WatchEvent& event) { reactor->Push(event); },
                                     [this, reactor, peer, job_id = request->job_id(),
                                      node_id = request->node_id()](absl::Status status) {
                                       LogIfDenied("a watch", peer, job_id, node_id, status);
                                       reactor->End(ToGrpcStatus(status));
                                     }});
  return reactor.get();
}

grpc::ServerUnaryReactor* RendezvousService::Heartbeat(grpc::CallbackServerContext* context,
                                                       const HeartbeatRequest* raw_request,
                                                       HeartbeatResponse* response) {
  absl::StatusOr<Caller> caller = Admit(context, "Heartbeat", /*credential=*/false);
  if (!caller.ok()) return Answer(context, RpcMethod::kHeartbeat, caller.status());
  HeartbeatRequest copy;
  const HeartbeatRequest& request = InNamespace(*raw_request, caller->job_prefix, &copy);
  absl::StatusOr<int64_t> round = hub_->Heartbeat(request);
  if (round.ok()) response->set_round(*round);
  LogIfDenied("a heartbeat", context->peer(), request.job_id(), request.node_id(), round.status());
  return Answer(context, RpcMethod::kHeartbeat, round.status());
}

grpc::ServerUnaryReactor* RendezvousService::ReportFailure(grpc::CallbackServerContext* context,
                                                           const ReportFailureRequest* raw_request,
                                                           ReportFailureResponse* response) {
  absl::StatusOr<Caller> caller = Admit(context, "ReportFailure", /*credential=*/true);
  if (!caller.ok()) return Answer(context, RpcMethod::kReportFailure, caller.status());
  ReportFailureRequest copy;
  const ReportFailureRequest& request = InNamespace(*raw_request, caller->job_prefix, &copy);
  const absl::Status status = hub_->ReportFailure(request);
  LogIfDenied("a failure report", context->peer(), request.job_id(), request.node_id(), status);
  return Answer(context, RpcMethod::kReportFailure, status);
}

grpc::ServerUnaryReactor* RendezvousService::ReportDone(grpc::CallbackServerContext* context,
                                                        const ReportDoneRequest* raw_request,
                                                        ReportDoneResponse* response) {
  absl::StatusOr<Caller> caller = Admit(context, "ReportDone", /*credential=*/true);
  if (!caller.ok()) return Answer(context, RpcMethod::kReportDone, caller.status());
  ReportDoneRequest copy;
  const ReportDoneRequest& request = InNamespace(*raw_request, caller->job_prefix, &copy);
  const absl::Status status = hub_->ReportDone(request);
  LogIfDenied("a done report", context->peer(), request.job_id(), request.node_id(), status);
  return Answer(context, RpcMethod::kReportDone, status);
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* context,
                                                   const LeaveRequest* raw_request,
                                                   LeaveResponse* response) {
  absl::StatusOr<Caller> caller = Admit(context, "Leave", /*credential=*/true);
  if (!caller.ok()) return Answer(context, RpcMethod::kLeave, caller.status());
  LeaveRequest copy;
  const LeaveRequest& request = InNamespace(*raw_request, caller->job_prefix, &copy);
  const absl::Status status = hub_->Leave(request);
  LogIfDenied("a leave", context->peer(), request.job_id(), request.node_id(), status);
  return Answer(context, RpcMethod::kLeave, status);
}

grpc::ServerUnaryReactor* RendezvousService::Status(grpc::CallbackServerContext* context,
                                                    const StatusRequest* request,
                                                    StatusResponse* response) {
  absl::StatusOr<Caller> caller = Admit(context, "Status", /*credential=*/true);
  if (!caller.ok()) return Answer(context, RpcMethod::kStatus, caller.status());
  absl::StatusOr<StatusResponse> status =
      hub_->Status(absl::StrCat(caller->job_prefix, request->job_id()), request->nodes());
  if (status.ok()) {
    *response = *std::move(status);
    response->set_job_id(request->job_id());  // the caller's id, not the hub's
  }
  return Answer(context, RpcMethod::kStatus, status.status());
}

grpc::ServerUnaryReactor* RendezvousService::ListJobs(grpc::CallbackServerContext* context,
                                                      const ListJobsRequest* request,
                                                      ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = Admit(context, "ListJobs", /*credential=*/true);
  if (!caller.ok()) return Answer(context, RpcMethod::kListJobs, caller.status());
  *response = hub_->ListJobs(caller->job_prefix);  // the caller's namespace only
  for (StatusResponse& job : *response->mutable_jobs()) {
    job.set_job_id(job.job_id().substr(caller->job_prefix.size()));
  }
  return Answer(context, RpcMethod::kListJobs, absl::OkStatus());
}

grpc::ServerUnaryReactor* RendezvousService::Stop(grpc::CallbackServerContext* context,
                                                  const StopRequest* request,
                                                  StopResponse* response) {
  absl::StatusOr<Caller> caller = Admit(context, "Stop", /*credential=*/true);
  if (!caller.ok()) return Answer(context, RpcMethod::kStop, caller.status());
  if (absl::Status id = ValidateJobId(request->job_id()); !id.ok())
    return Answer(context, RpcMethod::kStop, id);
  const absl::Status status =
      hub_->Stop(absl::StrCat(caller->job_prefix, request->job_id()), request->reason());
  if (status.ok()) {
    static const auto logger = Logger("rdzv");
    logger->warn(
        "job '{}' stopped by {}{}: {}", ForLog(request->job_id()), ForLog(context->peer()),
        caller->uid ? absl::StrCat(" (uid ", *caller->uid, ")") : std::string(),
        request->reason().empty() ? "no reason given" : ForLog(request->reason(), kMaxReasonBytes));
  }
  return Answer(context, RpcMethod::kStop, status);
}

grpc::ServerWriteReactor<JobEvent>* RendezvousService::WatchJob(
    grpc::CallbackServerContext* context, const WatchJobRequest* request) {
  absl::StatusOr<Caller> caller = Admit(context, "WatchJob", /*credential=*/true);
  if (!caller.ok())
    return new RefusedStream<JobEvent>(ToGrpcStatus(caller.status()), metrics_.get(),
                                       RpcMethod::kWatchJob);
  if (absl::Status id = ValidateJobId(request->job_id()); !id.ok()) {
    return new RefusedStream<JobEvent>(ToGrpcStatus(id), metrics_.get(), RpcMethod::kWatchJob);
  }
  const std::string peer = context->peer();
  absl::StatusOr<PeerLimits::Slot> slot = peers_.Acquire(peer, PeerLimits::Kind::kWatch);
  if (!slot.ok()) {
    LogRefusal("peer-limit", absl::StrCat("refused a job watch from ", ForLog(peer), ": ",
                                          slot.status().message()));
    return new RefusedStream<JobEvent>(ToGrpcStatus(slot.status()), metrics_.get(),
                                       RpcMethod::kWatchJob);
  }
  const std::string job_id = absl::StrCat(caller->job_prefix, request->job_id());
  const uint64_t ticket = hub_->NewTicket();
  std::shared_ptr<JobWatchReactor> reactor = JobWatchReactor::Create(
      hub_, job_id, caller->job_prefix.size(), ticket, *std::move(slot), metrics_.get());
  const absl::Status observed =
      hub_->ObserveJob(job_id, ticket,
                       RendezvousHub::Observer{
                           [reactor](const JobEvent& event) { reactor->QueueEvent(event); },
                           [reactor] { reactor->Flush(); },
                           [reactor](absl::Status status) { reactor->End(ToGrpcStatus(status)); }});
  if (absl::IsNotFound(observed)) {
    // Told as the caller named it, not as the hub knows it.
    reactor->End(ToGrpcStatus(absl::NotFoundError(
        absl::StrCat("no job '", ForLog(request->job_id()), "' on this server"))));
  } else if (!observed.ok()) {
    reactor->End(ToGrpcStatus(observed));
  }
  return reactor.get();
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const std::string& host, int port, const ServerOptions& options) {
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> tls =
        ServerTlsCredentials(options.tls);
    if (!tls.ok()) return tls.status();
    credentials = *std::move(tls);
  }
  std::unique_ptr<RendezvousServer> server(new RendezvousServer());
  server->ticker_ = CallbackTicker::Acquire();
  HubOptions hub = options.hub;
  if (options.ping_interval > absl::ZeroDuration()) {
    // Every stream end is counted so, not only those of an unanswered ping
    // (an agent that died, a cut link the kernel found): only the ping's
    // timeout is sure to have passed in silence.
    hub.state.stream_silence = options.ping_timeout;
  }
  server->hub_ = std::make_shared<RendezvousHub>(hub);
  if (options.metrics) server->metrics_ = std::make_shared<RendezvousMetrics>(server->hub_);
  server->service_ = std::make_unique<RendezvousService>(
      server->hub_, options.token, options.per_peer, options.munge, server->metrics_);
  grpc::ServerBuilder builder;
  server->health_.set_metrics(server->metrics_.get());
  // Without this, gRPC sets SO_REUSEPORT and a second server on the same port
  // would silently share it instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Callers keep their own deadlines (a client cancels its call when its
  // deadline passes, and the cancel reaches the hub), so the server keeps no
  // timer per call: with 10,000 long-polling joins those timers were a
  // quarter of the server's CPU in Debian's gRPC (a debug build).
  builder.AddChannelArgument(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 0);
  // Messages here are a few hundred bytes: no bandwidth to estimate, so no
  // BDP pings (and their timers) after every read.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Agents ping to find a server that vanished (channel.h): allow it, with
  // room for timer jitter (pings that come too early get a connection closed).
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      static_cast<int>(absl::ToInt64Milliseconds(kMinClientKeepaliveInterval / 2)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (options.ping_interval > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(options.ping_interval));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Milliseconds(options.ping_timeout));
    // Idle connections are the point: an agent's watch stream sends nothing
    // for hours. gRPC's default stops pinging after two pings with no data.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  const std::string address = FormatEndpoint(host, port);
  builder.AddListeningPort(address, credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(&server->health_);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->hub_->Shutdown();
    if (port != 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "cannot listen on ", address, ": the port is in use or the address is not this host's"));
    }
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", address));
  }
  if (options.keepalive_interval > absl::ZeroDuration()) {
    // Without it the server still works; only vanished hosts go unnoticed.
    absl::Status keepalive = EnableKeepalive(server->port_, options);
    if (!keepalive.ok()) {
      Logger("rdzv")->warn(
          "{}; a host that vanishes without closing its connection will not be "
          "noticed",
          keepalive.message());
    }
  }
  return server;
}

RendezvousServer::~RendezvousServer() { Shutdown(absl::ZeroDuration()); }

void RendezvousServer::Shutdown(absl::Duration grace, RendezvousHub::Jobs jobs) {
  if (shut_down_) return;
  shut_down_ = true;
  hub_->Shutdown(jobs);
  if (server_ == nullptr) return;  // Start failed: nothing listens
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace muster::rdzv
