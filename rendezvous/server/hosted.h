// The rendezvous an agent hosts in its own process: with --rdzv-backend
// c10d on the node that --rdzv-endpoint names it serves the other nodes over
// gRPC; standalone and static it serves only this node's agent, on no port.
// This is the launcher's one entry to the server (scripts/check-layers):
// everything else of rendezvous/server/ is musterd's.
//
// Thread safety: NewClient, Metrics and Shutdown from one thread (the
// launch's); the clients and metrics it hands out are safe from any.
#ifndef MUSTER_RENDEZVOUS_SERVER_HOSTED_H_
#define MUSTER_RENDEZVOUS_SERVER_HOSTED_H_

#include <memory>
#include <string>

#include <prometheus/collectable.h>

#include "absl/status/statusor.h"
#include "rendezvous/client/client.h"
#include "rendezvous/server/service.h"

namespace muster::rdzv {

class HostedRendezvous {
 public:
  // Only this process reaches it: no port, no gRPC.
  static std::unique_ptr<HostedRendezvous> InProcess();
  // Serving the other nodes on `bind_host`:`port` with `options`.
  // Errors: RendezvousServer::Start's (the port taken, among them).
  static absl::StatusOr<std::unique_ptr<HostedRendezvous>> Serve(const std::string& bind_host,
                                                                 int port,
                                                                 const ServerOptions& options);

  HostedRendezvous(const HostedRendezvous&) = delete;
  HostedRendezvous& operator=(const HostedRendezvous&) = delete;
  // Shutdown, if not called.
  ~HostedRendezvous();

  // This node's agent's client: in-process calls to the hub. `host` is the
  // address the other nodes reach this one at (the master address a round
  // hands out when this node is rank 0's).
  std::unique_ptr<RendezvousClient> NewClient(const std::string& host);

  // What it tells /metrics: the server's counters when it serves with
  // ServerOptions::metrics, else its jobs' figures only.
  std::shared_ptr<prometheus::Collectable> Metrics();

  // The server stops taking calls first, then the hub tells what waits that
  // it is going away; both are dropped here, on the calling thread, never in
  // a gRPC callback (callback_ticker.h, "The end"). Call after the agent that
  // used the client is gone.
  void Shutdown();

 private:
  HostedRendezvous(std::unique_ptr<RendezvousServer> server, std::shared_ptr<RendezvousHub> hub);

  std::unique_ptr<RendezvousServer> server_;  // null in-process
  std::shared_ptr<RendezvousHub> hub_;
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVER_HOSTED_H_
