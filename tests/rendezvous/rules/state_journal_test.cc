// A restarted rendezvous continues every job where it was: the state
// machine's durable changes (Effects::journal), restored into a new state,
// give back rounds, ranks, secrets, restart counts and results, with the
// timers started afresh. Pure: the records go from one state to another in
// memory (the file is journal_test's).
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "rendezvous/rules/state.h"
#include "tests/rendezvous/rules/state_fixture.h"

namespace muster::rdzv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

StateOptions Journaled() {
  StateOptions options;
  options.journal = true;
  options.ride_out_outages = true;
  return options;
}

class DurableStateTest : public StateTest {
 protected:
  DurableStateTest() : StateTest(Journaled()) {}

  // Starts a new state from `records` at `now`, as musterd does when it
  // starts again; the test goes on with it.
  void RestartFrom(const std::vector<JournalRecord>& records, absl::Time now) {
    storage_.emplace(Journaled());
    for (const JournalRecord& record : records) {
      absl::Status restored = state_.Restore(record, now);
      EXPECT_TRUE(restored.ok()) << restored << "\n" << record.DebugString();
    }
  }
  // From every record the state has journalled so far.
  void Restart(absl::Time now) { RestartFrom(std::vector<JournalRecord>(journal_), now); }

  // The state's snapshot, each record serialized: equal strings, equal states.
  std::vector<std::string> SnapshotBytes() const {
    std::vector<std::string> out;
    for (const JournalRecord& record : state_.Snapshot()) out.push_back(record.SerializeAsString());
    return out;
  }

  absl::StatusOr<std::optional<WatchEvent>> CatchUp(const std::string& node, int64_t round) {
    return state_.CatchUp({job_, node}, SecretOf(node), round);
  }
};

TEST_F(StateTest, NothingIsJournalledUnlessAsked) {
  Form({"a", "b"}, At(0));
  Fail("a", 0, At(10));
  EXPECT_THAT(journal_, IsEmpty());
}

TEST_F(DurableStateTest, AssignmentsOfADaemonTellAgentsToRideOutItsOutages) {
  for (const auto& [node, assignment] : Form({"a", "b"}, At(0))) {
    EXPECT_TRUE(assignment.ride_out_outages()) << node;
  }
}

TEST_F(StateTest, AssignmentsOfAnAgentsRendezvousDoNot) {
  // Losing the agent that hosts it is losing its node.
  for (const auto& [node, assignment] : Form({"a", "b"}, At(0))) {
    EXPECT_FALSE(assignment.ride_out_outages()) << node;
  }
}

TEST_F(StateTest, AssignmentsOfAnAgentsRendezvousNameNoPeers) {
  for (const auto& [node, assignment] :
       Form({Spec("a").PeerPort(7), Spec("b").PeerPort(8)}, At(0))) {
    EXPECT_THAT(assignment.peers(), IsEmpty()) << node;
    EXPECT_EQ(assignment.peer_key(), "") << node;
  }
}

TEST_F(DurableStateTest, EachNodeOfASmallRoundIsToldEveryOtherAndTheRoundsKey) {
  config_ = Config(3, 3);
  std::map<std::string, Assignment> round =
      Form({Spec("a").PeerPort(7001).Addr("10.0.0.1"), Spec("b").PeerPort(7002),
            Spec("c").PeerPort(7003).Host("gpu-c")},
           At(0));
  ASSERT_EQ(round.size(), 3u);
  const std::string key = round["a"].peer_key();
  EXPECT_EQ(key.size(), 32u);
  std::map<std::string, std::string> seen;  // asker → the peers it is told, in order
  for (const auto& [node, assignment] : round) {
    EXPECT_EQ(assignment.peer_key(), key) << node;
    for (const Peer& peer : assignment.peers()) {
      EXPECT_NE(peer.node_id(), node);
      absl::StrAppend(&seen[node], peer.node_id(), "@", peer.host(), "/", peer.addr(), ":",
                      peer.port(), " ");
    }
  }
  // In group-rank order from each node (a, b, c joined in that order).
  EXPECT_EQ(seen["a"], "b@host-b/peer-b:7002 c@gpu-c/peer-c:7003 ");
  EXPECT_EQ(seen["b"], "c@gpu-c/peer-c:7003 a@host-a/10.0.0.1:7001 ");
  EXPECT_EQ(seen["c"], "a@host-a/10.0.0.1:7001 b@host-b/peer-b:7002 ");
}

TEST_F(DurableStateTest, TheNextRoundHasAnotherKeyAndARestoredStateTheSame) {
  config_ = Config(2, 2);
  std::map<std::string, Assignment> first = Form({"a", "b"}, At(0));
  Fail("a", 0, At(100));
  std::map<std::string, Assignment> second = Form({"a", "b"}, At(200));
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second["a"].round(), 1);
  EXPECT_EQ(second["a"].peer_key(), second["b"].peer_key());
  EXPECT_NE(second["a"].peer_key(), first["a"].peer_key());
  Restart(At(300));
  std::optional<Assignment> again = state_.AssignmentOf({job_, "b"});
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->peer_key(), second["b"].peer_key());
}

TEST_F(DurableStateTest, ALargeRoundNamesEightPeersSpreadAroundIt) {
  config_ = Config(20, 20);
  std::vector<std::string> names;
  for (int i = 0; i < 20; ++i) names.push_back(absl::StrCat("n", i));
  std::vector<Spec> nodes(names.begin(), names.end());
  std::map<std::string, Assignment> round = Form(nodes, At(0));
  ASSERT_EQ(round.size(), 20u);
  std::map<std::string, int> rank_of;
  for (const auto& [node, assignment] : round) rank_of[node] = assignment.group_rank();
  for (const auto& [node, assignment] : round) {
    ASSERT_EQ(assignment.peers_size(), kMaxPeers) << node;
    std::set<int> offsets;
    for (const Peer& peer : assignment.peers()) {
      offsets.insert((rank_of[peer.node_id()] - assignment.group_rank() + 20) % 20);
    }
    // 20 * k / 9 for k = 1..8: distinct, never 0 (itself).
    EXPECT_EQ(offsets, (std::set<int>{2, 4, 6, 8, 11, 13, 15, 17})) << node;
  }
}

TEST_F(DurableStateTest, ARunningRoundComesBackWithItsRanksSecretsAndRestartCount) {
  config_ = Config(2, 2, /*max_restarts=*/2);
  Form({Spec("a").Lws(2), Spec("b").Lws(4)}, At(0));
  Fail("a", 0, At(100));  // restart 1 of 2
  std::map<std::string, Assignment> before = Assigned(Join(Spec("a").Lws(2), At(200)));
  for (auto& [id, a] : Assigned(Join(Spec("b").Lws(4), At(210)))) before[id] = a;
  ASSERT_THAT(before, SizeIs(2));

  Restart(At(500'000));
  StatusResponse status = JobStatus();
  EXPECT_EQ(status.state(), "running");
  EXPECT_EQ(status.round(), 1);
  EXPECT_EQ(status.restart_count(), 1);
  EXPECT_EQ(status.participants(), 2);
  // Each node's secret is its own, as before.
  Beat({"a", "b"}, At(500'001));
  EXPECT_EQ(state_.Heartbeat({job_, "a"}, SecretOf("b"), At(500'002)).status().code(),
            absl::StatusCode::kPermissionDenied);
  // The round goes on where it was: the next failure is restart 2 of 2...
  auto pushed = Pushed(Fail("b", 1, At(500'100), /*rank=*/2));
  ASSERT_THAT(pushed["a"], SizeIs(1));
  EXPECT_EQ(pushed["a"][0].round_changed().new_round(), 2);
  EXPECT_THAT(pushed["a"][0].round_changed().detail(), HasSubstr("restart 2 of 2"));
  // ... and the nodes come back to the same ranks.
  std::map<std::string, Assignment> after = Assigned(Join(Spec("a").Lws(2), At(500'200)));
  for (auto& [id, a] : Assigned(Join(Spec("b").Lws(4), At(500'210)))) after[id] = a;
  ASSERT_THAT(after, SizeIs(2));
  for (const char* node : {"a", "b"}) {
    EXPECT_EQ(after[node].group_rank(), before[node].group_rank()) << node;
    EXPECT_EQ(after[node].rank_base(), before[node].rank_base()) << node;
    EXPECT_EQ(after[node].node_secret(), before[node].node_secret()) << node;
    EXPECT_EQ(after[node].restart_count(), 2) << node;
  }
  // The third failure finds no restart left.
  Effects closed = Fail("a", 2, At(500'300));
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_THAT(Pushed(closed)["b"][0].job_closed().reason(), HasSubstr("no restarts left"));
}

TEST_F(DurableStateTest, TheTimersStartAgainWhenTheStateIsRestored) {
  Form({"a", "b"}, At(0));
  const absl::Time restart = At(3'600'000);  // an hour later: every deadline long past
  Restart(restart);
  EXPECT_EQ(state_.NextDeadline(), restart + absl::Milliseconds(kHeartbeatMs));
  EXPECT_TRUE(Advance(restart + absl::Milliseconds(kHeartbeatMs - 1)).pushed.empty());
  EXPECT_EQ(JobStatus().participants(), 2);
  // Past the heartbeat timeout from the restart, a node that never came
  // back is dropped as any silent node is.
  Beat({"a"}, restart + absl::Milliseconds(kHeartbeatMs - 1));
  Effects lost = Advance(restart + absl::Milliseconds(kHeartbeatMs));
  ASSERT_THAT(Pushed(lost)["a"], SizeIs(1));
  EXPECT_THAT(Pushed(lost)["a"][0].round_changed().detail(), HasSubstr("node host-b silent"));
}

TEST_F(DurableStateTest, AnOpenRestartRoundWaitsForItsMembers) {
  Form({"a", "b"}, At(0));
  Fail("b", 0, At(100));
  Join("a", At(150));  // back before the restart; its pending join is lost with the server
  Restart(At(10'000));
  StatusResponse status = JobStatus();
  EXPECT_EQ(status.state(), "open");
  EXPECT_EQ(status.round(), 1);
  EXPECT_EQ(status.restart_count(), 1);
  EXPECT_EQ(status.participants(), 0) << "joins are not durable: their agents call again";
  EXPECT_EQ(status.missing_count(), 2);
  // A newcomer cannot take a member's seat while its members come back.
  EXPECT_THAT(Assigned(Join("a", At(10'100))), IsEmpty());
  std::map<std::string, Assignment> round = Assigned(Join("b", At(10'200)));
  ASSERT_THAT(round, SizeIs(2));
  EXPECT_EQ(round["a"].round(), 1);
  EXPECT_EQ(round["a"].group_rank(), 0);
  EXPECT_EQ(round["b"].group_rank(), 1);
}

TEST_F(DurableStateTest, ANodeThatJoinedButNeverHadItsAssignmentIsNotKept) {
  Join("a", At(0));  // round 0 never formed: no secret was ever given out
  Restart(At(1'000));
  EXPECT_EQ(state_.Status(job_).status().code(), absl::StatusCode::kNotFound);
  // Its agent calls again and is a newcomer, with a secret of its own.
  Join("a", At(1'100));
  EXPECT_THAT(Assigned(Join("b", At(1'200))), SizeIs(2));
}

TEST_F(DurableStateTest, AClosedJobStaysClosedWithItsRootCause) {
  config_ = Config(2, 2, /*max_restarts=*/0);
  Form({"a", "b"}, At(0));
  Fail("b", 0, At(100), /*rank=*/1);
  Restart(At(5'000));
  EXPECT_EQ(JobStatus().state(), "closed");
  absl::StatusOr<std::optional<WatchEvent>> missed = CatchUp("a", 0);
  ASSERT_TRUE(missed.ok()) << missed.status();
  ASSERT_TRUE(missed->has_value());
  const JobClosed& closed = (*missed)->job_closed();
  EXPECT_FALSE(closed.succeeded());
  EXPECT_EQ(closed.root_cause().rank(), 1);
  EXPECT_EQ(closed.root_cause().message(), "boom");
  Effects effects;
  absl::Status refused = TryJoin("c", At(5'100), &effects);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("is closed"));
}

TEST_F(DurableStateTest, ANodeThatFinishedStaysFinished) {
  Form({"a", "b"}, At(0));
  Done("a", 0, At(100));
  Restart(At(1'000));
  Effects closed = Done("b", 0, At(1'100));
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_TRUE(Pushed(closed)["a"][0].job_closed().succeeded());
}

TEST_F(DurableStateTest, AMemberThatLeftIsNotBroughtBack) {
  config_ = Config(1, 2);
  Form({"a", "b"}, At(0));
  Leave("b", At(100));  // round 1 opens without it
  Restart(At(1'000));
  EXPECT_EQ(JobStatus().round(), 1);
  EXPECT_EQ(JobStatus().missing_count(), 1);
  std::map<std::string, Assignment> round = Assigned(Join("a", At(1'100)));
  ASSERT_THAT(round, SizeIs(1));
  EXPECT_EQ(round["a"].group_world_size(), 1);
}

TEST_F(DurableStateTest, AForgottenJobIsNotBroughtBack) {
  Form({"a", "b"}, At(0));
  Done("a", 0, At(10));
  Done("b", 0, At(20));
  Advance(At(20) + kClosedJobRetention);
  EXPECT_EQ(journal_.back().record_case(), JournalRecord::kJobForgotten);
  Restart(At(20) + kClosedJobRetention + absl::Seconds(1));
  EXPECT_EQ(state_.job_count(), 0u);
  EXPECT_EQ(state_.open_job_count(), 0u);
}

TEST_F(DurableStateTest, ASnapshotRestoresTheSameStateAsTheWholeJournal) {
  // Several jobs, one in each phase.
  config_ = Config(2, 2, /*max_restarts=*/5);
  job_ = "running";
  Form({"a", "b"}, At(0));
  Fail("a", 0, At(10));
  Join("a", At(20));
  Join("b", At(21));  // round 1 runs
  Done("a", 1, At(2'000));
  job_ = "open";
  config_ = Config(2, 3, /*max_restarts=*/5);
  Form({"a", "b", "c"}, At(0));
  Leave("c", At(10));  // round 1 opens, b and a to rejoin
  job_ = "closed";
  config_ = Config(1, 1, /*max_restarts=*/0);
  Form({"a"}, At(0));
  Fail("a", 0, At(5));

  const std::vector<std::string> original = SnapshotBytes();
  const std::vector<JournalRecord> snapshot = state_.Snapshot();
  const size_t open = state_.open_job_count(), all = state_.job_count();
  RestartFrom(snapshot, At(10'000));
  EXPECT_EQ(SnapshotBytes(), original) << "from the snapshot";
  EXPECT_EQ(state_.open_job_count(), open);
  EXPECT_EQ(state_.job_count(), all);
  Restart(At(10'000));
  EXPECT_EQ(SnapshotBytes(), original) << "from the whole journal";
  EXPECT_EQ(state_.open_job_count(), open);
}

// Found by the simulator (tests/sim, seed 14): a member of round 0 left out
// of round 1 (it rejoined after the last call) stayed a member in the live
// state, which a snapshot wrote with its old secret, while the journal's
// records, replayed, have it out of the job.
TEST_F(DurableStateTest, AMemberLeftOutOfTheNextRoundIsNoMemberInASnapshot) {
  config_ = Config(2, 3, /*max_restarts=*/3);
  Form({"a", "b", "c"}, At(0));
  Fail("a", 0, At(10));  // round 1 opens: a, b and c are to rejoin
  Join("a", At(20));
  Join("b", At(21));
  Advance(At(21 + kLastCallMs));  // round 1 forms without c
  ASSERT_EQ(JobStatus().participants(), 2);
  Join("c", At(30'000));  // c comes back: round 2 opens for it

  // Joins of nodes that wait are not journaled, so neither is the count of
  // joins (next_join_seq): a restored state counts on from its members'.
  auto members = [this] {
    std::vector<JournalRecord> records = state_.Snapshot();
    for (JournalRecord& record : records) {
      if (record.has_round_formed()) record.mutable_round_formed()->clear_next_join_seq();
    }
    std::vector<std::string> out;
    for (const JournalRecord& record : records) out.push_back(record.ShortDebugString());
    return out;
  };
  const std::vector<std::string> live = members();
  ASSERT_THAT(live, SizeIs(2));
  EXPECT_THAT(live[0], Not(HasSubstr("secret-c")));
  Restart(At(40'000));
  EXPECT_EQ(members(), live);
}

// Found by the simulator (seed 318907 before the fix): musterd crashed
// while it wrote that node b was lost and the round it opened for that;
// the journal kept the first record only, and the restored job ran round 0
// without b's ranks, which never ended.
TEST_F(DurableStateTest, AJournalTornAfterANodesRemovalStillOpensItsRound) {
  config_ = Config(1, 2);
  Form({"a", "b"}, At(0));
  Beat({"a"}, At(kHeartbeatMs - 1));
  const size_t before = journal_.size();
  Advance(At(kHeartbeatMs + 1));  // b silent: it is lost, and round 1 opens
  ASSERT_EQ(journal_.size(), before + 2);
  std::vector<JournalRecord> torn(journal_.begin(), journal_.end() - 1);
  RestartFrom(torn, At(20'000));
  EXPECT_EQ(JobStatus().state(), "open") << "round 0 cannot run without b's ranks";
  EXPECT_EQ(JobStatus().round(), 1);
  Restart(At(30'000));  // the whole journal: the same, b gone
  EXPECT_EQ(JobStatus().state(), "open");
  EXPECT_EQ(JobStatus().round(), 1);
}

TEST_F(DurableStateTest, ARecordThatDoesNotFitIsRefused) {
  JournalRecord opened;
  opened.mutable_round_opened()->set_job_id("never-formed");
  EXPECT_EQ(state_.Restore(opened, At(0)).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(state_.Restore(JournalRecord(), At(0)).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(state_.job_count(), 0u);
}

}  // namespace
}  // namespace muster::rdzv
