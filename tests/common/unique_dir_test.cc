#include "common/unique_dir.h"

#include <fcntl.h>

#include <utility>

#include "gtest/gtest.h"

namespace muster {
namespace {

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(UniqueDirTest, DroppingItClosesTheDirectoryAndItsDescriptor) {
  int fd = -1;
  {
    UniqueDir dir(opendir("/"));
    ASSERT_TRUE(dir.valid());
    fd = dirfd(dir.get());
    EXPECT_TRUE(IsOpen(fd));
  }
  EXPECT_FALSE(IsOpen(fd));
}

TEST(UniqueDirTest, MovingHandsOverOwnershipAndLeavesTheSourceEmpty) {
  UniqueDir from(opendir("/"));
  ASSERT_TRUE(from.valid());
  const int fd = dirfd(from.get());
  UniqueDir to(std::move(from));
  EXPECT_FALSE(from.valid());
  EXPECT_TRUE(IsOpen(fd));
  UniqueDir assigned;
  assigned = std::move(to);
  EXPECT_FALSE(to.valid());
  EXPECT_TRUE(IsOpen(fd));
  assigned.reset();
  EXPECT_FALSE(IsOpen(fd));
}

TEST(UniqueDirTest, AFailedOpenIsHeldAsInvalid) {
  UniqueDir dir(opendir("/nonexistent-directory"));
  EXPECT_FALSE(dir.valid());
}

TEST(UniqueDirTest, ReleaseGivesTheStreamBackUnclosed) {
  UniqueDir dir(opendir("/"));
  ASSERT_TRUE(dir.valid());
  DIR* raw = dir.release();
  EXPECT_FALSE(dir.valid());
  EXPECT_TRUE(IsOpen(dirfd(raw)));
  closedir(raw);
}

}  // namespace
}  // namespace muster
