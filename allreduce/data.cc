#include "allreduce/data.h"

#include <cstring>

namespace muster::allreduce {
namespace {

// bfloat16 is the top half of a float; rounding to nearest even.
float Bf16ToFloat(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
void AddTyped(T* dst, const T* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] += src[i];
}

// Values go from 0 to m - 1; sums of up to 32 ranks stay under 256 with
// m = 8, and past that m = 2 keeps them exact in bfloat16 up to 256 ranks.
int Modulus(int ranks) { return ranks <= 32 ? 8 : 2; }

}  // namespace

void AddInto(void* dst, const void* src, int64_t count, DataType type) {
  switch (type) {
    case DataType::kFloat:
      AddTyped(static_cast<float*>(dst), static_cast<const float*>(src), count);
      break;
    case DataType::kDouble:
      AddTyped(static_cast<double*>(dst), static_cast<const double*>(src), count);
      break;
    case DataType::kHalf:
      AddTyped(static_cast<_Float16*>(dst), static_cast<const _Float16*>(src), count);
      break;
    case DataType::kBfloat16: {
      auto* d = static_cast<uint16_t*>(dst);
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) d[i] = FloatToBf16(Bf16ToFloat(d[i]) + Bf16ToFloat(s[i]));
      break;
    }
  }
}

void Fill(void* data, int64_t count, DataType type, int rank, int ranks) {
  const int m = Modulus(ranks);
  for (int64_t i = 0; i < count; ++i) {
    const float v = static_cast<float>((rank + i) % m);
    switch (type) {
      case DataType::kFloat: static_cast<float*>(data)[i] = v; break;
      case DataType::kDouble: static_cast<double*>(data)[i] = v; break;
      case DataType::kHalf: static_cast<_Float16*>(data)[i] = static_cast<_Float16>(v); break;
      case DataType::kBfloat16: static_cast<uint16_t*>(data)[i] = FloatToBf16(v); break;
    }
  }
}

int64_t CountWrong(const void* data, int64_t count, DataType type, int ranks) {
  // The sum depends on i mod m only.
  const int m = Modulus(ranks);
  double expected[8] = {};
  for (int k = 0; k < m; ++k) {
    for (int r = 0; r < ranks; ++r) expected[k] += static_cast<double>((r + k) % m);
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    double got = 0;
    switch (type) {
      case DataType::kFloat: got = static_cast<const float*>(data)[i]; break;
      case DataType::kDouble: got = static_cast<const double*>(data)[i]; break;
      case DataType::kHalf: got = static_cast<float>(static_cast<const _Float16*>(data)[i]); break;
      case DataType::kBfloat16: got = Bf16ToFloat(static_cast<const uint16_t*>(data)[i]); break;
    }
    if (got != expected[i % m]) ++wrong;
  }
  return wrong;
}

}  // namespace muster::allreduce
