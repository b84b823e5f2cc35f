// musterd's command line, parsed and checked with no file read and no socket.
#include "rendezvous/server/musterd_flags.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state.h"

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

MusterdConfig Parse(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedMusterdFlags> parsed = ParseMusterdFlags(args);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed.ok() && parsed->print.has_value());
  return parsed.ok() ? parsed->config : MusterdConfig();
}

// The usage error `args` get; fails the test if they parse.
std::string Refused(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedMusterdFlags> parsed = ParseMusterdFlags(args);
  EXPECT_FALSE(parsed.ok()) << "accepted";
  if (parsed.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << parsed.status();
  return std::string(parsed.status().message());
}

TEST(MusterdFlagsTest, TheDefaults) {
  const MusterdConfig config = Parse({});
  EXPECT_EQ(config.listen, "0.0.0.0");
  EXPECT_EQ(config.port, kDefaultRdzvPort);
  EXPECT_EQ(config.ping_interval, absl::Seconds(12));
  EXPECT_EQ(config.ping_timeout, absl::Seconds(5));
  EXPECT_EQ(config.max_join_timeout, absl::Hours(1));
  EXPECT_EQ(config.drain, absl::ZeroDuration());
  EXPECT_EQ(config.max_jobs, StateOptions().max_jobs);
  EXPECT_FALSE(config.metrics_port.has_value());
  EXPECT_EQ(config.metrics_listen, "127.0.0.1");
  EXPECT_TRUE(config.token_file.empty() && config.state_dir.empty() && config.event_log.empty());
  EXPECT_FALSE(config.munge);
  EXPECT_TRUE(config.tls.empty());
}

TEST(MusterdFlagsTest, EveryFlagLandsInTheConfig) {
  const MusterdConfig config = Parse({"--listen",
                                      "127.0.0.1",
                                      "--port",
                                      "0",
                                      "--token-file",
                                      "/t",
                                      "--state-dir",
                                      "/s",
                                      "--ping-interval",
                                      "90s",
                                      "--ping-timeout",
                                      "3",
                                      "--max-join-timeout",
                                      "1h30m",
                                      "--max-jobs",
                                      "7",
                                      "--event-log",
                                      "/e",
                                      "--metrics-port",
                                      "0",
                                      "--metrics-listen",
                                      "0.0.0.0",
                                      "--metrics-password-file",
                                      "/p",
                                      "--drain",
                                      "2m",
                                      "--tls-cert",
                                      "/c",
                                      "--tls-key",
                                      "/k",
                                      "--tls-cacert",
                                      "/ca"});
  EXPECT_EQ(config.listen, "127.0.0.1");
  EXPECT_EQ(config.port, 0);
  EXPECT_EQ(config.token_file, "/t");
  EXPECT_EQ(config.state_dir, "/s");
  EXPECT_EQ(config.ping_interval, absl::Seconds(90));
  EXPECT_EQ(config.ping_timeout, absl::Seconds(3));
  EXPECT_EQ(config.max_join_timeout, absl::Minutes(90));
  EXPECT_EQ(config.max_jobs, 7u);
  EXPECT_EQ(config.event_log, "/e");
  EXPECT_EQ(config.metrics_port, 0);
  EXPECT_EQ(config.metrics_listen, "0.0.0.0");
  EXPECT_EQ(config.metrics_password_file, "/p");
  EXPECT_EQ(config.drain, absl::Minutes(2));
  EXPECT_EQ(config.tls.cert, "/c");
  EXPECT_EQ(config.tls.key, "/k");
  EXPECT_EQ(config.tls.cacert, "/ca");
  const MusterdConfig munge = Parse({"--munge", "--munge-socket", "/m"});
  EXPECT_TRUE(munge.munge);
  EXPECT_EQ(munge.munge_socket, "/m");
}

TEST(MusterdFlagsTest, HelpAndVersionArePrinted) {
  absl::StatusOr<ParsedMusterdFlags> help = ParseMusterdFlags({"--help", "--port", "nonsense"});
  ASSERT_TRUE(help.ok()) << help.status();
  ASSERT_TRUE(help->print.has_value());
  EXPECT_THAT(*help->print, HasSubstr("--state-dir"));
  EXPECT_THAT(*help->print, HasSubstr("Exit status:"));
  absl::StatusOr<ParsedMusterdFlags> version = ParseMusterdFlags({"--version"});
  ASSERT_TRUE(version.ok() && version->print.has_value());
  EXPECT_THAT(*version->print, StartsWith("musterd "));
}

TEST(MusterdFlagsTest, PortsAreNumbersInRange) {
  EXPECT_EQ(Refused({"--port", "65536"}), "--port 65536: give a port number 0..65535");
  EXPECT_EQ(Refused({"--port", "http"}), "--port http: give a port number 0..65535");
  EXPECT_EQ(Refused({"--metrics-port", "70000"}),
            "--metrics-port 70000: give a port number 0..65535");
}

TEST(MusterdFlagsTest, DurationsAreAboveZeroAndWrittenAsUsersWriteThem) {
  EXPECT_EQ(Parse({"--ping-interval", "3600"}).ping_interval, absl::Hours(1));
  EXPECT_EQ(Parse({"--drain", "0"}).drain, absl::ZeroDuration()) << "no drain";
  EXPECT_THAT(Refused({"--ping-interval", "0"}), HasSubstr("give a duration above zero"));
  EXPECT_THAT(Refused({"--ping-timeout", "-5s"}), HasSubstr("give a duration above zero"));
  EXPECT_THAT(Refused({"--max-join-timeout", "soon"}),
              HasSubstr("--max-join-timeout soon: give a duration such as 90s"));
  EXPECT_THAT(Refused({"--drain", "inf"}), HasSubstr("--drain inf"));
}

TEST(MusterdFlagsTest, AtLeastOneJob) {
  EXPECT_EQ(Refused({"--max-jobs", "0"}), "--max-jobs 0: give at least 1");
}

TEST(MusterdFlagsTest, MetricsSettingsNeedAPort) {
  EXPECT_THAT(Refused({"--metrics-listen", "0.0.0.0"}), HasSubstr("need --metrics-port"));
  EXPECT_THAT(Refused({"--metrics-password-file", "/p"}), HasSubstr("need --metrics-port"));
}

TEST(MusterdFlagsTest, ListenIsAnAddressWithoutItsPort) {
  EXPECT_EQ(Refused({"--listen", ""}), "--listen is empty; give an address, e.g. 0.0.0.0");
  EXPECT_THAT(Refused({"--listen", "10.0.0.1:29400"}), HasSubstr("give the port with --port"));
  EXPECT_THAT(Refused({"--listen", "[::1]:29400"}), HasSubstr("give the port with --port"));
  EXPECT_THAT(Refused({"--listen", "[::1"}), HasSubstr("is not an IPv6 address in brackets"));
  EXPECT_EQ(Parse({"--listen", "[::1]"}).listen, "::1");
  EXPECT_EQ(Parse({"--listen", "::"}).listen, "::");
}

TEST(MusterdFlagsTest, TlsFilesComeInTheirPairs) {
  EXPECT_THAT(Refused({"--tls-cert", "/c"}), HasSubstr("--tls-cert needs --tls-key"));
  EXPECT_THAT(Refused({"--tls-key", "/k"}), HasSubstr("--tls-key needs --tls-cert"));
  EXPECT_THAT(Refused({"--tls-cacert", "/ca"}), HasSubstr("--tls-cacert needs --tls-cert"));
}

TEST(MusterdFlagsTest, MungeExcludesATokenAndOwnsItsSocket) {
  EXPECT_THAT(Refused({"--munge", "--token-file", "/t"}), HasSubstr("excludes"));
  EXPECT_THAT(Refused({"--munge-socket", "/m"}), HasSubstr("requires"));
  EXPECT_THAT(Refused({"--no-such-flag"}), HasSubstr("see musterd --help"));
}

}  // namespace
}  // namespace muster::rdzv
