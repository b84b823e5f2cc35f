// The hub's timers on a FakeClock, with no timer thread: time moves only
// when a test moves it, and RunDueTimers delivers before it returns, so
// every check runs at an exact time and nothing sleeps. One test keeps the
// real clock and thread, the way servers run.
#include "rendezvous/server/hub.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/server/journal.h"
#include "tests/rendezvous/server/fake_time_hub.h"
#include "tests/rendezvous/server/pending.h"
#include "tests/support/temp_dir.h"

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kHeartbeatMs = 1'000;
constexpr int64_t kLastCallMs = 1'000;
constexpr int64_t kJoinTimeoutMs = 5'000;

JobConfig Config(int min, int max) {
  JobConfig config;
  config.set_min_nodes(min);
  config.set_max_nodes(max);
  config.set_max_restarts(3);
  config.set_last_call_timeout_ms(0);
  config.set_join_timeout_ms(60'000);
  config.set_heartbeat_timeout_ms(60'000);
  return config;
}

JoinRequest Request(const std::string& node, const JobConfig& config) {
  JoinRequest request;
  request.set_job_id("job");
  *request.mutable_config() = config;
  NodeInfo* info = request.mutable_node();
  info->set_node_id(node);
  info->set_host("host-" + node);
  info->set_local_world_size(1);
  info->set_node_rank_hint(-1);
  info->set_master_port_candidate(29500);
  request.set_protocol_version(kProtocolVersion);
  return request;
}

class HubTest : public ::testing::Test {
 protected:
  Pending<absl::StatusOr<Assignment>> Join(const std::string& node, const JobConfig& config) {
    Pending<absl::StatusOr<Assignment>> join;
    hub_.Join(Request(node, config), "10.0.0.1", hub_.NewTicket(), join.Callback());
    return join;
  }

  // Opens the node's watch; its events (all but WatchStarted) go to `events`.
  // Without a timer thread the hub delivers on the caller's thread, so the
  // vector needs no lock.
  // `ended` gets how the watch ended, if it did.
  void Watch(const std::string& node, const std::string& secret, std::vector<WatchEvent>* events,
             absl::Status* ended = nullptr) {
    WatchRequest request;
    request.set_job_id("job");
    request.set_node_id(node);
    request.set_node_secret(secret);
    hub_.Watch(request, hub_.NewTicket(),
               RendezvousHub::Watcher{[events](const WatchEvent& event) {
                                        if (!event.has_watch_started()) events->push_back(event);
                                      },
                                      [ended](absl::Status status) {
                                        if (ended != nullptr) *ended = std::move(status);
                                      }});
  }

  void Advance(absl::Duration d) {
    clock_.Advance(d);
    hub_.RunDueTimers();
  }

  StatusResponse JobStatus() {
    absl::StatusOr<StatusResponse> status = hub_.Status("job");
    EXPECT_TRUE(status.ok()) << status.status();
    return status.value_or(StatusResponse());
  }

  FakeClock clock_;
  RendezvousHub hub_{FakeTimeHub(&clock_)};
};

TEST_F(HubTest, SilentNodeIsLostWhenTheClockReachesItsHeartbeatTimeoutAndNotBefore) {
  JobConfig config = Config(2, 2);
  config.set_heartbeat_timeout_ms(kHeartbeatMs);
  Pending<absl::StatusOr<Assignment>> a = Join("a", config);
  Pending<absl::StatusOr<Assignment>> b = Join("b", config);
  ASSERT_TRUE(a.Done() && b.Done()) << "max nodes joined: the round completes at once";
  absl::StatusOr<Assignment> assigned = a.Wait();
  ASSERT_TRUE(assigned.ok());
  std::vector<WatchEvent> events;
  Watch("a", assigned->node_secret(), &events);  // a's open stream is its heartbeat; b sends none

  Advance(absl::Milliseconds(kHeartbeatMs - 1));
  EXPECT_THAT(events, IsEmpty());
  EXPECT_EQ(JobStatus().participants(), 2);

  Advance(absl::Milliseconds(1));
  ASSERT_THAT(events, SizeIs(1));
  ASSERT_TRUE(events[0].has_round_changed());
  EXPECT_EQ(events[0].round_changed().reason(), RoundChanged::NODE_LOST);
  EXPECT_EQ(events[0].round_changed().new_round(), 1);
  EXPECT_THAT(events[0].round_changed().detail(), HasSubstr("host-b"));
}

TEST_F(HubTest, AHeartbeatCarriesProgressAndAFailureReportTheStepItCameAfter) {
  JobConfig config = Config(1, 1);
  config.set_max_no_progress_restarts(1);
  absl::StatusOr<Assignment> assigned = Join("a", config).Wait();
  ASSERT_TRUE(assigned.ok());
  HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_node_id("a");
  beat.set_node_secret(assigned->node_secret());
  beat.mutable_progress()->set_step(12);
  beat.mutable_progress()->set_round(0);
  ASSERT_TRUE(hub_.Heartbeat(beat).ok());
  EXPECT_EQ(JobStatus().step(), 12);
  beat.mutable_progress()->set_step(-5);
  EXPECT_EQ(hub_.Heartbeat(beat).status().code(), absl::StatusCode::kInvalidArgument);

  // Restart 1 reaches step 13 just before it fails: a new step, no stop.
  ReportFailureRequest failed;
  failed.set_job_id("job");
  failed.set_node_id("a");
  failed.set_node_secret(assigned->node_secret());
  failed.set_round(0);
  failed.mutable_failure()->set_host("host-a");
  ASSERT_TRUE(hub_.ReportFailure(failed).ok());
  auto rejoin = [&] {
    JoinRequest request = Request("a", config);
    request.set_node_secret(assigned->node_secret());
    Pending<absl::StatusOr<Assignment>> join;
    hub_.Join(request, "10.0.0.1", hub_.NewTicket(), join.Callback());
    return join.Wait().ok();
  };
  ASSERT_TRUE(rejoin());
  failed.set_round(1);
  failed.mutable_progress()->set_step(13);
  failed.mutable_progress()->set_round(1);
  ASSERT_TRUE(hub_.ReportFailure(failed).ok());
  EXPECT_EQ(JobStatus().state(), "open");
  EXPECT_EQ(JobStatus().step(), 13);
  // Restart 2 reaches nothing new: stuck.
  ASSERT_TRUE(rejoin());
  failed.set_round(2);
  ASSERT_TRUE(hub_.ReportFailure(failed).ok());
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_THAT(JobStatus().close_reason(), HasSubstr("no new step"));
}

TEST_F(HubTest, LastCallCompletesTheRoundAtMinNodesWhenTheClockReachesItAndNotBefore) {
  JobConfig config = Config(2, 3);
  config.set_last_call_timeout_ms(kLastCallMs);
  Pending<absl::StatusOr<Assignment>> a = Join("a", config);
  Pending<absl::StatusOr<Assignment>> b = Join("b", config);

  Advance(absl::Milliseconds(kLastCallMs - 1));
  EXPECT_FALSE(a.Done());
  EXPECT_FALSE(b.Done());
  EXPECT_EQ(JobStatus().last_call_remaining_ms(), 1) << "Status reads the hub's clock";

  Advance(absl::Milliseconds(1));
  ASSERT_TRUE(a.Done() && b.Done()) << "RunDueTimers delivers before it returns";
  absl::StatusOr<Assignment> assignment = a.Wait();
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  EXPECT_EQ(assignment->group_world_size(), 2);
  EXPECT_TRUE(b.Wait().ok());
}

TEST_F(HubTest, JoinShortOfMinNodesFailsWithDeadlineExceededWhenTheClockReachesItsJoinTimeout) {
  JobConfig config = Config(2, 2);
  config.set_join_timeout_ms(kJoinTimeoutMs);
  Pending<absl::StatusOr<Assignment>> a = Join("a", config);

  Advance(absl::Milliseconds(kJoinTimeoutMs - 1));
  EXPECT_FALSE(a.Done());

  Advance(absl::Milliseconds(1));
  ASSERT_TRUE(a.Done());
  EXPECT_EQ(a.Wait().status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(HubTest, WithoutATimerThreadNoDeadlinePassesUntilRunDueTimers) {
  JobConfig config = Config(2, 2);
  config.set_join_timeout_ms(kJoinTimeoutMs);
  Pending<absl::StatusOr<Assignment>> a = Join("a", config);
  clock_.Advance(absl::Milliseconds(2 * kJoinTimeoutMs));
  // Calls read the time, but only RunDueTimers runs the timers.
  EXPECT_EQ(JobStatus().state(), "open");
  EXPECT_FALSE(a.Done());

  hub_.RunDueTimers();
  EXPECT_EQ(a.Wait(absl::ZeroDuration()).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(HubTest, NextDeadlineIsTheEarliestTimerOnTheHubsClock) {
  EXPECT_EQ(hub_.NextDeadline(), std::nullopt) << "no job, no timer";
  const absl::Time start = clock_.Now();
  JobConfig config = Config(2, 2);
  config.set_join_timeout_ms(kJoinTimeoutMs);
  config.set_heartbeat_timeout_ms(2 * kJoinTimeoutMs);
  Pending<absl::StatusOr<Assignment>> a = Join("a", config);
  EXPECT_EQ(hub_.NextDeadline(), start + absl::Milliseconds(kJoinTimeoutMs));
}

TEST_F(HubTest, EveryNodeGetsAnUnpredictableSecretThatItsCallsMustCarry) {
  Pending<absl::StatusOr<Assignment>> a = Join("a", Config(2, 2));
  Pending<absl::StatusOr<Assignment>> b = Join("b", Config(2, 2));
  absl::StatusOr<Assignment> assigned_a = a.Wait();
  absl::StatusOr<Assignment> assigned_b = b.Wait();
  ASSERT_TRUE(assigned_a.ok() && assigned_b.ok());
  EXPECT_EQ(assigned_a->node_secret().size(), 32u);
  EXPECT_NE(assigned_a->node_secret(), assigned_b->node_secret());

  HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_node_id("a");
  EXPECT_EQ(hub_.Heartbeat(beat).status().code(), absl::StatusCode::kPermissionDenied);
  beat.set_node_secret(assigned_b->node_secret());
  EXPECT_EQ(hub_.Heartbeat(beat).status().code(), absl::StatusCode::kPermissionDenied);
  beat.set_node_secret(assigned_a->node_secret());
  EXPECT_TRUE(hub_.Heartbeat(beat).ok());

  LeaveRequest leave;
  leave.set_job_id("job");
  leave.set_node_id("a");
  leave.set_node_secret(assigned_b->node_secret());
  EXPECT_EQ(hub_.Leave(leave).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(JobStatus().participants(), 2);
}

TEST_F(HubTest, WatchWithoutTheNodesSecretIsRefusedAndLeavesTheNodesOwnWatchOpen) {
  Pending<absl::StatusOr<Assignment>> a = Join("a", Config(2, 2));
  Pending<absl::StatusOr<Assignment>> b = Join("b", Config(2, 2));
  absl::StatusOr<Assignment> assigned = a.Wait();
  ASSERT_TRUE(assigned.ok());
  std::vector<WatchEvent> own;
  absl::Status own_end = absl::OkStatus();
  Watch("a", assigned->node_secret(), &own, &own_end);
  std::vector<WatchEvent> stolen;
  absl::Status stolen_end = absl::OkStatus();
  Watch("a", "guessed", &stolen, &stolen_end);
  EXPECT_EQ(stolen_end.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(own_end.ok()) << "the node's own watch was replaced: " << own_end;

  ReportFailureRequest report;
  report.set_job_id("job");
  report.set_node_id("b");
  report.set_round(0);
  report.set_node_secret(b.Wait()->node_secret());
  ASSERT_TRUE(hub_.ReportFailure(report).ok());
  EXPECT_THAT(stolen, IsEmpty());
  // The node's own watch is still open: end it while own_end is alive.
  hub_.Shutdown();
  ASSERT_THAT(own, SizeIs(1));
  EXPECT_EQ(own[0].round_changed().reason(), RoundChanged::WORKER_FAILED);
}

// Found in CI (test_gpu_check.Preflight, ASan tree): the agent that hosted
// the rendezvous closed the job and stopped its server while the other
// node's failure report was on its way; that node was told only "the
// rendezvous server is shutting down", and exited without saying why the
// job ended. A closed job's calls are told how it ended.
TEST_F(HubTest, AStoppingServerStillTellsHowAClosedJobEnded) {
  JobConfig config = Config(2, 2);
  config.set_max_restarts(0);
  Pending<absl::StatusOr<Assignment>> a = Join("a", config);
  Pending<absl::StatusOr<Assignment>> b = Join("b", config);
  ASSERT_TRUE(a.Wait().ok());
  ASSERT_TRUE(b.Wait().ok());
  ReportFailureRequest report;
  report.set_job_id("job");
  report.set_node_id("a");
  report.set_round(0);
  report.set_node_secret(a.Wait()->node_secret());
  ASSERT_TRUE(hub_.ReportFailure(report).ok());  // no restart left: the job closes
  hub_.Shutdown();
  report.set_node_id("b");
  report.set_node_secret(b.Wait()->node_secret());
  absl::Status late = hub_.ReportFailure(report);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("job 'job' is closed ("));
  HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_node_id("b");
  beat.set_node_secret(b.Wait()->node_secret());
  EXPECT_EQ(hub_.Heartbeat(beat).status().code(), absl::StatusCode::kFailedPrecondition);
  // Another job's calls are told the server is going away, as before.
  beat.set_job_id("other");
  EXPECT_EQ(hub_.Heartbeat(beat).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(HubTest, CancelledJoinsLeaveNoJobBehindPastMaxJoinTimeout) {
  HubOptions options = FakeTimeHub(&clock_);
  options.state.max_join_timeout = absl::Seconds(3);
  options.state.max_jobs = 1;
  RendezvousHub hub(options);
  JobConfig config = Config(2, 2);
  config.set_join_timeout_ms(3'600'000);
  const uint64_t ticket = hub.NewTicket();
  Pending<absl::StatusOr<Assignment>> a;
  hub.Join(Request("a", config), "10.0.0.1", ticket, a.Callback());
  hub.CancelJoin({"job", "a"}, ticket);
  EXPECT_EQ(a.Wait().status().code(), absl::StatusCode::kCancelled);
  JoinRequest other = Request("a", config);
  other.set_job_id("other");
  Pending<absl::StatusOr<Assignment>> refused;
  hub.Join(other, "10.0.0.1", hub.NewTicket(), refused.Callback());
  EXPECT_EQ(refused.Wait().status().code(), absl::StatusCode::kResourceExhausted);

  clock_.Advance(absl::Seconds(3));
  hub.RunDueTimers();
  EXPECT_EQ(hub.Status("job").status().code(), absl::StatusCode::kNotFound);
  Pending<absl::StatusOr<Assignment>> accepted;
  hub.Join(other, "10.0.0.1", hub.NewTicket(), accepted.Callback());
  EXPECT_FALSE(accepted.Done()) << "pending: the job is open";
  EXPECT_TRUE(hub.Status("other").ok());
}

TEST(HubRealClockTest, TheTimerThreadRunsADeadlineWhenTheRealClockReachesIt) {
  RendezvousHub hub;  // the real clock and the timer thread
  JobConfig config = Config(2, 2);
  config.set_join_timeout_ms(50);
  Pending<absl::StatusOr<Assignment>> a;
  hub.Join(Request("a", config), "10.0.0.1", hub.NewTicket(), a.Callback());
  EXPECT_EQ(a.Wait().status().code(), absl::StatusCode::kDeadlineExceeded);
}

// ---- With a journal (musterd --state-dir) ----

class HubJournalTest : public ::testing::Test {
 protected:
  void TearDown() override { hub_.reset(); }

  // A hub on the journal in dir_, started from what it holds: musterd's start.
  void StartHub(JournalOptions journal_options = {}) {
    hub_.reset();  // closes its journal first
    Replayed replayed;
    absl::StatusOr<std::unique_ptr<Journal>> journal =
        Journal::Open(dir_ + "/state", &replayed, journal_options);
    ASSERT_TRUE(journal.ok()) << journal.status();
    HubOptions options = FakeTimeHub(&clock_);
    options.journal = *std::move(journal);
    options.restore = std::move(replayed.records);
    options.on_journal_failure = [this](const absl::Status& status) {
      failures_.push_back(status);
    };
    hub_ = std::make_unique<RendezvousHub>(std::move(options));
  }

  Pending<absl::StatusOr<Assignment>> Join(const std::string& node, JoinRequest request) {
    Pending<absl::StatusOr<Assignment>> join;
    hub_->Join(request, "10.0.0.1", hub_->NewTicket(), join.Callback());
    return join;
  }

  support::TempDir temp_{"hub-journal"};
  const std::string dir_ = temp_.path();
  FakeClock clock_;
  std::unique_ptr<RendezvousHub> hub_;
  std::vector<absl::Status> failures_;
};

TEST_F(HubJournalTest, AHubStartedAgainOnItsJournalContinuesTheJob) {
  StartHub();
  auto a = Join("a", Request("a", Config(2, 2)));
  auto b = Join("b", Request("b", Config(2, 2)));
  absl::StatusOr<Assignment> assigned = a.Wait();
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  ASSERT_TRUE(b.Wait().ok());
  // Stopped as musterd stops on SIGTERM with --state-dir: the job is kept.
  hub_->Shutdown(RendezvousHub::Jobs::kKept);
  clock_.Advance(absl::Minutes(5));
  StartHub();
  EXPECT_EQ(hub_->CountJobs().open, 1u);
  absl::StatusOr<StatusResponse> status = hub_->Status("job");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), "running");
  EXPECT_EQ(status->participants(), 2);
  HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_node_id("a");
  beat.set_node_secret(assigned->node_secret());
  EXPECT_EQ(hub_->Heartbeat(beat).value_or(-1), 0);
  beat.set_node_secret("a guess");
  EXPECT_EQ(hub_->Heartbeat(beat).status().code(), absl::StatusCode::kPermissionDenied);
}

// musterctl watch of a job that closed before a restart: its history is
// gone, but how it ended is journaled; the watch shows that, and ends.
TEST_F(HubJournalTest, AWatchOfAJobClosedBeforeARestartShowsTheCloseAndEnds) {
  StartHub();
  auto a = Join("a", Request("a", Config(1, 1)));
  ASSERT_TRUE(a.Wait().ok());
  ASSERT_TRUE(hub_->Stop("job", "maintenance").ok());
  hub_->Shutdown(RendezvousHub::Jobs::kKept);
  clock_.Advance(absl::Minutes(1));
  StartHub();
  std::vector<JobEvent> seen;
  std::optional<absl::Status> ended;
  ASSERT_TRUE(hub_->ObserveJob("job", hub_->NewTicket(),
                               RendezvousHub::Observer{
                                   [&seen](const JobEvent& event) { seen.push_back(event); }, [] {},
                                   [&ended](absl::Status s) { ended = s; }})
                  .ok());
  ASSERT_THAT(seen, SizeIs(1));
  EXPECT_EQ(seen[0].kind(), JobEvent::JOB_CLOSED);
  EXPECT_FALSE(seen[0].succeeded());
  EXPECT_THAT(seen[0].detail(), HasSubstr("stopped by an operator: maintenance (closed before "
                                          "this rendezvous restarted"));
  EXPECT_TRUE(IsFinalEvent(seen[0])) << "so the watch ends after it";
  // The hub kept no observer (a shutdown would end it): nothing would
  // follow a later job of the same id.
  hub_->Shutdown();
  EXPECT_FALSE(ended.has_value());
}

TEST_F(HubJournalTest, AJournalCompactedAsItGrewStillContinuesTheJob) {
  // Compacts at every change: the file is always a snapshot of the state.
  StartHub(JournalOptions{.compact_bytes = 1});
  auto a = Join("a", Request("a", Config(2, 2)));
  auto b = Join("b", Request("b", Config(2, 2)));
  absl::StatusOr<Assignment> assigned = a.Wait();
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  ASSERT_TRUE(b.Wait().ok());
  ReportFailureRequest failure;
  failure.set_job_id("job");
  failure.set_node_id("a");
  failure.set_node_secret(assigned->node_secret());
  failure.set_round(0);
  ASSERT_TRUE(hub_->ReportFailure(failure).ok());
  EXPECT_THAT(failures_, IsEmpty());

  StartHub();
  absl::StatusOr<StatusResponse> status = hub_->Status("job");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), "open");
  EXPECT_EQ(status->round(), 1);
  EXPECT_EQ(status->restart_count(), 1);
  EXPECT_EQ(status->missing_count(), 2) << "both members must come back";
}

TEST_F(HubJournalTest, WhenTheJournalCannotBeWrittenNothingThatDependsOnItIsDelivered) {
  // Compacts at the first record; where the new file would go is taken.
  StartHub(JournalOptions{.compact_bytes = 1});
  std::filesystem::create_directory(dir_ + "/state/journal.new");
  auto a = Join("a", Request("a", Config(1, 1)));
  absl::StatusOr<Assignment> assigned = a.Wait();
  EXPECT_EQ(assigned.status().code(), absl::StatusCode::kUnavailable) << assigned.status();
  ASSERT_THAT(failures_, SizeIs(1));
  EXPECT_THAT(failures_[0].message(), HasSubstr("journal.new"));
  // The hub stopped; later calls are told to call again.
  EXPECT_EQ(Join("b", Request("b", Config(1, 1))).Wait().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_THAT(failures_, SizeIs(1)) << "told once";
}

// An observer (musterctl watch) gets the job's history, then each event as
// it happens, in order, up to the close; the event sink (musterd
// --event-log) gets every job's events in the same order.
TEST(HubObserverTest, AnObserverGetsTheHistoryThenTheEventsUpToTheClose) {
  FakeClock clock;
  std::vector<std::string> sunk;
  HubOptions options = FakeTimeHub(&clock);
  options.on_event = [&sunk](const JobEvent& event) {
    sunk.push_back(absl::StrCat(event.job_id(), " ", event.kind()));
  };
  RendezvousHub hub(options);
  EXPECT_EQ(hub.ObserveJob("job", hub.NewTicket(), {}).code(), absl::StatusCode::kNotFound);

  const JobConfig config = Config(2, 2);
  Pending<absl::StatusOr<Assignment>> a;
  hub.Join(Request("a", config), "10.0.0.1", hub.NewTicket(), a.Callback());
  std::vector<JobEvent::Kind> seen;
  int flushes = 0;
  absl::Status ended;
  ASSERT_TRUE(hub.ObserveJob("job", hub.NewTicket(),
                             RendezvousHub::Observer{
                                 [&seen](const JobEvent& event) { seen.push_back(event.kind()); },
                                 [&flushes] { ++flushes; },
                                 [&ended](absl::Status status) { ended = status; }})
                  .ok());
  EXPECT_THAT(seen, ::testing::ElementsAre(JobEvent::NODE_JOINED)) << "the history first";
  EXPECT_EQ(flushes, 1);
  Pending<absl::StatusOr<Assignment>> b;
  hub.Join(Request("b", config), "10.0.0.1", hub.NewTicket(), b.Callback());
  ASSERT_TRUE(b.Done());
  EXPECT_THAT(seen, ::testing::ElementsAre(JobEvent::NODE_JOINED, JobEvent::NODE_JOINED,
                                           JobEvent::ROUND_STARTED));
  EXPECT_GE(flushes, 2);
  ASSERT_TRUE(hub.Stop("job", "enough").ok());
  EXPECT_EQ(seen.back(), JobEvent::JOB_CLOSED);
  const size_t at_close = seen.size();
  EXPECT_EQ(hub.Stop("job", "again").code(), absl::StatusCode::kFailedPrecondition);
  hub.Shutdown();
  EXPECT_TRUE(ended.ok()) << "forgotten after its final event, not ended by the shutdown";
  EXPECT_EQ(seen.size(), at_close);
  EXPECT_THAT(sunk, ::testing::ElementsAre("job 1", "job 1", "job 3", "job 5"));
}

TEST(HubObserverTest, AShutdownEndsAnObserverOfARunningJob) {
  FakeClock clock;
  RendezvousHub hub(FakeTimeHub(&clock));
  Pending<absl::StatusOr<Assignment>> a;
  hub.Join(Request("a", Config(1, 1)), "10.0.0.1", hub.NewTicket(), a.Callback());
  std::optional<absl::Status> ended;
  const uint64_t ticket = hub.NewTicket();
  ASSERT_TRUE(hub.ObserveJob("job", ticket,
                             RendezvousHub::Observer{[](const JobEvent&) {}, [] {},
                                                     [&ended](absl::Status s) { ended = s; }})
                  .ok());
  hub.Shutdown(RendezvousHub::Jobs::kKept);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(hub.ObserveJob("job", hub.NewTicket(), {}).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace muster::rdzv
