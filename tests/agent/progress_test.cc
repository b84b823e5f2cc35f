// What a worker's MUSTER_PROGRESS_FILE may say, and how the agent reads it.
#include "agent/progress.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace muster {
namespace {

TEST(ParseProgressTest, AStepAndAnOptionalCountOnTheFirstLine) {
  std::optional<StepLine> step = ParseProgress("1200\n");
  ASSERT_TRUE(step);
  EXPECT_EQ(step->step, 1200);
  EXPECT_EQ(step->count, 0);
  step = ParseProgress("  7 4096  \n");
  ASSERT_TRUE(step);
  EXPECT_EQ(step->step, 7);
  EXPECT_EQ(step->count, 4096);
  step = ParseProgress("15");  // no newline
  ASSERT_TRUE(step);
  EXPECT_EQ(step->step, 15);
  // os.pwrite at offset 0 leaves a longer old tail behind its newline.
  step = ParseProgress("9\n99 12345\n");
  ASSERT_TRUE(step);
  EXPECT_EQ(step->step, 9);
  step = ParseProgress("9007199254740992");  // 2^53
  ASSERT_TRUE(step);
}

TEST(ParseProgressTest, AnythingElseIsSkipped) {
  for (const char* bad : {"", "\n", "-1", "+3", "1.5", "step 3", "3 x", "1 2 3", "9007199254740993",
                          "99999999999999999999"}) {
    EXPECT_FALSE(ParseProgress(bad)) << bad;
  }
  EXPECT_FALSE(ParseProgress(std::string(kMaxProgressLine, '1'))) << "no line in 64 bytes";
}

TEST(ReadProgressFileTest, ReadsTheStepDatedByTheFilesTime) {
  support::TempDir dir;
  const std::string path = dir.path() + "/progress";
  EXPECT_FALSE(ReadProgressFile(path)) << "not written yet";
  ASSERT_TRUE(support::WriteFile(path, "42 7\n"));
  const timespec times[2] = {{1'700'000'000, 0}, {1'700'000'000, 500'000'000}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  std::optional<NodeProgress> read = ReadProgressFile(path);
  ASSERT_TRUE(read);
  EXPECT_EQ(read->step, 42);
  EXPECT_EQ(read->count, 7);
  EXPECT_EQ(read->written, absl::FromUnixMillis(1'700'000'000'500));
  ASSERT_TRUE(support::WriteFile(path, ""));  // truncated, not written yet
  EXPECT_FALSE(ReadProgressFile(path));
  ASSERT_EQ(mkfifo((dir.path() + "/fifo").c_str(), 0600), 0);
  EXPECT_FALSE(ReadProgressFile(dir.path() + "/fifo")) << "only a plain file, never a block";
  ASSERT_EQ(symlink(path.c_str(), (dir.path() + "/link").c_str()), 0);
  EXPECT_FALSE(ReadProgressFile(dir.path() + "/link")) << "no link followed";
}

}  // namespace
}  // namespace muster
