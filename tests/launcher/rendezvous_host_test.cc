#include "launcher/rendezvous_host.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A stand-in for IsLocalAddress: the hosts it says are local, and every
// host it was asked about.
struct FakeAddresses {
  std::vector<std::string> local;
  std::vector<std::string> asked;
  std::function<bool(const std::string&)> Predicate() {
    return [this](const std::string& host) {
      asked.push_back(host);
      return std::find(local.begin(), local.end(), host) != local.end();
    };
  }
};

HostingFacts Facts(const std::string& endpoint_host) {
  return HostingFacts{endpoint_host, "node7", "", std::nullopt};
}

TEST(ShouldHostRendezvousTest, LoopbackEndpointIsHostedHereWithoutALookup) {
  for (const char* host : {"localhost", "127.0.0.1", "127.0.1.1", "::1"}) {
    FakeAddresses addresses;
    EXPECT_TRUE(ShouldHostRendezvous(Facts(host), addresses.Predicate())) << host;
    EXPECT_THAT(addresses.asked, IsEmpty()) << host;
  }
}

TEST(ShouldHostRendezvousTest, ThisMachinesNameIsHostedHere) {
  FakeAddresses addresses;
  EXPECT_TRUE(ShouldHostRendezvous(Facts("node7"), addresses.Predicate()));
  EXPECT_THAT(addresses.asked, IsEmpty());
}

TEST(ShouldHostRendezvousTest, LocalAddrNamingTheEndpointIsHostedHere) {
  FakeAddresses addresses;
  HostingFacts facts = Facts("10.1.2.3");
  facts.local_addr = "10.1.2.3";
  EXPECT_TRUE(ShouldHostRendezvous(facts, addresses.Predicate()));
  EXPECT_THAT(addresses.asked, IsEmpty());
}

TEST(ShouldHostRendezvousTest, AnAddressOfThisMachineIsHostedHere) {
  FakeAddresses addresses{{"10.1.2.3"}, {}};
  EXPECT_TRUE(ShouldHostRendezvous(Facts("10.1.2.3"), addresses.Predicate()));
  EXPECT_THAT(addresses.asked, ElementsAre("10.1.2.3"));
}

TEST(ShouldHostRendezvousTest, AnotherMachinesEndpointIsNotHostedHere) {
  FakeAddresses addresses{{"10.1.2.3"}, {}};
  HostingFacts facts = Facts("node8");
  facts.local_addr = "10.1.2.3";
  EXPECT_FALSE(ShouldHostRendezvous(facts, addresses.Predicate()));
  EXPECT_THAT(addresses.asked, ElementsAre("node8"));
}

TEST(ShouldHostRendezvousTest, IsHostGivenWinsAndNothingIsLookedUp) {
  FakeAddresses addresses{{"node8"}, {}};
  HostingFacts facts = Facts("node8");
  facts.is_host = false;
  EXPECT_FALSE(ShouldHostRendezvous(facts, addresses.Predicate()));
  facts = Facts("localhost");
  facts.is_host = false;
  EXPECT_FALSE(ShouldHostRendezvous(facts, addresses.Predicate()));
  facts = Facts("far-away");
  facts.is_host = true;
  EXPECT_TRUE(ShouldHostRendezvous(facts, addresses.Predicate()));
  EXPECT_THAT(addresses.asked, IsEmpty());
}

TEST(BindHostTest, LoopbackEndpointListensOnLoopbackOnly) {
  EXPECT_EQ(BindHost("localhost"), "127.0.0.1");
  EXPECT_EQ(BindHost("127.0.0.5"), "127.0.0.5");
  EXPECT_EQ(BindHost("::1"), "::1");
}

TEST(BindHostTest, AnyOtherEndpointListensOnEveryIpv4Address) {
  EXPECT_EQ(BindHost("node7"), "0.0.0.0");
  EXPECT_EQ(BindHost("10.1.2.3"), "0.0.0.0");
}

TEST(NumericLoopbackTest, OnlyLocalhostBecomesANumber) {
  EXPECT_EQ(NumericLoopback("localhost"), "127.0.0.1");
  EXPECT_EQ(NumericLoopback("node7"), "node7");
  EXPECT_EQ(NumericLoopback("::1"), "::1");
}

TEST(IsLoopbackTest, NamesAndAddresses) {
  EXPECT_TRUE(IsLoopback("localhost"));
  EXPECT_TRUE(IsLoopback("127.0.0.1"));
  EXPECT_TRUE(IsLoopback("::1"));
  EXPECT_FALSE(IsLoopback("10.0.0.1"));
  EXPECT_FALSE(IsLoopback("localhost.example.com"));
  EXPECT_FALSE(IsLoopback("1270.0.0.1"));
}

HaFacts Multinode() {
  HaFacts facts;
  facts.max_nodes = 3;
  facts.etcd_on_path = true;
  return facts;
}

TEST(ChooseHaTest, OnByDefaultForTwoOrMoreNodesWhereEtcdIsInstalled) {
  absl::StatusOr<HaChoice> choice = ChooseHa(Multinode());
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(choice->on);
  EXPECT_EQ(choice->why_not, "");
}

TEST(ChooseHaTest, OneNodeOrHaZeroIsHostModeWithoutAWord) {
  HaFacts one = Multinode();
  one.max_nodes = 1;
  HaFacts off = Multinode();
  off.ha = false;
  off.etcd_on_path = false;
  for (const HaFacts& facts : {one, off}) {
    absl::StatusOr<HaChoice> choice = ChooseHa(facts);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_FALSE(choice->on);
    EXPECT_EQ(choice->why_not, "");
  }
}

TEST(ChooseHaTest, WithoutEtcdHostModeSaysTheJobWillNotOutliveThisNodeAndHowToChangeIt) {
  HaFacts facts = Multinode();
  facts.etcd_on_path = false;
  absl::StatusOr<HaChoice> choice = ChooseHa(facts);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_FALSE(choice->on);
  EXPECT_THAT(choice->why_not, HasSubstr("the job will not outlive this node"));
  EXPECT_THAT(choice->why_not, HasSubstr("etcd is not on PATH: install etcd-server"));
  EXPECT_THAT(choice->why_not, HasSubstr("ha=0 says this on purpose"));
}

TEST(ChooseHaTest, TlsOrMungeAloneFallBackByDefaultAndRefuseHaOne) {
  HaFacts tls = Multinode();
  tls.tls = true;
  HaFacts munge = Multinode();
  munge.munge_only = true;
  for (const auto& [facts, missing] : {std::pair{tls, "do not serve TLS yet"},
                                       std::pair{munge, "munge gives its members no secret"}}) {
    absl::StatusOr<HaChoice> choice = ChooseHa(facts);
    ASSERT_TRUE(choice.ok()) << choice.status();
    EXPECT_FALSE(choice->on);
    EXPECT_THAT(choice->why_not, HasSubstr(missing));
    HaFacts asked = facts;
    asked.ha = true;
    choice = ChooseHa(asked);
    ASSERT_FALSE(choice.ok());
    EXPECT_THAT(choice.status().message(), HasSubstr("ha=1 cannot keep this job's credential"));
    EXPECT_THAT(choice.status().message(), HasSubstr(missing));
  }
}

TEST(ChooseHaTest, HaOneIsOnWithoutEtcdForTheCallerToRefuseWithItsPath) {
  HaFacts facts = Multinode();
  facts.ha = true;
  facts.etcd_on_path = false;
  facts.max_nodes = 1;
  absl::StatusOr<HaChoice> choice = ChooseHa(facts);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(choice->on);
}

TEST(FollowHostsHaTest, AJoinerFollowsTheHostUnlessItsOwnHaDisagrees) {
  for (bool etcd : {false, true}) {
    EXPECT_EQ(FollowHostsHa(std::nullopt, etcd, "n0:29400").value_or(!etcd), etcd);
    EXPECT_EQ(FollowHostsHa(etcd, etcd, "n0:29400").value_or(!etcd), etcd);
  }
  absl::StatusOr<bool> on = FollowHostsHa(true, false, "n0:29400");
  ASSERT_FALSE(on.ok());
  EXPECT_THAT(on.status().message(),
              HasSubstr("ha=1 on this node, but the rendezvous host at n0:29400 runs host mode"));
  absl::StatusOr<bool> off = FollowHostsHa(false, true, "n0:29400");
  ASSERT_FALSE(off.ok());
  EXPECT_THAT(off.status().message(),
              HasSubstr("ha=0 on this node, but the rendezvous host at n0:29400 keeps the job on "
                        "an etcd cluster"));
}

}  // namespace
}  // namespace muster
