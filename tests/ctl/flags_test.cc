// musterctl's command line, parsed and checked with no file read and no
// connection.
#include "ctl/flags.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

Config Parse(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(args);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed.ok() && parsed->print.has_value());
  return parsed.ok() ? parsed->config : Config();
}

std::string Refused(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(args);
  EXPECT_FALSE(parsed.ok()) << "accepted";
  if (parsed.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << parsed.status();
  return std::string(parsed.status().message());
}

TEST(CtlFlagsTest, StatusOfEveryJobOrOne) {
  const Config all = Parse({"status", "--endpoint", "head"});
  EXPECT_EQ(all.command, Command::kStatus);
  EXPECT_EQ(all.endpoint, "head:29400") << "the default port";
  EXPECT_EQ(all.timeout, absl::Seconds(5));
  EXPECT_TRUE(all.job.empty());
  EXPECT_FALSE(all.json);
  const Config one = Parse({"status", "--endpoint", "10.0.0.1:5000", "job7", "--json",
                            "--token-file", "/t", "--timeout", "2.5"});
  EXPECT_EQ(one.endpoint, "10.0.0.1:5000");
  EXPECT_EQ(one.job, "job7");
  EXPECT_TRUE(one.json);
  EXPECT_EQ(one.auth.token_file, "/t");
  EXPECT_EQ(one.timeout, absl::Milliseconds(2500));
}

TEST(CtlFlagsTest, WatchStopAndHealth) {
  const Config watch = Parse({"watch", "--endpoint", "[::1]:7", "j", "--munge"});
  EXPECT_EQ(watch.command, Command::kWatch);
  EXPECT_EQ(watch.endpoint, "[::1]:7");
  EXPECT_TRUE(watch.auth.munge);
  const Config stop = Parse({"stop", "--endpoint", "h", "j", "--reason", "bad node"});
  EXPECT_EQ(stop.command, Command::kStop);
  EXPECT_EQ(stop.reason, "bad node");
  const Config health = Parse({"health", "--endpoint", "h", "--service", "muster.Rendezvous",
                               "--cacert", "/ca", "--cert", "/c", "--key", "/k"});
  EXPECT_EQ(health.command, Command::kHealth);
  EXPECT_EQ(health.service, "muster.Rendezvous");
  EXPECT_EQ(health.tls.cacert, "/ca");
  EXPECT_EQ(health.tls.cert, "/c");
}

TEST(CtlFlagsTest, HelpAndVersionArePrinted) {
  absl::StatusOr<ParsedFlags> help = ParseFlags({"--help"});
  ASSERT_TRUE(help.ok() && help->print.has_value());
  EXPECT_THAT(*help->print, HasSubstr("Exit status: 0 yes, 1 no"));
  absl::StatusOr<ParsedFlags> version = ParseFlags({"--version"});
  ASSERT_TRUE(version.ok() && version->print.has_value());
  EXPECT_THAT(*version->print, StartsWith("musterctl "));
}

TEST(CtlFlagsTest, UsageErrorsNameTheFix) {
  EXPECT_THAT(Refused({}), HasSubstr("see musterctl --help"));
  EXPECT_THAT(Refused({"status"}), HasSubstr("--endpoint is required"));
  EXPECT_THAT(Refused({"watch", "--endpoint", "h"}), HasSubstr("job is required"));
  EXPECT_EQ(Refused({"status", "--endpoint", "h", "--timeout", "0"}),
            "--timeout 0: give seconds above 0, e.g. 5");
  EXPECT_EQ(Refused({"status", "--endpoint", "h", "--timeout", "3601"}),
            "--timeout 3601: give seconds above 0, e.g. 5");
  EXPECT_THAT(Refused({"status", "--endpoint", "h:99999"}), HasSubstr("--endpoint"));
  EXPECT_THAT(Refused({"health", "--endpoint", "h", "--cert", "/c", "--key", "/k"}),
              HasSubstr("need --cacert"));
  EXPECT_THAT(Refused({"stop", "--endpoint", "h", "j", "--munge-socket", "/m"}),
              HasSubstr("requires"));
}

}  // namespace
}  // namespace muster::ctl
