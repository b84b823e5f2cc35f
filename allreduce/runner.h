// A backend's side of one size: runs the all-reduce out of place and in
// place, times both, and checks both results.
#ifndef MUSTER_ALLREDUCE_RUNNER_H_
#define MUSTER_ALLREDUCE_RUNNER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "allreduce/sweep.h"

namespace muster::allreduce {

// One rank's part of a size: times are this rank's averages per iteration.
struct LocalResult {
  double time_us = 0;
  int64_t wrong = 0;
  double inplace_time_us = 0;
  int64_t inplace_wrong = 0;
};

struct RunnerOptions {
  int warmup = 5;
  int iterations = 20;
  int corrupt_rank = -1;  // test hook: this rank spoils its result
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual absl::StatusOr<LocalResult> Run(const SweepSize& size, DataType type) = 0;
  // After the last size, on success: lets peers finish what they need of this rank.
  virtual absl::Status Finish() { return absl::OkStatus(); }
};

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_RUNNER_H_
