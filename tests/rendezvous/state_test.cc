// The rendezvous rules, checked on the pure state machine: no sockets, the
// time passed in.
#include "rendezvous/state.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace muster::rdzv {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
absl::Time At(int64_t ms) { return kT0 + absl::Milliseconds(ms); }

constexpr int64_t kLastCallMs = 1'000;
constexpr int64_t kJoinTimeoutMs = 60'000;
constexpr int64_t kHeartbeatMs = 5'000;

JobConfig Config(int min, int max, int max_restarts = 3) {
  JobConfig config;
  config.set_min_nodes(min);
  config.set_max_nodes(max);
  config.set_max_restarts(max_restarts);
  config.set_last_call_timeout_ms(kLastCallMs);
  config.set_join_timeout_ms(kJoinTimeoutMs);
  config.set_heartbeat_timeout_ms(kHeartbeatMs);
  return config;
}

// A node as its agent describes it: Spec("a") runs on host "host-a".
struct Spec {
  Spec(const char* node_id) : id(node_id) {}  // implicit: Join({"a"}, ...)
  Spec& Lws(int n) {
    local_world_size = n;
    return *this;
  }
  Spec& Hint(int h) {
    hint = h;
    return *this;
  }
  Spec& Port(int p) {
    port = p;
    return *this;
  }
  Spec& Addr(std::string a) {
    advertised_addr = std::move(a);
    return *this;
  }
  Spec& Host(std::string h) {
    host = std::move(h);
    return *this;
  }

  std::string id;
  int local_world_size = 1;
  int hint = -1;
  int port = 29500;
  std::string advertised_addr;
  std::string host;  // empty: "host-" + id
};

class StateTest : public ::testing::Test {
 protected:
  JoinRequest Request(const Spec& spec) const {
    JoinRequest request;
    request.set_job_id(job_);
    *request.mutable_config() = config_;
    NodeInfo* node = request.mutable_node();
    node->set_node_id(spec.id);
    node->set_host(spec.host.empty() ? "host-" + spec.id : spec.host);
    node->set_advertised_addr(spec.advertised_addr);
    node->set_local_world_size(spec.local_world_size);
    node->set_node_rank_hint(spec.hint);
    node->set_master_port_candidate(spec.port);
    return request;
  }

  absl::Status TryJoin(const Spec& spec, absl::Time now, Effects* effects) {
    return state_.Join(Request(spec), PeerOf(spec.id), now, effects);
  }

  Effects Join(const Spec& spec, absl::Time now) {
    Effects effects;
    absl::Status status = TryJoin(spec, now, &effects);
    EXPECT_TRUE(status.ok()) << spec.id << ": " << status;
    return effects;
  }

  static std::string PeerOf(const std::string& id) { return "peer-" + id; }

  static Failure MakeFailure(const std::string& node, int rank) {
    Failure failure;
    failure.set_rank(rank);
    failure.set_host("host-" + node);
    failure.set_exit_code(1);
    failure.set_message("boom");
    return failure;
  }

  Effects Fail(const std::string& node, int64_t round, absl::Time now, int rank = 0) {
    Effects effects;
    absl::Status status =
        state_.ReportFailure({job_, node}, round, MakeFailure(node, rank), now, &effects);
    EXPECT_TRUE(status.ok()) << status;
    return effects;
  }

  Effects Done(const std::string& node, int64_t round, absl::Time now) {
    Effects effects;
    absl::Status status = state_.ReportDone({job_, node}, round, now, &effects);
    EXPECT_TRUE(status.ok()) << status;
    return effects;
  }

  Effects Leave(const std::string& node, absl::Time now, const std::string& reason = "stopped") {
    Effects effects;
    absl::Status status = state_.Leave({job_, node}, reason, now, &effects);
    EXPECT_TRUE(status.ok()) << status;
    return effects;
  }

  Effects Advance(absl::Time now) {
    Effects effects;
    state_.Advance(now, &effects);
    return effects;
  }

  void Beat(const std::vector<std::string>& nodes, absl::Time now) {
    for (const std::string& node : nodes) {
      EXPECT_TRUE(state_.Heartbeat({job_, node}, now).ok()) << node;
    }
  }

  StatusResponse JobStatus() {
    absl::StatusOr<StatusResponse> status = state_.Status(job_);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : StatusResponse();
  }

  // Forms round 0 of a job whose min and max are config_'s; every node joins at `now`.
  std::map<std::string, Assignment> Form(const std::vector<Spec>& nodes, absl::Time now) {
    std::map<std::string, Assignment> assigned;
    for (const Spec& spec : nodes) {
      for (auto& [id, a] : Assigned(Join(spec, now))) assigned[id] = a;
    }
    return assigned;
  }

  std::map<std::string, Assignment> Assigned(const Effects& effects) const {
    std::map<std::string, Assignment> out;
    for (const auto& [key, assignment] : effects.assigned) {
      EXPECT_EQ(key.job_id, job_);
      out[key.node_id] = assignment;
    }
    return out;
  }

  static std::vector<std::string> Keys(const std::map<std::string, Assignment>& m) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : m) keys.push_back(k);
    return keys;
  }

  // Node id → every event pushed to it, in order.
  std::map<std::string, std::vector<WatchEvent>> Pushed(const Effects& effects) const {
    std::map<std::string, std::vector<WatchEvent>> out;
    for (const auto& [key, event] : effects.pushed) {
      EXPECT_EQ(key.job_id, job_);
      out[key.node_id].push_back(event);
    }
    return out;
  }

  std::map<std::string, absl::Status> JoinFailed(const Effects& effects) const {
    std::map<std::string, absl::Status> out;
    for (const auto& [key, status] : effects.join_failed) out[key.node_id] = status;
    return out;
  }

  std::string job_ = "job";
  JobConfig config_ = Config(2, 2);
  RendezvousState state_;
};

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
  EXPECT_EQ(state_.Heartbeat({job_, "a"}, At(400)).status().code(),
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
  EXPECT_EQ(state_.ReportDone({job_, "b"}, 0, At(200), &effects).code(),
            absl::StatusCode::kAborted);
}

TEST_F(StateTest, DoneFromANodeOutsideTheRoundDoesNotCloseTheJob) {
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(10));  // waiting, not a participant
  Effects effects;
  EXPECT_FALSE(state_.ReportDone({job_, "c"}, 0, At(20), &effects).ok());
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
  EXPECT_EQ(state_.Heartbeat({job_, "c"}, At(5'001)).status().code(), absl::StatusCode::kNotFound);

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

TEST_F(StateTest, NextDeadlineIsNoneWithoutTimersAndOnlyRetentionForClosedJobs) {
  config_ = Config(1, 1);
  config_.set_heartbeat_timeout_ms(0);
  Join({"a"}, At(0));  // round complete, heartbeats off
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
  absl::StatusOr<std::optional<WatchEvent>> current = state_.CatchUp({job_, "a"}, 0);
  ASSERT_TRUE(current.ok());
  EXPECT_FALSE(current->has_value());

  Fail("b", 0, At(100), /*rank=*/1);
  absl::StatusOr<std::optional<WatchEvent>> missed = state_.CatchUp({job_, "a"}, 0);
  ASSERT_TRUE(missed.ok() && missed->has_value());
  EXPECT_EQ((*missed)->round_changed().new_round(), 1);
  EXPECT_EQ((*missed)->round_changed().reason(), RoundChanged::WORKER_FAILED);
  EXPECT_FALSE(state_.CatchUp({job_, "a"}, 1)->has_value());

  EXPECT_EQ(state_.CatchUp({job_, "nobody"}, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.CatchUp({"nojob", "a"}, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StateTest, CatchUpAfterCloseReturnsJobClosed) {
  Form({{"a"}, {"b"}}, At(0));
  Done("a", 0, At(1));
  Done("b", 0, At(2));
  absl::StatusOr<std::optional<WatchEvent>> missed = state_.CatchUp({job_, "a"}, 0);
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
  absl::StatusOr<std::optional<WatchEvent>> event = state_.CatchUp({job_, "a"}, 0);
  ASSERT_TRUE(event.ok() && event->has_value());
  EXPECT_FALSE((*event)->job_closed().succeeded());
  EXPECT_THAT((*event)->job_closed().reason(), HasSubstr("no nodes left"));
  // Leaving a closed job, or twice, is not an error.
  Effects again;
  EXPECT_TRUE(state_.Leave({job_, "a"}, "", At(200), &again).ok());
}

TEST_F(StateTest, LeaveOfAnUnknownNodeIsNotFound) {
  Join({"a"}, At(0));
  Effects effects;
  EXPECT_EQ(state_.Leave({job_, "b"}, "", At(1), &effects).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Leave({"nojob", "a"}, "", At(1), &effects).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.Status("nojob").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace muster::rdzv
