#include "rendezvous/server/hosted.h"

#include <utility>

#include "rendezvous/server/local_client.h"
#include "rendezvous/server/metrics.h"

namespace muster::rdzv {

std::unique_ptr<HostedRendezvous> HostedRendezvous::InProcess() {
  return std::unique_ptr<HostedRendezvous>(
      new HostedRendezvous(nullptr, std::make_shared<RendezvousHub>()));
}

absl::StatusOr<std::unique_ptr<HostedRendezvous>> HostedRendezvous::Serve(
    const std::string& bind_host, int port, const ServerOptions& options) {
  absl::StatusOr<std::unique_ptr<RendezvousServer>> started =
      RendezvousServer::Start(bind_host, port, options);
  if (!started.ok()) return started.status();
  std::shared_ptr<RendezvousHub> hub = (*started)->hub();
  return std::unique_ptr<HostedRendezvous>(
      new HostedRendezvous(*std::move(started), std::move(hub)));
}

HostedRendezvous::HostedRendezvous(std::unique_ptr<RendezvousServer> server,
                                   std::shared_ptr<RendezvousHub> hub)
    : server_(std::move(server)), hub_(std::move(hub)) {}

HostedRendezvous::~HostedRendezvous() { Shutdown(); }

std::unique_ptr<RendezvousClient> HostedRendezvous::NewClient(const std::string& host) {
  return NewLocalClient(hub_, host);
}

std::shared_ptr<prometheus::Collectable> HostedRendezvous::Metrics() {
  if (server_ != nullptr && server_->metrics() != nullptr) return server_->metrics();
  return std::make_shared<RendezvousMetrics>(hub_);
}

void HostedRendezvous::Shutdown() {
  if (server_) server_->Shutdown();
  if (hub_) hub_->Shutdown();
  server_.reset();
  hub_.reset();
}

}  // namespace muster::rdzv
