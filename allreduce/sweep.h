// What muster-allreduce measures: the sizes of its sweep and the data types,
// spelled as nccl-tests spells them (-b 8 -e 1G -f 2 -d float).
#ifndef MUSTER_ALLREDUCE_SWEEP_H_
#define MUSTER_ALLREDUCE_SWEEP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster::allreduce {

enum class DataType { kFloat, kHalf, kBfloat16, kDouble };

// "float", "half", "bfloat16", "double" (and nccl-tests' short forms
// "f32", "f16", "bf16", "f64"). kInvalidArgument names the accepted ones.
absl::StatusOr<DataType> ParseDataType(absl::string_view name);
const char* DataTypeName(DataType type);
int DataTypeSize(DataType type);

// A byte count: digits with an optional K, M or G suffix (powers of 1024,
// either case), as nccl-tests reads -b and -e: "8", "64K", "1G".
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

// One row of the sweep: `count` elements of the type, `bytes` = count x size.
struct SweepSize {
  int64_t bytes = 0;
  int64_t count = 0;
  friend bool operator==(const SweepSize&, const SweepSize&) = default;
};

// min_bytes, then each size `factor` times the last, up to max_bytes; each
// rounded down to whole elements of `type`, and sizes under one element
// left out. Errors (kInvalidArgument): min > max, factor < 2, min < 1, or
// no size holds one element.
absl::StatusOr<std::vector<SweepSize>> SizeSweep(int64_t min_bytes, int64_t max_bytes, int factor,
                                                 DataType type);

// Bandwidths as nccl-tests reports them, in GB/s (1e9 bytes): algbw is the
// bytes of one rank's buffer over the time; busbw = algbw x 2(n-1)/n for an
// all-reduce, comparable across rank counts (0 for one rank).
double AlgBandwidth(int64_t bytes, double seconds);
double AllReduceBusBandwidth(double algbw, int ranks);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_SWEEP_H_
