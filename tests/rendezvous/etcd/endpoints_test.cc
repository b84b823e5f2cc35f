#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rendezvous/etcd/client.h"

namespace muster::etcd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Parsed(absl::string_view text) {
  absl::StatusOr<EtcdEndpoints> parsed = ParseEtcdEndpoints(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? parsed->endpoints : std::vector<std::string>{};
}

// The message of a refusal, which must be kInvalidArgument.
std::string Refusal(absl::string_view text) {
  absl::StatusOr<EtcdEndpoints> parsed = ParseEtcdEndpoints(text);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(parsed.status().message());
}

TEST(ParseEtcdEndpointsTest, AnEntryWithoutAPortGetsEtcds) {
  EXPECT_THAT(Parsed("etcd1"), ElementsAre("etcd1:2379"));
}

TEST(ParseEtcdEndpointsTest, ListsKeepTheirOrderAndSpacesAroundEntriesAreDropped) {
  EXPECT_THAT(Parsed("etcd1:2379, 10.0.0.2:32379 ,etcd3"),
              ElementsAre("etcd1:2379", "10.0.0.2:32379", "etcd3:2379"));
}

TEST(ParseEtcdEndpointsTest, Ipv6AddressesKeepTheirBrackets) {
  EXPECT_THAT(Parsed("[::1]:2381,[fe80::1%eth0]"),
              ElementsAre("[::1]:2381", "[fe80::1%eth0]:2379"));
}

TEST(ParseEtcdEndpointsTest, HttpSchemeIsStrippedAndAsksForNoTls) {
  absl::StatusOr<EtcdEndpoints> parsed = ParseEtcdEndpoints("http://etcd1:2379,HTTP://etcd2/");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->endpoints, ElementsAre("etcd1:2379", "etcd2:2379"));
  EXPECT_FALSE(parsed->tls);
}

TEST(ParseEtcdEndpointsTest, HttpsSchemeAsksForTls) {
  absl::StatusOr<EtcdEndpoints> parsed = ParseEtcdEndpoints("https://etcd1,https://[::1]:2379");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->endpoints, ElementsAre("etcd1:2379", "[::1]:2379"));
  EXPECT_TRUE(parsed->tls);
}

TEST(ParseEtcdEndpointsTest, EntriesWithoutASchemeDoNotAskForTls) {
  absl::StatusOr<EtcdEndpoints> parsed = ParseEtcdEndpoints("etcd1,etcd2");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->tls);
}

TEST(ParseEtcdEndpointsTest, AnEmptyListIsRefused) {
  EXPECT_THAT(Refusal(""), HasSubstr("no etcd endpoint given"));
  EXPECT_THAT(Refusal("  "), HasSubstr("no etcd endpoint given"));
}

TEST(ParseEtcdEndpointsTest, AnEmptyEntryIsRefusedByItsPlace) {
  EXPECT_THAT(Refusal("etcd1,,etcd3"), HasSubstr("entry 2 is empty"));
  EXPECT_THAT(Refusal("etcd1,"), HasSubstr("entry 2 is empty"));
}

TEST(ParseEtcdEndpointsTest, ABadEntryIsNamedWithWhatIsWrong) {
  EXPECT_THAT(Refusal("etcd1,etcd2:port"), HasSubstr("\"etcd2:port\": the port must be a number"));
  EXPECT_THAT(Refusal("etcd1:70000"), HasSubstr("the port must be a number"));
  EXPECT_THAT(Refusal("etcd1:0"), HasSubstr("from 1 to 65535"));
  EXPECT_THAT(Refusal(":2379"), HasSubstr("the host is missing"));
  EXPECT_THAT(Refusal("etcd 1"), HasSubstr("the host may hold only"));
}

TEST(ParseEtcdEndpointsTest, TheHintNamesEtcdsPortNotTheRendezvous) {
  const std::string message = Refusal(":2379");
  EXPECT_THAT(message, HasSubstr("etcd1:2379"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("29400")));
}

TEST(ParseEtcdEndpointsTest, Ipv6WithoutBracketsIsRefused) {
  EXPECT_THAT(Refusal("::1"), HasSubstr("must be in brackets"));
  EXPECT_THAT(Refusal("fe80::1:2379"), HasSubstr("must be in brackets"));
}

TEST(ParseEtcdEndpointsTest, OtherSchemesAreRefused) {
  EXPECT_THAT(Refusal("unix:///run/etcd.sock"), HasSubstr("the scheme \"unix\""));
  EXPECT_THAT(Refusal("grpc://etcd1"), HasSubstr("the scheme \"grpc\""));
}

TEST(ParseEtcdEndpointsTest, HttpAndHttpsMixedAreRefused) {
  EXPECT_THAT(Refusal("http://etcd1,https://etcd2"),
              HasSubstr("\"https://etcd2\": http:// and https:// are mixed"));
}

TEST(ParseEtcdEndpointsTest, APathIsRefused) {
  EXPECT_THAT(Refusal("http://etcd1:2379/v3/kv"), HasSubstr("a path is not part"));
}

TEST(ParseEtcdEndpointsTest, AnEndpointGivenTwiceIsRefused) {
  EXPECT_THAT(Refusal("etcd1,etcd1:2379"), HasSubstr("etcd1:2379 is listed twice"));
}

TEST(PrefixEndTest, IncrementsTheLastByte) { EXPECT_EQ(PrefixEnd("job/a"), "job/b"); }

TEST(PrefixEndTest, DropsTrailingFfBytes) {
  EXPECT_EQ(PrefixEnd(std::string("a\xff\xff", 3)), "b");
}

TEST(PrefixEndTest, CoversEveryKeyWhenNoByteCanGrow) {
  EXPECT_EQ(PrefixEnd(""), std::string(1, '\0'));
  EXPECT_EQ(PrefixEnd(std::string("\xff", 1)), std::string(1, '\0'));
}

}  // namespace
}  // namespace muster::etcd
