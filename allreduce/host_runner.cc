#include "allreduce/host_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "allreduce/data.h"
#include "common/status.h"

namespace muster::allreduce {

HostRunner::HostRunner(AllReduceFn all_reduce, const WorkerEnv& env, const RunnerOptions& options,
                       int64_t max_bytes)
    : all_reduce_(std::move(all_reduce)), env_(env), options_(options), send_(max_bytes),
      recv_(max_bytes), corrupt_(options.corrupt_rank == env.rank) {}

absl::StatusOr<LocalResult> HostRunner::Run(const SweepSize& size, DataType type) {
  LocalResult result;
  using Clock = std::chrono::steady_clock;
  const size_t bytes = static_cast<size_t>(size.bytes);
  Fill(send_.data(), size.count, type, env_.rank, env_.world_size);
  for (const bool inplace : {false, true}) {
    // Out-of-place: copy the input into the output buffer, then sum there.
    auto op = [&]() -> absl::Status {
      if (!inplace) std::memcpy(recv_.data(), send_.data(), bytes);
      return all_reduce_(recv_.data(), size.count, type);
    };
    for (int i = 0; i < options_.warmup; ++i) MUSTER_RETURN_IF_ERROR(op());
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < options_.iterations; ++i) MUSTER_RETURN_IF_ERROR(op());
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                      std::max(1, options_.iterations);
    // The check: fresh values, one more all-reduce.
    if (inplace) Fill(recv_.data(), size.count, type, env_.rank, env_.world_size);
    MUSTER_RETURN_IF_ERROR(op());
    if (corrupt_) Fill(recv_.data(), 1, type, env_.rank + 1, env_.world_size);  // the test hook
    const int64_t wrong = CountWrong(recv_.data(), size.count, type, env_.world_size);
    (inplace ? result.inplace_time_us : result.time_us) = us;
    (inplace ? result.inplace_wrong : result.wrong) = wrong;
  }
  return result;
}

}  // namespace muster::allreduce
