// The agent's side of the rendezvous: asynchronous calls whose results arrive
// on callbacks, so the agent's event loop never blocks on the network.
#ifndef MUSTER_RENDEZVOUS_CLIENT_CLIENT_H_
#define MUSTER_RENDEZVOUS_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/rendezvous.pb.h"
#include "rendezvous/auth/munge.h"
#include "rendezvous/auth/tls_files.h"

namespace muster::rdzv {

// How a gRPC client reaches its server.
struct ClientOptions {
  // The client pings the server this often (see channel.h).
  absl::Duration keepalive = absl::Seconds(10);
  // The job's shared token (token.h), sent with every call as
  // `authorization: Bearer <token>`. Empty: calls carry no credential.
  std::string token;
  // Where the token came from, for messages ("/home/me/.muster-token").
  std::string token_file;
  // Empty: plaintext. Else TLS (tls.h): the server's certificate is checked
  // against tls.cacert and the host of the target, and tls.cert with tls.key,
  // when given, is presented to the server.
  TlsFiles tls;
  // Munge (auth/munge.h): Join, Status, ReportFailure, ReportDone and
  // Leave each carry a fresh credential (kMungeMetadataKey: munged refuses a
  // replay), made on the caller's thread before the call starts; Heartbeat
  // and Watch carry only this process's uid (kUidMetadataKey), the node's
  // secret being their proof. Unset: no munge. Ignored with a token.
  std::optional<MungeOptions> munge;
};

// How an agent reaches its job's rendezvous. Two implementations: gRPC to a
// server elsewhere (Create), and in-process calls to a hub in this process
// (local_client.h), used by the node that hosts the rendezvous.
class RendezvousClient {
 public:
  // A gRPC client of the server at `target`, "host:port" (IPv6 in brackets).
  // Connecting is lazy: a join waits for the server to come up until its
  // deadline (agents often start before the host does).
  //
  // A call the server refuses for its credential ends kUnauthenticated, with
  // a message that says which token was wrong (or that none was given) and
  // what to do: retrying cannot help. With options.tls, a connection that
  // fails (kUnavailable) says what to check of the certificates; TLS files
  // that cannot be used (see ClientTlsCredentials, which callers run first
  // to report them) fail every call with kInvalidArgument. With munge, a
  // credential that cannot be made (munged down) ends the call
  // kFailedPrecondition, naming munged's socket, before anything is sent.
  static std::unique_ptr<RendezvousClient> Create(const std::string& target,
                                                  const ClientOptions& options = {});

  // Implementations cancel what is in flight and return only when no
  // callback can run any more and the callbacks given to the calls are
  // destroyed; the gRPC one then drops its channel, and its share of the
  // process's callback threads (callback_ticker.h, "The end"). REQUIRES: not
  // called from within one of this client's callbacks.
  virtual ~RendezvousClient() = default;

  // Where the rendezvous is, for messages.
  virtual const std::string& target() const = 0;

  // Whether an open watch says nothing of whether the rendezvous answers:
  // the etcd backend's outlives an outage of any length (its client opens
  // it again), where the gRPC one ends within its keepalive. The agent then
  // heartbeats while it watches (ElasticOptions::heartbeat_with_watch).
  virtual bool WatchOutlivesOutages() const { return false; }

  // Each call runs asynchronously; its callback runs exactly once, within
  // `timeout`, on another thread or before the call returns.
  virtual void Join(const JoinRequest& request, absl::Duration timeout,
                    std::function<void(absl::StatusOr<Assignment>)> done) = 0;
  virtual void Heartbeat(const HeartbeatRequest& request, absl::Duration timeout,
                         std::function<void(absl::StatusOr<int64_t>)> done) = 0;
  virtual void ReportFailure(const ReportFailureRequest& request, absl::Duration timeout,
                             std::function<void(absl::Status)> done) = 0;
  virtual void ReportDone(const ReportDoneRequest& request, absl::Duration timeout,
                          std::function<void(absl::Status)> done) = 0;
  virtual void Leave(const LeaveRequest& request, absl::Duration timeout,
                     std::function<void(absl::Status)> done) = 0;
  virtual void Status(const StatusRequest& request, absl::Duration timeout,
                      std::function<void(absl::StatusOr<StatusResponse>)> done) = 0;

  // Opens the node's watch: `on_event` for each event in order (a JobClosed
  // event is the last), and `on_end` at most once, when the watch ends; an
  // error status there means events may have been missed. Ends an earlier
  // watch first.
  virtual void Watch(const WatchRequest& request, std::function<void(const WatchEvent&)> on_event,
                     std::function<void(absl::Status)> on_end) = 0;

  // Blocking conveniences for tools and tests.
  absl::StatusOr<Assignment> JoinSync(const JoinRequest& request, absl::Duration timeout);
  absl::StatusOr<StatusResponse> StatusSync(const StatusRequest& request, absl::Duration timeout);
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_CLIENT_CLIENT_H_
