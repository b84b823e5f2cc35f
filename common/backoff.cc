#include "common/backoff.h"

#include <algorithm>

namespace muster {

Backoff::Backoff(absl::Duration initial, absl::Duration max)
    : initial_(initial), max_(max), next_(initial) {}

absl::Duration Backoff::Next() {
  const absl::Duration now = next_;
  next_ = std::min(2 * next_, max_);
  return now;
}

void Backoff::Reset() { next_ = initial_; }

}  // namespace muster
