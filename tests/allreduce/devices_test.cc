#include "allreduce/devices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::allreduce {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(CheckDistinctDevicesTest, EachRankOnItsOwnGpuIsFine) {
  EXPECT_TRUE(CheckDistinctDevices({{0, "a", "0000:3b:00.0"},
                                    {1, "a", "0000:5e:00.0"},
                                    {2, "b", "0000:3b:00.0"},  // same bus id, other host
                                    {3, "b", "0000:5e:00.0"}})
                  .ok());
}

TEST(CheckDistinctDevicesTest, TwoRanksOnOneGpuNameBothRanksTheHostAndTheBusId) {
  absl::Status status = CheckDistinctDevices({{0, "a", "0000:3b:00.0"},
                                              {1, "a", "0000:5e:00.0"},
                                              {2, "b", "0000:3b:00.0"},
                                              {3, "b", "0000:3b:00.0"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("ranks 2 and 3"), HasSubstr("0000:3b:00.0"),
                                      HasSubstr("on b"), HasSubstr("LOCAL_RANK")));
}

TEST(CheckDistinctDevicesTest, RanksWithoutAGpuAreNotCompared) {
  EXPECT_TRUE(CheckDistinctDevices({{0, "a", ""}, {1, "a", ""}, {2, "a", ""}}).ok());
}

}  // namespace
}  // namespace muster::allreduce
