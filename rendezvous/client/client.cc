#include "rendezvous/client/client.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include <map>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/auth/tls.h"
#include "rendezvous/auth/token.h"
#include "rendezvous/grpc/callback_ticker.h"
#include "rendezvous/grpc/channel.h"
#include "rendezvous/grpc/status.h"
#include "rendezvous/rules/protocol.h"

namespace muster::rdzv {

grpc::ChannelArguments ClientChannelArguments(absl::Duration keepalive) {
  grpc::ChannelArguments args;
  // Reconnect quickly after a transient failure: the server may be an agent
  // that is just starting, or a musterd that restarts (agents wait for it
  // with their workers running: at most a second's backoff between tries,
  // so they are back within about a second of its return; with 2 s, 16
  // agents took 2.0 s after a 3 s outage, bench/musterd_restart.py).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Messages are a few hundred bytes: no bandwidth to estimate, and each BDP
  // ping would cost the server a read and a write.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  const int keepalive_ms =
      static_cast<int>(absl::ToInt64Milliseconds(std::max(keepalive, kMinClientKeepaliveInterval)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  // The watch stream sends nothing between rounds: ping all the same.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  return args;
}

namespace {

class GrpcRendezvousClient final : public RendezvousClient {
 public:
  GrpcRendezvousClient(std::string target, const ClientOptions& options);
  ~GrpcRendezvousClient() override;

  const std::string& target() const override { return target_; }
  void Join(const JoinRequest& request, absl::Duration timeout,
            std::function<void(absl::StatusOr<Assignment>)> done) override;
  void Heartbeat(const HeartbeatRequest& request, absl::Duration timeout,
                 std::function<void(absl::StatusOr<int64_t>)> done) override;
  void ReportFailure(const ReportFailureRequest& request, absl::Duration timeout,
                     std::function<void(absl::Status)> done) override;
  void ReportDone(const ReportDoneRequest& request, absl::Duration timeout,
                  std::function<void(absl::Status)> done) override;
  void Leave(const LeaveRequest& request, absl::Duration timeout,
             std::function<void(absl::Status)> done) override;
  void Status(const StatusRequest& request, absl::Duration timeout,
              std::function<void(absl::StatusOr<StatusResponse>)> done) override;
  void Watch(const WatchRequest& request, std::function<void(const WatchEvent&)> on_event,
             std::function<void(absl::Status)> on_end) override;

 private:
  class WatchStream;

  // What a call proves itself with, under munge: a fresh credential, or
  // (Heartbeat, Watch) only the node's secret, with a uid claim.
  enum class Proof { kCredential, kSecret };
  // A context with the deadline, registered so the destructor can cancel it.
  std::shared_ptr<grpc::ClientContext> NewCall(absl::Duration timeout, bool wait_for_ready);
  // Puts the credential on a call. Insecure channels carry no
  // CallCredentials: the metadata goes on each context. Errors: a munge
  // credential could not be made.
  absl::Status Authorize(grpc::ClientContext& context, Proof proof) const;
  // The call's status, with a refusal of our credential told in words
  // that say what to fix.
  absl::Status FromCall(const grpc::Status& status) const;
  // What to check of the certificates when TLS is on and no connection succeeds.
  std::string TlsHint() const;
  void EndCall(grpc::ClientContext* context);
  template <typename Request, typename Response, typename Result>
  void Unary(void (Rendezvous::Stub::async_interface::*method)(grpc::ClientContext*, const Request*,
                                                               Response*,
                                                               std::function<void(grpc::Status)>),
             const Request& request, absl::Duration timeout, bool wait_for_ready, Proof proof,
             std::function<Result(absl::Status, Response&)> convert,
             std::function<void(Result)> done);

  // Without it, a push or an answer that comes after a quiet second can
  // wait 100 ms for gRPC's callback threads (callback_ticker.h).
  const std::shared_ptr<CallbackTicker> ticker_ = CallbackTicker::Acquire();
  const std::string target_;
  const std::string token_;
  const std::string token_file_;
  const TlsFiles tls_;
  // Why no channel could be made (TLS files that cannot be used): every call fails with it.
  absl::Status unusable_;
  const std::optional<MungeOptions> munge_;
  const std::string uid_ = std::to_string(::getuid());
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Rendezvous::Stub> stub_;

  // No gRPC call is made with mu_ held: gRPC may run a callback inline,
  // and callbacks take mu_.
  absl::Mutex mu_;
  std::map<grpc::ClientContext*, std::shared_ptr<grpc::ClientContext>> calls_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<WatchStream> watch_ ABSL_GUARDED_BY(mu_);
  // Calls and streams whose gRPC objects are not destroyed yet: the
  // destructor waits for both to be 0.
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
};

class GrpcRendezvousClient::WatchStream final : public grpc::ClientReadReactor<WatchEvent> {
 public:
  WatchStream(GrpcRendezvousClient* client, const WatchRequest& request,
              std::function<void(const WatchEvent&)> on_event,
              std::function<void(absl::Status)> on_end)
      : client_(client), request_(request), on_event_(std::move(on_event)),
        on_end_(std::move(on_end)) {}

  // Keeps the stream alive until OnDone, however the client lets go of it.
  void Start(std::shared_ptr<WatchStream> self) {
    self_ = std::move(self);
    // A watch carries no credential: nothing to fail.
    client_->Authorize(context_, Proof::kSecret).IgnoreError();
    client_->stub_->async()->Watch(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows with the status
    on_event_(event_);
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    on_end_(client_->FromCall(status));
    GrpcRendezvousClient* const client = client_;
    std::shared_ptr<WatchStream> self;
    {
      absl::MutexLock lock(&client->mu_);
      if (client->watch_.get() == this) client->watch_.reset();
      self = std::move(self_);
    }
    // This stream, and with it its ClientContext and gRPC call, go before
    // the client's destructor may go on: had the last reference to gRPC
    // been dropped on this thread after the process began to exit, gRPC
    // would clean up in a detached thread racing exit (agents that exited
    // 134 or 139 after their job succeeded, about 1 in 4,000).
    self.reset();  // deletes this
    absl::MutexLock lock(&client->mu_);
    --client->streams_;
  }

 private:
  GrpcRendezvousClient* const client_;
  std::shared_ptr<WatchStream> self_;
  grpc::ClientContext context_;
  const WatchRequest request_;
  WatchEvent event_;
  std::function<void(const WatchEvent&)> on_event_;
  std::function<void(absl::Status)> on_end_;
};

GrpcRendezvousClient::GrpcRendezvousClient(std::string target, const ClientOptions& options)
    : target_(std::move(target)), token_(options.token), token_file_(options.token_file),
      tls_(options.tls), munge_(options.munge) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!tls_.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> secure = ClientTlsCredentials(tls_);
    if (secure.ok()) {
      credentials = *std::move(secure);
    } else {
      // Never plaintext in its place: calls fail, saying why.
      unusable_ = secure.status();
      credentials = nullptr;
    }
  }
  if (credentials != nullptr) {
    channel_ =
        grpc::CreateCustomChannel(target_, credentials, ClientChannelArguments(options.keepalive));
    stub_ = Rendezvous::NewStub(channel_);
  }
}

absl::Status GrpcRendezvousClient::Authorize(grpc::ClientContext& context, Proof proof) const {
  if (!token_.empty()) {
    context.AddMetadata(std::string(kAuthorizationKey), absl::StrCat(kBearerPrefix, token_));
    return absl::OkStatus();
  }
  if (!munge_) return absl::OkStatus();
  if (proof == Proof::kSecret) {
    context.AddMetadata(std::string(kUidMetadataKey), uid_);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> credential = EncodeMungeCredential(*munge_);
  if (!credential.ok()) {
    // Retrying soon will not help more than the agent's own restart would.
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make a munge credential for the rendezvous at ", target_, ": ",
                     credential.status().message()));
  }
  context.AddMetadata(std::string(kMungeMetadataKey), *std::move(credential));
  return absl::OkStatus();
}

absl::Status GrpcRendezvousClient::FromCall(const grpc::Status& status) const {
  if (!tls_.empty()) {
    // A failed handshake reads "failed to connect to all addresses; ... Ssl
    // handshake failed ..." (or "... Socket closed" where the server wanted
    // a client certificate); a call that waited for the connection ends
    // with its deadline while the channel keeps failing.
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
        !absl::StrContains(status.error_message(), "Connection refused")) {
      return absl::UnavailableError(absl::StrCat(status.error_message(), " (", TlsHint(), ")"));
    }
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        channel_->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      return absl::DeadlineExceededError(
          absl::StrCat(status.error_message(),
                       "; no connection to the server succeeded (if it is "
                       "running, ",
                       TlsHint(), ")"));
    }
  }
  if (status.error_code() != grpc::StatusCode::UNAUTHENTICATED) return FromGrpcStatus(status);
  if (token_.empty() && munge_) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the rendezvous at ", target_,
        " refused our munge credential: either it takes a token (musterd --token-file: give "
        "every agent --rdzv-conf token_file=PATH), or its munged does not share this host's "
        "munge key, or the clocks of the two hosts are minutes apart"));
  }
  if (token_.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the rendezvous at ", target_,
        " requires a token and this agent has none: give it the token file that musterd "
        "--token-file (or the hosting agent) was given, with --rdzv-conf token_file=PATH or "
        "MUSTER_TOKEN_FILE=PATH"));
  }
  const std::string file = token_file_.empty() ? "this agent's token file" : token_file_;
  return absl::UnauthenticatedError(absl::StrCat(
      "the rendezvous at ", target_, " refused our credential: the token in ", file,
      " is not the one musterd --token-file (or the hosting agent's token_file) was given; give "
      "every agent and the rendezvous the same token file"));
}

std::string GrpcRendezvousClient::TlsHint() const {
  std::string host = target_.substr(0, target_.rfind(':'));
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return absl::StrCat(
      "TLS: check that ", tls_.cacert, " signed the server's certificate and that it names ", host,
      tls_.cert.empty()
          ? ", and that the server does not require a client certificate (give "
            "cert=PATH,key=PATH if it does)"
          : absl::StrCat(", and that the server trusts the authority that signed ", tls_.cert));
}

GrpcRendezvousClient::~GrpcRendezvousClient() {
  std::vector<std::shared_ptr<grpc::ClientContext>> calls;
  std::shared_ptr<WatchStream> watch;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [raw, context] : calls_) calls.push_back(context);
    watch = watch_;
  }
  for (const auto& context : calls) context->TryCancel();
  if (watch) watch->Cancel();
  calls.clear();
  watch.reset();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](GrpcRendezvousClient* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
        return self->pending_ == 0 && self->streams_ == 0;
      },
      this));
}

std::shared_ptr<grpc::ClientContext> GrpcRendezvousClient::NewCall(absl::Duration timeout,
                                                                   bool wait_for_ready) {
  auto context = std::make_shared<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->set_wait_for_ready(wait_for_ready);
  absl::MutexLock lock(&mu_);
  calls_.emplace(context.get(), context);
  ++pending_;
  return context;
}

void GrpcRendezvousClient::EndCall(grpc::ClientContext* context) {
  std::shared_ptr<grpc::ClientContext> ended;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(context);
    if (it == calls_.end()) return;
    ended = std::move(it->second);
    calls_.erase(it);
  }
  // Destroyed outside the lock, but before the destructor may go on (see WatchStream::OnDone).
  ended.reset();
  absl::MutexLock lock(&mu_);
  --pending_;
}

template <typename Request, typename Response, typename Result>
void GrpcRendezvousClient::Unary(
    void (Rendezvous::Stub::async_interface::*method)(grpc::ClientContext*, const Request*,
                                                      Response*, std::function<void(grpc::Status)>),
    const Request& request, absl::Duration timeout, bool wait_for_ready, Proof proof,
    std::function<Result(absl::Status, Response&)> convert, std::function<void(Result)> done) {
  if (!unusable_.ok()) {
    Response none;
    done(convert(unusable_, none));
    return;
  }
  // calls_ owns the context until EndCall, at the end of the callback.
  grpc::ClientContext* context = NewCall(timeout, wait_for_ready).get();
  if (absl::Status authorized = Authorize(*context, proof); !authorized.ok()) {
    Response none;
    done(convert(std::move(authorized), none));
    EndCall(context);
    return;
  }
  auto call = std::make_shared<std::pair<Request, Response>>(request, Response());
  (stub_->async()->*method)(context, &call->first, &call->second,
                            [this, context, call, convert = std::move(convert),
                             done = std::move(done)](grpc::Status status) mutable {
                              done(convert(FromCall(status), call->second));
                              // Nothing of the call outlives EndCall, which may let
                              // the destructor go on: the caller's callback goes here,
                              // not after the client.
                              call.reset();
                              convert = nullptr;
                              done = nullptr;
                              EndCall(context);
                            });
}

void GrpcRendezvousClient::Join(const JoinRequest& request, absl::Duration timeout,
                                std::function<void(absl::StatusOr<Assignment>)> done) {
  Unary<JoinRequest, JoinResponse, absl::StatusOr<Assignment>>(
      &Rendezvous::Stub::async_interface::Join, request, timeout, /*wait_for_ready=*/true,
      Proof::kCredential,
      [target = target_](absl::Status status,
                         JoinResponse& response) -> absl::StatusOr<Assignment> {
        if (!status.ok()) return status;
        if (response.protocol_version() != kProtocolVersion) {
          return absl::FailedPreconditionError(absl::StrCat(
              "the rendezvous at ", target, " speaks protocol version ",
              response.protocol_version(),
              response.protocol_version() == 0 ? " (a muster older than protocol versions)" : "",
              ", this agent speaks version ", kProtocolVersion,
              "; run the same muster version on every node (and musterd)"));
        }
        return std::move(*response.mutable_assignment());
      },
      std::move(done));
}

void GrpcRendezvousClient::Heartbeat(const HeartbeatRequest& request, absl::Duration timeout,
                                     std::function<void(absl::StatusOr<int64_t>)> done) {
  Unary<HeartbeatRequest, HeartbeatResponse, absl::StatusOr<int64_t>>(
      &Rendezvous::Stub::async_interface::Heartbeat, request, timeout, /*wait_for_ready=*/false,
      Proof::kSecret,
      [](absl::Status status, HeartbeatResponse& response) -> absl::StatusOr<int64_t> {
        if (!status.ok()) return status;
        return response.round();
      },
      std::move(done));
}

template <typename Response>
absl::Status StatusOnly(absl::Status status, Response&) {
  return status;
}

void GrpcRendezvousClient::ReportFailure(const ReportFailureRequest& request,
                                         absl::Duration timeout,
                                         std::function<void(absl::Status)> done) {
  Unary<ReportFailureRequest, ReportFailureResponse, absl::Status>(
      &Rendezvous::Stub::async_interface::ReportFailure, request, timeout, true, Proof::kCredential,
      StatusOnly<ReportFailureResponse>, std::move(done));
}

void GrpcRendezvousClient::ReportDone(const ReportDoneRequest& request, absl::Duration timeout,
                                      std::function<void(absl::Status)> done) {
  Unary<ReportDoneRequest, ReportDoneResponse, absl::Status>(
      &Rendezvous::Stub::async_interface::ReportDone, request, timeout, true, Proof::kCredential,
      StatusOnly<ReportDoneResponse>, std::move(done));
}

void GrpcRendezvousClient::Leave(const LeaveRequest& request, absl::Duration timeout,
                                 std::function<void(absl::Status)> done) {
  Unary<LeaveRequest, LeaveResponse, absl::Status>(&Rendezvous::Stub::async_interface::Leave,
                                                   request, timeout, false, Proof::kCredential,
                                                   StatusOnly<LeaveResponse>, std::move(done));
}

void GrpcRendezvousClient::Status(const StatusRequest& request, absl::Duration timeout,
                                  std::function<void(absl::StatusOr<StatusResponse>)> done) {
  Unary<StatusRequest, StatusResponse, absl::StatusOr<StatusResponse>>(
      &Rendezvous::Stub::async_interface::Status, request, timeout, false, Proof::kCredential,
      [](absl::Status status, StatusResponse& response) -> absl::StatusOr<StatusResponse> {
        if (!status.ok()) return status;
        return std::move(response);
      },
      std::move(done));
}

void GrpcRendezvousClient::Watch(const WatchRequest& request,
                                 std::function<void(const WatchEvent&)> on_event,
                                 std::function<void(absl::Status)> on_end) {
  if (!unusable_.ok()) {
    on_end(unusable_);
    return;
  }
  auto stream =
      std::make_shared<WatchStream>(this, request, std::move(on_event), std::move(on_end));
  std::shared_ptr<WatchStream> replaced;
  {
    absl::MutexLock lock(&mu_);
    replaced = std::exchange(watch_, stream);
    ++streams_;
  }
  if (replaced) replaced->Cancel();
  stream->Start(stream);
}

}  // namespace

std::unique_ptr<RendezvousClient> RendezvousClient::Create(const std::string& target,
                                                           const ClientOptions& options) {
  return std::make_unique<GrpcRendezvousClient>(target, options);
}

absl::StatusOr<Assignment> RendezvousClient::JoinSync(const JoinRequest& request,
                                                      absl::Duration timeout) {
  absl::Notification done;
  absl::StatusOr<Assignment> result;
  Join(request, timeout, [&](absl::StatusOr<Assignment> r) {
    result = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

absl::StatusOr<StatusResponse> RendezvousClient::StatusSync(const StatusRequest& request,
                                                            absl::Duration timeout) {
  absl::Notification done;
  absl::StatusOr<StatusResponse> result;
  Status(request, timeout, [&](absl::StatusOr<StatusResponse> r) {
    result = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

}  // namespace muster::rdzv
