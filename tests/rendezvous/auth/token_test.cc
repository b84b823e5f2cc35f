// Reading the token file (real files in a temporary directory) and checking
// a call's credential.
#include "rendezvous/auth/token.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "tests/support/temp_dir.h"

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

class TokenFileTest : public ::testing::Test {
 protected:
  // A file holding `contents`, with `mode`.
  std::string Write(const std::string& name, const std::string& contents, mode_t mode = 0600) {
    const std::string path = temp_.Path(name);
    EXPECT_TRUE(support::WriteFile(path, contents));
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }

  support::TempDir temp_{"token-test"};
  const std::string dir_ = temp_.path();
};

TEST_F(TokenFileTest, OneLineWithItsNewlineStrippedIsTheToken) {
  EXPECT_EQ(*ReadTokenFile(Write("t", std::string(kToken) + "\n")), kToken);
  EXPECT_EQ(*ReadTokenFile(Write("crlf", std::string(kToken) + "\r\n")), kToken);
  EXPECT_EQ(*ReadTokenFile(Write("bare", kToken)), kToken);
  EXPECT_EQ(*ReadTokenFile(Write("ro", kToken, 0400)), kToken);
}

TEST_F(TokenFileTest, ReadableOrWritableByGroupOrOthersIsRefusedWithTheChmodToRun) {
  for (mode_t mode : {0644, 0640, 0604, 0660, 0602, 0620, 0610, 0601, 0666}) {
    const std::string path = Write("t" + std::to_string(mode), kToken, mode);
    absl::StatusOr<std::string> token = ReadTokenFile(path);
    ASSERT_FALSE(token.ok()) << std::oct << mode;
    EXPECT_TRUE(absl::IsFailedPrecondition(token.status()));
    char shown[8];
    snprintf(shown, sizeof shown, "%04o", mode);
    EXPECT_THAT(token.status().message(), HasSubstr(path));
    EXPECT_THAT(token.status().message(), HasSubstr(std::string("mode ") + shown));
    EXPECT_THAT(token.status().message(), HasSubstr("chmod 600 " + path));
  }
}

TEST_F(TokenFileTest, MissingFileIsNotFoundAndSaysHowToMakeOne) {
  const std::string path = dir_ + "/absent";
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  ASSERT_TRUE(absl::IsNotFound(token.status())) << token.status();
  EXPECT_THAT(token.status().message(), HasSubstr(path));
  EXPECT_THAT(token.status().message(), HasSubstr("umask 077"));
}

TEST_F(TokenFileTest, EmptyFileOrJustANewlineIsRefused) {
  for (const char* contents : {"", "\n", "\r\n"}) {
    absl::StatusOr<std::string> token = ReadTokenFile(Write("e", contents));
    ASSERT_FALSE(token.ok()) << contents;
    EXPECT_THAT(token.status().message(), HasSubstr("is empty"));
  }
}

TEST_F(TokenFileTest, ShortTokenIsRefused) {
  absl::StatusOr<std::string> token = ReadTokenFile(Write("s", "short-secret\n"));
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr("12 bytes, under the 16"));
  EXPECT_TRUE(ReadTokenFile(Write("sixteen", "0123456789abcdef")).ok());
}

TEST_F(TokenFileTest, SpacesTabsSecondLinesAndControlCharactersAreRefused) {
  for (const std::string& contents :
       {std::string(" ") + kToken, std::string(kToken) + " \n", std::string(kToken) + "\t",
        std::string(kToken) + "\n\n", std::string(kToken) + "\nsecond-line-of-text\n",
        std::string("0123456789\x01"
                    "abcdefgh"),
        std::string(kToken) + "\xc3\xa9"}) {
    absl::StatusOr<std::string> token = ReadTokenFile(Write("w", contents));
    EXPECT_FALSE(token.ok()) << contents;
    EXPECT_TRUE(absl::IsFailedPrecondition(token.status())) << token.status();
  }
}

TEST_F(TokenFileTest, DirectoryIsNotARegularFile) {
  const std::string path = dir_ + "/sub";
  ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr("not a regular file"));
}

TEST_F(TokenFileTest, HugeFileIsNotAToken) {
  absl::StatusOr<std::string> token = ReadTokenFile(Write("big", std::string(10000, 'x')));
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(token.status().message(), HasSubstr("over 4096 bytes"));
}

TEST(TokenFileStatTest, FileOfAnotherUserIsRefused) {
  struct stat st = {};
  st.st_mode = S_IFREG | 0600;
  st.st_uid = 1234;
  EXPECT_TRUE(CheckTokenFileStat("/t", st, 1234).ok());
  absl::Status other = CheckTokenFileStat("/t", st, 4321);
  ASSERT_TRUE(absl::IsFailedPrecondition(other));
  EXPECT_THAT(other.message(), HasSubstr("owned by uid 1234"));
}

TEST(BearerTest, OnlyBearerAndTheExactTokenMatch) {
  EXPECT_TRUE(BearerMatches(std::string("Bearer ") + kToken, kToken));
  EXPECT_FALSE(BearerMatches(kToken, kToken));  // "Bearer " missing
  EXPECT_FALSE(BearerMatches(std::string("bearer ") + kToken, kToken));
  EXPECT_FALSE(BearerMatches(std::string("Bearer  ") + kToken, kToken));
  EXPECT_FALSE(BearerMatches(std::string("Bearer ") + kToken + "x", kToken));
  EXPECT_FALSE(BearerMatches(std::string("Bearer ") + std::string(kToken).substr(1), kToken));
  EXPECT_FALSE(BearerMatches("Bearer 0123456789abcdef0123456789abcdeF", kToken));
  EXPECT_FALSE(BearerMatches("", kToken));
  EXPECT_FALSE(BearerMatches("Bearer ", ""));  // no token configured matches nothing
}

}  // namespace
}  // namespace muster::rdzv
