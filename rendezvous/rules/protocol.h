// The version of the rendezvous protocol (proto/rendezvous.proto) this build
// speaks. A server and its agents must speak the same one: the server
// refuses a join of another version, and an agent refuses an answer of
// another. Bump it with every change to the messages' meaning.
#ifndef MUSTER_RENDEZVOUS_RULES_PROTOCOL_H_
#define MUSTER_RENDEZVOUS_RULES_PROTOCOL_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace muster::rdzv {

// 0 is what a peer older than versions sends (the field's default).
inline constexpr int32_t kProtocolVersion = 2;

// The most nodes of its round an Assignment names (Assignment.peers): a
// node asks them before it rides out an outage of the rendezvous.
inline constexpr int kMaxPeers = 8;

// The port a rendezvous listens on and is dialled at when none is given
// (torchrun's c10d default): musterd --port, --rdzv-endpoint HOST, musterctl.
inline constexpr int kDefaultRdzvPort = 29400;

// In the kNotFound message a server answers a node it removed from the job
// ("node N was dropped from job 'J': node H silent for 30 s"): the agent
// tells it from a server that forgot the job.
inline constexpr char kDroppedFromJob[] = "was dropped from job";

// In the kFailedPrecondition message a server answers a join from a host
// kept out of the job ("host H is excluded from job 'J': ..."): the agent
// exits with kExitNodeExcluded.
inline constexpr char kExcludedFromJob[] = "is excluded from job";

// In the kFailedPrecondition message a server answers a call for a job that
// closed as succeeded ("job 'J' succeeded and is closed (every node
// finished)"; ClosedJob in rules/state.h): the agent ends as when told
// JobClosed.succeeded, with exit code 0.
inline constexpr char kJobSucceeded[] = "' succeeded and is closed";

// Whether such a message says the job succeeded: kJobSucceeded before the
// reason, which is free text and may contain anything.
inline bool ClosedJobSucceeded(absl::string_view message) {
  const size_t marker = message.find(kJobSucceeded);
  return marker != absl::string_view::npos && marker < message.find(" (");
}

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_RULES_PROTOCOL_H_
