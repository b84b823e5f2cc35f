// Buffers of the four data types on the CPU: the sum the ring computes, and
// the values every rank starts with and the check of the result. Rank r's
// element i is (r + i) mod 8 (mod 2 past 32 ranks), so every sum is a small
// integer, exact in half and in bfloat16 (up to 256 ranks).
#ifndef MUSTER_ALLREDUCE_DATA_H_
#define MUSTER_ALLREDUCE_DATA_H_

#include <cstdint>

#include "allreduce/sweep.h"

namespace muster::allreduce {

// dst[i] += src[i] for `count` elements of `type`.
void AddInto(void* dst, const void* src, int64_t count, DataType type);
// Rank `rank`'s starting values, in a job of `ranks` ranks.
void Fill(void* data, int64_t count, DataType type, int rank, int ranks);
// How many of `count` elements differ from the sum over `ranks` ranks.
int64_t CountWrong(const void* data, int64_t count, DataType type, int ranks);

// IEEE binary16 (half) from and to float, rounding to nearest even, for
// compilers without _Float16 (Debian 12's clang, which builds the
// thread-safety check): with it, half arithmetic is the compiler's.
float HalfToFloat(uint16_t half);
uint16_t FloatToHalf(float value);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_DATA_H_
