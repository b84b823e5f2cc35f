#include "common/unique_handle.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>

#include <utility>

#include "gtest/gtest.h"

namespace muster {
namespace {

// The handle is a counter, and releasing it counts: a test sees how often
// each handle was released.
void CountRelease(int* releases) { ++*releases; }
using Counted = UniqueHandle<int*, CountRelease>;

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(UniqueHandleTest, DroppingTheOwnerReleasesTheHandleOnce) {
  int releases = 0;
  { const Counted owner(&releases); }
  EXPECT_EQ(releases, 1);
}

TEST(UniqueHandleTest, AnEmptyOwnerHoldsNothing) {
  Counted empty;
  EXPECT_FALSE(empty.valid());
  empty.reset();
  EXPECT_FALSE(Counted(nullptr).valid());
}

TEST(UniqueHandleTest, MovingHandsOverTheHandleAndLeavesTheSourceEmpty) {
  int releases = 0;
  {
    Counted from(&releases);
    Counted to(std::move(from));
    EXPECT_FALSE(from.valid());
    EXPECT_EQ(to.get(), &releases);
    Counted assigned;
    assigned = std::move(to);
    EXPECT_FALSE(to.valid());
    EXPECT_EQ(assigned.get(), &releases);
    EXPECT_EQ(releases, 0);
  }
  EXPECT_EQ(releases, 1);
}

TEST(UniqueHandleTest, MoveAssigningReleasesWhatTheTargetHeld) {
  int old_releases = 0, new_releases = 0;
  Counted target(&old_releases);
  target = Counted(&new_releases);
  EXPECT_EQ(old_releases, 1);
  EXPECT_EQ(new_releases, 0);
  EXPECT_EQ(target.get(), &new_releases);
}

TEST(UniqueHandleTest, ResetReleasesTheOldHandleAndTakesTheNew) {
  int old_releases = 0, new_releases = 0;
  Counted owner(&old_releases);
  owner.reset(&new_releases);
  EXPECT_EQ(old_releases, 1);
  EXPECT_EQ(owner.get(), &new_releases);
  owner.reset();
  EXPECT_EQ(new_releases, 1);
  EXPECT_FALSE(owner.valid());
}

TEST(UniqueHandleTest, ReleaseGivesTheHandleBackUnreleased) {
  int releases = 0;
  {
    Counted owner(&releases);
    EXPECT_EQ(owner.release(), &releases);
    EXPECT_FALSE(owner.valid());
  }
  EXPECT_EQ(releases, 0);
}

TEST(UniqueHandleTest, OutReleasesWhatIsHeldForACreateCallToFill) {
  int old_releases = 0, new_releases = 0;
  Counted owner(&old_releases);
  int** slot = owner.out();
  EXPECT_EQ(old_releases, 1);
  EXPECT_EQ(*slot, nullptr);
  *slot = &new_releases;
  EXPECT_EQ(owner.get(), &new_releases);
}

TEST(UniqueFdTest, MinusOneIsEmptySoAFailedOpenIsNotClosed) {
  const UniqueFd failed(open("/nonexistent-file", O_RDONLY | O_CLOEXEC));
  EXPECT_FALSE(failed.valid());
  EXPECT_EQ(failed.get(), -1);
}

TEST(UniqueFdTest, DroppingItClosesTheDescriptor) {
  int fd = -1;
  {
    const UniqueFd owner(open("/", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(owner.valid());
    fd = owner.get();
    EXPECT_TRUE(IsOpen(fd));
  }
  EXPECT_FALSE(IsOpen(fd));
}

TEST(UniqueDirTest, DroppingItClosesTheDirectoryAndItsDescriptor) {
  int fd = -1;
  {
    const UniqueDir dir(opendir("/"));
    ASSERT_TRUE(dir.valid());
    fd = dirfd(dir.get());
    EXPECT_TRUE(IsOpen(fd));
  }
  EXPECT_FALSE(IsOpen(fd));
}

TEST(UniqueAddrInfoTest, HoldsTheListGetaddrinfoReturned) {
  addrinfo hints = {};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;  // no resolver is asked
  hints.ai_socktype = SOCK_STREAM;
  UniqueAddrInfo found;
  ASSERT_EQ(getaddrinfo("127.0.0.1", "80", &hints, found.out()), 0);
  ASSERT_TRUE(found.valid());
  EXPECT_EQ(found.get()->ai_family, AF_INET);
}

TEST(UniqueIfAddrsTest, HoldsTheListGetifaddrsReturned) {
  UniqueIfAddrs interfaces;
  ASSERT_EQ(getifaddrs(interfaces.out()), 0);
  EXPECT_TRUE(interfaces.valid());  // loopback at least
}

}  // namespace
}  // namespace muster
