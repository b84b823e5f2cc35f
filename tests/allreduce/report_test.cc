#include "allreduce/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::allreduce {
namespace {

using ::testing::HasSubstr;

TEST(ReportTest, ARowHasNcclTestsColumns) {
  // 1 GB in 0.5 s: algbw 2 GB/s; 4 ranks: busbw 3 GB/s.
  SizeResult r{1'000'000'000, 250'000'000, DataType::kFloat, 500'000, 0, 250'000, 3};
  const std::string row = TableRow(r, 4);
  EXPECT_THAT(row, HasSubstr("1000000000"));
  EXPECT_THAT(row, HasSubstr("250000000"));
  EXPECT_THAT(row, HasSubstr("float"));
  EXPECT_THAT(row, HasSubstr("sum"));
  EXPECT_THAT(row, HasSubstr("500000.00    2.00    3.00      0"));
  EXPECT_THAT(row, HasSubstr("250000.00    4.00    6.00      3"));
  EXPECT_THAT(TableHeader(), HasSubstr("busbw"));
  EXPECT_THAT(TableHeader(), HasSubstr("#wrong"));
}

TEST(ReportTest, AverageBusBandwidthIsOverEveryRowAndBothModes) {
  std::vector<SizeResult> results = {{1'000'000'000, 1, DataType::kFloat, 1e6, 0, 1e6, 0},
                                     {1'000'000'000, 1, DataType::kFloat, 0.5e6, 0, 0.5e6, 0}};
  EXPECT_DOUBLE_EQ(AverageBusBandwidth(results, 2), 1.5);  // busbw 1 and 2
  EXPECT_DOUBLE_EQ(AverageBusBandwidth({}, 2), 0.0);
}

TEST(ReportTest, JsonHasTheFieldsScriptsRead) {
  RunSummary summary;
  summary.backend = "tcp";
  summary.world_size = 2;
  summary.hosts = {"a", "b\"q"};
  summary.devices = {"cpu", "cpu"};
  summary.results = {{8, 2, DataType::kHalf, 10, 0, 12, 1}};
  const std::string json = JsonReport(summary);
  for (const char* field :
       {"\"backend\": \"tcp\"", "\"world_size\": 2", "\"hosts\": [\"a\", \"b\\\"q\"]",
        "\"results\": [", "\"bytes\": 8", "\"dtype\": \"half\"", "\"time_us\": 10",
        "\"algbw_gbps\": ", "\"busbw_gbps\": ", "\"wrong\": 0", "\"inplace\": {\"time_us\": 12",
        "\"wrong\": 1}"}) {
    EXPECT_THAT(json, HasSubstr(field));
  }
}

}  // namespace
}  // namespace muster::allreduce
