#include "allreduce/backend.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster::allreduce {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

BackendFacts Facts(int world_size, std::vector<int> without_nccl, std::vector<int> elsewhere) {
  return BackendFacts{world_size, std::move(without_nccl), std::move(elsewhere)};
}

Backend Choose(Backend asked, const BackendFacts& facts) {
  absl::StatusOr<Backend> chosen = ChooseBackend(asked, facts);
  EXPECT_TRUE(chosen.ok()) << chosen.status();
  return chosen.ok() ? *chosen : Backend::kAuto;
}

TEST(ParseBackendTest, EveryNameParsesBackToItself) {
  for (Backend backend : {Backend::kAuto, Backend::kNccl, Backend::kShm, Backend::kTcp}) {
    absl::StatusOr<Backend> parsed = ParseBackend(BackendName(backend));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, backend);
  }
}

TEST(ParseBackendTest, UnknownNameListsTheKnownOnes) {
  absl::StatusOr<Backend> parsed = ParseBackend("gloo");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(),
              AllOf(HasSubstr("gloo"), HasSubstr("auto, nccl, shm or tcp")));
}

TEST(MayUseGpuTest, OnlyTheCpuBackendsLeaveTheGpusAlone) {
  EXPECT_TRUE(MayUseGpu(Backend::kAuto));
  EXPECT_TRUE(MayUseGpu(Backend::kNccl));
  EXPECT_FALSE(MayUseGpu(Backend::kShm));
  EXPECT_FALSE(MayUseGpu(Backend::kTcp));
}

TEST(ChooseBackendTest, AutoIsNcclWhereEveryRankHasAGpu) {
  EXPECT_EQ(Choose(Backend::kAuto, Facts(4, {}, {2, 3})), Backend::kNccl);
  EXPECT_EQ(Choose(Backend::kAuto, Facts(1, {}, {})), Backend::kNccl);
}

TEST(ChooseBackendTest, AutoIsSharedMemoryWhereAllShareRankZerosMachine) {
  EXPECT_EQ(Choose(Backend::kAuto, Facts(4, {0, 1, 2, 3}, {})), Backend::kShm);
  EXPECT_EQ(Choose(Backend::kAuto, Facts(2, {1}, {})), Backend::kShm);
}

TEST(ChooseBackendTest, AutoIsTcpWhenARankIsElsewhere) {
  EXPECT_EQ(Choose(Backend::kAuto, Facts(4, {0, 1, 2, 3}, {3})), Backend::kTcp);
}

TEST(ChooseBackendTest, AutoIsTcpForOneRankWithoutAGpu) {
  EXPECT_EQ(Choose(Backend::kAuto, Facts(1, {0}, {})), Backend::kTcp);
}

TEST(ChooseBackendTest, AnAskedBackendEveryRankCanUseIsKept) {
  EXPECT_EQ(Choose(Backend::kTcp, Facts(2, {}, {})), Backend::kTcp);
  EXPECT_EQ(Choose(Backend::kShm, Facts(2, {0, 1}, {})), Backend::kShm);
  EXPECT_EQ(Choose(Backend::kNccl, Facts(2, {}, {1})), Backend::kNccl);
  EXPECT_EQ(Choose(Backend::kTcp, Facts(2, {0, 1}, {1})), Backend::kTcp);
}

TEST(ChooseBackendTest, NcclAskedWithARankWithoutAGpuNamesIt) {
  absl::StatusOr<Backend> chosen = ChooseBackend(Backend::kNccl, Facts(4, {1, 3}, {}));
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      chosen.status().message(),
      AllOf(HasSubstr("--backend nccl"), HasSubstr("rank(s) 1, 3"), HasSubstr("tcp or auto")));
}

TEST(ChooseBackendTest, ShmAskedWithARankElsewhereNamesIt) {
  absl::StatusOr<Backend> chosen = ChooseBackend(Backend::kShm, Facts(4, {}, {2}));
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(chosen.status().message(),
              AllOf(HasSubstr("--backend shm"), HasSubstr("rank(s) 2"), HasSubstr("/dev/shm")));
}

}  // namespace
}  // namespace muster::allreduce
