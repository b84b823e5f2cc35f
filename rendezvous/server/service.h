// The rendezvous gRPC service on the callback API, and a server that hosts it.
// A pending join or an open watch costs a reactor, not a thread.
#ifndef MUSTER_RENDEZVOUS_SERVER_SERVICE_H_
#define MUSTER_RENDEZVOUS_SERVER_SERVICE_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/health.grpc.pb.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/auth/tls_files.h"
#include "rendezvous/grpc/callback_ticker.h"
#include "rendezvous/rules/log_limiter.h"
#include "rendezvous/server/hub.h"
#include "rendezvous/server/metrics.h"
#include "rendezvous/server/peer_limits.h"

namespace muster::rdzv {

// What one client connection may hold open at once (see peer_limits.h).
struct PeerBounds {
  int pending_joins = 64;
  int open_watches = 64;
};

// A rendezvous that trusts munge credentials (auth/munge.h): Slurm's,
// with no configuration inside an allocation.
struct MungeAuth {
  // The munged that decodes the credentials.
  MungeOptions munge;
  // true (a hosting agent): only this process's uid may use the rendezvous;
  // any other is refused kPermissionDenied. false (musterd): every uid may,
  // each in a namespace of its own: the hub sees "<uid>/<job id>", so
  // another uid's job of the same id is another job.
  bool only_own_uid = true;
};

// Translates gRPC calls to a RendezvousHub. Its only state: the calls each
// connection holds open, and the rate of its own log lines.
//
// With a `token`, every call must carry `authorization: Bearer <token>`
// metadata (token.h); any other call, whatever it asks, is answered
// UNAUTHENTICATED with kRefusedMessage before its request is read. An empty
// token lets every call in (as before tokens existed).
//
// With `munge` (and no token), Join, ReportFailure, ReportDone, Leave and
// the operator's calls (Status, ListJobs, Stop, WatchJob) must carry a
// fresh munge credential (kMungeMetadataKey): none, or
// one that does not decode (forged, replayed, expired, another key's), is
// answered UNAUTHENTICATED with kRefusedMessage; a uid the rendezvous does
// not serve, PERMISSION_DENIED. Heartbeat and Watch carry no credential (no
// munged round trip per heartbeat): the node's secret authorizes them, and
// on a namespacing rendezvous their kUidMetadataKey claim only picks the
// namespace the secret is looked up in. A credential is decoded on the
// gRPC thread that runs the handler: a munged round trip of about 0.4 ms
// that holds that thread (on 2 cores, Status calls went from 14,500 to
// 3,800 a second with 8 clients, munged's own threads the bound).
class RendezvousService final : public Rendezvous::CallbackService {
 public:
  // `metrics` (null: none) counts every call and times each join.
  explicit RendezvousService(std::shared_ptr<RendezvousHub> hub, std::string token = "",
                             PeerBounds bounds = {}, std::optional<MungeAuth> munge = std::nullopt,
                             std::shared_ptr<RendezvousMetrics> metrics = nullptr);

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
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context, const LeaveRequest* request,
                                  LeaveResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const StatusRequest* request, StatusResponse* response) override;
  // An operator's calls (musterctl): with a token or munge, a credential
  // like a join's; under munge only the caller's own uid's jobs.
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const ListJobsRequest* request,
                                     ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* Stop(grpc::CallbackServerContext* context, const StopRequest* request,
                                 StopResponse* response) override;
  grpc::ServerWriteReactor<JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                               const WatchJobRequest* request) override;

 private:
  class JoinReactor;
  template <typename Event>
  class QueuedStream;
  class WatchReactor;
  class JobWatchReactor;
  // A watch (of a node or of a job) refused before it opened.
  template <typename Event>
  class RefusedStream;
  // Finishes a unary call with `status`, counted for `method` (metrics_).
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, RpcMethod method,
                                   const absl::Status& status);
  // Whether the call carries the token (always, with none configured);
  // logs a refusal.
  bool Authenticated(grpc::CallbackServerContext* context, const char* method);

  // Who a call was let in as.
  struct Caller {
    // Put before the job id the client gives, for the hub: "" or "<uid>/".
    std::string job_prefix;
    // Decoded from its munge credential; unset for a call that carries none.
    std::optional<uid_t> uid;
  };
  // Authenticated, then the munge checks. `credential`: the call must carry
  // a munge credential (else it may carry a uid claim). Errors, logged:
  // kUnauthenticated (kRefusedMessage), kPermissionDenied (a uid not
  // served), kUnavailable (munged does not answer).
  absl::StatusOr<Caller> Admit(grpc::CallbackServerContext* context, const char* method,
                               bool credential);

  // Logs `line` (which must show client strings through ForLog) at warning
  // level, at most 10 a second per `kind`, saying how many were left out.
  void LogRefusal(absl::string_view kind, const std::string& line);
  // Logs a call refused for want of the node's secret.
  void LogIfDenied(absl::string_view call, const std::string& peer, const std::string& job_id,
                   const std::string& node_id, const absl::Status& status);

  const std::shared_ptr<RendezvousHub> hub_;
  const std::string token_;
  const std::optional<MungeAuth> munge_;
  // The uid this process runs as: the only one served with only_own_uid.
  const uid_t own_uid_;
  PeerLimits peers_;
  const std::shared_ptr<RendezvousMetrics> metrics_;
  absl::Mutex log_mu_;
  LogLimiter log_limiter_ ABSL_GUARDED_BY(log_mu_);
};

// What every refused call is told, whatever it carried and asked, with a
// token or munge: it says nothing of any job, not even whether one exists.
inline constexpr char kRefusedMessage[] =
    "this rendezvous needs a valid credential (a token, or munge under Slurm)";

// How the server keeps time and watches its connections.
struct ServerOptions {
  // The hub's clock and timer thread (see HubOptions); the defaults are the
  // real clock and a thread. Tests put the server on a FakeClock.
  HubOptions hub;
  // Pending joins and open watches per client connection.
  PeerBounds per_peer;

  // The kernel probes every idle connection (TCP keepalive) this often, in
  // whole seconds, and resets it after `keepalive_probes` unanswered probes
  // in a row. That ends the node's watch stream, and the node's heartbeat
  // timeout starts: an open watch stream is the node's heartbeat (see
  // RendezvousHub::Watch), and the probes are what find a host that vanished
  // without closing its connection (power loss, a cut link). A host whose
  // agent dies closes its connections at once. Zero: no keepalive.
  absl::Duration keepalive_interval = absl::Seconds(1);
  int keepalive_probes = 3;

  // The server pings a connection (HTTP/2 PING) once it has read nothing
  // from it for this long, and closes it when the ping goes unanswered for
  // `ping_timeout`. The kernel's probes cannot find an agent that is stopped
  // (SIGSTOP) or hung while its host answers TCP: a ping is answered by the
  // agent process itself. gRPC starts this timer again at every read, so
  // while an agent pings more often than this (every heartbeat_timeout / 3,
  // 10 s by default; rendezvous/grpc/channel.h) the server sends no ping of its
  // own; answering one costs it less than sending one (docs/BENCHMARKS.md,
  // "Hangs"), hence musterd's 12 s, a little longer than the agents' 10 s.
  // Closing the connection ends its watch stream, and the node's heartbeat
  // timeout counts from the unanswered ping (hub.state.stream_silence, set
  // to ping_timeout): a stopped agent is dropped heartbeat_timeout +
  // ping_interval after it last answered, at most.
  // Zero: no pings.
  absl::Duration ping_interval = absl::Seconds(12);
  absl::Duration ping_timeout = absl::Seconds(5);

  // The job's shared token (token.h): every call must carry it. Empty: no
  // authentication, anyone who reaches the port may call.
  std::string token;
  // Empty: plaintext. Else TLS (tls.h): the server presents tls.cert and
  // tls.key, and with tls.cacert requires every client to present a
  // certificate that authority signed. Plaintext clients are refused.
  TlsFiles tls;
  // Munge credentials (see RendezvousService); with a token too, the token
  // is what is checked.
  std::optional<MungeAuth> munge;
  // Keep the figures of RendezvousMetrics (RendezvousServer::metrics):
  // every call counted as it is answered, each join timed.
  bool metrics = false;
};

// A gRPC server hosting one RendezvousService.
// gRPC's health checking protocol (grpc.health.v1), Check only: "" (the
// server) and "muster.rdzv.Rendezvous" are known, anything else is
// NOT_FOUND. No credential is asked (a load balancer's or Kubernetes' probe
// has none) and nothing is told but whether the server serves. Watch is
// left unimplemented: its streams would be held open by anyone, unbounded
// (gRPC's built-in service implements it), and probes only Check.
class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  void SetServing(bool serving) { serving_.store(serving, std::memory_order_relaxed); }
  // Counts each Check there (null: none). Before the server starts.
  void set_metrics(RendezvousMetrics* metrics) { metrics_ = metrics; }

 private:
  std::atomic<bool> serving_{true};
  RendezvousMetrics* metrics_ = nullptr;
};

class RendezvousServer {
 public:
  // Listens on host:port; port 0 picks a free port. kAlreadyExists when the
  // port is taken, kInvalidArgument for an address gRPC cannot bind or TLS
  // files that cannot be used (ServerTlsCredentials' message).
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(const std::string& host, int port,
                                                                 const ServerOptions& options = {});
  ~RendezvousServer();

  int port() const { return port_; }
  // The hub behind the service: an agent in the same process talks to it
  // directly (see local_client.h) rather than through loopback gRPC.
  const std::shared_ptr<RendezvousHub>& hub() const { return hub_; }
  // The server's metrics, for an exposer to serve; null unless
  // ServerOptions::metrics.
  const std::shared_ptr<RendezvousMetrics>& metrics() const { return metrics_; }
  // What the health service (HealthService, on the same port) answers:
  // SERVING from Start on, NOT_SERVING after SetServing(false), e.g. while
  // musterd drains.
  void SetServing(bool serving) { health_.SetServing(serving); }
  // Stops accepting calls and ends the ones in flight within `grace`;
  // pending joins and watches are told what becomes of their jobs (see
  // RendezvousHub::Jobs). Returns once every reactor's OnDone has run; the
  // destructor then drops the server's share of gRPC's callback threads on
  // its own thread (callback_ticker.h, "The end"). REQUIRES: not called
  // from within a gRPC callback, where it would wait for itself.
  void Shutdown(absl::Duration grace = absl::Seconds(1),
                RendezvousHub::Jobs jobs = RendezvousHub::Jobs::kLost);

 private:
  RendezvousServer() = default;
  // Keeps a call that comes after a quiet second from waiting 100 ms for
  // gRPC's callback threads (callback_ticker.h).
  std::shared_ptr<CallbackTicker> ticker_;
  std::shared_ptr<RendezvousHub> hub_;
  std::shared_ptr<RendezvousMetrics> metrics_;
  std::unique_ptr<RendezvousService> service_;
  HealthService health_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

// The host part of a gRPC peer string ("ipv4:10.0.0.2:5000" → "10.0.0.2",
// "ipv6:[::1]:5000" → "::1").
std::string PeerHost(const std::string& peer);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVER_SERVICE_H_
