#include "allreduce/data.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace muster::allreduce {
namespace {

// Every rank's buffer summed the plain way, element by element.
std::vector<char> SumOfRanks(int ranks, int64_t count, DataType type) {
  const int size = DataTypeSize(type);
  std::vector<char> sum(count * size), mine(count * size);
  Fill(sum.data(), count, type, 0, ranks);
  for (int r = 1; r < ranks; ++r) {
    Fill(mine.data(), count, type, r, ranks);
    AddInto(sum.data(), mine.data(), count, type);
  }
  return sum;
}

TEST(DataTest, TheSumOfEveryRanksValuesChecksOutInEachType) {
  for (DataType type :
       {DataType::kFloat, DataType::kHalf, DataType::kBfloat16, DataType::kDouble}) {
    for (int ranks : {1, 2, 3, 8, 9, 32, 33, 256}) {
      for (int64_t count : {1, 7, 1000}) {
        std::vector<char> sum = SumOfRanks(ranks, count, type);
        EXPECT_EQ(CountWrong(sum.data(), count, type, ranks), 0)
            << DataTypeName(type) << ", " << ranks << " ranks, " << count << " elements";
      }
    }
  }
}

TEST(DataTest, AWrongElementIsCounted) {
  for (DataType type :
       {DataType::kFloat, DataType::kHalf, DataType::kBfloat16, DataType::kDouble}) {
    std::vector<char> sum = SumOfRanks(4, 100, type);
    // Element 10 with rank 5's value instead of the sum.
    Fill(sum.data() + 10 * DataTypeSize(type), 1, type, 5, 4);
    EXPECT_EQ(CountWrong(sum.data(), 100, type, 4), 1) << DataTypeName(type);
    // A rank's own values are not the sum.
    std::vector<char> alone(100 * DataTypeSize(type));
    Fill(alone.data(), 100, type, 0, 4);
    EXPECT_EQ(CountWrong(alone.data(), 100, type, 4), 100) << DataTypeName(type);
  }
}

TEST(DataTest, HalfAndBfloat16AddWithRounding) {
  // 1 + 2^-9 is not a bfloat16 (8 bits of mantissa): it rounds to even, 1.
  uint16_t a = 0x3f80, b = 0x3b00;  // 1.0 and 2^-9 in bfloat16
  AddInto(&a, &b, 1, DataType::kBfloat16);
  EXPECT_EQ(a, 0x3f80);
  uint16_t c = 0x3f80, d = 0x3f80;  // 1 + 1 = 2
  AddInto(&c, &d, 1, DataType::kBfloat16);
  EXPECT_EQ(c, 0x4000);
  uint16_t h = FloatToHalf(1.5f), k = FloatToHalf(2.25f);
  AddInto(&h, &k, 1, DataType::kHalf);
  EXPECT_EQ(HalfToFloat(h), 3.75f);
}

#ifdef __FLT16_MANT_DIG__
// The conversions of compilers without _Float16 agree with this one's.
TEST(DataTest, HalfConversionsAgreeWithTheCompilersFloat16) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    _Float16 native;
    const auto half = static_cast<uint16_t>(bits);
    std::memcpy(&native, &half, sizeof half);
    const float expected = static_cast<float>(native);
    const float got = HalfToFloat(half);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
    } else {
      EXPECT_EQ(std::memcmp(&got, &expected, sizeof got), 0) << bits << ": " << got;
    }
  }
  // Every float from 0 to past the largest half, in steps that hit each
  // half, the points halfway between two and their neighbours; both signs.
  uint32_t checked = 0;
  for (uint32_t bits = 0; bits < 0x47900000u; bits += 0x3ffu, ++checked) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (uint32_t near : {bits, bits | 0xfffu, bits | 0x1000u, (bits | 0x1000u) + 1}) {
        float value;
        const uint32_t v = near | sign;
        std::memcpy(&value, &v, sizeof value);
        const _Float16 native = static_cast<_Float16>(value);
        uint16_t expected;
        std::memcpy(&expected, &native, sizeof expected);
        ASSERT_EQ(FloatToHalf(value), expected) << std::hex << v;
      }
    }
  }
  EXPECT_GT(checked, 1'000'000u);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}
#endif

}  // namespace
}  // namespace muster::allreduce
