// Node secrets as the server draws them.
#include "rendezvous/auth/node_secret.h"

#include <string>

#include <gtest/gtest.h>

namespace muster::rdzv {
namespace {

TEST(NodeSecretTest, SecretsAre32HexDigitsAndDiffer) {
  absl::StatusOr<std::string> a = NewNodeSecret();
  absl::StatusOr<std::string> b = NewNodeSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
  EXPECT_LE(a->size(), kMaxNodeSecretLength);
}

}  // namespace
}  // namespace muster::rdzv
