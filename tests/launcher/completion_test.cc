#include "launcher/completion.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace muster {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(CompletionTest, ChoicesAreTheLowercaseWordsOfAValueName) {
  EXPECT_THAT(CompletionChoices("static|c10d|muster|etcd"),
              ElementsAre("static", "c10d", "muster", "etcd"));
  EXPECT_THAT(CompletionChoices("N|gpu|cpu|auto"), ElementsAre("gpu", "cpu", "auto"));
  EXPECT_THAT(CompletionChoices("node|socket|exclusive|core-complex"),
              ElementsAre("node", "socket", "exclusive", "core-complex"));
  EXPECT_THAT(CompletionChoices("0-3|RANK:V,..."), IsEmpty());
  EXPECT_THAT(CompletionChoices("RANK"), IsEmpty());
  EXPECT_THAT(CompletionChoices("seconds"), IsEmpty()) << "one word is a name, not a choice";
}

TEST(CompletionTest, EveryOptionAndChoiceIsInEachShellsScript) {
  const std::vector<OptionSummary> options = OptionSummaries();
  for (const char* shell : {"bash", "zsh", "tcsh"}) {
    SCOPED_TRACE(shell);
    const std::string script = CompletionScript(shell, options);
    for (const OptionSummary& option : options) {
      for (const std::string& spelling : option.spellings) {
        // tcsh lists long options without their dashes.
        EXPECT_THAT(script, HasSubstr(std::string(shell) == "tcsh" && spelling.size() > 2
                                          ? spelling.substr(2)
                                          : spelling));
      }
    }
    EXPECT_THAT(script, HasSubstr("static c10d muster etcd"));
    EXPECT_THAT(script, HasSubstr("node socket exclusive core-complex"));
  }
  EXPECT_THAT(CompletionScript("bash", options),
              AllOf(HasSubstr("complete -o filenames -F _muster muster"),
                    HasSubstr("--log-dir|--log_dir) _muster_reply -d")));
  EXPECT_THAT(CompletionScript("zsh", options), HasSubstr("bashcompinit"));
  const std::string tcsh = CompletionScript("tcsh", options);
  EXPECT_EQ(tcsh.find('\n'), tcsh.size() - 1) << "one line: tcsh's eval joins lines";
  EXPECT_THAT(tcsh, Not(HasSubstr("#")));
  EXPECT_EQ(CompletionScript("fish", options), "");
}

}  // namespace
}  // namespace muster
