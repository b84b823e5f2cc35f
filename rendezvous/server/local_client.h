// A rendezvous client for the node whose process hosts the rendezvous: calls
// go straight to the hub, with no socket, no serialization and no gRPC
// threads. `--standalone` runs on this alone.
#ifndef MUSTER_RENDEZVOUS_SERVER_LOCAL_CLIENT_H_
#define MUSTER_RENDEZVOUS_SERVER_LOCAL_CLIENT_H_

#include <memory>

#include "rendezvous/client/client.h"
#include "rendezvous/server/hub.h"

namespace muster::rdzv {

// `peer_addr` is the address the hub records for this node when it
// advertises none: what the other nodes reach this host at (the rendezvous
// endpoint's host, which they connect to), as a remote peer's address would be.
std::unique_ptr<RendezvousClient> NewLocalClient(std::shared_ptr<RendezvousHub> hub,
                                                 std::string peer_addr = "127.0.0.1");

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVER_LOCAL_CLIENT_H_
