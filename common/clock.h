// Where the time comes from. Everything that reads the time (the rendezvous
// hub, the agent) takes a Clock, so that its rules are tested on fake time
// with no sleeps, as leveldb's Env::NowMicros allows.
#ifndef MUSTER_COMMON_CLOCK_H_
#define MUSTER_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace muster {

class Clock {
 public:
  virtual ~Clock() = default;

  // The time now. Never goes backwards. Thread-safe.
  virtual absl::Time Now() const = 0;

  // The process's clock: the wall time of its first use, advanced by the
  // monotonic clock since, so that a stepped system clock neither stalls nor
  // rushes a timer. Lives as long as the process.
  static Clock& Real();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'750'000'000)) : now_(start) {}

  absl::Time Now() const override;
  // REQUIRES: d >= 0.
  void Advance(absl::Duration d);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_COMMON_CLOCK_H_
