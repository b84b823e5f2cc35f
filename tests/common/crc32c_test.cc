#include "common/crc32c.h"

#include <string>

#include <gtest/gtest.h>

namespace muster {
namespace {

TEST(Crc32cTest, KnownValues) {
  // The check value of CRC-32C, and RFC 3720's test vectors (B.4).
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32cTest, ContinuesAcrossPieces) {
  EXPECT_EQ(Crc32c("56789", Crc32c("1234")), Crc32c("123456789"));
}

TEST(Crc32cTest, OneFlippedBitChangesIt) {
  std::string data(4096, 'x');
  const uint32_t before = Crc32c(data);
  data[2048] ^= 0x10;
  EXPECT_NE(Crc32c(data), before);
}

}  // namespace
}  // namespace muster
