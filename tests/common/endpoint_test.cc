#include "common/endpoint.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr int kDefault = 29400;

Endpoint Parse(absl::string_view text) {
  absl::StatusOr<Endpoint> endpoint = ParseEndpoint(text, kDefault);
  EXPECT_TRUE(endpoint.ok()) << text << ": " << endpoint.status();
  return endpoint.ok() ? *endpoint : Endpoint{"<error>", -2};
}

std::string Error(absl::string_view text, absl::string_view flag = "") {
  absl::StatusOr<Endpoint> endpoint = ParseEndpoint(text, kDefault, flag);
  EXPECT_FALSE(endpoint.ok()) << text << " parsed as " << endpoint->host << " " << endpoint->port;
  if (endpoint.ok()) return "";
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(endpoint.status().message());
}

TEST(ParseEndpointTest, HostAloneTakesTheDefaultPort) {
  const Endpoint endpoint = Parse("node1");
  EXPECT_EQ(endpoint.host, "node1");
  EXPECT_EQ(endpoint.port, kDefault);
}

TEST(ParseEndpointTest, HostAndPort) {
  const Endpoint endpoint = Parse("my_host-2.example.com:65535");
  EXPECT_EQ(endpoint.host, "my_host-2.example.com");
  EXPECT_EQ(endpoint.port, 65535);
  EXPECT_EQ(Parse("10.0.0.1:0").port, 0);
  EXPECT_EQ(Parse("10.0.0.1:0").host, "10.0.0.1");
}

TEST(ParseEndpointTest, BracketedIpv6LosesItsBracketsAndTakesTheDefaultPort) {
  const Endpoint endpoint = Parse("[::1]");
  EXPECT_EQ(endpoint.host, "::1");
  EXPECT_EQ(endpoint.port, kDefault);
}

TEST(ParseEndpointTest, BracketedIpv6WithPortAndZone) {
  const Endpoint endpoint = Parse("[fe80::1%eth0]:1");
  EXPECT_EQ(endpoint.host, "fe80::1%eth0");
  EXPECT_EQ(endpoint.port, 1);
}

TEST(ParseEndpointTest, DefaultPortIsReturnedAsGivenSoCallersCanTellNoPort) {
  absl::StatusOr<Endpoint> endpoint = ParseEndpoint("[::]", -1);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_EQ(endpoint->port, -1);
}

TEST(ParseEndpointTest, LeadingZerosInThePortAreDigitsLikeAnyOther) {
  EXPECT_EQ(Parse("node:000080").port, 80);
}

TEST(ParseEndpointTest, EachErrorSaysWhatIsWrong) {
  EXPECT_THAT(Error("::1:29400"), StartsWith("an IPv6 address must be in brackets;"));
  EXPECT_THAT(Error("fe80::1"), StartsWith("an IPv6 address must be in brackets;"));
  EXPECT_THAT(Error(""), StartsWith("the host is missing;"));
  EXPECT_THAT(Error(":29400"), StartsWith("the host is missing;"));
  EXPECT_THAT(Error("ho st:1"), StartsWith("the host may hold only letters, digits"));
  EXPECT_THAT(Error("a/b"), StartsWith("the host may hold only letters, digits"));
  EXPECT_THAT(Error("[::1"), StartsWith("the [ of an IPv6 address is not closed;"));
  EXPECT_THAT(Error("[]:1"), StartsWith("the text in [ ] is not an IPv6 address;"));
  EXPECT_THAT(Error("[host]:1"), StartsWith("the text in [ ] is not an IPv6 address;"));
  EXPECT_THAT(Error("[::1 ]:1"), StartsWith("the text in [ ] is not an IPv6 address;"));
  EXPECT_THAT(Error("[::1]x"), StartsWith("only :PORT may follow the ] of an IPv6 address;"));
  EXPECT_THAT(Error("[::1]]"), StartsWith("only :PORT may follow the ] of an IPv6 address;"));
  for (const char* bad_port : {"host:", "host:65536", "host:x", "host:-1", "host: 5", "host:+5",
                               "host:99999999999999999999", "[::1]:", "[::1]:70000"}) {
    EXPECT_THAT(Error(bad_port), StartsWith("the port must be a number from 0 to 65535;"))
        << bad_port;
  }
}

TEST(ParseEndpointTest, EveryErrorGivesTheFixNamingTheFlag) {
  EXPECT_THAT(Error("host:x", "--rdzv-endpoint"),
              HasSubstr("; give --rdzv-endpoint HOST[:PORT] or [IPV6][:PORT], e.g. node1:29400 "
                        "or [::1]:29400"));
  EXPECT_THAT(Error("host:x"),
              AllOf(HasSubstr("; give HOST[:PORT] or [IPV6][:PORT]"), Not(HasSubstr("give  "))));
}

TEST(FormatEndpointTest, NameOrIpv4IsHostColonPort) {
  EXPECT_EQ(FormatEndpoint("node1", 29400), "node1:29400");
  EXPECT_EQ(FormatEndpoint("10.0.0.1", 0), "10.0.0.1:0");
}

TEST(FormatEndpointTest, Ipv6GoesInBrackets) {
  EXPECT_EQ(FormatEndpoint("::1", 5), "[::1]:5");
  EXPECT_EQ(FormatEndpoint("fe80::1%eth0", 5), "[fe80::1%eth0]:5");
}

TEST(FormatEndpointTest, HostAlreadyInBracketsIsNotBracketedTwice) {
  EXPECT_EQ(FormatEndpoint("[::1]", 5), "[::1]:5");
}

TEST(FormatEndpointTest, WhatFormatWritesParsesBackToTheSameEndpoint) {
  for (const Endpoint& endpoint :
       {Endpoint{"node1", 1}, Endpoint{"10.0.0.1", 65535}, Endpoint{"fe80::1%eth0", 0}}) {
    const Endpoint back = Parse(FormatEndpoint(endpoint));
    EXPECT_EQ(back.host, endpoint.host);
    EXPECT_EQ(back.port, endpoint.port);
  }
}

}  // namespace
}  // namespace muster
