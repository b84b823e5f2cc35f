#include "launcher/nproc.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace muster {
namespace {

TEST(ResolveNprocTest, Kinds) {
  EXPECT_EQ(*ResolveNproc(NprocKind::kCount, 3, 0, 2), 3);
  EXPECT_EQ(*ResolveNproc(NprocKind::kGpu, 1, 8, 2), 8);
  EXPECT_EQ(*ResolveNproc(NprocKind::kCpu, 1, 8, 2), 2);
  EXPECT_EQ(*ResolveNproc(NprocKind::kAuto, 1, 8, 2), 8);
  EXPECT_EQ(*ResolveNproc(NprocKind::kAuto, 1, 0, 2), 2);
}

TEST(ResolveNprocTest, GpuWithoutGpuIsAClearError) {
  absl::StatusOr<int> n = ResolveNproc(NprocKind::kGpu, 1, 0, 2);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("no GPU"), absl::string_view::npos);
}

TEST(CountVisibleGpusTest, CudaVisibleDevices) {
  EXPECT_EQ(CountVisibleGpus(std::string("0,1,3")), 3);
  EXPECT_EQ(CountVisibleGpus(std::string("GPU-8f2c,GPU-1a2b")), 2);
  EXPECT_EQ(CountVisibleGpus(std::string("")), 0);
  EXPECT_EQ(CountVisibleGpus(std::string("-1")), 0);
  EXPECT_EQ(CountVisibleGpus(std::string("0,-1,2")), 1);  // CUDA stops at an invalid entry
}

TEST(CountVisibleGpusTest, DriverDirectory) {
  const std::string dir = testing::TempDir() + "/gpus";
  std::filesystem::create_directories(dir + "/0000:3b:00.0");
  std::filesystem::create_directories(dir + "/0000:86:00.0");
  EXPECT_EQ(CountVisibleGpus(std::nullopt, dir), 2);
  EXPECT_EQ(CountVisibleGpus(std::nullopt, dir + "/missing", dir + "/missing"), 0);
  std::filesystem::remove_all(dir);
}

TEST(CountVisibleGpusTest, DeviceNodesWhereTheDriverDirectoryIsMissing) {
  const std::string dev = testing::TempDir() + "/dev";
  std::filesystem::create_directories(dev);
  for (const char* name : {"nvidia0", "nvidia1", "nvidia12", "nvidiactl", "nvidia-uvm",
                           "nvidia-uvm-tools", "nvidia-caps", "null"}) {
    std::ofstream(dev + "/" + name).put('\n');
  }
  EXPECT_EQ(CountVisibleGpus(std::nullopt, dev + "/missing", dev), 3);
  // The driver's own list wins where it exists, even empty.
  std::filesystem::create_directories(dev + "/gpus");
  EXPECT_EQ(CountVisibleGpus(std::nullopt, dev + "/gpus", dev), 0);
  std::filesystem::remove_all(dev);
}

}  // namespace
}  // namespace muster
