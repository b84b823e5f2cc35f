#include "allreduce/data.h"

#include <cmath>
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

#ifdef __FLT16_MANT_DIG__
using Half = _Float16;
#else
// A half kept as its bits, added through float as the compilers do.
struct Half {
  uint16_t bits;
  Half() = default;
  explicit Half(float value) : bits(FloatToHalf(value)) {}
  explicit operator float() const { return HalfToFloat(bits); }
  Half& operator+=(Half other) {
    bits = FloatToHalf(HalfToFloat(bits) + HalfToFloat(other.bits));
    return *this;
  }
};
static_assert(sizeof(Half) == 2);
#endif

template <typename T>
void AddTyped(T* dst, const T* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] += src[i];
}

// Values go from 0 to m - 1; sums of up to 32 ranks stay under 256 with
// m = 8, and past that m = 2 keeps them exact in bfloat16 up to 256 ranks.
int Modulus(int ranks) { return ranks <= 32 ? 8 : 2; }

}  // namespace

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)  // inf, NaN
                                       : sign | ((exponent + 112) << 23) | (mantissa << 13);
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7fffffffu;
  if (bits > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (bits >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to inf
  if (bits < 0x38800000u) {                        // below 2^-14: subnormal or zero
    float magnitude;
    std::memcpy(&magnitude, &bits, sizeof magnitude);
    // In units of 2^-24 (exact: a power of two), rounded to nearest even.
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  bits += 0xfffu + ((bits >> 13) & 1u);  // to nearest even at the half's last bit
  return sign | static_cast<uint16_t>((bits - 0x38000000u) >> 13);  // exponent 127 to 15
}

void AddInto(void* dst, const void* src, int64_t count, DataType type) {
  switch (type) {
    case DataType::kFloat:
      AddTyped(static_cast<float*>(dst), static_cast<const float*>(src), count);
      break;
    case DataType::kDouble:
      AddTyped(static_cast<double*>(dst), static_cast<const double*>(src), count);
      break;
    case DataType::kHalf:
      AddTyped(static_cast<Half*>(dst), static_cast<const Half*>(src), count);
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
      case DataType::kHalf: static_cast<Half*>(data)[i] = static_cast<Half>(v); break;
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
      case DataType::kHalf: got = static_cast<float>(static_cast<const Half*>(data)[i]); break;
      case DataType::kBfloat16: got = Bf16ToFloat(static_cast<const uint16_t*>(data)[i]); break;
    }
    if (got != expected[i % m]) ++wrong;
  }
  return wrong;
}

}  // namespace muster::allreduce
