// How a rendezvous client's gRPC channel is set up: shared by the agent's
// client and the scale benchmark's simulated agents, so the benchmark
// measures what agents do.
#ifndef MUSTER_RENDEZVOUS_GRPC_CHANNEL_H_
#define MUSTER_RENDEZVOUS_GRPC_CHANNEL_H_

#include <grpcpp/support/channel_arguments.h>

#include "absl/time/time.h"

namespace muster::rdzv {

// Clients ping the server (HTTP/2 PING) at most this often; the server
// accepts pings this far apart (gRPC's default would call anything under
// 5 minutes abuse and drop the connection).
inline constexpr absl::Duration kMinClientKeepaliveInterval = absl::Seconds(1);

// A client pings the server every `keepalive` (at least
// kMinClientKeepaliveInterval) and gives the connection up when a ping is
// not answered within as long: while its watch stream is its heartbeat an
// agent makes no calls, and the ping is how it finds a server that vanished
// without closing the connection (giving the connection up ends the watch,
// and the agent's Heartbeat calls resume). Agents use keep_alive_interval x
// keep_alive_max_attempt or heartbeat_timeout / 3, whichever is shorter:
// 10 s by default.
grpc::ChannelArguments ClientChannelArguments(absl::Duration keepalive);

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_GRPC_CHANNEL_H_
