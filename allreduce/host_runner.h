// The Runner of the CPU backends (the TCP ring, shared memory): buffers in
// host memory, an all-reduce function to time and check.
#ifndef MUSTER_ALLREDUCE_HOST_RUNNER_H_
#define MUSTER_ALLREDUCE_HOST_RUNNER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "allreduce/env.h"
#include "allreduce/runner.h"
#include "allreduce/sweep.h"

namespace muster::allreduce {

class HostRunner final : public Runner {
 public:
  // Sums `count` elements of `type` at `data` over every rank, in place.
  using AllReduceFn = std::function<absl::Status(void* data, int64_t count, DataType type)>;

  // Buffers for sizes up to `max_bytes`.
  HostRunner(AllReduceFn all_reduce, const WorkerEnv& env, const RunnerOptions& options,
             int64_t max_bytes);

  // Out-of-place (the input copied to the output buffer first), then in
  // place: warm-up, timed iterations, then one more on fresh values, checked.
  absl::StatusOr<LocalResult> Run(const SweepSize& size, DataType type) override;

 private:
  AllReduceFn all_reduce_;
  const WorkerEnv env_;
  const RunnerOptions options_;
  std::vector<char> send_, recv_;
  const bool corrupt_;
};

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_HOST_RUNNER_H_
