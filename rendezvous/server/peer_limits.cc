#include "rendezvous/server/peer_limits.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace muster::rdzv {

struct PeerLimits::State {
  struct Counts {
    int joins = 0;
    int watches = 0;
    int& of(Kind kind) { return kind == Kind::kJoin ? joins : watches; }
  };
  State(int joins, int watches) : max_joins(joins), max_watches(watches) {}

  const int max_joins;
  const int max_watches;
  absl::Mutex mu;
  absl::flat_hash_map<std::string, Counts> by_peer ABSL_GUARDED_BY(mu);
};

PeerLimits::PeerLimits(int max_joins, int max_watches)
    : state_(std::make_shared<State>(max_joins, max_watches)) {}

absl::StatusOr<PeerLimits::Slot> PeerLimits::Acquire(absl::string_view peer, Kind kind) {
  const int max = kind == Kind::kJoin ? state_->max_joins : state_->max_watches;
  absl::MutexLock lock(&state_->mu);
  int& held = state_->by_peer[peer].of(kind);
  if (held >= max) {
    const char* what = kind == Kind::kJoin ? "pending joins" : "open watches";
    return absl::ResourceExhaustedError(
        absl::StrCat("this connection holds ", held, " ", what,
                     ", the most one connection may; an "
                     "agent needs one: run one agent per connection, or wait for these to end"));
  }
  ++held;
  return Slot(state_, std::string(peer), kind);
}

int PeerLimits::Held(absl::string_view peer, Kind kind) const {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->by_peer.find(peer);
  return it == state_->by_peer.end() ? 0 : it->second.of(kind);
}

PeerLimits::Slot& PeerLimits::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    state_ = std::move(other.state_);
    peer_ = std::move(other.peer_);
    kind_ = other.kind_;
  }
  return *this;
}

void PeerLimits::Slot::Release() {
  if (state_ == nullptr) return;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->by_peer.find(peer_);
    if (it != state_->by_peer.end() && --it->second.of(kind_) <= 0 &&
        it->second.joins + it->second.watches == 0) {
      state_->by_peer.erase(it);  // a server sees many peers over its life
    }
  }
  state_.reset();
}

}  // namespace muster::rdzv
