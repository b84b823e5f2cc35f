// Who runs the job's own etcd members (host mode's HA): the planner's rules,
// on fake time, one step at a time as the leader takes them.
#include "rendezvous/etcd/members.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace muster::etcd {
namespace {

using Kind = MemberStep::Kind;

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

MemberView Voter(uint64_t id, const std::string& url) { return {id, url, false, true}; }
MemberView Learner(uint64_t id, const std::string& url, bool started) {
  return {id, url, true, started};
}
MemberOffer Offer(const std::string& node, const std::string& host, const std::string& url) {
  return {node, "m-" + node, host, url, "http://" + host + ":2379"};
}

TEST(MemberPlannerTest, AOneMemberClusterSeatsTheNodesThatOfferUntilThree) {
  MemberPlanner planner;
  const std::vector<MemberOffer> offers = {Offer("a", "h0", "p0"), Offer("c", "h2", "p2"),
                                           Offer("b", "h1", "p1")};
  MemberStep step = planner.Next({Voter(1, "p0")}, offers, kStart);
  ASSERT_EQ(step.kind, Kind::kAdd);
  EXPECT_EQ(step.offer.node, "b");  // the smallest node id of those not seated
  // One learner at a time: nothing more until it has started.
  step = planner.Next({Voter(1, "p0"), Learner(2, "p1", false)}, offers, kStart);
  EXPECT_EQ(step.kind, Kind::kNone);
  step = planner.Next({Voter(1, "p0"), Learner(2, "p1", true)}, offers, kStart);
  ASSERT_EQ(step.kind, Kind::kPromote);
  EXPECT_EQ(step.member, 2u);
  step = planner.Next({Voter(1, "p0"), Voter(2, "p1")}, offers, kStart);
  ASSERT_EQ(step.kind, Kind::kAdd);
  EXPECT_EQ(step.offer.node, "c");
  step = planner.Next({Voter(1, "p0"), Voter(2, "p1"), Voter(3, "p2")}, offers, kStart);
  EXPECT_EQ(step.kind, Kind::kNone);
}

TEST(MemberPlannerTest, ANodeOnAHostWithoutAMemberComesFirst) {
  MemberPlanner planner;
  // "a2" shares host h0 with the member: "z" on a host of its own goes first.
  const std::vector<MemberOffer> offers = {Offer("a", "h0", "p0"), Offer("a2", "h0", "p0b"),
                                           Offer("z", "h9", "p9")};
  MemberStep step = planner.Next({Voter(1, "p0")}, offers, kStart);
  ASSERT_EQ(step.kind, Kind::kAdd);
  EXPECT_EQ(step.offer.node, "z");
}

TEST(MemberPlannerTest, AMemberWhoseNodeWentIsRemovedAfterTheGraceThenReplaced) {
  MemberPlanner planner;
  const std::vector<MemberView> members = {Voter(1, "p0"), Voter(2, "p1"), Voter(3, "p2")};
  // Node "a" (p0) was lost; spare "d" waits.
  const std::vector<MemberOffer> offers = {Offer("b", "h1", "p1"), Offer("c", "h2", "p2"),
                                           Offer("d", "h3", "p3")};
  EXPECT_EQ(planner.Next(members, offers, kStart).kind, Kind::kNone);
  EXPECT_EQ(planner.Next(members, offers, kStart + kOfferGrace / 2).kind, Kind::kNone);
  MemberStep step = planner.Next(members, offers, kStart + kOfferGrace);
  ASSERT_EQ(step.kind, Kind::kRemove);
  EXPECT_EQ(step.member, 1u);
  step = planner.Next({Voter(2, "p1"), Voter(3, "p2")}, offers, kStart + kOfferGrace);
  ASSERT_EQ(step.kind, Kind::kAdd);
  EXPECT_EQ(step.offer.node, "d");
}

TEST(MemberPlannerTest, AnOfferBackWithinTheGraceKeepsTheMember) {
  MemberPlanner planner;
  const std::vector<MemberView> members = {Voter(1, "p0"), Voter(2, "p1")};
  EXPECT_EQ(planner.Next(members, {Offer("b", "h1", "p1")}, kStart).kind, Kind::kNone);
  const std::vector<MemberOffer> both = {Offer("a", "h0", "p0"), Offer("b", "h1", "p1")};
  EXPECT_EQ(planner.Next(members, both, kStart + absl::Seconds(1)).kind, Kind::kNone);
  // Gone again: the grace starts afresh.
  EXPECT_EQ(planner.Next(members, {Offer("b", "h1", "p1")}, kStart + absl::Seconds(2)).kind,
            Kind::kNone);
  EXPECT_EQ(planner.Next(members, {Offer("b", "h1", "p1")}, kStart + absl::Seconds(4)).kind,
            Kind::kNone);
  EXPECT_EQ(planner.Next(members, {Offer("b", "h1", "p1")}, kStart + absl::Seconds(5)).kind,
            Kind::kRemove);
}

TEST(MemberPlannerTest, TheLastStartedVoterIsNeverRemoved) {
  MemberPlanner planner;
  const std::vector<MemberView> members = {Voter(1, "p0")};
  EXPECT_EQ(planner.Next(members, {}, kStart).kind, Kind::kNone);
  EXPECT_EQ(planner.Next(members, {}, kStart + absl::Hours(1)).kind, Kind::kNone);
}

TEST(MemberPlannerTest, ALearnerThatNeverStartsIsRemovedAndAnotherNodeSeated) {
  MemberPlanner planner;
  const std::vector<MemberOffer> offers = {Offer("a", "h0", "p0"), Offer("b", "h1", "p1"),
                                           Offer("c", "h2", "p2")};
  const std::vector<MemberView> members = {Voter(1, "p0"), Learner(2, "p1", false)};
  EXPECT_EQ(planner.Next(members, offers, kStart).kind, Kind::kNone);
  EXPECT_EQ(planner.Next(members, offers, kStart + kLearnerStartTimeout / 2).kind, Kind::kNone);
  MemberStep step = planner.Next(members, offers, kStart + kLearnerStartTimeout);
  ASSERT_EQ(step.kind, Kind::kRemove);
  EXPECT_EQ(step.member, 2u);
}

TEST(MemberPlannerTest, AFullClusterAddsNobody) {
  MemberPlanner planner;
  const std::vector<MemberOffer> offers = {Offer("a", "h0", "p0"), Offer("b", "h1", "p1"),
                                           Offer("c", "h2", "p2"), Offer("d", "h3", "p3")};
  EXPECT_EQ(planner.Next({Voter(1, "p0"), Voter(2, "p1"), Voter(3, "p2")}, offers, kStart).kind,
            Kind::kNone);
  EXPECT_EQ(planner.Next({Voter(1, "p0")}, offers, kStart, /*size=*/1).kind, Kind::kNone);
}

TEST(MemberPlannerTest, InitialClusterNamesEveryMember) {
  EXPECT_EQ(InitialCluster({{"m0", "http://10.0.0.1:2380"}, {"m1", "http://10.0.0.2:2380"}}),
            "m0=http://10.0.0.1:2380,m1=http://10.0.0.2:2380");
}

}  // namespace
}  // namespace muster::etcd
