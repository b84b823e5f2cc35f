#include "common/hostlist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Expand(absl::string_view list) {
  absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(list);
  EXPECT_TRUE(hosts.ok()) << list << ": " << hosts.status();
  return hosts.ok() ? *hosts : std::vector<std::string>();
}

TEST(ExpandHostlistTest, SlurmsDocumentedForms) {
  EXPECT_THAT(Expand("linux[1-3,6]"), ElementsAre("linux1", "linux2", "linux3", "linux6"));
  EXPECT_THAT(Expand("node1,node[2-5,12]"),
              ElementsAre("node1", "node2", "node3", "node4", "node5", "node12"));
  EXPECT_EQ(Expand("tux[0-5,12,20-25]").size(), 13u);
}

TEST(ExpandHostlistTest, ZeroPaddingKeepsTheWidthAsWritten) {
  EXPECT_THAT(Expand("gpu[01-04,07]"), ElementsAre("gpu01", "gpu02", "gpu03", "gpu04", "gpu07"));
  EXPECT_THAT(Expand("gpu[8-10]"), ElementsAre("gpu8", "gpu9", "gpu10"));
  EXPECT_THAT(Expand("gpu[008-010]"), ElementsAre("gpu008", "gpu009", "gpu010"));
}

TEST(ExpandHostlistTest, SuffixesSeveralGroupsAndPlainLists) {
  EXPECT_THAT(Expand("a[1-2]-ib"), ElementsAre("a1-ib", "a2-ib"));
  EXPECT_THAT(Expand("rack[1-2]-n[01-02]"),
              ElementsAre("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"));
  EXPECT_THAT(Expand("n1,n3 n5"), ElementsAre("n1", "n3", "n5"));
  EXPECT_THAT(Expand("node1"), ElementsAre("node1"));
  EXPECT_THAT(Expand("gpu[3]"), ElementsAre("gpu3"));
  EXPECT_THAT(Expand("[1-2]"), ElementsAre("1", "2"));
  EXPECT_THAT(Expand("a[1-2],b[3-4]"), ElementsAre("a1", "a2", "b3", "b4"));
}

TEST(ExpandHostlistTest, MalformedListsSayWhatIsWrong) {
  struct Case {
    const char* list;
    const char* says;
  };
  for (const Case& c :
       {Case{"gpu[1-", "no ']'"}, Case{"gpu[3-1]", "runs backwards"}, Case{"gpu[]", "empty"},
        Case{"gpu[a-b]", "not a number"}, Case{"gpu]1[", "no '['"}, Case{"gpu[1-2", "no ']'"},
        Case{"gpu[[1]]", "nested"}, Case{"", "no host"}, Case{" , ", "no host"},
        Case{"gpu[1-2-3]", "not a number"}, Case{"gpu[-3]", "not a number"},
        Case{"gpu[0-99999999999]", "more than"}}) {
    absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(c.list);
    EXPECT_EQ(hosts.status().code(), absl::StatusCode::kInvalidArgument) << c.list;
    EXPECT_THAT(hosts.status().message(),
                AllOf(HasSubstr(c.says), HasSubstr(absl::StrCat("'", c.list, "'"))))
        << c.list;
  }
}

TEST(ExpandHostlistTest, TheLimitBoundsTheProductToo) {
  EXPECT_EQ(ExpandHostlist("a[1-1000]-b[1-1000]", 10'000).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpandHostlist("a[1-100]-b[1-100]", 10'000)->size(), 10'000u);
}

}  // namespace
}  // namespace muster
