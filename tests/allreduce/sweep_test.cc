#include "allreduce/sweep.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::allreduce {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseBytesTest, ReadsDigitsWithBinarySuffixes) {
  EXPECT_EQ(*ParseBytes("8"), 8);
  EXPECT_EQ(*ParseBytes("64K"), 64 * 1024);
  EXPECT_EQ(*ParseBytes("64k"), 64 * 1024);
  EXPECT_EQ(*ParseBytes("16M"), 16 << 20);
  EXPECT_EQ(*ParseBytes("1G"), int64_t{1} << 30);
  EXPECT_EQ(*ParseBytes("0"), 0);
}

TEST(ParseBytesTest, RejectsWhatIsNotAByteCount) {
  for (const char* bad :
       {"", "K", "-8", "1.5M", "8KB", "1T", " 8", "99999999999999999999", "9999999999999G"}) {
    absl::StatusOr<int64_t> parsed = ParseBytes(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseBytes("1.5M").status().message(), HasSubstr("64K"));
}

TEST(DataTypeTest, NamesAndSizes) {
  EXPECT_EQ(*ParseDataType("float"), DataType::kFloat);
  EXPECT_EQ(*ParseDataType("bf16"), DataType::kBfloat16);
  EXPECT_EQ(*ParseDataType("Half"), DataType::kHalf);
  EXPECT_EQ(*ParseDataType("f64"), DataType::kDouble);
  EXPECT_EQ(DataTypeSize(DataType::kFloat), 4);
  EXPECT_EQ(DataTypeSize(DataType::kHalf), 2);
  EXPECT_EQ(DataTypeSize(DataType::kBfloat16), 2);
  EXPECT_EQ(DataTypeSize(DataType::kDouble), 8);
  EXPECT_STREQ(DataTypeName(DataType::kBfloat16), "bfloat16");
  EXPECT_THAT(ParseDataType("int8").status().message(),
              HasSubstr("float, half, bfloat16 or double"));
}

TEST(SizeSweepTest, MultipliesByTheFactorUpToTheMaximum) {
  absl::StatusOr<std::vector<SweepSize>> sweep = SizeSweep(8, 128, 2, DataType::kFloat);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_THAT(*sweep, ElementsAre(SweepSize{8, 2}, SweepSize{16, 4}, SweepSize{32, 8},
                                  SweepSize{64, 16}, SweepSize{128, 32}));
  // The last size may fall short of the maximum, as in nccl-tests.
  EXPECT_THAT(*SizeSweep(8, 100, 4, DataType::kFloat),
              ElementsAre(SweepSize{8, 2}, SweepSize{32, 8}));
  EXPECT_THAT(*SizeSweep(1 << 30, 1 << 30, 2, DataType::kHalf),
              ElementsAre(SweepSize{1 << 30, 1 << 29}));
}

TEST(SizeSweepTest, RoundsToWholeElementsAndSkipsSizesUnderOne) {
  // 4 bytes of double is no element; 12 bytes is one (8 bytes); 36 is four.
  EXPECT_THAT(*SizeSweep(4, 36, 3, DataType::kDouble),
              ElementsAre(SweepSize{8, 1}, SweepSize{32, 4}));
  // A count of one: the smallest all-reduce.
  EXPECT_THAT(*SizeSweep(4, 4, 2, DataType::kFloat), ElementsAre(SweepSize{4, 1}));
}

TEST(SizeSweepTest, RejectsImpossibleSweeps) {
  EXPECT_EQ(SizeSweep(64, 8, 2, DataType::kFloat).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SizeSweep(0, 8, 2, DataType::kFloat).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SizeSweep(8, 64, 1, DataType::kFloat).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(SizeSweep(1, 4, 2, DataType::kDouble).status().message(), HasSubstr("raise -e"));
  // A huge maximum does not overflow.
  EXPECT_EQ(SizeSweep(1, INT64_MAX, 2, DataType::kFloat)->back().bytes, int64_t{1} << 62);
}

TEST(BandwidthTest, AlgbwAndBusbwAsNcclTestsComputeThem) {
  EXPECT_DOUBLE_EQ(AlgBandwidth(1'000'000'000, 0.5), 2.0);
  EXPECT_DOUBLE_EQ(AlgBandwidth(1'000, 0), 0.0);
  EXPECT_DOUBLE_EQ(AllReduceBusBandwidth(2.0, 2), 2.0);   // 2(n-1)/n = 1
  EXPECT_DOUBLE_EQ(AllReduceBusBandwidth(2.0, 4), 3.0);   // 1.5
  EXPECT_DOUBLE_EQ(AllReduceBusBandwidth(8.0, 8), 14.0);  // 1.75
  EXPECT_DOUBLE_EQ(AllReduceBusBandwidth(2.0, 1), 0.0);   // one rank moves nothing
}

}  // namespace
}  // namespace muster::allreduce
