#include "common/json.h"

#include <string>

#include "gtest/gtest.h"

namespace muster {
namespace {

TEST(JsonQuoteTest, PlainTextIsQuoted) { EXPECT_EQ(JsonQuote("round 3"), R"("round 3")"); }

TEST(JsonQuoteTest, QuotesBackslashesAndControlCharactersAreEscaped) {
  EXPECT_EQ(JsonQuote("a\"b\\c"), R"("a\"b\\c")");
  EXPECT_EQ(JsonQuote("l1\nl2\r\t"), R"("l1\nl2\r\t")");
  EXPECT_EQ(JsonQuote(std::string("\0\x1f\x7f", 3)), R"("\u0000\u001f\u007f")");
}

TEST(JsonQuoteTest, ValidUtf8IsKept) {
  EXPECT_EQ(JsonQuote("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
}

// A worker's message may hold any bytes; the line must stay valid JSON.
TEST(JsonQuoteTest, EachByteOfInvalidUtf8BecomesTheReplacementCharacter) {
  EXPECT_EQ(JsonQuote("a\xff"
                      "b"),
            R"("a\ufffdb")");
  EXPECT_EQ(JsonQuote("\xc3"), R"("\ufffd")");                                // cut short
  EXPECT_EQ(JsonQuote("\xc0\xaf"), R"("\ufffd\ufffd")");                      // overlong
  EXPECT_EQ(JsonQuote("\xed\xa0\x80"), R"("\ufffd\ufffd\ufffd")");            // a surrogate
  EXPECT_EQ(JsonQuote("\xf4\x90\x80\x80"), R"("\ufffd\ufffd\ufffd\ufffd")");  // past U+10FFFF
}

}  // namespace
}  // namespace muster
