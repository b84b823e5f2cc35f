#include "common/unique_addrinfo.h"

#include <netdb.h>
#include <sys/socket.h>

#include <utility>

#include "gtest/gtest.h"

namespace muster {
namespace {

// A numeric address: no resolver is asked.
UniqueAddrInfo Loopback() {
  addrinfo hints = {};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  EXPECT_EQ(getaddrinfo("127.0.0.1", "80", &hints, &list), 0);
  return UniqueAddrInfo(list);
}

TEST(UniqueAddrInfoTest, HoldsTheListGetaddrinfoReturned) {
  const UniqueAddrInfo found = Loopback();
  ASSERT_NE(found.get(), nullptr);
  EXPECT_EQ(found.get()->ai_family, AF_INET);
}

TEST(UniqueAddrInfoTest, MovingHandsOverTheListAndLeavesTheSourceEmpty) {
  UniqueAddrInfo from = Loopback();
  addrinfo* const list = from.get();
  UniqueAddrInfo to(std::move(from));
  EXPECT_EQ(from.get(), nullptr);
  EXPECT_EQ(to.get(), list);
  UniqueAddrInfo assigned;
  assigned = std::move(to);
  EXPECT_EQ(to.get(), nullptr);
  EXPECT_EQ(assigned.get(), list);
}

TEST(UniqueAddrInfoTest, ReleaseGivesTheListBack) {
  UniqueAddrInfo found = Loopback();
  addrinfo* list = found.release();
  EXPECT_EQ(found.get(), nullptr);
  ASSERT_NE(list, nullptr);
  freeaddrinfo(list);
}

TEST(UniqueAddrInfoTest, AnEmptyOwnerFreesNothing) {
  UniqueAddrInfo empty;
  empty.reset();
  EXPECT_EQ(empty.get(), nullptr);
}

}  // namespace
}  // namespace muster
