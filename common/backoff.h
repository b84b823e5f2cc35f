// How long to wait before trying again: `initial`, then twice the last wait
// up to `max`, and `initial` again after a success. It reads no clock and
// never sleeps: the caller waits, on its own clock (etcd's client, between
// rounds of its members and before it reopens a watch).
//
// Thread safety: none; the caller serializes.
#ifndef MUSTER_COMMON_BACKOFF_H_
#define MUSTER_COMMON_BACKOFF_H_

#include "absl/time/time.h"

namespace muster {

class Backoff {
 public:
  // REQUIRES: 0 < initial <= max.
  Backoff(absl::Duration initial, absl::Duration max);

  // The wait now; the next is twice as long, `max` at most.
  absl::Duration Next();

  // After a success: the next wait is `initial` again.
  void Reset();

 private:
  absl::Duration initial_;
  absl::Duration max_;
  absl::Duration next_;
};

}  // namespace muster

#endif  // MUSTER_COMMON_BACKOFF_H_
