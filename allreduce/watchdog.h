// A last resort against a hang in a call that cannot be interrupted: a
// blocking NCCL call (joining the communicator, the first collective's
// connections, finalizing) waits for every rank, and a rank that died makes
// it wait for ever. Armed around such a call, the watchdog says which step
// hung and ends the process with exit 1 once the limit has passed. Steps that
// can be interrupted keep their own, shorter deadlines and fail cleanly.
#ifndef MUSTER_ALLREDUCE_WATCHDOG_H_
#define MUSTER_ALLREDUCE_WATCHDOG_H_

#include <chrono>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace muster::allreduce {

class Watchdog {
 public:
  // `who` starts the message ("rank 3"); `limit` is the time one armed step may take.
  Watchdog(std::string who, absl::Duration limit);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts the clock for `what` ("joining the NCCL communicator").
  void Arm(std::string what);
  void Disarm();

 private:
  void Watch();

  const std::string who_;
  const absl::Duration limit_;
  absl::Mutex mu_;
  std::string what_ ABSL_GUARDED_BY(mu_);  // empty: disarmed
  // A steady clock: a step of the wall clock must not end a healthy rank.
  std::chrono::steady_clock::time_point deadline_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_WATCHDOG_H_
