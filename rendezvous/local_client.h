// A rendezvous client for the node whose process hosts the rendezvous: calls
// go straight to the hub, with no socket, no serialization and no gRPC
// threads. `--standalone` runs on this alone.
#ifndef MUSTER_RENDEZVOUS_LOCAL_CLIENT_H_
#define MUSTER_RENDEZVOUS_LOCAL_CLIENT_H_

#include <memory>

#include "rendezvous/client.h"
#include "rendezvous/hub.h"

namespace muster::rdzv {

// The client reports itself to the hub as peer 127.0.0.1.
std::unique_ptr<RendezvousClient> NewLocalClient(std::shared_ptr<RendezvousHub> hub);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_LOCAL_CLIENT_H_
