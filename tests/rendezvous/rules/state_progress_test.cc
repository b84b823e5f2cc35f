// The rules of progress and of bad nodes, on fake time: the steps workers
// report, the goodput, --max-no-progress-restarts, and hosts excluded after
// --max-node-failures failures in a row (the spare seated in their place).
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state.h"
#include "tests/rendezvous/rules/state_fixture.h"

namespace muster::rdzv {
namespace {

using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class ProgressTest : public StateTest {
 protected:
  ProgressTest() : ProgressTest(StateOptions{}) {}
  explicit ProgressTest(StateOptions options) : StateTest(options) {}

  absl::Status TryProgress(const std::string& node, int64_t round, int64_t step, absl::Time now,
                           Effects* effects, int64_t age_ms = 0) {
    Progress progress;
    progress.set_round(round);
    progress.set_step(step);
    progress.set_age_ms(age_ms);
    const size_t kept = effects->journal.size();
    absl::Status status =
        state_.ReportProgress({job_, node}, SecretOf(node), progress, now, effects);
    Keep(*effects, kept);
    return status;
  }
  Effects Step(const std::string& node, int64_t round, int64_t step, absl::Time now,
               int64_t age_ms = 0) {
    Effects effects;
    absl::Status status = TryProgress(node, round, step, now, &effects, age_ms);
    EXPECT_TRUE(status.ok()) << status;
    return effects;
  }
  // Every node of `nodes` joins round `round` again after a failure.
  void Rejoin(const std::vector<Spec>& nodes, absl::Time now) {
    std::map<std::string, Assignment> assigned = Form(nodes, now);
    ASSERT_THAT(assigned, SizeIs(nodes.size()));
  }
  static std::vector<JobEvent::Kind> Kinds(const Effects& effects) {
    std::vector<JobEvent::Kind> kinds;
    for (const JobEvent& event : effects.events) kinds.push_back(event.kind());
    return kinds;
  }
  JobClosed ClosedEvent(const Effects& effects, const std::string& node) {
    for (const auto& [key, event] : effects.pushed) {
      if (key.node_id == node && event.has_job_closed()) return event.job_closed();
    }
    ADD_FAILURE() << "no JobClosed pushed to " << node;
    return JobClosed();
  }
};

// ---------------------------------------------------------------- progress

TEST_F(ProgressTest, StepsSetTheJobsStepAndRateAndTheFirstOfARoundIsAnEvent) {
  Form({{"a"}, {"b"}}, At(0));
  EXPECT_EQ(JobStatus().step(), -1) << "nothing reported yet";
  Effects first = Step("a", 0, 10, At(1'000));
  EXPECT_THAT(Kinds(first), ElementsAre(JobEvent::PROGRESS));
  EXPECT_THAT(first.events[0].detail(), HasSubstr("step 10"));
  // Written 500 ms before it came: the rate counts from when it was written.
  Effects second = Step("a", 0, 30, At(3'500), /*age_ms=*/500);
  EXPECT_THAT(second.events, IsEmpty()) << "at most one PROGRESS event a minute";
  absl::StatusOr<StatusResponse> status = state_.Status(job_, At(4'000), /*nodes=*/true);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->step(), 30);
  EXPECT_EQ(status->step_unix_ms(), absl::ToUnixMillis(At(3'000)));
  EXPECT_THAT(status->steps_per_second(), DoubleNear(10.0, 1e-9));
  EXPECT_EQ(status->nodes(0).step(), 30);
  EXPECT_EQ(status->nodes(1).step(), -1);
  // A minute on, a new step is an event again.
  EXPECT_THAT(Kinds(Step("b", 0, 40, At(61'000))), ElementsAre(JobEvent::PROGRESS));
  EXPECT_THAT(Step("b", 0, 41, At(62'000)).events, IsEmpty());
}

TEST_F(ProgressTest, OnlyAMemberOfTheRunningRoundReportsForIt) {
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(10));  // a spare: waits
  Step("c", 0, 99, At(100));
  Step("a", 1, 99, At(100));  // a round the job is not in
  EXPECT_EQ(JobStatus().step(), -1);
  Step("a", 0, 5, At(200));
  Step("a", 0, 3, At(300));  // older than what it said: nothing new
  EXPECT_EQ(JobStatus().step(), 5);
}

TEST_F(ProgressTest, ABadReportIsRefusedAndChangesNothing) {
  Form({{"a"}, {"b"}}, At(0));
  Effects effects;
  for (int64_t step : {int64_t{-1}, kMaxProgressValue + 1}) {
    absl::Status refused = TryProgress("a", 0, step, At(100), &effects);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.message(), HasSubstr("step"));
  }
  EXPECT_EQ(TryProgress("a", 0, 1, At(100), &effects, kMaxProgressAgeMs + 1).code(),
            absl::StatusCode::kInvalidArgument);
  Progress progress;
  progress.set_step(7);
  EXPECT_EQ(
      state_.ReportProgress({job_, "a"}, "not-its-secret", progress, At(100), &effects).code(),
      absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(state_.ReportProgress({job_, "z"}, "", progress, At(100), &effects).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(effects.empty());
  EXPECT_EQ(JobStatus().step(), -1);
}

TEST_F(ProgressTest, GoodputIsTheShareOfWallTimeInRoundsThatMadeProgress) {
  config_ = Config(1, 1, /*max_restarts=*/5);
  Form({{"a"}}, At(0));
  Step("a", 0, 1, At(1'000));
  Fail("a", 0, At(10'000));  // 10 s of a round that made progress
  Form({{"a"}}, At(12'000));
  Fail("a", 1, At(20'000));  // 8 s of one that did not
  absl::StatusOr<StatusResponse> status = state_.Status(job_, At(20'000));
  ASSERT_TRUE(status.ok());
  EXPECT_THAT(status->goodput(), DoubleNear(0.5, 1e-9));
  Form({{"a"}}, At(20'000));
  Step("a", 2, 2, At(25'000));
  // The running round counts while it makes progress: (10 + 10) / 30.
  status = state_.Status(job_, At(30'000));
  ASSERT_TRUE(status.ok());
  EXPECT_THAT(status->goodput(), DoubleNear(20.0 / 30.0, 1e-9));
  Effects closed = Done("a", 2, At(30'000));
  const JobClosed event = ClosedEvent(closed, "a");
  EXPECT_TRUE(event.succeeded());
  EXPECT_EQ(event.last_step(), 2);
  EXPECT_THAT(event.goodput(), DoubleNear(20.0 / 30.0, 1e-9));
}

// ---------------------------------------------------------------- --max-no-progress-restarts

TEST_F(ProgressTest, RestartsThatReachNoNewStepStopTheJobAsStuck) {
  config_ = Config(2, 2, /*max_restarts=*/10);
  config_.set_max_no_progress_restarts(2);
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(100));  // round 0 is no restart: not counted
  Rejoin({{"a"}, {"b"}}, At(200));
  Fail("b", 1, At(300));  // restart 1 reached nothing: 1 in a row
  EXPECT_EQ(JobStatus().no_progress_restarts(), 1);
  Rejoin({{"a"}, {"b"}}, At(400));
  Effects closed = Fail("a", 2, At(500));  // 2 in a row: stop
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_EQ(JobStatus().restart_count(), 2);
  for (const std::string node : {"a", "b"}) {
    const JobClosed event = ClosedEvent(closed, node);
    EXPECT_FALSE(event.succeeded());
    EXPECT_TRUE(event.no_progress());
    EXPECT_FALSE(event.progressed());
    EXPECT_EQ(event.last_step(), -1);
    EXPECT_THAT(event.reason(), AllOf(HasSubstr("2 restart(s) in a row reached no new step"),
                                      HasSubstr("MUSTER_PROGRESS_FILE"),
                                      HasSubstr("--max-no-progress-restarts 2")));
  }
}

TEST_F(ProgressTest, NewStepsInEveryRoundUseEveryRestart) {
  config_ = Config(1, 1, /*max_restarts=*/3);
  config_.set_max_no_progress_restarts(1);
  Form({{"a"}}, At(0));
  for (int round = 0; round < 3; ++round) {
    Step("a", round, 100 * (round + 1), At(1'000 * round + 100));
    Fail("a", round, At(1'000 * round + 200));
    Form({{"a"}}, At(1'000 * round + 300));
  }
  Step("a", 3, 400, At(3'100));
  Effects closed = Fail("a", 3, At(3'200));
  const JobClosed event = ClosedEvent(closed, "a");
  EXPECT_FALSE(event.no_progress());
  EXPECT_TRUE(event.progressed()) << "a requeue resumes it";
  EXPECT_EQ(event.last_step(), 400);
  EXPECT_THAT(event.reason(), HasSubstr("no restarts left"));
  EXPECT_EQ(JobStatus().restart_count(), 3);
}

TEST_F(ProgressTest, ARoundResumedFromACheckpointMakesProgressOnlyPastTheBestStep) {
  config_ = Config(1, 1, /*max_restarts=*/10);
  config_.set_max_no_progress_restarts(2);
  Form({{"a"}}, At(0));
  Step("a", 0, 1'500, At(100));
  Fail("a", 0, At(200));
  Form({{"a"}}, At(300));
  Step("a", 1, 1'000, At(400));  // the checkpoint's step, then up to 1,500 again
  Step("a", 1, 1'500, At(500));
  Fail("a", 1, At(600));
  EXPECT_EQ(JobStatus().no_progress_restarts(), 1) << "the same failure at the same step";
  Form({{"a"}}, At(700));
  Step("a", 2, 1'501, At(800));  // past it: a new step
  EXPECT_EQ(JobStatus().no_progress_restarts(), 0);
  Fail("a", 2, At(900));
  EXPECT_EQ(JobStatus().state(), "open");
  EXPECT_EQ(JobStatus().step(), 1'501);
}

TEST_F(ProgressTest, AFailureReportCarriesTheStepItCameAfter) {
  // The hub applies the report's progress first: a step written just
  // before the crash counts.
  config_ = Config(1, 1, /*max_restarts=*/10);
  config_.set_max_no_progress_restarts(1);
  Form({{"a"}}, At(0));
  Fail("a", 0, At(100));
  Form({{"a"}}, At(200));
  Step("a", 1, 1, At(300));
  Fail("a", 1, At(300));
  EXPECT_EQ(JobStatus().state(), "open");
}

TEST_F(ProgressTest, AJobAnOperatorStopsIsNoneToRequeue) {
  Form({{"a"}, {"b"}}, At(0));
  Step("a", 0, 5, At(100));
  Effects effects;
  ASSERT_TRUE(state_.Stop(job_, "maintenance", At(200), &effects).ok());
  const JobClosed event = ClosedEvent(effects, "a");
  EXPECT_FALSE(event.progressed());
  EXPECT_EQ(event.last_step(), 5);
}

// ---------------------------------------------------------------- bad nodes

TEST_F(ProgressTest, AHostFailingKTimesInARowIsExcludedAndTheSpareTakesItsSeat) {
  config_ = Config(2, 2, /*max_restarts=*/5);
  config_.set_max_node_failures(2);
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(10));  // the spare
  Fail("a", 0, At(100));
  Rejoin({{"a"}, {"b"}}, At(200));
  EXPECT_EQ(JobStatus().waiting(), 1) << "a restart round keeps its members' seats";

  Effects excluded = Fail("a", 1, At(300));
  auto pushed = Pushed(excluded);
  ASSERT_THAT(pushed["a"], SizeIs(1));
  EXPECT_FALSE(pushed["a"][0].node_excluded().job_ends()) << "the job goes on";
  const Exclusion& exclusion = pushed["a"][0].node_excluded().exclusion();
  EXPECT_EQ(exclusion.host(), "host-a");
  EXPECT_EQ(exclusion.node_id(), "a");
  EXPECT_THAT(exclusion.cause(), AllOf(HasSubstr("root cause of 2 failures"),
                                       HasSubstr("--max-node-failures 2"), HasSubstr("host-a")));
  ASSERT_THAT(pushed["b"], SizeIs(1));
  EXPECT_THAT(pushed["b"][0].round_changed().detail(),
              AllOf(HasSubstr("restart 2 of 5"), HasSubstr("host host-a is excluded")));
  EXPECT_THAT(Kinds(excluded), testing::Contains(JobEvent::NODE_EXCLUDED));
  // The spare is seated in a's place; the round forms when b is back.
  std::map<std::string, Assignment> assigned = Assigned(Join({"b"}, At(400)));
  EXPECT_THAT(Keys(assigned), ElementsAre("b", "c"));
  EXPECT_EQ(assigned["c"].restart_count(), 2) << "no restart beyond the one that found it";
  EXPECT_EQ(JobStatus().restart_count(), 2);
  ASSERT_THAT(JobStatus().excluded(), SizeIs(1));
  EXPECT_EQ(JobStatus().excluded(0).host(), "host-a");

  // Neither a itself nor another agent on its host gets back in.
  Effects refused_effects;
  for (const Spec& spec : {Spec("a"), Spec("a2").Host("host-a")}) {
    absl::Status refused = TryJoin(spec, At(500), &refused_effects);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << spec.id;
    EXPECT_THAT(refused.message(),
                AllOf(HasSubstr("host-a"), HasSubstr(kExcludedFromJob), HasSubstr("root cause")));
  }
  EXPECT_TRUE(refused_effects.empty());
}

TEST_F(ProgressTest, FailuresOfDifferentHostsAreNotInARow) {
  config_ = Config(2, 2, /*max_restarts=*/5);
  config_.set_max_node_failures(2);
  Form({{"a"}, {"b"}}, At(0));
  int64_t round = 0;
  for (const char* node : {"a", "b", "a", "b"}) {
    Fail(node, round, At(1'000 * round + 100));
    ++round;
    Rejoin({{"a"}, {"b"}}, At(1'000 * round));
  }
  EXPECT_THAT(JobStatus().excluded(), IsEmpty());
  EXPECT_EQ(JobStatus().restart_count(), 4);
}

TEST_F(ProgressTest, AgentsSharingAHostCountApartAndAreExcludedTogether) {
  config_ = Config(3, 3, /*max_restarts=*/5);
  config_.set_max_node_failures(2);
  const std::vector<Spec> nodes = {Spec("a1").Host("host-a"), Spec("a2").Host("host-a"), {"b"}};
  Form(nodes, At(0));
  Fail("a1", 0, At(100));
  Rejoin(nodes, At(200));
  Fail("a2", 1, At(300));  // the same host, another agent: not in a row
  Rejoin(nodes, At(400));
  EXPECT_THAT(JobStatus().excluded(), IsEmpty());
  // a2 twice in a row: its host goes, a1 with it.
  auto pushed = Pushed(Fail("a2", 2, At(500)));
  EXPECT_TRUE(pushed["a1"].at(0).has_node_excluded());
  EXPECT_TRUE(pushed["a2"].at(0).has_node_excluded());
  EXPECT_THAT(JobStatus().excluded(), SizeIs(1));
  EXPECT_EQ(JobStatus().node_count(), 1);
}

TEST_F(ProgressTest, WithNoSpareTheJobWaitsForAJoinUntilJoinTimeout) {
  config_ = Config(2, 2, /*max_restarts=*/5);
  config_.set_max_node_failures(1);
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(100));  // excluded at once
  EXPECT_THAT(Assigned(Join({"b"}, At(200))), IsEmpty());
  Advance(At(100 + kJoinTimeoutMs - 1));
  EXPECT_EQ(JobStatus().state(), "open");
  // A new node (another host) is seated...
  EXPECT_THAT(Keys(Assigned(Join({"d"}, At(60'000)))), ElementsAre("b", "d"));
}

TEST_F(ProgressTest, WithNoSpareTheJoinTimeoutClosesTheJobNamingTheExcludedHost) {
  config_ = Config(2, 2, /*max_restarts=*/5);
  config_.set_max_node_failures(1);
  Form({{"a"}, {"b"}}, At(0));
  Fail("a", 0, At(100));
  Join({"b"}, At(200));
  Effects closed = Advance(At(200 + kJoinTimeoutMs));  // from the first join of the round
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_THAT(JobStatus().close_reason(), AllOf(HasSubstr("join timeout"), HasSubstr("host-a")));
}

TEST_F(ProgressTest, ANodeWhoseOwnHealthCheckFailsIsExcludedWithoutARestart) {
  config_ = Config(2, 2, /*max_restarts=*/3);
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(10));  // the spare
  Effects effects;
  ASSERT_TRUE(state_
                  .Leave({job_, "b"}, SecretOf("b"), "GPU 1: Xid 79 (fallen off the bus)", At(100),
                         &effects, /*exclude=*/true)
                  .ok());
  Keep(effects);
  auto pushed = Pushed(effects);
  ASSERT_THAT(pushed["b"], SizeIs(1));
  EXPECT_THAT(pushed["b"][0].node_excluded().exclusion().cause(),
              AllOf(HasSubstr("its own health check failed"), HasSubstr("Xid 79")));
  ASSERT_THAT(pushed["a"], SizeIs(1));
  EXPECT_EQ(pushed["a"][0].round_changed().reason(), RoundChanged::NODE_LOST);
  EXPECT_THAT(Keys(Assigned(Join({"a"}, At(200)))), ElementsAre("a", "c"));
  EXPECT_EQ(JobStatus().restart_count(), 0) << "a node lost, no restart spent";
  ASSERT_THAT(JobStatus().excluded(), SizeIs(1));
  EXPECT_EQ(JobStatus().excluded(0).host(), "host-b");
  Effects refused;
  EXPECT_EQ(TryJoin({"b"}, At(300), &refused).code(), absl::StatusCode::kFailedPrecondition);
  // Without the secret, nobody excludes a node.
  EXPECT_EQ(state_.Leave({job_, "a"}, "guess", "bad", At(400), &refused, true).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(ProgressTest, APreflightRunsInEveryRoundThatSeatsANewNode) {
  config_ = Config(2, 2, /*max_restarts=*/3);
  config_.set_preflight(true);
  for (const auto& [id, a] : Form({{"a"}, {"b"}}, At(0))) EXPECT_TRUE(a.preflight()) << id;
  Join({"c"}, At(10));  // the spare
  Fail("a", 0, At(100));
  for (const auto& [id, a] : Form({{"a"}, {"b"}}, At(200))) {
    EXPECT_FALSE(a.preflight()) << id << ": the same nodes as before, nothing to check";
  }
  Leave("b", At(300));  // c is seated in b's place: a new node, checked
  for (const auto& [id, a] : Assigned(Join({"a"}, At(400)))) EXPECT_TRUE(a.preflight()) << id;
}

TEST_F(ProgressTest, ASpareWhosePreflightFailsIsExcludedAndTheJobGoesOn) {
  config_ = Config(2, 2, /*max_restarts=*/3);
  config_.set_preflight(true);
  Form({{"a"}, {"b"}}, At(0));
  Join({"c"}, At(10));
  Join({"d"}, At(20));  // a second spare
  Leave("b", At(300));
  ASSERT_THAT(Keys(Assigned(Join({"a"}, At(400)))), ElementsAre("a", "c"));
  Failure failure = MakeFailure("a", 0);
  failure.set_no_restart(true);  // the pre-flight's: a wrong sum
  Effects effects;
  ASSERT_TRUE(state_.ReportFailure({job_, "a"}, SecretOf("a"), 1, failure, At(500), &effects).ok());
  Keep(effects);
  auto pushed = Pushed(effects);
  ASSERT_THAT(pushed["c"], SizeIs(1));
  EXPECT_THAT(pushed["c"][0].node_excluded().exclusion().cause(),
              HasSubstr("pre-flight all-reduce failed in the round that seated it"));
  EXPECT_EQ(pushed["a"].at(0).round_changed().reason(), RoundChanged::NODE_LOST);
  EXPECT_EQ(JobStatus().state(), "open") << "the job goes on";
  EXPECT_EQ(JobStatus().restart_count(), 0);
  // c's own report of the same pre-flight, refused, says why, should it
  // arrive before the push.
  Effects late;
  absl::Status refused =
      state_.ReportFailure({job_, "c"}, SecretOf("c"), 1, MakeFailure("c", 1), At(550), &late);
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr(kExcludedFromJob), HasSubstr("failed in the round that seated it")));
  // The other spare is seated, and checked in its turn.
  std::map<std::string, Assignment> next = Assigned(Join({"a"}, At(600)));
  EXPECT_THAT(Keys(next), ElementsAre("a", "d"));
  EXPECT_TRUE(next["d"].preflight());
}

TEST_F(ProgressTest, AJoinWhoseHealthCheckFailedIsRefusedAndItsHostExcluded) {
  Form({{"a"}, {"b"}}, At(0));
  JoinRequest sick = Request({"c"});
  sick.set_health_fault("GPU 0 (GPU-x): retired pages are pending (it needs a reset)");
  Effects effects;
  absl::Status refused = state_.Join(sick, PeerOf("c"), SecretOf("c"), At(100), &effects);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), AllOf(HasSubstr(kExcludedFromJob), HasSubstr("retired pages"),
                                       HasSubstr("health check before it was seated")));
  ASSERT_THAT(JobStatus().excluded(), SizeIs(1));
  EXPECT_EQ(JobStatus().excluded(0).host(), "host-c");
  EXPECT_EQ(JobStatus().node_count(), 2) << "never seated, never a node of the job";
  // A job that does not exist is not made by it.
  sick.set_job_id("other");
  EXPECT_EQ(state_.Join(sick, PeerOf("c"), SecretOf("c"), At(100), &effects).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(state_.job_count(), 1u);
}

TEST_F(ProgressTest, AJoinWhoseHealthCheckFailedCannotExcludeAHostTheJobSeated) {
  Form({{"a"}, {"b"}}, At(0));
  // Anyone with the job's token may send it: it carries no node's secret.
  JoinRequest forged = Request(Spec("evil").Host("host-a"));
  forged.set_health_fault(std::string(100'000, 'x'));
  Effects effects;
  absl::Status refused = state_.Join(forged, PeerOf("evil"), SecretOf("evil"), At(100), &effects);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << "the sender is refused";
  EXPECT_LT(refused.message().size(), 1'000u) << "the fault is cut";
  EXPECT_TRUE(effects.empty());
  EXPECT_THAT(JobStatus().excluded(), IsEmpty()) << "host-a has a node in the job";
  EXPECT_EQ(JobStatus().state(), "running");
}

TEST_F(ProgressTest, AJobOfOneNodeNeverExcludesIt) {
  config_ = Config(1, 1, /*max_restarts=*/5);
  config_.set_max_node_failures(1);
  Form({{"a"}}, At(0));
  Fail("a", 0, At(100));
  EXPECT_THAT(Assigned(Join({"a"}, At(200))), SizeIs(1));
  EXPECT_THAT(JobStatus().excluded(), IsEmpty());
}

TEST_F(ProgressTest, ExclusionWithNoRestartLeftStillTellsTheNodeAndClosesTheJob) {
  config_ = Config(2, 2, /*max_restarts=*/0);
  config_.set_max_node_failures(1);
  Form({{"a"}, {"b"}}, At(0));
  Effects closed = Fail("a", 0, At(100));
  auto pushed = Pushed(closed);
  ASSERT_THAT(pushed["a"], SizeIs(2));
  EXPECT_TRUE(pushed["a"][0].node_excluded().job_ends()) << "a ends as the job does";
  EXPECT_TRUE(pushed["a"][1].has_job_closed());
  const JobClosed event = ClosedEvent(closed, "b");
  ASSERT_THAT(event.excluded(), SizeIs(1));
  EXPECT_EQ(event.excluded(0).host(), "host-a");
}

TEST_F(ProgressTest, EveryNodeOfAJobGivesTheSameRules) {
  config_ = Config(2, 2);
  config_.set_max_node_failures(2);
  Join({"a"}, At(0));
  config_.set_max_node_failures(3);
  Effects effects;
  absl::Status refused = TryJoin({"b"}, At(10), &effects);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("--max-node-failures 2"));
  config_.set_max_node_failures(-1);
  EXPECT_EQ(TryJoin({"c"}, At(10), &effects).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- the journal

StateOptions WithJournal() {
  StateOptions options;
  options.journal = true;
  return options;
}

class DurableProgressTest : public ProgressTest {
 protected:
  DurableProgressTest() : ProgressTest(WithJournal()) {}
  void Restart(absl::Time now) {
    std::vector<JournalRecord> records = journal_;
    storage_.emplace(WithJournal());
    for (const JournalRecord& record : records) {
      absl::Status restored = state_.Restore(record, now);
      EXPECT_TRUE(restored.ok()) << restored;
    }
  }
};

TEST_F(DurableProgressTest, ExclusionsAndProgressOutliveARestartOfTheRendezvous) {
  config_ = Config(2, 2, /*max_restarts=*/10);
  config_.set_max_node_failures(2);
  config_.set_max_no_progress_restarts(5);
  Form({{"a"}, {"b"}}, At(0));
  Step("a", 0, 70, At(50));
  Fail("a", 0, At(100));
  Rejoin({{"a"}, {"b"}}, At(200));
  Fail("a", 1, At(300));  // excluded; restart 1 reached nothing new
  Rejoin({{"b"}, {"c"}}, At(400));
  const std::vector<JournalRecord> before = state_.Snapshot();

  Restart(At(10'000));
  StatusResponse status = JobStatus();
  EXPECT_EQ(status.step(), 70);
  EXPECT_EQ(status.no_progress_restarts(), 0) << "an exclusion starts the count again";
  ASSERT_THAT(status.excluded(), SizeIs(1));
  EXPECT_EQ(status.excluded(0).host(), "host-a");
  std::vector<JournalRecord> after = state_.Snapshot();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].SerializeAsString(), before[i].SerializeAsString()) << i;
  }
  Effects effects;
  EXPECT_EQ(TryJoin(Spec("a3").Host("host-a"), At(10'001), &effects).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace muster::rdzv
