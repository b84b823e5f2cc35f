#include "agent/template.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace muster {
namespace {

std::string Substitute(const std::string& text) {
  return SubstituteTemplate(text, {{"rank", "3"}, {"local_rank", "1"}, {"role_name", "trainer"}});
}

// What Python's string.Template(text).safe_substitute(rank=3, local_rank=1,
// role_name="trainer") gives, checked by hand with Python 3.11.
TEST(SubstituteTemplateTest, BracedAndBareNames) {
  EXPECT_EQ(Substitute("[rank${rank}]: "), "[rank3]: ");
  EXPECT_EQ(Substitute("$role_name$local_rank"), "trainer1");
  EXPECT_EQ(Substitute("--out=/tmp/${local_rank}.log"), "--out=/tmp/1.log");
  // A bare name is the longest run of name characters.
  EXPECT_EQ(Substitute("$ranks $rank_x $rank-x"), "$ranks $rank_x 3-x");
}

TEST(SubstituteTemplateTest, DoubleDollarIsADollar) {
  EXPECT_EQ(Substitute("cost $$5 $$rank"), "cost $5 $rank");
}

TEST(SubstituteTemplateTest, WhatSafeSubstituteLeavesAlone) {
  EXPECT_EQ(Substitute("${unknown} $unknown"), "${unknown} $unknown");
  EXPECT_EQ(Substitute("$ 5$ ${rank"), "$ 5$ ${rank");
  EXPECT_EQ(Substitute("${ rank} ${1x} $1"), "${ rank} ${1x} $1");
  EXPECT_EQ(Substitute("trailing $"), "trailing $");
  EXPECT_EQ(Substitute(""), "");
}

}  // namespace
}  // namespace muster
