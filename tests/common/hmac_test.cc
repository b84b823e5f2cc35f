#include "common/hmac.h"

#include <string>

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"

namespace muster {
namespace {

// RFC 4231's test cases 1 and 2.
TEST(HmacTest, MatchesRfc4231) {
  EXPECT_EQ(absl::BytesToHexString(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(absl::BytesToHexString(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HmacTest, AnEmptyKeyAndMessageStillGiveThirtyTwoBytes) {
  EXPECT_EQ(HmacSha256("", "").size(), kHmacSha256Length);
}

}  // namespace
}  // namespace muster
