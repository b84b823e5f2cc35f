#include "launcher/local_address.h"

#include "gtest/gtest.h"

namespace muster {
namespace {

// Numeric addresses only: a name could wait on a resolver.
TEST(IsLocalAddressTest, LoopbackAddressIsLocal) { EXPECT_TRUE(IsLocalAddress("127.0.0.1")); }

TEST(IsLocalAddressTest, DocumentationAddressIsNotLocal) {
  EXPECT_FALSE(IsLocalAddress("192.0.2.1"));  // TEST-NET-1, never assigned
}

}  // namespace
}  // namespace muster
