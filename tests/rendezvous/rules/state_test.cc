// The rendezvous rules, checked on the pure state machine: no sockets, the
// time passed in.
#include "rendezvous/rules/state.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "rendezvous/rules/protocol.h"
#include "tests/rendezvous/rules/state_fixture.h"

namespace muster::rdzv {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

// ---------------------------------------------------------------- validation

TEST(ValidateJobIdTest, AcceptsPrintableIdsUpTo256Characters) {
  EXPECT_TRUE(ValidateJobId("a").ok());
  EXPECT_TRUE(ValidateJobId("train-llama_7b.2024/run#3").ok());
  EXPECT_TRUE(ValidateJobId(std::string(256, 'x')).ok());
}

TEST(ValidateJobIdTest, RejectsEmpty) {
  absl::Status status = ValidateJobId("");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("empty"));
}

TEST(ValidateJobIdTest, RejectsSpacesAndControlCharacters) {
  for (const char* id : {"my job", " job", "job\t1", "job\n", "job\x7f"}) {
    absl::Status status = ValidateJobId(id);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(status.message(), HasSubstr("space or control")) << id;
  }
}

TEST(ValidateJobIdTest, RejectsOneMegabyteIdNamingBothLengths) {
  absl::Status status = ValidateJobId(std::string(1 << 20, 'j'));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("1048576"), HasSubstr("256")));
  EXPECT_EQ(ValidateJobId(std::string(257, 'j')).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateJobConfigTest, RejectsBadRangesAndNegativeValues) {
  EXPECT_TRUE(ValidateJobConfig(Config(1, 1)).ok());
  EXPECT_TRUE(ValidateJobConfig(Config(1, 8, 0)).ok());
  EXPECT_EQ(ValidateJobConfig(Config(0, 2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateJobConfig(Config(3, 2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateJobConfig(Config(1, 2, -1)).code(), absl::StatusCode::kInvalidArgument);
  JobConfig negative = Config(1, 2);
  negative.set_join_timeout_ms(-1);
  EXPECT_EQ(ValidateJobConfig(negative).code(), absl::StatusCode::kInvalidArgument);
}

// Each bound, the field it names and the bound itself in the message.
TEST(ValidateJobConfigTest, RejectsValuesBeyondTheirBoundsNamingFieldAndBound) {
  struct Case {
    std::function<void(JobConfig*)> change;
    std::vector<std::string> said;
  };
  const std::vector<Case> cases = {
      {[](JobConfig* c) { c->set_max_nodes(65537); }, {"max_nodes", "65536"}},
      {[](JobConfig* c) { c->set_max_restarts(1'000'001); }, {"max_restarts", "1000000"}},
      // A job whose nodes never expire must not exist: 0 was "no heartbeat".
      {[](JobConfig* c) { c->set_heartbeat_timeout_ms(0); }, {"heartbeat_timeout", "1 s"}},
      {[](JobConfig* c) { c->set_heartbeat_timeout_ms(999); }, {"heartbeat_timeout", "1 s"}},
      {[](JobConfig* c) { c->set_join_timeout_ms(kMaxTimeoutMs + 1); }, {"join_timeout", "7 days"}},
      {[](JobConfig* c) { c->set_last_call_timeout_ms(kMaxTimeoutMs + 1); },
       {"last_call_timeout", "7 days"}},
      {[](JobConfig* c) { c->set_heartbeat_timeout_ms(kMaxTimeoutMs + 1); },
       {"heartbeat_timeout", "7 days"}},
  };
  for (const Case& c : cases) {
    JobConfig config = Config(1, 2);
    c.change(&config);
    absl::Status status = ValidateJobConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << config.ShortDebugString();
    for (const std::string& word : c.said) EXPECT_THAT(status.message(), HasSubstr(word));
  }
  JobConfig edge = Config(1, 65536, 1'000'000);
  edge.set_heartbeat_timeout_ms(1'000);
  edge.set_join_timeout_ms(kMaxTimeoutMs);
  EXPECT_TRUE(ValidateJobConfig(edge).ok());
}

TEST(CutTextTest, KeepsTheStartAndSaysHowMuchWasCut) {
  EXPECT_EQ(CutText("short", 100), "short");
  const std::string cut = CutText(std::string(1000, 'x'), 100);
  EXPECT_LE(cut.size(), 100u);
  EXPECT_EQ(cut.substr(0, 10), std::string(10, 'x'));
  EXPECT_THAT(cut, HasSubstr("... [cut: "));
  const size_t kept = cut.find("...");
  EXPECT_THAT(cut, HasSubstr(absl::StrCat("[cut: ", 1000 - kept, " bytes]")));
}

TEST(CutTextTest, NeverSplitsAUtf8Character) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += "\xc3\xa9";  // é, two bytes each
  for (size_t max : {60u, 61u, 62u, 63u, 100u}) {
    const std::string cut = CutText(text, max);
    EXPECT_LE(cut.size(), max);
    const size_t kept = cut.find("...");
    ASSERT_NE(kept, std::string::npos);
    EXPECT_EQ(kept % 2, 0u) << "max " << max;  // whole characters only
  }
}

TEST_F(StateTest, BadJoinIsRejectedWithoutCreatingTheJob) {
  Effects effects;
  job_ = "has space";
  EXPECT_EQ(TryJoin({"a"}, At(0), &effects).code(), absl::StatusCode::kInvalidArgument);
  job_ = "job";
  EXPECT_EQ(TryJoin({""}, At(0), &effects).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TryJoin(Spec("a").Lws(0), At(0), &effects).code(), absl::StatusCode::kInvalidArgument);
  config_ = Config(3, 2);
  EXPECT_EQ(TryJoin({"a"}, At(0), &effects).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.job_count(), 0u);
  EXPECT_TRUE(effects.assigned.empty());
}

// ---------------------------------------------------------------- forming a round

TEST_F(StateTest, RoundCompletesAtMaxNodesAtOnce) {
  config_ = Config(1, 3);
  EXPECT_THAT(Assigned(Join({"a"}, At(0))), IsEmpty());
  EXPECT_THAT(Assigned(Join({"b"}, At(10))), IsEmpty());
  // The third node fills the round: no last call.
  std::map<std::string, Assignment> assigned = Assigned(Join({"c"}, At(20)));
  EXPECT_THAT(Keys(assigned), ElementsAre("a", "b", "c"));
  for (const auto& [id, a] : assigned) {
    EXPECT_EQ(a.round(), 0);
    EXPECT_EQ(a.group_world_size(), 3);
    EXPECT_EQ(a.world_size(), 3);
  }
  EXPECT_EQ(JobStatus().state(), "running");
}

TEST_F(StateTest, RoundAtMinNodesCompletesOnlyAfterLastCall) {
  config_ = Config(2, 4);
  Join({"a"}, At(0));
  Join({"b"}, At(100));  // min reached: last call ends at 1100
  ASSERT_EQ(state_.NextDeadline(), At(100 + kLastCallMs));
  EXPECT_TRUE(Advance(At(100 + kLastCallMs - 1)).assigned.empty());
  EXPECT_EQ(JobStatus().state(), "open");
  EXPECT_THAT(Keys(Assigned(Advance(At(100 + kLastCallMs)))), ElementsAre("a", "b"));
  EXPECT_EQ(JobStatus().state(), "running");
}

TEST_F(StateTest, NodeJoiningDuringLastCallIsInTheRound) {
  config_ = Config(2, 4);
  Join({"a"}, At(0));
  Join({"b"}, At(0));
  EXPECT_THAT(Assigned(Join({"c"}, At(500))), IsEmpty());
  // The last call is counted from when the minimum was reached, not from the last join.
  EXPECT_THAT(Keys(Assigned(Advance(At(kLastCallMs)))), ElementsAre("a", "b", "c"));
}

TEST_F(StateTest, DroppingBelowMinDuringLastCallCancelsIt) {
  config_ = Config(2, 4);
  Join({"a"}, At(0));
  Join({"b"}, At(0));
  Effects left = Leave("b", At(500));
  EXPECT_EQ(JoinFailed(left).at("b").code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(Advance(At(kLastCallMs)).assigned.empty());
  // A new minimum starts a new last call.
  Join({"c"}, At(2'000));
  EXPECT_TRUE(Advance(At(2'000 + kLastCallMs - 1)).assigned.empty());
  EXPECT_THAT(Keys(Assigned(Advance(At(2'000 + kLastCallMs)))), ElementsAre("a", "c"));
}

// A restart round of a, b and c (--nnodes 2:3), each of whose agents says
// it may take `allowance` ms to stop its workers (0: an agent from before
// NodeInfo.stop_allowance_ms): round 1 opens at 100 ms, when a fails; a and
// b are back by 300 ms, so the last call alone would end at 1.3 s; c's
// agent still watches (it is stopping).
class StopAllowanceTest : public StateTest {
 protected:
  void OpenRestartRoundWithoutC(int64_t allowance) {
    config_ = Config(2, 3);
    Form({Spec("a").StopAllowance(allowance), Spec("b").StopAllowance(allowance),
          Spec("c").StopAllowance(allowance)},
         At(0));
    Effects watching;
    state_.SetWatching({job_, "c"}, true, At(50), &watching);
    Fail("a", 0, At(100));
    Join(Spec("a").StopAllowance(allowance), At(200));
    Join(Spec("b").StopAllowance(allowance), At(300));
  }
};

// Found by the simulator (tests/sim, seed 1761 before the fix): with a last
// call shorter than a node takes to stop its workers, that node missed
// every restart round, and each time it came back a new round opened for
// it, which the next slowest node missed: the job went round after round
// and never trained.
TEST_F(StopAllowanceTest, ARestartRoundHoldsTheSeatOfAMemberStillStopping) {
  OpenRestartRoundWithoutC(20'000);
  EXPECT_EQ(state_.NextDeadline(), At(100 + 20'000));
  EXPECT_EQ(JobStatus().last_call_remaining_ms(), -1) << "asked without a time";
  EXPECT_TRUE(Advance(At(100 + 19'999)).assigned.empty());
  // c is back within its allowance: all three, at once.
  EXPECT_THAT(Keys(Assigned(Join(Spec("c").StopAllowance(20'000), At(15'000)))),
              ElementsAre("a", "b", "c"));
}

TEST_F(StopAllowanceTest, AMemberNotBackWithinItsStopAllowanceGivesUpItsSeat) {
  OpenRestartRoundWithoutC(5'000);
  EXPECT_THAT(Keys(Assigned(Advance(At(100 + 5'000)))), ElementsAre("a", "b"));
}

TEST_F(StopAllowanceTest, AMemberWhoseWatchEndedHasNoSeatHeldPastTheLastCall) {
  // Its agent is gone (or cut off): it is not stopping workers.
  OpenRestartRoundWithoutC(20'000);
  EXPECT_EQ(state_.NextDeadline(), At(100 + 20'000));
  Effects ended;
  state_.SetWatching({job_, "c"}, false, At(400), &ended);
  EXPECT_TRUE(ended.rearm_timer);
  EXPECT_EQ(state_.NextDeadline(), At(300 + kLastCallMs));
  EXPECT_THAT(Keys(Assigned(Advance(At(300 + kLastCallMs)))), ElementsAre("a", "b"));
}

TEST_F(StopAllowanceTest, WithoutAStopAllowanceTheLastCallDecides) {
  OpenRestartRoundWithoutC(0);
  EXPECT_THAT(Keys(Assigned(Advance(At(300 + kLastCallMs)))), ElementsAre("a", "b"));
}

// Agents tell a job that succeeded from one that failed by what a refused
// call says (kJobSucceeded): a spare refused its join exits 0.
TEST_F(StateTest, CallsForAClosedJobSayWhetherItSucceeded) {
  config_ = Config(1, 1);
  Form({"a"}, At(0));
  Effects waiting = Join({"s"}, At(10));  // a spare waits
  Effects done = Done("a", 0, At(20));
  ASSERT_THAT(done.join_failed, SizeIs(1));
  EXPECT_THAT(std::string(done.join_failed[0].second.message()),
              HasSubstr(std::string("'job") + kJobSucceeded + " (every node finished)"));
  Effects refused;
  EXPECT_THAT(std::string(TryJoin({"late"}, At(30), &refused).message()), HasSubstr(kJobSucceeded));
  EXPECT_THAT(std::string(state_.Heartbeat({job_, "a"}, SecretOf("a"), At(30)).status().message()),
              HasSubstr(kJobSucceeded));

  job_ = "failed";
  Form({"a"}, At(0));
  Fail("a", 0, At(10));  // max_restarts 3: restart; then no more
  for (int round = 1; round <= 3; ++round) {
    Join({"a"}, At(10 + round));
    Fail("a", round, At(20 + round));
  }
  ASSERT_EQ(JobStatus().state(), "closed");
  Effects late;
  EXPECT_THAT(std::string(TryJoin({"late"}, At(40), &late).message()),
              AllOf(HasSubstr("'failed' is closed ("), Not(HasSubstr(kJobSucceeded))));
}

// Found by the simulator (seed 31971 before the fix): an agent whose
// connection broke on its side first joined again while the server still
// held its first join; without a secret (none was ever sent to it), it was
// refused as an impostor and exited 1. Its join key, drawn by its process,
// now says the join is its own.
TEST_F(StateTest, ANodeNeverSeatedMayJoinAgainWithItsJoinKey) {
  config_ = Config(2, 2);
  JoinRequest first = Request({"a"});
  first.clear_node_secret();
  first.set_join_key("key-of-a");
  Effects effects;
  ASSERT_TRUE(state_.Join(first, "peer-a", SecretOf("a"), At(0), &effects).ok());
  // Someone else with a's id, another key or none: refused, a untouched.
  for (const std::string& key : {std::string(), std::string("guessed")}) {
    JoinRequest other = first;
    other.set_join_key(key);
    other.mutable_node()->set_host("elsewhere");
    Effects refused;
    EXPECT_EQ(state_.Join(other, "peer-x", "x", At(50), &refused).code(),
              absl::StatusCode::kPermissionDenied)
        << key;
    EXPECT_TRUE(refused.empty());
  }
  EXPECT_TRUE(state_.Join(first, "peer-a", "another", At(100), &effects).ok());
  // Once seated, it is told its secret, and must present it: the key is no
  // proof any more.
  std::map<std::string, Assignment> formed = Assigned(Join({"b"}, At(200)));
  ASSERT_THAT(Keys(formed), ElementsAre("a", "b"));
  EXPECT_EQ(formed["a"].node_secret(), SecretOf("a")) << "the first join's";
  Fail("a", 0, At(300));
  Effects refused;
  EXPECT_EQ(state_.Join(first, "peer-a", "x", At(400), &refused).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(StateTest, ANodeDroppedAndNotSeatedAgainMayJoinAgainWithItsJoinKey) {
  // It presents the secret it had, which the job no longer holds for it.
  config_ = Config(1, 2);
  Form({"a", "b"}, At(0));
  Beat({"a"}, At(kHeartbeatMs - 1));
  Advance(At(kHeartbeatMs + 1));      // b silent: dropped
  JoinRequest back = Request({"b"});  // with its old secret
  back.set_join_key("key-of-b");
  Effects effects;
  ASSERT_TRUE(state_.Join(back, "peer-b", "new-secret-b", At(6'000), &effects).ok());
  EXPECT_TRUE(state_.Join(back, "peer-b", "x", At(6'100), &effects).ok()) << "its own, again";
}

TEST_F(StateTest, ZeroLastCallCompletesAtMinImmediately) {
  config_ = Config(2, 4);
  config_.set_last_call_timeout_ms(0);
  Join({"a"}, At(0));
  EXPECT_THAT(Keys(Assigned(Join({"b"}, At(1)))), ElementsAre("a", "b"));
}

// ---------------------------------------------------------------- ranks

TEST_F(StateTest, RanksFollowHintsWhenEveryNodeGivesOne) {
  config_ = Config(3, 3);
  auto assigned = Form({Spec("a").Hint(2), Spec("b").Hint(0), Spec("c").Hint(1)}, At(0));
  EXPECT_EQ(assigned.at("b").group_rank(), 0);
  EXPECT_EQ(assigned.at("c").group_rank(), 1);
  EXPECT_EQ(assigned.at("a").group_rank(), 2);
}

TEST_F(StateTest, RanksFollowHostNamesWhenAnyHintIsMissing) {
  config_ = Config(3, 3);
  auto assigned = Form({Spec("1").Hint(0).Host("node-c"), Spec("2").Hint(-1).Host("node-a"),
                        Spec("3").Hint(1).Host("node-b")},
                       At(0));
  EXPECT_EQ(assigned.at("2").group_rank(), 0);  // node-a
  EXPECT_EQ(assigned.at("3").group_rank(), 1);  // node-b
  EXPECT_EQ(assigned.at("1").group_rank(), 2);  // node-c
}

TEST_F(StateTest, RanksOnOneHostFollowJoinOrder) {
  config_ = Config(3, 3);
  // Node ids sort the other way round, so only join order can give this result.
  Join(Spec("z").Host("same"), At(0));
  Join(Spec("y").Host("same"), At(1));
  auto assigned = Assigned(Join(Spec("x").Host("same"), At(2)));
  EXPECT_EQ(assigned.at("z").group_rank(), 0);
  EXPECT_EQ(assigned.at("y").group_rank(), 1);
  EXPECT_EQ(assigned.at("x").group_rank(), 2);
}

TEST_F(StateTest, RankBaseSumsLocalWorldSizesOfEarlierNodes) {
  config_ = Config(3, 3);
  auto assigned = Form({Spec("a").Lws(8), Spec("b").Lws(2), Spec("c").Lws(4)}, At(0));
  EXPECT_EQ(assigned.at("a").rank_base(), 0);
  EXPECT_EQ(assigned.at("b").rank_base(), 8);
  EXPECT_EQ(assigned.at("c").rank_base(), 10);
  for (const auto& [id, a] : assigned) {
    EXPECT_EQ(a.world_size(), 14) << id;
    EXPECT_EQ(a.group_world_size(), 3) << id;
    EXPECT_EQ(a.max_restarts(), 3) << id;
    EXPECT_EQ(a.restart_count(), 0) << id;
  }
}

TEST_F(StateTest, MasterIsGroupRankZerosAdvertisedAddressAndPort) {
  config_ = Config(2, 2);
  auto assigned =
      Form({Spec("b").Port(40002).Addr("10.0.0.2"), Spec("a").Port(40001).Addr("10.0.0.1")}, At(0));
  for (const auto& [id, a] : assigned) {
    EXPECT_EQ(a.master_addr(), "10.0.0.1") << id;
    EXPECT_EQ(a.master_port(), 40001) << id;
  }
}

TEST_F(StateTest, MasterFallsBackToThePeerAddressTheServerSaw) {
  config_ = Config(2, 2);
  auto assigned = Form({Spec("a").Port(40001), Spec("b").Port(40002)}, At(0));
  EXPECT_EQ(assigned.at("b").master_addr(), PeerOf("a"));
  EXPECT_EQ(assigned.at("b").master_port(), 40001);
}

// ---------------------------------------------------------------- membership changes

TEST_F(StateTest, JoinerBelowMaxOpensNextRoundWithoutUsingARestart) {
  config_ = Config(2, 4);
  config_.set_last_call_timeout_ms(0);
  Form({{"a"}, {"b"}}, At(0));

  Effects joined = Join({"c"}, At(100));
  EXPECT_THAT(Assigned(joined), IsEmpty());
  auto pushed = Pushed(joined);
  ASSERT_EQ(pushed.size(), 2u) << "only the participants are told";
  for (const std::string id : {"a", "b"}) {
    ASSERT_EQ(pushed[id].size(), 1u);
    const RoundChanged& changed = pushed[id][0].round_changed();
    EXPECT_EQ(changed.new_round(), 1);
    EXPECT_EQ(changed.reason(), RoundChanged::NODE_JOINED);
    EXPECT_THAT(changed.detail(), HasSubstr("host-c"));
  }
  EXPECT_EQ(JobStatus().restart_count(), 0);
}

TEST_F(StateTest, MembershipRoundCompletesOnceEveryOldParticipantRejoined) {
  config_ = Config(1, 4);
  config_.set_last_call_timeout_ms(30'000);
  Join({"a"}, At(0));
  Join({"b"}, At(0));
  Advance(At(30'000));  // round 0: a, b
  Join({"c"}, At(31'000));
  EXPECT_THAT(Assigned(Join({"a"}, At(31'001))), IsEmpty());
  // b was the last old participant: no last call, though the round is below max.
  auto assigned = Assigned(Join({"b"}, At(31'002)));
  EXPECT_THAT(Keys(assigned), ElementsAre("a", "b", "c"));
  EXPECT_EQ(assigned.at("c").round(), 1);
  EXPECT_EQ(assigned.at("c").restart_count(), 0);
  EXPECT_EQ(assigned.at("a").world_size(), 3);
}

TEST_F(StateTest, JoinerWaitsWhenTheRoundIsFullAndFillsAPlaceLater) {
  config_ = Config(2, 2);
  Form({{"a"}, {"b"}}, At(0));
  Effects waits = Join({"c"}, At(100));
  EXPECT_TRUE(waits.assigned.empty());
  EXPECT_TRUE(waits.pushed.empty()) << "a full round is not disturbed";
  EXPECT_EQ(JobStatus().waiting(), 1);

  // b leaves: the round re-forms and the waiting node takes its place.
  Effects left = Leave("b", At(200));
  EXPECT_EQ(Pushed(left)["a"].at(0).round_changed().reason(), RoundChanged::NODE_LOST);
  auto assigned = Assigned(Join({"a"}, At(300)));
  EXPECT_THAT(Keys(assigned), ElementsAre("a", "c"));
  EXPECT_EQ(JobStatus().waiting(), 0);
}

// ---------------------------------------------------------------- failures and restarts

TEST_F(StateTest, FailureOpensRestartRoundPushedToEveryParticipant) {
  Form({{"a"}, {"b"}}, At(0));
  Effects failed = Fail("b", 0, At(100), /*rank=*/1);
  auto pushed = Pushed(failed);
  ASSERT_EQ(pushed.size(), 2u);
  for (const std::string id : {"a", "b"}) {
    const RoundChanged& changed = pushed[id].at(0).round_changed();
    EXPECT_EQ(changed.new_round(), 1);
    EXPECT_EQ(changed.reason(), RoundChanged::WORKER_FAILED);
    EXPECT_THAT(changed.detail(),
                AllOf(HasSubstr("rank 1"), HasSubstr("host-b"), HasSubstr("restart 1 of 3")));
  }
  EXPECT_EQ(JobStatus().restart_count(), 1);

  Join({"b"}, At(200));
  auto assigned = Assigned(Join({"a"}, At(300)));
  ASSERT_THAT(Keys(assigned), ElementsAre("a", "b"));
  EXPECT_EQ(assigned.at("a").round(), 1);
  EXPECT_EQ(assigned.at("a").restart_count(), 1);
}

TEST_F(StateTest, RestartRoundCompletesAsSoonAsEveryLiveParticipantRejoined) {
  config_ = Config(1, 4);
  config_.set_last_call_timeout_ms(30'000);
  Join({"a"}, At(0));
  Join({"b"}, At(0));
  Advance(At(30'000));
  Fail("a", 0, At(31'000));
  EXPECT_THAT(Assigned(Join({"a"}, At(31'001))), IsEmpty());
  EXPECT_THAT(Keys(Assigned(Join({"b"}, At(31'002)))), ElementsAre("a", "b"));
}

TEST_F(StateTest, OnlyTheFirstFailureOfARoundUsesARestart) {
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(100));
  Effects second = Fail("b", 0, At(101));  // the same round: stale now
  EXPECT_TRUE(second.pushed.empty());
  EXPECT_EQ(JobStatus().restart_count(), 1);
  EXPECT_EQ(JobStatus().round(), 1);
}

TEST_F(StateTest, FailureReportForAnOldRoundIsIgnored) {
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(100));
  Form({{"a"}, {"b"}}, At(200));  // round 1 runs
  Effects stale = Fail("b", 0, At(300));
  EXPECT_TRUE(stale.pushed.empty());
  EXPECT_TRUE(stale.assigned.empty());
  EXPECT_EQ(JobStatus().restart_count(), 1);
  EXPECT_EQ(JobStatus().state(), "running");
}

TEST_F(StateTest, ExhaustedRestartsCloseTheJobWithTheRootCause) {
  config_ = Config(2, 2, /*max_restarts=*/1);
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(100));
  Form({{"a"}, {"b"}}, At(200));
  Effects closed = Fail("b", 1, At(300), /*rank=*/1);
  auto pushed = Pushed(closed);
  ASSERT_EQ(pushed.size(), 2u);
  for (const std::string id : {"a", "b"}) {
    const JobClosed& event = pushed[id].at(0).job_closed();
    EXPECT_FALSE(event.succeeded());
    EXPECT_THAT(event.reason(), AllOf(HasSubstr("host-b"), HasSubstr("no restarts left")));
    EXPECT_EQ(event.root_cause().host(), "host-b");
    EXPECT_EQ(event.root_cause().rank(), 1);
    EXPECT_EQ(event.root_cause().message(), "boom");
  }
  EXPECT_EQ(JobStatus().state(), "closed");

  Effects effects;
  absl::Status late = TryJoin({"c"}, At(400), &effects);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), AllOf(HasSubstr("'job' is closed"), HasSubstr("no restarts left"),
                                    HasSubstr("--rdzv-id")));
  EXPECT_TRUE(effects.empty());
  EXPECT_EQ(state_.Heartbeat({job_, "a"}, SecretOf("a"), At(400)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StateTest, ZeroMaxRestartsClosesOnFirstFailureAndFailsWaitingJoins) {
  config_ = Config(2, 2, /*max_restarts=*/0);
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(50));  // waits: the round is full
  Effects closed = Fail("a", 0, At(100));
  EXPECT_FALSE(Pushed(closed)["b"].at(0).job_closed().succeeded());
  EXPECT_EQ(JoinFailed(closed).at("c").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(StateTest, FailureAfterAnotherNodeFinishedClosesTheJob) {
  Form({{"a"}, {"b"}}, At(0));
  Done("a", 0, At(100));
  Effects closed = Fail("b", 0, At(200));
  const JobClosed event = Pushed(closed)["b"].at(0).job_closed();
  EXPECT_FALSE(event.succeeded());
  EXPECT_THAT(event.reason(), HasSubstr("partly finished"));
  EXPECT_EQ(JobStatus().restart_count(), 0);
}

TEST_F(StateTest, NoRestartIsHonouredOnlyForThePreflightOfRoundZero) {
  config_ = Config(2, 2, /*max_restarts=*/3);  // no --preflight
  Form({{"a"}, {"b"}}, At(0));
  Failure failure = MakeFailure("a", 0);
  failure.set_no_restart(true);
  Effects effects;
  ASSERT_TRUE(state_.ReportFailure({job_, "a"}, SecretOf("a"), 0, failure, At(100), &effects).ok());
  Keep(effects);
  EXPECT_EQ(JobStatus().state(), "open") << "a node cannot spare the job its restarts";
  EXPECT_EQ(JobStatus().restart_count(), 1);
}

TEST_F(StateTest, NodesMustAgreeOnThePreflight) {
  config_ = Config(2, 2, /*max_restarts=*/0);
  config_.set_preflight(true);
  Join({"a"}, At(0));
  config_.set_preflight(false);
  Effects effects;
  absl::Status refused = TryJoin({"b"}, At(10), &effects);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("runs with --preflight allreduce, but this node asked for no "
                              "--preflight"),
                    HasSubstr("give every node the same --preflight")));
}

TEST_F(StateTest, FailedPreflightClosesTheJobWithRestartsLeft) {
  config_ = Config(2, 2, /*max_restarts=*/3);
  config_.set_preflight(true);
  Form({{"a"}, {"b"}}, At(0));
  Failure failure = MakeFailure("a", 0);
  failure.set_no_restart(true);
  Effects closed;
  ASSERT_TRUE(state_.ReportFailure({job_, "a"}, SecretOf("a"), 0, failure, At(100), &closed).ok());
  Keep(closed);
  const JobClosed event = Pushed(closed)["b"].at(0).job_closed();
  EXPECT_FALSE(event.succeeded());
  EXPECT_THAT(event.reason(),
              AllOf(HasSubstr("host-a"), HasSubstr("pre-flight"), HasSubstr("no restart mends")));
  EXPECT_TRUE(event.root_cause().no_restart());
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_EQ(JobStatus().restart_count(), 0);
}

// ---------------------------------------------------------------- success

TEST_F(StateTest, JobSucceedsWhenEveryNodeIsDone) {
  Form({{"a"}, {"b"}}, At(0));
  EXPECT_TRUE(Done("a", 0, At(100)).pushed.empty());
  Effects closed = Done("b", 0, At(200));
  auto pushed = Pushed(closed);
  ASSERT_EQ(pushed.size(), 2u);
  EXPECT_TRUE(pushed["a"].at(0).job_closed().succeeded());
  EXPECT_FALSE(pushed["a"].at(0).job_closed().has_root_cause());

  Effects effects;
  EXPECT_EQ(TryJoin({"a"}, At(300), &effects).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(StateTest, DoneForAnOldRoundIsAborted) {
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(100));
  Effects effects;
  EXPECT_EQ(state_.ReportDone({job_, "b"}, SecretOf("b"), 0, At(200), &effects).code(),
            absl::StatusCode::kAborted);
}

TEST_F(StateTest, DoneFromANodeOutsideTheRoundDoesNotCloseTheJob) {
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(10));  // waiting, not a participant
  Effects effects;
  EXPECT_FALSE(state_.ReportDone({job_, "c"}, SecretOf("c"), 0, At(20), &effects).ok());
  Done("a", 0, At(30));
  EXPECT_EQ(JobStatus().state(), "running") << "b is still running";
}

// ---------------------------------------------------------------- liveness

TEST_F(StateTest, HeartbeatsKeepNodesAlive) {
  Form({{"a"}, {"b"}}, At(0));
  for (int64_t t = 4'000; t <= 40'000; t += 4'000) {
    Beat({"a", "b"}, At(t));
    EXPECT_TRUE(Advance(At(t + 1)).empty()) << t;
  }
  EXPECT_EQ(state_.NextDeadline(), At(40'000 + kHeartbeatMs));
}

TEST_F(StateTest, AnOpenWatchStreamIsAHeartbeatAndItsEndStartsTheTimeout) {
  Form({{"a"}, {"b"}}, At(0));
  Effects effects;
  state_.SetWatching({job_, "a"}, true, At(1'000), &effects);
  state_.SetWatching({job_, "b"}, true, At(1'000), &effects);
  EXPECT_EQ(state_.NextDeadline(), std::nullopt) << "no heartbeat timer while both watch";
  EXPECT_TRUE(Advance(At(60'000)).empty()) << "silent, but watching: alive";

  Effects ended;
  state_.SetWatching({job_, "b"}, false, At(60'000), &ended);
  EXPECT_TRUE(ended.rearm_timer) << "b's heartbeat deadline starts now";
  EXPECT_EQ(state_.NextDeadline(), At(60'000 + kHeartbeatMs));
  EXPECT_TRUE(Advance(At(60'000 + kHeartbeatMs - 1)).empty());
  auto pushed = Pushed(Advance(At(60'000 + kHeartbeatMs)));
  ASSERT_EQ(pushed.count("a"), 1u)
      << "b was silent for the heartbeat timeout after its watch ended";
  EXPECT_EQ(pushed["a"].at(0).round_changed().reason(), RoundChanged::NODE_LOST);

  Effects unknown;  // a node the job no longer has: ignored
  state_.SetWatching({job_, "b"}, true, At(70'000), &unknown);
  EXPECT_TRUE(unknown.empty());
}

// The server pings a connection silent for its ping interval and closes it
// when the ping is not answered (ServerOptions::ping_interval): a stream
// that ended so had been silent for the ping timeout at least, so the
// heartbeat timeout counts from the unanswered ping.
class StreamSilenceTest : public StateTest {
 protected:
  static StateOptions Options() {
    StateOptions options;
    options.stream_silence = absl::Seconds(2);
    return options;
  }
  StreamSilenceTest() : StateTest(Options()) {}
};

TEST_F(StreamSilenceTest, TheHeartbeatTimeoutOfAnEndedStreamCountsFromTheUnansweredPing) {
  Form({{"a"}, {"b"}}, At(0));
  Effects effects;
  state_.SetWatching({job_, "a"}, true, At(1'000), &effects);
  state_.SetWatching({job_, "b"}, true, At(1'000), &effects);
  state_.SetWatching({job_, "b"}, false, At(60'000), &effects);
  EXPECT_EQ(state_.NextDeadline(), At(60'000 - 2'000 + kHeartbeatMs));
  EXPECT_TRUE(Advance(At(60'000 - 2'000 + kHeartbeatMs - 1)).empty());
  EXPECT_EQ(Pushed(Advance(At(60'000 - 2'000 + kHeartbeatMs))).count("a"), 1u);
}

TEST_F(StreamSilenceTest, NeverMoreThanHalfTheHeartbeatTimeoutIsTakenOff) {
  config_.set_heartbeat_timeout_ms(3'000);  // less than the silence: half of it is kept
  Form({{"a"}, {"b"}}, At(0));
  Effects effects;
  state_.SetWatching({job_, "b"}, true, At(1'000), &effects);
  state_.SetWatching({job_, "b"}, false, At(10'000), &effects);
  Beat({"a"}, At(10'000));
  EXPECT_EQ(state_.NextDeadline(), At(10'000 + 1'500));
}

TEST_F(StateTest, ARemovedNodeThatCallsAgainIsToldWhyItWasDropped) {
  config_ = Config(2, 3);
  Form({{"a"}, {"b"}, {"c"}}, At(0));
  Beat({"a", "b"}, At(4'000));
  Advance(At(kHeartbeatMs));  // c is silent: dropped
  absl::StatusOr<int64_t> beat = state_.Heartbeat({job_, "c"}, SecretOf("c"), At(6'000));
  ASSERT_TRUE(absl::IsNotFound(beat.status())) << beat.status();
  EXPECT_EQ(beat.status().message(),
            absl::StrCat("node c ", kDroppedFromJob, " '", job_, "': node host-c silent for 5 s"));
  absl::StatusOr<int64_t> stranger = state_.Heartbeat({job_, "z"}, SecretOf("z"), At(6'000));
  EXPECT_EQ(stranger.status().message(), absl::StrCat("node z is not part of job '", job_, "'"))
      << "a node never in the job is told only that";
  for (absl::string_view wrong : {absl::string_view(), absl::string_view("secret-of-a")}) {
    absl::StatusOr<int64_t> impostor = state_.Heartbeat({job_, "c"}, wrong, At(6'000));
    EXPECT_EQ(impostor.status().message(), absl::StrCat("node c is not part of job '", job_, "'"))
        << "only the dropped node itself learns why, not a caller that names it";
    absl::StatusOr<std::optional<WatchEvent>> watch = state_.CatchUp({job_, "c"}, wrong, 0);
    EXPECT_EQ(watch.status().message(), impostor.status().message());
  }
}

TEST_F(StateTest, SilentNodeIsRemovedAndTheRoundReformsFromTheRest) {
  config_ = Config(2, 3);
  Form({{"a"}, {"b"}, {"c"}}, At(0));
  Beat({"a", "b"}, At(4'000));
  EXPECT_TRUE(Advance(At(kHeartbeatMs - 1)).empty());
  Effects lost = Advance(At(kHeartbeatMs));
  auto pushed = Pushed(lost);
  ASSERT_EQ(pushed.size(), 2u);
  const RoundChanged& changed = pushed["a"].at(0).round_changed();
  EXPECT_EQ(changed.reason(), RoundChanged::NODE_LOST);
  EXPECT_EQ(changed.new_round(), 1);
  EXPECT_THAT(changed.detail(), HasSubstr("host-c"));
  EXPECT_EQ(JobStatus().restart_count(), 0);
  EXPECT_EQ(state_.Heartbeat({job_, "c"}, SecretOf("c"), At(5'001)).status().code(),
            absl::StatusCode::kNotFound);

  Join({"a"}, At(5'100));
  auto assigned = Assigned(Join({"b"}, At(5'200)));
  ASSERT_THAT(Keys(assigned), ElementsAre("a", "b"));
  EXPECT_EQ(assigned.at("a").world_size(), 2);
}

TEST_F(StateTest, LostNodeBelowMinWaitsThenJoinTimeoutNamesIt) {
  Form({{"a"}, {"b"}}, At(0));
  Beat({"a"}, At(4'000));
  Advance(At(kHeartbeatMs));  // b is lost; a is told to rejoin
  Join({"a"}, At(6'000));
  EXPECT_TRUE(Advance(At(6'000 + kJoinTimeoutMs - 1)).empty());
  EXPECT_EQ(JobStatus().state(), "open");

  Effects closed = Advance(At(6'000 + kJoinTimeoutMs));
  const JobClosed event = Pushed(closed)["a"].at(0).job_closed();
  EXPECT_FALSE(event.succeeded());
  EXPECT_THAT(event.reason(), AllOf(HasSubstr("join timeout"), HasSubstr("host-b (lost)")));
  absl::Status join = JoinFailed(closed).at("a");
  EXPECT_EQ(join.code(), absl::StatusCode::kDeadlineExceeded) << join;
  EXPECT_THAT(join.message(), HasSubstr("host-b"));
}

TEST_F(StateTest, JoinTimeoutWithTooFewNodesFailsPendingJoins) {
  config_ = Config(3, 3);
  Join({"a"}, At(0));
  Join({"b"}, At(1'000));
  ASSERT_EQ(state_.NextDeadline(), At(kJoinTimeoutMs));
  EXPECT_TRUE(Advance(At(kJoinTimeoutMs - 1)).join_failed.empty());
  Effects closed = Advance(At(kJoinTimeoutMs));
  auto failed = JoinFailed(closed);
  ASSERT_EQ(failed.size(), 2u);
  for (const auto& [id, status] : failed) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << id << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("2 of at least 3")) << id;
  }
  EXPECT_EQ(JobStatus().state(), "closed");
  Effects effects;
  EXPECT_EQ(TryJoin({"c"}, At(kJoinTimeoutMs + 1), &effects).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StateTest, JoinTimeoutDoesNotCloseAJobThatReachedMinDuringLastCall) {
  config_ = Config(2, 4);
  config_.set_last_call_timeout_ms(30'000);
  config_.set_join_timeout_ms(10'000);
  Join({"a"}, At(0));
  Join({"b"}, At(5'000));  // min reached; the last call runs to 35 s
  Effects at_join_timeout = Advance(At(10'000));
  EXPECT_TRUE(at_join_timeout.pushed.empty());
  EXPECT_TRUE(at_join_timeout.join_failed.empty());
  EXPECT_EQ(JobStatus().state(), "open");
  EXPECT_THAT(Keys(Assigned(Advance(At(35'000)))), ElementsAre("a", "b"));
}

TEST_F(StateTest, PendingJoinIsNotTimedOutByTheHeartbeatTimer) {
  // An agent only heartbeats once it is in the job: a node waiting for the
  // others (here 30 s, six heartbeat timeouts) must not be dropped.
  Join({"a"}, At(0));
  Effects waited = Advance(At(6 * kHeartbeatMs));
  EXPECT_TRUE(waited.join_failed.empty());
  EXPECT_THAT(Keys(Assigned(Join({"b"}, At(6 * kHeartbeatMs)))), ElementsAre("a", "b"));
}

TEST_F(StateTest, NodeWaitingForAFullRoundIsNotTimedOut) {
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(0));
  for (int64_t t = 4'000; t <= 20'000; t += 4'000) Beat({"a", "b"}, At(t));
  Effects effects = Advance(At(20'001));
  EXPECT_TRUE(effects.join_failed.empty());
  EXPECT_EQ(JobStatus().waiting(), 1);
}

TEST_F(StateTest, FinishedNodeThatGoesSilentDoesNotRestartTheOthers) {
  // A finished agent exits and stops heartbeating; the rest keep running.
  Form({{"a"}, {"b"}}, At(0));
  Done("a", 0, At(1'000));
  for (int64_t t = 4'000; t <= 20'000; t += 4'000) {
    Beat({"b"}, At(t));
    EXPECT_TRUE(Advance(At(t)).pushed.empty()) << t;
  }
  Effects closed = Done("b", 0, At(21'000));
  EXPECT_TRUE(Pushed(closed)["b"].at(0).job_closed().succeeded());
}

TEST_F(StateTest, LosingARunningNodeAfterAnotherFinishedClosesTheJob) {
  Form({{"a"}, {"b"}}, At(0));
  Done("a", 0, At(1'000));
  Effects closed = Leave("b", At(2'000), "killed");
  const JobClosed event = Pushed(closed)["a"].at(0).job_closed();
  EXPECT_FALSE(event.succeeded());
  EXPECT_THAT(event.reason(), AllOf(HasSubstr("host-b"), HasSubstr("killed")));
}

// ---------------------------------------------------------------- config and jobs

TEST_F(StateTest, ConfigMismatchIsRefusedNamingBothConfigs) {
  config_ = Config(2, 4, 3);
  Join({"a"}, At(0));
  for (const JobConfig& other : {Config(2, 3, 3), Config(1, 4, 3), Config(2, 4, 5)}) {
    config_ = other;
    Effects effects;
    absl::Status status = TryJoin({"b"}, At(1), &effects);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("--nnodes 2:4 --max-restarts 3"),
                      HasSubstr(absl::StrCat("--nnodes ", other.min_nodes(), ":", other.max_nodes(),
                                             " --max-restarts ", other.max_restarts()))));
    EXPECT_TRUE(effects.assigned.empty());
  }
  EXPECT_EQ(JobStatus().participants(), 1);
  EXPECT_EQ(JobStatus().config().max_nodes(), 4);
}

TEST_F(StateTest, JobsWithDifferentIdsAreIndependent) {
  job_ = "one";
  config_ = Config(1, 1, 0);
  EXPECT_THAT(Keys(Assigned(Join({"a"}, At(0)))), ElementsAre("a"));
  job_ = "two";
  config_ = Config(2, 2, 5);  // a different config is fine under another id
  Join({"a"}, At(0));

  job_ = "one";
  Effects closed = Fail("a", 0, At(10));
  for (const auto& [key, event] : closed.pushed) EXPECT_EQ(key.job_id, "one");
  EXPECT_EQ(JobStatus().state(), "closed");

  job_ = "two";
  EXPECT_EQ(JobStatus().state(), "open");
  EXPECT_THAT(Keys(Assigned(Join({"b"}, At(20)))), ElementsAre("a", "b"));
  EXPECT_EQ(state_.job_count(), 2u);
}

// ---------------------------------------------------------------- deadlines

TEST_F(StateTest, NextDeadlineIsTheEarliestTimer) {
  EXPECT_EQ(state_.NextDeadline(), std::nullopt);
  config_ = Config(3, 4);
  Join({"a"}, At(0));
  EXPECT_EQ(state_.NextDeadline(), At(kJoinTimeoutMs));  // joins don't need heartbeats
  Join({"b"}, At(0));
  Join({"c"}, At(500));
  EXPECT_EQ(state_.NextDeadline(), At(500 + kLastCallMs));
  Advance(At(500 + kLastCallMs));
  // Running: the heartbeat timer, counted from the round's start.
  EXPECT_EQ(state_.NextDeadline(), At(500 + kLastCallMs + kHeartbeatMs));
  Beat({"a", "b", "c"}, At(3'000));
  EXPECT_EQ(state_.NextDeadline(), At(3'000 + kHeartbeatMs));
}

TEST_F(StateTest, NextDeadlineIsNoneWhileEveryNodeWatchesAndOnlyRetentionForClosedJobs) {
  config_ = Config(1, 1);
  Join({"a"}, At(0));  // round complete: a's heartbeat timer runs
  EXPECT_EQ(state_.NextDeadline(), At(kHeartbeatMs));
  Effects effects;
  state_.SetWatching({job_, "a"}, true, At(0), &effects);  // the stream is its heartbeat
  EXPECT_EQ(state_.NextDeadline(), std::nullopt);
  config_ = Config(2, 2);
  job_ = "other";
  Join({"a"}, At(0));
  Advance(At(kJoinTimeoutMs));
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_EQ(state_.NextDeadline(), At(kJoinTimeoutMs) + kClosedJobRetention);
}

// Advance(t) must leave no deadline at or before t, or the server's timer spins.
TEST_F(StateTest, NextDeadlineIsAfterNowOnceAdvanced) {
  config_ = Config(2, 3);
  config_.set_last_call_timeout_ms(30'000);
  config_.set_join_timeout_ms(10'000);
  auto check = [this](int64_t ms) {
    Advance(At(ms));
    std::optional<absl::Time> next = state_.NextDeadline();
    if (next) {
      EXPECT_GT(*next, At(ms)) << "at " << ms << " ms";
    }
  };
  Join({"a"}, At(0));
  check(1'000);
  Join({"b"}, At(2'000));  // last call to 32 s, beyond the join timeout
  check(10'000);
  check(12'000);
  check(32'000);
  Done("a", 0, At(33'000));
  check(60'000);  // a silent after finishing, b silent: b is lost
  check(120'000);
}

TEST_F(StateTest, ClosedJobIsForgottenAfterRetentionAndItsIdCanBeUsedAgain) {
  config_ = Config(1, 1);
  Join({"a"}, At(0));
  Done("a", 0, At(1));
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_EQ(state_.NextDeadline(), At(1) + kClosedJobRetention);
  Advance(At(1) + kClosedJobRetention - absl::Milliseconds(1));
  EXPECT_EQ(state_.job_count(), 1u);
  Effects forgotten;
  state_.Advance(At(1) + kClosedJobRetention, &forgotten);
  EXPECT_EQ(state_.job_count(), 0u);
  EXPECT_THAT(forgotten.log, Contains(HasSubstr("forgotten")));
  Effects again;
  EXPECT_TRUE(TryJoin({"b"}, At(1) + kClosedJobRetention + absl::Seconds(1), &again).ok());
  EXPECT_EQ(again.assigned.size(), 1u);
}

// ---------------------------------------------------------------- catch-up and leave

TEST_F(StateTest, CatchUpReturnsTheEventANodeMissed) {
  Form({{"a"}, {"b"}}, At(0));
  absl::StatusOr<std::optional<WatchEvent>> current = state_.CatchUp({job_, "a"}, SecretOf("a"), 0);
  ASSERT_TRUE(current.ok());
  EXPECT_FALSE(current->has_value());

  Fail("b", 0, At(100), /*rank=*/1);
  absl::StatusOr<std::optional<WatchEvent>> missed = state_.CatchUp({job_, "a"}, SecretOf("a"), 0);
  ASSERT_TRUE(missed.ok() && missed->has_value());
  EXPECT_EQ((*missed)->round_changed().new_round(), 1);
  EXPECT_EQ((*missed)->round_changed().reason(), RoundChanged::WORKER_FAILED);
  EXPECT_FALSE(state_.CatchUp({job_, "a"}, SecretOf("a"), 1)->has_value());

  EXPECT_EQ(state_.CatchUp({job_, "nobody"}, SecretOf("nobody"), 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.CatchUp({"nojob", "a"}, SecretOf("a"), 0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StateTest, CatchUpAfterCloseReturnsJobClosed) {
  Form({{"a"}, {"b"}}, At(0));
  Done("a", 0, At(1));
  Done("b", 0, At(2));
  absl::StatusOr<std::optional<WatchEvent>> missed = state_.CatchUp({job_, "a"}, SecretOf("a"), 0);
  ASSERT_TRUE(missed.ok() && missed->has_value());
  EXPECT_TRUE((*missed)->job_closed().succeeded());
}

TEST_F(StateTest, LeaveReformsTheRoundWithoutUsingARestart) {
  config_ = Config(1, 2);
  Form({{"a"}, {"b"}}, At(0));
  Effects left = Leave("b", At(100), "agent stopped by SIGTERM");
  auto pushed = Pushed(left);
  ASSERT_EQ(pushed.size(), 1u);
  const RoundChanged& changed = pushed["a"].at(0).round_changed();
  EXPECT_EQ(changed.reason(), RoundChanged::NODE_LOST);
  EXPECT_THAT(changed.detail(), AllOf(HasSubstr("host-b"), HasSubstr("SIGTERM")));
  auto assigned = Assigned(Join({"a"}, At(200)));
  EXPECT_EQ(assigned.at("a").restart_count(), 0);
  EXPECT_EQ(assigned.at("a").world_size(), 1);
}

TEST_F(StateTest, LastNodeLeavingClosesTheJob) {
  config_ = Config(1, 1);
  Join({"a"}, At(0));
  Effects closed = Leave("a", At(100));
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_TRUE(closed.pushed.empty()) << "the node that left is not told";
  absl::StatusOr<std::optional<WatchEvent>> event = state_.CatchUp({job_, "a"}, SecretOf("a"), 0);
  ASSERT_TRUE(event.ok() && event->has_value());
  EXPECT_FALSE((*event)->job_closed().succeeded());
  EXPECT_THAT((*event)->job_closed().reason(), HasSubstr("no nodes left"));
  // Leaving a closed job, or twice, is not an error.
  Effects again;
  EXPECT_TRUE(state_.Leave({job_, "a"}, SecretOf("a"), "", At(200), &again).ok());
}

TEST_F(StateTest, LeaveOfAnUnknownNodeIsNotFound) {
  Join({"a"}, At(0));
  Effects effects;
  EXPECT_EQ(state_.Leave({job_, "b"}, SecretOf("b"), "", At(1), &effects).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Leave({"nojob", "a"}, SecretOf("a"), "", At(1), &effects).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Status("nojob").status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------- node secrets

TEST_F(StateTest, EveryNodeGetsTheSecretTheServerDrewAndKeepsItAcrossRounds) {
  auto assigned = Form({{"a"}, {"b"}}, At(0));
  EXPECT_EQ(assigned.at("a").node_secret(), SecretOf("a"));
  EXPECT_EQ(assigned.at("b").node_secret(), SecretOf("b"));
  Fail("a", 0, At(100));
  // The server draws a new secret for every join; a live node keeps its own.
  Effects effects;
  ASSERT_TRUE(state_.Join(Request({"a"}), PeerOf("a"), "fresh-a", At(200), &effects).ok());
  ASSERT_TRUE(state_.Join(Request({"b"}), PeerOf("b"), "fresh-b", At(200), &effects).ok());
  auto again = Assigned(effects);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again.at("a").node_secret(), SecretOf("a"));
  EXPECT_EQ(again.at("b").node_secret(), SecretOf("b"));
}

TEST_F(StateTest, JoinForALiveNodeWithoutItsSecretIsRefusedAndChangesNothing) {
  Form({{"a"}, {"b"}}, At(0));
  for (const std::string& presented :
       {std::string(), std::string("secret-b"), std::string("secret-a-but-longer")}) {
    JoinRequest impostor = Request({"a"});
    impostor.set_node_secret(presented);
    impostor.mutable_node()->set_host("elsewhere");
    Effects effects;
    absl::Status status = state_.Join(impostor, "peer-x", "fresh", At(100), &effects);
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << presented;
    EXPECT_THAT(status.message(), AllOf(HasSubstr("node id a is held by another agent"),
                                        HasSubstr("a node speaks only for itself")));
    EXPECT_TRUE(effects.empty());
  }
  const StatusResponse status = JobStatus();
  EXPECT_EQ(status.state(), "running");
  EXPECT_EQ(status.round(), 0);
  EXPECT_EQ(status.waiting(), 0);
  Beat({"a", "b"}, At(200));  // the real a is still a, with its secret
}

TEST_F(StateTest, CallsForANodeWithoutItsSecretAreRefusedAndChangeNothing) {
  Form({{"a"}, {"b"}}, At(0));
  const NodeKey a{job_, "a"};
  Effects effects;
  auto denied = [](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
    EXPECT_THAT(status.message(), HasSubstr("a node speaks only for itself"));
  };
  for (const std::string& wrong : {std::string(), SecretOf("b")}) {
    denied(state_.Heartbeat(a, wrong, At(100)).status());
    denied(state_.ReportFailure(a, wrong, 0, MakeFailure("a", 0), At(100), &effects));
    denied(state_.ReportDone(a, wrong, 0, At(100), &effects));
    denied(state_.Leave(a, wrong, "bye", At(100), &effects));
    denied(state_.CatchUp(a, wrong, 0).status());
  }
  EXPECT_TRUE(effects.empty());
  const StatusResponse status = JobStatus();
  EXPECT_EQ(status.state(), "running");
  EXPECT_EQ(status.round(), 0);
  EXPECT_EQ(status.restart_count(), 0);
  EXPECT_EQ(status.participants(), 2);
  // Nor does a wrong heartbeat keep the node alive.
  Beat({"b"}, At(kHeartbeatMs - 1));
  Effects expired = Advance(At(kHeartbeatMs));
  EXPECT_THAT(Pushed(expired), Contains(testing::Key("b")));
  EXPECT_EQ(JobStatus().round(), 1);
}

TEST_F(StateTest, NodeThatLeftAndJoinsAgainGetsAFreshSecret) {
  Form({{"a"}, {"b"}}, At(0));
  Leave("b", At(10));
  Effects effects;
  // b presents its old secret: it is not live any more, so the server's new one counts.
  ASSERT_TRUE(state_.Join(Request({"b"}), PeerOf("b"), "new-b", At(20), &effects).ok());
  auto assigned = Assigned(Join({"a"}, At(30)));
  ASSERT_EQ(assigned.size(), 2u);
  EXPECT_EQ(assigned.at("b").node_secret(), "new-b");
  EXPECT_EQ(state_.Heartbeat({job_, "b"}, SecretOf("b"), At(40)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(state_.Heartbeat({job_, "b"}, "new-b", At(40)).ok());
}

TEST_F(StateTest, ANodeNoLongerInAClosedJobLearnsWhyButNotTheWorkersMessage) {
  config_ = Config(2, 2, /*max_restarts=*/0);
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(10));  // closes: no restarts
  absl::StatusOr<std::optional<WatchEvent>> member = state_.CatchUp({job_, "a"}, SecretOf("a"), 0);
  ASSERT_TRUE(member.ok() && member->has_value());
  EXPECT_EQ((*member)->job_closed().root_cause().message(), "boom");
  absl::StatusOr<std::optional<WatchEvent>> stranger = state_.CatchUp({job_, "stranger"}, "", 0);
  ASSERT_TRUE(stranger.ok() && stranger->has_value());
  EXPECT_THAT((*stranger)->job_closed().reason(), HasSubstr("no restarts left"));
  EXPECT_EQ((*stranger)->job_closed().root_cause().message(), "");
  EXPECT_EQ(state_.CatchUp({job_, "a"}, "wrong", 0).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// ---------------------------------------------------------------- seats

// min = max = 2: a spare that waited while the round ran must not take the
// seat of a member rejoining after a failure.
TEST_F(StateTest, SpareNeverTakesTheSeatOfAMemberRejoiningARestartRound) {
  auto first = Form({{"a"}, {"b"}}, At(0));
  EXPECT_THAT(Assigned(Join({"c"}, At(10))), IsEmpty());  // full: c waits
  Effects failed = Fail("b", 0, At(20));
  EXPECT_THAT(Assigned(failed), IsEmpty()) << "c must not fill the round with whoever comes first";
  EXPECT_THAT(Assigned(Join({"a"}, At(30))), IsEmpty());
  auto second = Assigned(Join({"b"}, At(40)));
  EXPECT_THAT(Keys(second), ElementsAre("a", "b"));
  for (const std::string id : {"a", "b"}) {
    EXPECT_EQ(second.at(id).group_rank(), first.at(id).group_rank()) << id;
    EXPECT_EQ(second.at(id).round(), 1);
  }
  EXPECT_EQ(JobStatus().waiting(), 1);  // c still waits for a free seat
}

TEST_F(StateTest, NewcomerDuringARestartRoundWaitsForTheMembers) {
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(10));
  EXPECT_THAT(Assigned(Join({"c"}, At(20))), IsEmpty());  // both seats are held
  EXPECT_THAT(Assigned(Join({"a"}, At(30))), IsEmpty());
  EXPECT_THAT(Keys(Assigned(Join({"b"}, At(40)))), ElementsAre("a", "b"));
}

TEST_F(StateTest, MemberGoneFromARestartRoundFreesItsSeatForASpare) {
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(10));  // waits
  Fail("a", 0, At(20));
  EXPECT_THAT(Assigned(Join({"b"}, At(30))), IsEmpty());
  Effects left = Leave("a", At(40));
  EXPECT_THAT(Keys(Assigned(left)), ElementsAre("b", "c"));
}

// Elastic, 2:3, full: the members get their seats back; a spare gets only
// the seat of a member that is not back by the last call.
TEST_F(StateTest, ElasticRestartSeatsMembersFirstAndSparesInWhatIsLeft) {
  config_ = Config(2, 3);
  auto first = Form({{"a"}, {"b"}, {"c"}}, At(0));
  ASSERT_EQ(first.size(), 3u);
  Join({"d"}, At(10));  // full: d waits
  Fail("c", 0, At(20));
  EXPECT_THAT(Assigned(Join({"a"}, At(30))), IsEmpty());
  EXPECT_THAT(Assigned(Join({"b"}, At(30))), IsEmpty());  // at min: the last call runs
  auto second = Assigned(Join({"c"}, At(500)));
  EXPECT_THAT(Keys(second), ElementsAre("a", "b", "c"));
  for (const auto& [id, a] : second) EXPECT_EQ(a.group_rank(), first.at(id).group_rank()) << id;

  // Next failure: c does not come back by the last call; d takes its seat.
  Fail("a", 1, At(1'000));
  Join({"a"}, At(1'100));
  Join({"b"}, At(1'100));
  EXPECT_THAT(Assigned(Advance(At(1'100 + kLastCallMs - 1))), IsEmpty());
  auto third = Assigned(Advance(At(1'100 + kLastCallMs)));
  EXPECT_THAT(Keys(third), ElementsAre("a", "b", "d"));
}

// ---------------------------------------------------------------- protocol and field limits

TEST_F(StateTest, JoinOfAnotherProtocolVersionIsRefusedNamingBothVersions) {
  for (int version : {0, kProtocolVersion + 1}) {
    JoinRequest request = Request({"a"});
    request.set_protocol_version(version);
    Effects effects;
    absl::Status status = state_.Join(request, "peer", "s", At(0), &effects);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), AllOf(HasSubstr(absl::StrCat("version ", version)),
                                        HasSubstr(absl::StrCat("version ", kProtocolVersion)),
                                        HasSubstr("same muster version on every node")));
  }
  EXPECT_EQ(state_.job_count(), 0u);
}

TEST_F(StateTest, JoinFieldsBeyondTheirBoundsAreRefusedNamingFieldAndBound) {
  struct Case {
    std::function<void(JoinRequest*)> change;
    std::vector<std::string> said;
  };
  const std::vector<Case> cases = {
      {[](JoinRequest* r) { r->mutable_node()->set_host(std::string(256, 'h')); }, {"host", "255"}},
      {[](JoinRequest* r) { r->mutable_node()->set_host("evil\nhost"); },
       {"host", "control character"}},
      {[](JoinRequest* r) { r->mutable_node()->set_advertised_addr(std::string(256, '1')); },
       {"advertised address", "255"}},
      {[](JoinRequest* r) { r->mutable_node()->set_advertised_addr("10.0.0.1\r"); },
       {"advertised address", "control character"}},
      {[](JoinRequest* r) { r->mutable_node()->set_node_id(std::string(513, 'n')); },
       {"node id", "512"}},
      {[](JoinRequest* r) { r->mutable_node()->set_node_id(""); }, {"node id", "1..512"}},
      {[](JoinRequest* r) { r->set_node_secret(std::string(129, 's')); }, {"secret", "128"}},
      {[](JoinRequest* r) { r->mutable_node()->set_local_world_size(0); },
       {"local_world_size", "65536"}},
      {[](JoinRequest* r) { r->mutable_node()->set_local_world_size(65537); },
       {"local_world_size", "65536"}},
      {[](JoinRequest* r) { r->mutable_node()->set_master_port_candidate(65536); },
       {"master_port_candidate", "65535"}},
      {[](JoinRequest* r) { r->mutable_node()->set_master_port_candidate(-1); },
       {"master_port_candidate", "0 for none"}},
      {[](JoinRequest* r) { r->mutable_node()->set_peer_port(65536); }, {"peer_port", "65535"}},
      {[](JoinRequest* r) { r->mutable_node()->set_peer_port(-1); }, {"peer_port", "0 for none"}},
      {[](JoinRequest* r) { r->set_join_key(std::string(129, 'k')); }, {"join key", "128"}},
      {[](JoinRequest* r) { r->mutable_config()->set_heartbeat_timeout_ms(0); },
       {"heartbeat_timeout"}},
  };
  for (const Case& c : cases) {
    JoinRequest request = Request({"a"});
    c.change(&request);
    Effects effects;
    absl::Status status = state_.Join(request, "peer", "s", At(0), &effects);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.said[0];
    for (const std::string& word : c.said) EXPECT_THAT(status.message(), HasSubstr(word));
  }
  EXPECT_EQ(state_.job_count(), 0u);
  JoinRequest edge = Request(Spec("a").Lws(65536).Port(0).Host(std::string(255, 'h')));
  Effects effects;
  EXPECT_TRUE(state_.Join(edge, "peer", "s", At(0), &effects).ok());
}

TEST_F(StateTest, JobWhoseWorldSizeWouldNotFitInt32IsRefused) {
  config_ = Config(65536, 65536);
  Effects effects;
  // 32767 nodes of 65536 workers: 2^31 - 65536; one more would be 2^31.
  for (int i = 0; i < 32767; ++i) {
    ASSERT_TRUE(TryJoin(Spec(absl::StrCat("n", i).c_str()).Lws(65536), At(0), &effects).ok()) << i;
  }
  absl::Status status = TryJoin(Spec("last").Lws(65536), At(0), &effects);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("2147483648 workers"), HasSubstr("2147483647")));
  EXPECT_TRUE(TryJoin(Spec("small").Lws(65535), At(0), &effects).ok());
}

TEST_F(StateTest, LongFailureMessageIsCutNotRefused) {
  config_ = Config(2, 2, /*max_restarts=*/0);
  Form({{"a"}, {"b"}}, At(0));
  Failure failure = MakeFailure("a", 0);
  const std::string traceback = "Traceback (most recent call last):\n" + std::string(1 << 20, 'x');
  failure.set_message(traceback);
  Effects effects;
  ASSERT_TRUE(state_.ReportFailure({job_, "a"}, SecretOf("a"), 0, failure, At(10), &effects).ok());
  auto pushed = Pushed(effects);
  ASSERT_EQ(pushed["b"].size(), 1u);
  const std::string& kept = pushed["b"][0].job_closed().root_cause().message();
  EXPECT_LE(kept.size(), kMaxFailureMessageBytes);
  EXPECT_GT(kept.size(), kMaxFailureMessageBytes - 100);
  EXPECT_EQ(kept.substr(0, 35), traceback.substr(0, 35));
  EXPECT_THAT(kept, testing::EndsWith(" bytes]"));
  EXPECT_THAT(kept, HasSubstr("... [cut: "));
}

// What a node sends comes back to the others bounded, with no control
// character to forge a log line.
TEST_F(StateTest, TextsTheServerBuildsFromClientInputAreBounded) {
  Form({{"a"}, {"b"}}, At(0));
  Effects left = Leave("b", At(10), "line one\nforged log line" + std::string(1 << 20, 'r'));
  auto pushed = Pushed(left);
  ASSERT_EQ(pushed["a"].size(), 1u);
  const std::string& detail = pushed["a"][0].round_changed().detail();
  EXPECT_LE(detail.size(), kMaxDetailBytes);
  EXPECT_THAT(detail, Not(HasSubstr("\n")));
  EXPECT_THAT(detail, HasSubstr("line one?forged"));
  for (const std::string& line : left.log) EXPECT_LE(line.size(), kMaxDetailBytes + 256);

  // A join timeout naming many missing hosts names 16 and counts the rest.
  config_ = Config(100, 100);
  job_ = "big";
  for (int i = 0; i < 99; ++i) {
    Join(Spec(absl::StrCat("n", i).c_str()).Host(absl::StrCat(std::string(250, 'h'), i)), At(0));
  }
  for (int i = 1; i < 99; ++i) Leave(absl::StrCat("n", i), At(1));
  Effects timed_out = Advance(At(kJoinTimeoutMs));
  ASSERT_EQ(timed_out.join_failed.size(), 1u);
  const std::string message(timed_out.join_failed[0].second.message());
  EXPECT_LE(message.size(), kMaxDetailBytes + 300);
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_LE(JobStatus().ByteSizeLong(), 8'000u);
}

// ---------------------------------------------------------------- job lifetime and count

TEST_F(StateTest, JobWithNoNodeIsForgottenAfterItsJoinTimeout) {
  Join({"a"}, At(0));
  Effects effects;
  state_.CancelJoin({job_, "a"}, At(1'000), &effects);
  EXPECT_EQ(state_.job_count(), 1u);
  EXPECT_EQ(state_.NextDeadline(), At(1'000 + kJoinTimeoutMs));
  Advance(At(1'000 + kJoinTimeoutMs - 1));
  EXPECT_EQ(state_.job_count(), 1u);
  Effects forgotten = Advance(At(1'000 + kJoinTimeoutMs));
  EXPECT_EQ(state_.job_count(), 0u);
  EXPECT_EQ(state_.open_job_count(), 0u);
  EXPECT_THAT(forgotten.log, Contains(HasSubstr("forgotten: no node in it")));
  EXPECT_EQ(state_.NextDeadline(), std::nullopt);
}

TEST_F(StateTest, EmptyJobIsForgottenAfterMaxJoinTimeoutWhateverTheClientAsks) {
  StateOptions options;
  options.max_join_timeout = absl::Seconds(10);
  RendezvousState state(options);
  config_.set_join_timeout_ms(kMaxTimeoutMs);  // 7 days asked
  Effects effects;
  ASSERT_TRUE(state.Join(Request({"a"}), "peer", "s", At(0), &effects).ok());
  state.CancelJoin({job_, "a"}, At(0), &effects);
  EXPECT_EQ(state.NextDeadline(), At(10'000));
  state.Advance(At(9'999), &effects);
  EXPECT_EQ(state.job_count(), 1u);
  state.Advance(At(10'000), &effects);
  EXPECT_EQ(state.job_count(), 0u);
}

TEST_F(StateTest, JobWithLiveNodesIsNotForgotten) {
  config_ = Config(1, 2);
  Join({"a"}, At(0));
  Effects effects;
  state_.SetWatching({job_, "a"}, true, At(0), &effects);
  Advance(At(kJoinTimeoutMs * 10));
  EXPECT_EQ(state_.job_count(), 1u);
  EXPECT_EQ(JobStatus().state(), "running");
}

// 10,000 jobs, each opened by a join its caller cancelled at once: the most
// the server holds; one more is refused; all are gone after their timeout.
TEST_F(StateTest, TenThousandJunkJobsAreRefusedBeyondMaxJobsAndForgotten) {
  Effects effects;
  for (int i = 0; i < 10'000; ++i) {
    job_ = absl::StrCat("junk-", i);
    ASSERT_TRUE(TryJoin({"x"}, At(0), &effects).ok()) << i;
    state_.CancelJoin({job_, "x"}, At(0), &effects);
  }
  EXPECT_EQ(state_.open_job_count(), 10'000u);
  job_ = "one-more";
  absl::Status refused = TryJoin({"x"}, At(1), &effects);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("holds 10000 open jobs"), HasSubstr("musterd --max-jobs")));
  job_ = "junk-7";  // an open job takes joins still
  EXPECT_TRUE(TryJoin({"y"}, At(1), &effects).ok());
  Effects forgotten = Advance(At(kJoinTimeoutMs));
  EXPECT_EQ(state_.job_count(), 1u);  // junk-7 has a node again
  EXPECT_LE(forgotten.log.size(), 10u) << "one line per forgotten job floods the log";
  job_ = "one-more";
  Effects created;
  EXPECT_TRUE(TryJoin({"x"}, At(kJoinTimeoutMs), &created).ok());
  // A second later, the next line of the kind says how many were left out.
  state_.CancelJoin({job_, "x"}, At(kJoinTimeoutMs), &created);
  Effects later = Advance(At(2 * kJoinTimeoutMs + 1000));
  EXPECT_THAT(later.log, Contains(HasSubstr("(and 9989 more 'forgotten' lines left out")));
}

TEST_F(StateTest, MaxJobsCountsOnlyOpenJobs) {
  StateOptions options;
  options.max_jobs = 2;
  RendezvousState state(options);
  config_ = Config(1, 1);
  Effects effects;
  auto join = [&](const std::string& job) {
    job_ = job;
    return state.Join(Request({"a"}), "peer", "s", At(0), &effects);
  };
  ASSERT_TRUE(join("one").ok());
  ASSERT_TRUE(join("two").ok());
  absl::Status refused = join("three");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("holds 2 open jobs"), HasSubstr("(musterd --max-jobs 2)")));
  ASSERT_TRUE(state.ReportDone({"one", "a"}, "s", 0, At(1), &effects).ok());  // closed
  EXPECT_EQ(state.open_job_count(), 1u);
  EXPECT_TRUE(join("three").ok());
}

TEST_F(StateTest, ClosedJobsBeyondMaxClosedJobsAreForgottenLongestClosedFirst) {
  StateOptions options;
  options.max_closed_jobs = 3;
  RendezvousState state(options);
  config_ = Config(1, 1);
  Effects effects;
  for (int i = 0; i < 5; ++i) {
    job_ = absl::StrCat("done-", i);
    ASSERT_TRUE(state.Join(Request({"a"}), "peer", "s", At(i), &effects).ok()) << i;
    ASSERT_TRUE(state.ReportDone({job_, "a"}, "s", 0, At(i), &effects).ok()) << i;
  }
  // Trimmed as a new job comes (done-0 as done-4 came) and as time passes
  // (done-1): never more than 3 kept.
  Effects later;
  state.Advance(At(10), &later);
  EXPECT_EQ(state.job_count(), 3u);
  EXPECT_THAT(later.log, Contains(HasSubstr("1 closed job(s) forgotten early: the rendezvous keeps "
                                            "at most 3 closed jobs")));
  EXPECT_TRUE(absl::IsNotFound(state.Status("done-0").status()));
  EXPECT_TRUE(absl::IsNotFound(state.Status("done-1").status()));
  for (const char* kept : {"done-2", "done-3", "done-4"}) {
    EXPECT_TRUE(state.Status(kept).ok()) << kept;
  }
  // An id used again after it was forgotten is a new job, and its close is
  // counted once.
  job_ = "done-0";
  ASSERT_TRUE(state.Join(Request({"a"}), "peer", "s", At(11), &effects).ok());
  ASSERT_TRUE(state.ReportDone({job_, "a"}, "s", 0, At(11), &effects).ok());
  state.Advance(At(12), &effects);
  EXPECT_EQ(state.job_count(), 3u);
  EXPECT_TRUE(state.Status("done-0").ok());
  EXPECT_TRUE(absl::IsNotFound(state.Status("done-2").status()));
}

// ---------------------------------------------------------------- on etcd

class ExternalLivenessTest : public StateTest {
 protected:
  ExternalLivenessTest() : StateTest(Options()) {}
  static StateOptions Options() {
    StateOptions options;
    options.external_liveness = true;
    return options;
  }
};

TEST_F(ExternalLivenessTest, NoNodeIsDroppedForSilenceWhenLivenessIsKnownElsewhere) {
  Form({"a", "b"}, At(0));
  EXPECT_EQ(state_.NextDeadline(), std::nullopt);
  EXPECT_TRUE(Advance(At(10 * kHeartbeatMs)).pushed.empty());
  EXPECT_EQ(JobStatus().participants(), 2);
}

TEST_F(ExternalLivenessTest, ADroppedNodeLeavesAsALostOneDoes) {
  config_ = Config(1, 2);
  Form({"a", "b"}, At(0));
  Effects effects;
  state_.DropNode({job_, "b"}, "lost: its etcd lease ended", At(100), &effects);
  auto pushed = Pushed(effects);
  ASSERT_THAT(pushed["a"], ::testing::SizeIs(1));
  EXPECT_EQ(pushed["a"][0].round_changed().reason(), RoundChanged::NODE_LOST);
  EXPECT_EQ(pushed["a"][0].round_changed().detail(), "node host-b lost: its etcd lease ended");
  EXPECT_EQ(JobStatus().restart_count(), 0) << "a lost node uses no restart";
  Effects again;
  state_.DropNode({job_, "b"}, "twice", At(101), &again);
  state_.DropNode({"no-such-job", "b"}, "never there", At(101), &again);
  EXPECT_TRUE(again.empty());
}

TEST_F(StateTest, AssignmentOfGivesARunningRoundsAssignmentAgain) {
  std::map<std::string, Assignment> formed = Form({Spec("a").Lws(2), Spec("b").Lws(3)}, At(0));
  for (const char* node : {"a", "b"}) {
    std::optional<Assignment> again = state_.AssignmentOf({job_, node});
    ASSERT_TRUE(again.has_value()) << node;
    EXPECT_EQ(again->SerializeAsString(), formed[node].SerializeAsString()) << node;
  }
  EXPECT_EQ(state_.AssignmentOf({job_, "c"}), std::nullopt);
  Fail("a", 0, At(10));
  EXPECT_EQ(state_.AssignmentOf({job_, "a"}), std::nullopt) << "the round is open";
}

}  // namespace
}  // namespace muster::rdzv
