// A last resort against a hang in a call that cannot be interrupted: a
// blocking NCCL call (joining the communicator, the first collective's
// connections, finalizing) waits for every rank, and a rank that died makes
// it wait for ever. Armed around such a call, the watchdog says which step
// hung and ends the process with exit 1 once the limit has passed. Steps that
// can be interrupted keep their own, shorter deadlines and fail cleanly.
#ifndef MUSTER_ALLREDUCE_WATCHDOG_H_
#define MUSTER_ALLREDUCE_WATCHDOG_H_

#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace muster::allreduce {

class Watchdog {
 public:
  // `who` starts the message ("rank 3"); `limit` is the time one armed step
  // may take on `clock` (the real one: the wall time advanced by the
  // monotonic clock, so a step of the wall clock ends no healthy rank). Not
  // owned; outlives the watchdog.
  Watchdog(std::string who, absl::Duration limit, Clock& clock = Clock::Real());
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts the clock for `what` ("joining the NCCL communicator").
  void Arm(std::string what);
  void Disarm();

  // What the process ends with if the armed step has run past its limit on
  // the clock now ("rank 3: error: joining the NCCL communicator did not
  // finish within 40s; ..."); empty while nothing is overdue. The watching
  // thread asks ten times a second.
  std::string Overdue() const;

 private:
  std::string OverdueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watch();

  const std::string who_;
  const absl::Duration limit_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  std::string what_ ABSL_GUARDED_BY(mu_);  // empty: disarmed
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_WATCHDOG_H_
