// Bounds on what one client connection (a gRPC peer) may hold open at once:
// pending joins and open watches. An agent holds one of each; a peer that
// holds dozens is a flood (or a benchmark's simulated fleet).
//
// Thread safety: safe to use from any thread.
#ifndef MUSTER_RENDEZVOUS_SERVER_PEER_LIMITS_H_
#define MUSTER_RENDEZVOUS_SERVER_PEER_LIMITS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster::rdzv {

class PeerLimits {
 public:
  enum class Kind { kJoin, kWatch };

 private:
  struct State;

 public:
  // One call held open; its place is given back when the slot goes.
  class Slot {
   public:
    Slot(Slot&& other) noexcept = default;
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { Release(); }

   private:
    friend class PeerLimits;
    Slot(std::shared_ptr<State> state, std::string peer, Kind kind)
        : state_(std::move(state)), peer_(std::move(peer)), kind_(kind) {}
    void Release();

    std::shared_ptr<State> state_;  // null once released or moved from
    std::string peer_;
    Kind kind_;
  };

  // At most `max_joins` pending joins and `max_watches` open watches per peer.
  PeerLimits(int max_joins, int max_watches);

  // A place for one more call of `kind` from `peer`, or kResourceExhausted
  // naming the bound.
  absl::StatusOr<Slot> Acquire(absl::string_view peer, Kind kind);

  // Calls of `kind` that `peer` holds now.
  int Held(absl::string_view peer, Kind kind) const;

 private:
  std::shared_ptr<State> state_;  // shared with the slots, which may outlive this
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_SERVER_PEER_LIMITS_H_
