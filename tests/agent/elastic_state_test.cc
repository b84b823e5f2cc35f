// The agent's elastic rules, checked on the pure state machine: every phase
// against every event, the time passed in, no processes and no sleeps.
#include "agent/elastic_state.h"

#include <signal.h>

#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "agent/exit_codes.h"
#include "rendezvous/rules/protocol.h"

namespace muster {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
absl::Time At(int64_t ms) { return kT0 + absl::Milliseconds(ms); }

constexpr int64_t kGraceMs = 3'000;
constexpr int64_t kKeepAliveMs = 5'000;
constexpr char kTarget[] = "rdzv:29400";

ElasticOptions Options(bool hosts = false) {
  ElasticOptions options;
  options.script = "train.py";
  options.rdzv_target = kTarget;
  options.hosts_rendezvous = hosts;
  options.join_timeout = absl::Seconds(600);
  options.keep_alive_interval = absl::Milliseconds(kKeepAliveMs);
  options.keep_alive_max_attempt = 3;
  options.shutdown_grace = absl::Milliseconds(kGraceMs);
  // Off here, so that each test sees its own timers: ProgressTest turns it on.
  options.progress_poll = absl::ZeroDuration();
  return options;
}

// The names of the actions, in order, without the log lines.
std::vector<std::string> Names(const Actions& actions) {
  std::vector<std::string> names;
  for (const Action& a : actions) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, action::Join>) names.push_back("Join");
          if constexpr (std::is_same_v<T, action::StartWorkers>) names.push_back("StartWorkers");
          if constexpr (std::is_same_v<T, action::SignalWorkers>) {
            names.push_back(std::string("Signal ") + sigabbrev_np(x.sig));
          }
          if constexpr (std::is_same_v<T, action::AbandonWorkers>) names.push_back("Abandon");
          if constexpr (std::is_same_v<T, action::ReportFailure>) names.push_back("ReportFailure");
          if constexpr (std::is_same_v<T, action::ReportDone>) names.push_back("ReportDone");
          if constexpr (std::is_same_v<T, action::SendHeartbeat>) {
            names.push_back(x.progress ? "Heartbeat+progress" : "Heartbeat");
          }
          if constexpr (std::is_same_v<T, action::ReadProgress>) names.push_back("ReadProgress");
          if constexpr (std::is_same_v<T, action::OpenWatch>) names.push_back("OpenWatch");
          if constexpr (std::is_same_v<T, action::QueryStatus>) names.push_back("QueryStatus");
          if constexpr (std::is_same_v<T, action::AskPeers>) {
            names.push_back("AskPeers " + std::to_string(x.round));
          }
          if constexpr (std::is_same_v<T, action::Exit>) {
            names.push_back("Exit " + std::to_string(x.code));
          }
        },
        a);
  }
  return names;
}

// The log lines, each as "LEVEL text".
std::vector<std::string> Logs(const Actions& actions) {
  std::vector<std::string> lines;
  for (const Action& a : actions) {
    if (const auto* log = std::get_if<action::Log>(&a)) {
      static const char* const kLevel[] = {"DEBUG ", "INFO ", "WARN ", "ERROR "};
      lines.push_back(kLevel[static_cast<int>(log->level)] + log->text);
    }
  }
  return lines;
}

template <typename T>
const T& Find(const Actions& actions) {
  for (const Action& a : actions) {
    if (const T* found = std::get_if<T>(&a)) return *found;
  }
  ADD_FAILURE() << "no such action";
  static const T kNone{};
  return kNone;
}

// `ride_out`: from a rendezvous that runs apart from the nodes (musterd).
rdzv::Assignment Assigned(int64_t round, int restart_count = 0, bool ride_out = false) {
  rdzv::Assignment assignment;
  assignment.set_round(round);
  assignment.set_restart_count(restart_count);
  assignment.set_world_size(2);
  assignment.set_ride_out_outages(ride_out);
  return assignment;
}

WorkerFailure Failure(int rank, int exit_code = 1, int signal = 0) {
  WorkerFailure failure;
  failure.rank = rank;
  failure.local_rank = rank;
  failure.host = "node-a";
  failure.pid = 1000 + rank;
  failure.exit_code = exit_code;
  failure.signal = signal;
  failure.time = kT0;
  return failure;
}

const ExitStatus kSuccess{0, 0};
const ExitStatus kExit1{1, 0};
const ExitStatus kByTerm{0, SIGTERM};

RdzvEvent RoundChangedTo(int64_t round) {
  rdzv::WatchEvent event;
  event.mutable_round_changed()->set_new_round(round);
  event.mutable_round_changed()->set_detail("a node failed");
  return rdzv_event::Pushed{1, event};
}

RdzvEvent JobClosed(bool succeeded, const std::string& reason) {
  rdzv::WatchEvent event;
  event.mutable_job_closed()->set_succeeded(succeeded);
  event.mutable_job_closed()->set_reason(reason);
  return rdzv_event::Pushed{1, event};
}

RdzvEvent WatchStarted(uint64_t generation) {
  rdzv::WatchEvent event;
  event.mutable_watch_started()->set_round(0);
  return rdzv_event::Pushed{generation, event};
}

RdzvEvent Beat(absl::StatusOr<int64_t> round) { return rdzv_event::HeartbeatAnswered{round}; }

class ElasticStateTest : public ::testing::Test {
 protected:
  explicit ElasticStateTest(ElasticOptions options = Options()) : state_(std::move(options)) {}

  // Joining: the first Join is out.
  void ToJoining() { EXPECT_THAT(Names(state_.Start(At(0))), ElementsAre("Join")); }
  // Running `workers` workers in `round`.
  void ToRunning(int workers = 2, int64_t round = 0) {
    ToJoining();
    Actions joined = state_.OnRdzv(rdzv_event::Joined{Assigned(round, 0, ride_out_)}, At(10));
    EXPECT_THAT(Names(joined), ElementsAre("OpenWatch", "StartWorkers"));
    EXPECT_THAT(Names(state_.OnWorkersStarted(workers, std::nullopt, At(10))), IsEmpty());
    ASSERT_EQ(state_.phase(), AgentPhase::kRunning);
  }
  // Stopping after rank 0 failed; the other workers still run.
  void ToStoppingAfterFailure(int workers = 2) {
    ToRunning(workers);
    Actions failed = state_.OnWorkerExit(kExit1, Failure(0), At(100));
    EXPECT_THAT(Names(failed), ElementsAre("ReportFailure", "Signal TERM"));
    ASSERT_EQ(state_.phase(), AgentPhase::kStopping);
  }
  // Every worker exited 0; ReportDone is out.
  void ToFinishing() {
    ToRunning(1);
    EXPECT_THAT(Names(state_.OnWorkerExit(kSuccess, Failure(0, 0), At(100))),
                ElementsAre("ReportDone"));
    ASSERT_EQ(state_.phase(), AgentPhase::kFinishing);
  }

  // The rendezvous's assignments say to ride out its outages (RideOutTest).
  bool ride_out_ = false;
  ElasticState state_;
};

// ---- Start and joining ----

TEST_F(ElasticStateTest, StartJoinsAndSchedulesTheFirstProgressLineAfterTwoSeconds) {
  ToJoining();
  EXPECT_EQ(state_.phase(), AgentPhase::kJoining);
  EXPECT_EQ(state_.NextDeadline(), At(2'000));
  EXPECT_THAT(Names(state_.Start(At(1))), IsEmpty()) << "a second Start is a no-op";
}

TEST_F(ElasticStateTest, EventsBeforeStartAreIgnored) {
  EXPECT_THAT(state_.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(0)), IsEmpty());
  EXPECT_THAT(state_.OnRdzv(RoundChangedTo(3), At(0)), IsEmpty());
  EXPECT_EQ(state_.phase(), AgentPhase::kIdle);
}

TEST_F(ElasticStateTest, JoinedOpensTheWatchAndStartsAttemptZero) {
  ToJoining();
  Actions actions = state_.OnRdzv(rdzv_event::Joined{Assigned(4)}, At(10));
  EXPECT_THAT(Names(actions), ElementsAre("OpenWatch", "StartWorkers"));
  EXPECT_EQ(Find<action::OpenWatch>(actions).generation, 1u);
  EXPECT_EQ(Find<action::OpenWatch>(actions).known_round, 4);
  EXPECT_EQ(Find<action::StartWorkers>(actions).attempt, 0);
  EXPECT_EQ(Find<action::StartWorkers>(actions).assignment.round(), 4);
  EXPECT_EQ(state_.phase(), AgentPhase::kJoining) << "running only once the workers are up";
  EXPECT_EQ(state_.NextDeadline(), At(10 + kKeepAliveMs)) << "progress line off, heartbeats on";
  state_.OnWorkersStarted(2, std::nullopt, At(11));
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
  EXPECT_EQ(state_.live_workers(), 2);
}

TEST_F(ElasticStateTest, ASecondJoinKeepsTheOpenWatchAndCountsTheAttempt) {
  ToRunning();
  state_.OnRdzv(RoundChangedTo(1), At(200));
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(210));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(220))),
              ElementsAre("Join"));
  Actions rejoined = state_.OnRdzv(rdzv_event::Joined{Assigned(1, 1)}, At(230));
  EXPECT_THAT(Names(rejoined), ElementsAre("StartWorkers"));
  EXPECT_EQ(Find<action::StartWorkers>(rejoined).attempt, 1);
  EXPECT_EQ(state_.attempts(), 2);
}

TEST_F(ElasticStateTest, NoRendezvousWithinJoinTimeoutExitsWithAHint) {
  ToJoining();
  Actions actions =
      state_.OnRdzv(rdzv_event::Joined{absl::DeadlineExceededError("deadline")}, At(605'000));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 1"));
  const auto& exit = Find<action::Exit>(actions);
  EXPECT_THAT(exit.why,
              HasSubstr("no rendezvous answered at rdzv:29400 within join_timeout (600 s)"));
  EXPECT_THAT(exit.why, HasSubstr("--rdzv-endpoint"));
  EXPECT_FALSE(exit.leave_reason) << "never in the job: nothing to leave";
  EXPECT_TRUE(state_.done());
}

TEST_F(ElasticStateTest, AHostingNodeWhoseJoinFailsSaysTheRendezvousFailed) {
  ElasticState host(Options(/*hosts=*/true));
  host.Start(At(0));
  Actions actions = host.OnRdzv(rdzv_event::Joined{absl::UnavailableError("shutting down")}, At(1));
  EXPECT_EQ(Find<action::Exit>(actions).why, "rendezvous at rdzv:29400 failed: shutting down");
}

TEST_F(ElasticStateTest, ARefusedJoinExitsNamingTheReason) {
  ToJoining();
  Actions actions =
      state_.OnRdzv(rdzv_event::Joined{absl::FailedPreconditionError("job 'x' is closed")}, At(1));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(actions).why, "rendezvous at rdzv:29400 failed: job 'x' is closed");
}

// The client words a refused credential (rendezvous/client/client.h); it is final.
const absl::Status kRefused = absl::UnauthenticatedError(
    "the rendezvous at rdzv:29400 refused our credential: the token in /t is not the one");

TEST_F(ElasticStateTest, AJoinRefusedForItsCredentialExitsAtOnceWithTheClientsMessage) {
  ToJoining();
  Actions actions = state_.OnRdzv(rdzv_event::Joined{kRefused}, At(1));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(actions).why, kRefused.message());
  EXPECT_TRUE(state_.done());
}

TEST_F(ElasticStateTest, AStatusRefusedForItsCredentialWhileJoiningExitsAtOnce) {
  ToJoining();
  Actions actions = state_.OnRdzv(rdzv_event::JobStatusAnswered{kRefused}, At(2'000));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(actions).why, kRefused.message());
}

TEST_F(ElasticStateTest, ARefusedHeartbeatIsNotRetriedButStopsTheWorkersAndExits) {
  ToRunning(1);
  Actions refused = state_.OnRdzv(Beat(kRefused), At(100));
  EXPECT_THAT(Names(refused), ElementsAre("Signal TERM")) << "one refusal is enough";
  EXPECT_THAT(Logs(refused), ElementsAre(HasSubstr("ERROR the rendezvous at rdzv:29400 refused")));
  EXPECT_EQ(state_.NextDeadline(), At(100 + kGraceMs)) << "no more heartbeats, only the kill timer";
  Actions exit = state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  ASSERT_THAT(Names(exit), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(exit).why, kRefused.message());
}

TEST_F(ElasticStateTest, ARefusedWatchIsNotReopenedButStopsTheWorkersAndExits) {
  ToRunning(1);
  Actions refused = state_.OnRdzv(rdzv_event::WatchEnded{1, kRefused}, At(100));
  EXPECT_THAT(Names(refused), ElementsAre("Signal TERM"));
  EXPECT_EQ(state_.NextDeadline(), At(100 + kGraceMs)) << "no watch retry, no heartbeat";
  Actions exit = state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  ASSERT_THAT(Names(exit), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(exit).why, kRefused.message());
}

TEST_F(ElasticStateTest, WhileJoiningTheProgressLineComesEveryFiveSeconds) {
  ToJoining();
  EXPECT_THAT(Names(state_.OnTimer(At(1'999))), IsEmpty());
  EXPECT_THAT(Names(state_.OnTimer(At(2'000))), ElementsAre("QueryStatus"));
  EXPECT_EQ(state_.NextDeadline(), At(7'000));
  rdzv::StatusResponse job;
  job.set_participants(1);
  job.mutable_config()->set_min_nodes(2);
  job.mutable_config()->set_max_nodes(2);
  job.set_last_call_remaining_ms(-1);
  EXPECT_THAT(Logs(state_.OnRdzv(rdzv_event::JobStatusAnswered{job}, At(2'001))),
              ElementsAre("INFO waiting for nodes: 1/2 joined (min 2, max 2)"));
}

TEST_F(ElasticStateTest, AStatusAnswerAfterTheRoundStartedIsNotPrinted) {
  ToRunning();
  EXPECT_THAT(state_.OnRdzv(rdzv_event::JobStatusAnswered{rdzv::StatusResponse()}, At(20)),
              IsEmpty());
}

TEST(ProgressLineTest, NamesWhoIsMissingAndWhenTheLastCallEnds) {
  rdzv::StatusResponse job;
  job.set_participants(3);
  job.mutable_config()->set_min_nodes(2);
  job.mutable_config()->set_max_nodes(8);
  job.set_last_call_remaining_ms(1'001);
  job.add_missing("host-b");
  job.add_missing("host-c");
  job.set_missing_count(5);
  EXPECT_EQ(ProgressLine(kTarget, job),
            "waiting for nodes: 3/8 joined (min 2, max 8), last call ends in 2 s; not back yet: "
            "host-b, host-c and 3 more");
  EXPECT_EQ(ProgressLine(kTarget, absl::UnavailableError("connection refused")),
            "waiting for the rendezvous at rdzv:29400 (connection refused)");
}

TEST_F(ElasticStateTest, AStopSignalWhileFirstJoiningExitsAt128PlusItWithoutLeaving) {
  ToJoining();
  Actions actions = state_.OnSignal(SIGINT, At(5));
  EXPECT_THAT(Names(actions), ElementsAre("Signal INT", "Exit 130"));
  EXPECT_FALSE(Find<action::Exit>(actions).leave_reason);
}

TEST_F(ElasticStateTest, AStopSignalWhileRejoiningLeavesTheJob) {
  ToFinishing();
  state_.OnRdzv(rdzv_event::DoneReported{absl::AbortedError("moved on")}, At(110));
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(120))), ElementsAre("Join"));
  Actions actions = state_.OnSignal(SIGTERM, At(130));
  EXPECT_THAT(Names(actions), ElementsAre("Signal TERM", "Exit 143"));
  EXPECT_EQ(Find<action::Exit>(actions).leave_reason, "agent stopped by SIGTERM");
}

TEST_F(ElasticStateTest, ARoundChangeWhileJoiningIsOnlyLogged) {
  ToJoining();
  Actions actions = state_.OnRdzv(RoundChangedTo(2), At(5));
  EXPECT_THAT(Names(actions), IsEmpty());
  EXPECT_THAT(Logs(actions), ElementsAre("INFO job moves to round 2: a node failed"));
}

TEST_F(ElasticStateTest, AJobThatClosesWhileJoiningEndsTheAgentWithItsResult) {
  ToJoining();
  EXPECT_THAT(Names(state_.OnRdzv(JobClosed(true, "done"), At(5))), ElementsAre("Exit 0"));
  ElasticState other(Options());
  other.Start(At(0));
  Actions failed = other.OnRdzv(JobClosed(false, "restarts ran out"), At(5));
  EXPECT_THAT(Names(failed), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(failed).why, "restarts ran out");
}

// ---- Running ----

TEST_F(ElasticStateTest, TheLastWorkerToSucceedReportsTheNodeDone) {
  ToRunning(2, 3);
  EXPECT_THAT(Names(state_.OnWorkerExit(kSuccess, Failure(0, 0), At(100))), IsEmpty());
  Actions actions = state_.OnWorkerExit(kSuccess, Failure(1, 0), At(110));
  EXPECT_THAT(Names(actions), ElementsAre("ReportDone"));
  EXPECT_EQ(Find<action::ReportDone>(actions).round, 3);
  EXPECT_EQ(state_.phase(), AgentPhase::kFinishing);
}

TEST_F(ElasticStateTest, AFailedWorkerIsReportedAndTheOthersGetSigtermThenSigkill) {
  ToRunning(2, 5);
  Actions actions = state_.OnWorkerExit(kExit1, Failure(1), At(100));
  EXPECT_THAT(Names(actions), ElementsAre("ReportFailure", "Signal TERM"));
  EXPECT_EQ(Find<action::ReportFailure>(actions).round, 5);
  EXPECT_EQ(Find<action::ReportFailure>(actions).failure.rank, 1);
  EXPECT_THAT(Logs(actions),
              ElementsAre("ERROR rank 1 (local rank 1, pid 1001) failed: exit code 1; stopping "
                          "the other workers"));
  EXPECT_EQ(state_.NextDeadline(), At(100 + kGraceMs));
  EXPECT_THAT(Names(state_.OnTimer(At(100 + kGraceMs - 1))), IsEmpty());
  Actions killed = state_.OnTimer(At(100 + kGraceMs));
  EXPECT_THAT(Names(killed), ElementsAre("Signal KILL"));
  EXPECT_THAT(
      Logs(killed),
      ElementsAre("WARN 1 worker(s) still running 3.0 s after the stop signal; sending SIGKILL"));
}

TEST_F(ElasticStateTest, AWorkerThatCouldNotStartCountsAsFailed) {
  ToJoining();
  state_.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(10));
  WorkerFailure failure = Failure(1, 127);
  failure.error = WorkerError{"cannot run ./train: Permission denied", "", std::nullopt};
  Actions actions = state_.OnWorkersStarted(1, failure, At(11));
  EXPECT_THAT(Names(actions), ElementsAre("ReportFailure", "Signal TERM"));
  EXPECT_THAT(Logs(actions),
              ElementsAre("ERROR rank 1 could not start: cannot run ./train: Permission denied"));
  EXPECT_EQ(state_.live_workers(), 1);
}

TEST_F(ElasticStateTest, AnAgentOutOfDescriptorsLeavesTheJobWithoutSpendingARestart) {
  ToJoining();
  state_.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(10));
  WorkerFailure failure = Failure(1, 127);
  failure.error = WorkerError{"pipe2: Too many open files", "", std::nullopt};
  failure.agent_out_of_resources = true;
  Actions actions = state_.OnWorkersStarted(1, failure, At(11));
  EXPECT_THAT(Names(actions), ElementsAre("Signal TERM")) << "no ReportFailure: no restart spent";
  EXPECT_THAT(Logs(actions), ElementsAre("ERROR rank 1 could not start: pipe2: Too many open "
                                         "files; stopping this node's workers"));
  EXPECT_EQ(state_.after_stop(), AfterStop::kExitLeave);
  // A new round while it stops does not bring it back: it cannot start workers.
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(12))), IsEmpty());
  Actions stopped = state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(20));
  ASSERT_THAT(Names(stopped), ElementsAre("Exit 1"));
  const auto& exit = Find<action::Exit>(stopped);
  ASSERT_TRUE(exit.leave_reason.has_value());
  EXPECT_THAT(*exit.leave_reason, HasSubstr("pipe2: Too many open files"));
  EXPECT_THAT(*exit.leave_reason, HasSubstr("ulimit -n"));
  EXPECT_EQ(exit.why, *exit.leave_reason);
  EXPECT_TRUE(exit.report.empty()) << "no worker failed: no failure table";
}

TEST_F(ElasticStateTest, AnAgentOutOfDescriptorsWithNoWorkerUpLeavesAtOnce) {
  ToJoining();
  state_.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(10));
  WorkerFailure failure = Failure(0, 127);
  failure.agent_out_of_resources = true;
  Actions actions = state_.OnWorkersStarted(0, failure, At(11));
  EXPECT_THAT(Names(actions), ElementsAre("Signal TERM", "Exit 1"));
  EXPECT_TRUE(Find<action::Exit>(actions).leave_reason.has_value());
}

TEST_F(ElasticStateTest, WhenNoWorkerCouldStartTheAgentWaitsForTheRendezvousToDecide) {
  ToJoining();
  state_.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(10));
  Actions actions = state_.OnWorkersStarted(0, Failure(0, 127), At(11));
  EXPECT_THAT(Names(actions), ElementsAre("ReportFailure", "Signal TERM"));
  EXPECT_EQ(state_.after_stop(), AfterStop::kAwaitDecision);
  EXPECT_EQ(state_.NextDeadline(), At(10 + kKeepAliveMs)) << "no kill timer: nothing runs";
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(20))), ElementsAre("Join"));
}

TEST_F(ElasticStateTest, ANewRoundWhileRunningStopsTheWorkersThenRejoins) {
  ToRunning();
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(100))), ElementsAre("Signal TERM"));
  EXPECT_EQ(state_.after_stop(), AfterStop::kRejoin);
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110))), IsEmpty());
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(120))),
              ElementsAre("Join"));
  EXPECT_EQ(state_.phase(), AgentPhase::kJoining);
  EXPECT_EQ(state_.NextDeadline(), At(120 + 2'000)) << "the progress line again";
}

TEST_F(ElasticStateTest, ARoundChangeNoNewerThanTheCurrentRoundIsIgnored) {
  ToRunning(2, 3);
  EXPECT_THAT(state_.OnRdzv(RoundChangedTo(3), At(100)), IsEmpty());
  EXPECT_THAT(state_.OnRdzv(RoundChangedTo(2), At(100)), IsEmpty());
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(4), At(100))), ElementsAre("Signal TERM"));
  EXPECT_THAT(state_.OnRdzv(RoundChangedTo(4), At(101)), IsEmpty()) << "told twice, acted once";
}

TEST_F(ElasticStateTest, AJobThatClosesWhileWorkersRunStopsThemAndExitsFailedEvenIfSucceeded) {
  ToRunning(1);
  EXPECT_THAT(Names(state_.OnRdzv(JobClosed(true, "every node finished"), At(100))),
              ElementsAre("Signal TERM"));
  Actions actions = state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  EXPECT_THAT(Names(actions), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(actions).why, "every node finished");
  EXPECT_FALSE(Find<action::Exit>(actions).failures_seen) << "killed by our SIGTERM: no failure";
}

TEST_F(ElasticStateTest, SigusrIsForwardedAndTheJobGoesOn) {
  ToRunning();
  Actions actions = state_.OnSignal(SIGUSR1, At(100));
  EXPECT_THAT(Names(actions), ElementsAre("Signal USR1"));
  EXPECT_THAT(Logs(actions), ElementsAre("INFO forwarded SIGUSR1 to 2 worker(s)"));
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
}

TEST_F(ElasticStateTest, AStopSignalStopsTheWorkersThenExitsAt128PlusItAndLeaves) {
  ToRunning();
  Actions actions = state_.OnSignal(SIGTERM, At(100));
  EXPECT_THAT(Names(actions), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(actions),
              ElementsAre("WARN received SIGTERM: stopping 2 worker(s) (grace 3.0 s)"));
  EXPECT_EQ(state_.NextDeadline(), At(100 + kGraceMs));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110))), IsEmpty());
  // A worker that exits 1 on SIGTERM is no failure of its own: the signal was ours.
  Actions exit = state_.OnWorkerExit(kExit1, Failure(1), At(120));
  EXPECT_THAT(Names(exit), ElementsAre("Exit 143"));
  EXPECT_EQ(Find<action::Exit>(exit).leave_reason, "agent stopped by SIGTERM");
  EXPECT_TRUE(Find<action::Exit>(exit).report.empty());
}

// --signals-to-handle SIGUSR1: SIGUSR1 stops the job; SIGUSR2, left out, is only forwarded.
TEST(ElasticStateSignalsTest, TheStopSignalsAreThoseGiven) {
  ElasticOptions options = Options();
  options.stop_signals = {SIGUSR1};
  ElasticState state(options);
  state.Start(At(0));
  state.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(10));
  state.OnWorkersStarted(2, std::nullopt, At(10));
  Actions usr2 = state.OnSignal(SIGUSR2, At(100));
  EXPECT_THAT(Names(usr2), ElementsAre("Signal USR2"));
  EXPECT_THAT(Logs(usr2), ElementsAre("INFO forwarded SIGUSR2 to 2 worker(s)"));
  EXPECT_EQ(state.phase(), AgentPhase::kRunning);
  Actions usr1 = state.OnSignal(SIGUSR1, At(200));
  EXPECT_THAT(Logs(usr1), ElementsAre("WARN received SIGUSR1: stopping 2 worker(s) (grace 3.0 s)"));
  EXPECT_EQ(state.phase(), AgentPhase::kStopping);
  state.OnWorkerExit(kByTerm, Failure(0, 0, SIGUSR1), At(210));
  Actions exit = state.OnWorkerExit(kByTerm, Failure(1, 0, SIGUSR1), At(220));
  EXPECT_THAT(Names(exit), ElementsAre("Exit 138"));
}

TEST_F(ElasticStateTest, ASecondStopSignalKillsTheWorkersAtOnce) {
  ToRunning();
  state_.OnSignal(SIGINT, At(100));
  Actions again = state_.OnSignal(SIGINT, At(200));
  EXPECT_THAT(Names(again), ElementsAre("Signal INT", "Signal KILL"));
  EXPECT_THAT(Logs(again), ElementsAre("WARN SIGINT again: killing the workers now"));
}

TEST_F(ElasticStateTest, AHeartbeatAnswerWithANewerRoundStandsInForALostPush) {
  ToRunning(2, 0);
  EXPECT_EQ(state_.MissedRound(0), std::nullopt) << "the round this node runs";
  EXPECT_EQ(state_.MissedRound(absl::UnavailableError("down")), std::nullopt);
  std::optional<rdzv::RoundChanged> missed = state_.MissedRound(2);
  ASSERT_TRUE(missed.has_value()) << "what the console events print for it";
  EXPECT_EQ(missed->new_round(), 2);
  EXPECT_EQ(missed->detail(), "the job moved on (seen in a heartbeat)");
  Actions actions = state_.OnRdzv(Beat(2), At(100));
  EXPECT_THAT(Names(actions), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(actions),
              ElementsAre("INFO job moves to round 2: the job moved on (seen in a heartbeat)"));
  EXPECT_THAT(state_.OnRdzv(Beat(0), At(100)), IsEmpty());
}

TEST_F(ElasticStateTest, DroppedByTheRendezvousWhileRunningStopsAndRejoins) {
  ToRunning(1);
  Actions actions = state_.OnRdzv(Beat(absl::NotFoundError("unknown node")), At(100));
  EXPECT_THAT(Names(actions), ElementsAre("Signal TERM"));
  EXPECT_EQ(state_.after_stop(), AfterStop::kRejoin);
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110))),
              ElementsAre("Join"));
}

TEST_F(ElasticStateTest, AHeartbeatThatSaysTheJobClosedEndsItUnlessThePushSaidSoFirst) {
  ToRunning(1);
  state_.OnRdzv(JobClosed(false, "rank 3 failed; restarts ran out"), At(100));
  EXPECT_THAT(state_.OnRdzv(Beat(absl::FailedPreconditionError("closed")), At(101)), IsEmpty());
  Actions exit = state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  EXPECT_EQ(Find<action::Exit>(exit).why, "rank 3 failed; restarts ran out");

  ElasticState other(Options());
  other.Start(At(0));
  other.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(1));
  other.OnWorkersStarted(1, std::nullopt, At(1));
  EXPECT_THAT(Names(other.OnRdzv(Beat(absl::FailedPreconditionError("job closed")), At(2))),
              ElementsAre("Signal TERM"));
  EXPECT_EQ(Find<action::Exit>(other.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(3))).why,
            "job closed");
}

TEST_F(ElasticStateTest, ThreeUnansweredHeartbeatsInARowStopTheWorkersAndExit) {
  ToRunning(1);
  const absl::Status down = absl::UnavailableError("connection refused");
  EXPECT_THAT(
      Logs(state_.OnRdzv(Beat(down), At(100))),
      ElementsAre("WARN heartbeat to the rendezvous at rdzv:29400 failed: connection refused"));
  EXPECT_THAT(state_.OnRdzv(Beat(down), At(200)), IsEmpty());
  Actions third = state_.OnRdzv(Beat(down), At(300));
  EXPECT_THAT(Names(third), ElementsAre("Signal TERM"));
  Actions exit = state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(310));
  EXPECT_THAT(Names(exit), ElementsAre("Exit 1"));
  EXPECT_THAT(Find<action::Exit>(exit).why,
              HasSubstr("did not answer 3 heartbeats in a row (keep_alive_max_attempt)"));
}

TEST_F(ElasticStateTest, AnAnswerBetweenFailedHeartbeatsStartsTheCountAgain) {
  ToRunning(1);
  const absl::Status down = absl::UnavailableError("down");
  state_.OnRdzv(Beat(down), At(100));
  state_.OnRdzv(Beat(down), At(200));
  EXPECT_THAT(Logs(state_.OnRdzv(Beat(0), At(300))),
              ElementsAre("INFO the rendezvous at rdzv:29400 answers again"));
  state_.OnRdzv(Beat(down), At(400));
  state_.OnRdzv(Beat(down), At(500));
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
  EXPECT_THAT(Names(state_.OnRdzv(Beat(absl::CancelledError("shutdown")), At(600))), IsEmpty())
      << "a cancelled call is no answer and no failure";
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
}

TEST_F(ElasticStateTest, ThreeUnansweredHeartbeatsWhileJoiningExitAtOnce) {
  ToRunning(1);
  state_.OnRdzv(RoundChangedTo(1), At(100));
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));  // rejoining now
  const absl::Status down = absl::UnavailableError("down");
  state_.OnRdzv(Beat(down), At(200));
  state_.OnRdzv(Beat(down), At(300));
  EXPECT_THAT(Names(state_.OnRdzv(Beat(down), At(400))), ElementsAre("Exit 1"));
}

TEST_F(ElasticStateTest, HeartbeatsAreSentOnlyWhileNoWatchStreamStandsInForThem) {
  ToRunning();
  EXPECT_THAT(Names(state_.OnTimer(At(10 + kKeepAliveMs))), ElementsAre("Heartbeat"));
  state_.OnRdzv(WatchStarted(7), At(5'100));  // a replaced watch's: does not count
  EXPECT_THAT(Names(state_.OnTimer(At(10 + 2 * kKeepAliveMs))), ElementsAre("Heartbeat"));
  state_.OnRdzv(WatchStarted(1), At(10'100));
  EXPECT_THAT(Names(state_.OnTimer(At(10 + 3 * kKeepAliveMs))), IsEmpty());
  EXPECT_EQ(state_.NextDeadline(), At(10 + 4 * kKeepAliveMs));
}

TEST_F(ElasticStateTest, ALostWatchStreamBeatsAtOnceAndReopensASecondLater) {
  ToRunning();
  state_.OnRdzv(WatchStarted(1), At(20));
  Actions ended =
      state_.OnRdzv(rdzv_event::WatchEnded{1, absl::UnavailableError("socket closed")}, At(1'000));
  EXPECT_THAT(Logs(ended),
              ElementsAre("DEBUG lost the rendezvous watch stream (socket closed); reconnecting"));
  EXPECT_EQ(state_.NextDeadline(), At(1'000)) << "the server's heartbeat timeout starts now";
  EXPECT_THAT(Names(state_.OnTimer(At(1'000))), ElementsAre("Heartbeat"));
  EXPECT_EQ(state_.NextDeadline(), At(2'000));
  Actions reopened = state_.OnTimer(At(2'000));
  EXPECT_THAT(Names(reopened), ElementsAre("OpenWatch"));
  EXPECT_EQ(Find<action::OpenWatch>(reopened).generation, 2u);
}

TEST_F(ElasticStateTest, TheEndOfAReplacedOrCancelledWatchIsNotRetried) {
  ToRunning();
  state_.OnRdzv(rdzv_event::WatchEnded{0, absl::UnavailableError("old")}, At(100));
  EXPECT_EQ(state_.NextDeadline(), At(10 + kKeepAliveMs)) << "generation 0 is not the open watch";
  state_.OnRdzv(rdzv_event::WatchEnded{1, absl::AbortedError("replaced")}, At(100));
  EXPECT_EQ(state_.NextDeadline(), At(10 + kKeepAliveMs));
  state_.OnRdzv(rdzv_event::WatchEnded{1, absl::CancelledError("cancelled")}, At(100));
  EXPECT_EQ(state_.NextDeadline(), At(10 + kKeepAliveMs));
}

// ---- Stopping ----

TEST_F(ElasticStateTest, AWorkerThatFailsOnItsOwnWhileStoppingIsInTheReport) {
  ToStoppingAfterFailure(3);
  state_.OnWorkerExit(ExitStatus{0, SIGSEGV}, Failure(1, 0, SIGSEGV), At(110));
  state_.OnWorkerExit(kByTerm, Failure(2, 0, SIGTERM), At(120));
  Actions exit = state_.OnRdzv(JobClosed(false, "restarts ran out"), At(130));
  ASSERT_THAT(Names(exit), ElementsAre("Exit 1"));
  const std::string& report = Find<action::Exit>(exit).report;
  EXPECT_THAT(report, HasSubstr("train.py FAILED after 1 attempt"));
  EXPECT_THAT(report, HasSubstr("SIGSEGV"));
  EXPECT_THAT(report, Not(HasSubstr("SIGTERM"))) << "killed by our stop: not a failure";
  EXPECT_TRUE(Find<action::Exit>(exit).failures_seen);
}

TEST_F(ElasticStateTest, OnceStoppedAfterAFailureTheAgentWaitsForTheRendezvousToDecide) {
  ToStoppingAfterFailure();
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110))), IsEmpty());
  EXPECT_EQ(state_.phase(), AgentPhase::kStopping);
  EXPECT_EQ(state_.live_workers(), 0);
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(120))), ElementsAre("Join"));
}

TEST_F(ElasticStateTest, AFailureThatCannotBeReportedEndsTheAgentOnceItsWorkersStop) {
  ToStoppingAfterFailure();
  for (int64_t at : {110, 1'110}) {
    state_.OnRdzv(rdzv_event::FailureReported{absl::UnavailableError("down")}, At(at));
    EXPECT_THAT(Names(state_.OnTimer(At(at + 1'000))), ElementsAre("ReportFailure"));
  }
  Actions unreported =
      state_.OnRdzv(rdzv_event::FailureReported{absl::UnavailableError("down")}, At(2'110));
  EXPECT_THAT(Names(unreported), IsEmpty());
  EXPECT_THAT(
      Logs(unreported),
      ElementsAre("ERROR could not report the failure to the rendezvous at rdzv:29400: down"));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(2'120))),
              ElementsAre("Exit 1"));
}

// Found by bench/chaos_soak.py (host mode and etcd): an agent stopped (or
// cut off) past heartbeat_timeout was dropped and the job went on without
// it; on waking, its workers failed as their peers had moved on, and the
// report of that failure, answered "dropped", ended the agent with exit 1.
TEST_F(ElasticStateTest, AFailureReportAnsweredDroppedRejoinsOnceTheWorkersStopped) {
  ToStoppingAfterFailure();
  Actions dropped =
      state_.OnRdzv(rdzv_event::FailureReported{absl::NotFoundError(absl::StrCat(
                        "node a ", rdzv::kDroppedFromJob, " 'job': node host-a silent for 5 s"))},
                    At(110));
  EXPECT_THAT(Names(dropped), IsEmpty());
  EXPECT_THAT(Logs(dropped), ElementsAre(HasSubstr("the rendezvous dropped this node")));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(120))),
              ElementsAre("Join"));
}

TEST_F(ElasticStateTest, AFailureThatCannotBeReportedInKeepAliveMaxAttemptTriesEndsTheAgent) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  Actions first =
      state_.OnRdzv(rdzv_event::FailureReported{absl::UnavailableError("down")}, At(120));
  EXPECT_THAT(Names(first), IsEmpty());
  EXPECT_THAT(Logs(first), ElementsAre(HasSubstr("the failure report to the rendezvous at "
                                                 "rdzv:29400 failed (down); trying again, 3 tries "
                                                 "in all (keep_alive_max_attempt)")));
  EXPECT_THAT(Names(state_.OnTimer(At(1'120))), ElementsAre("ReportFailure"));
  EXPECT_THAT(state_.OnRdzv(rdzv_event::FailureReported{absl::UnavailableError("down")}, At(1'130)),
              IsEmpty());
  EXPECT_THAT(Names(state_.OnTimer(At(2'130))), ElementsAre("ReportFailure"));
  EXPECT_THAT(
      Names(state_.OnRdzv(rdzv_event::FailureReported{absl::UnavailableError("down")}, At(2'140))),
      ElementsAre("Exit 1"));
  EXPECT_THAT(state_.OnRdzv(rdzv_event::FailureReported{absl::OkStatus()}, At(2'150)), IsEmpty());
}

TEST_F(ElasticStateTest, AFailureReportOnAConnectionClosedMeanwhileIsSentAgain) {
  // Stopped (SIGSTOP) past the hosting agent's keepalive: the first call on
  // the connection it closed meanwhile fails, the next one reconnects.
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  EXPECT_THAT(Names(state_.OnRdzv(
                  rdzv_event::FailureReported{absl::UnavailableError("Broken pipe")}, At(120))),
              IsEmpty());
  EXPECT_THAT(Names(state_.OnTimer(At(1'120))), ElementsAre("ReportFailure"));
  EXPECT_THAT(state_.OnRdzv(rdzv_event::FailureReported{absl::OkStatus()}, At(1'130)), IsEmpty());
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(1'200))), ElementsAre("Join"));
}

TEST_F(ElasticStateTest, ADoneReportOnAConnectionClosedMeanwhileIsSentAgain) {
  ToFinishing();
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::DoneReported{absl::UnavailableError("Broken pipe")},
                                  At(110))),
              IsEmpty());
  EXPECT_THAT(Names(state_.OnTimer(At(1'110))), ElementsAre("ReportDone"));
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::DoneReported{absl::OkStatus()}, At(1'120))),
              ElementsAre("Exit 0"));
}

TEST_F(ElasticStateTest, ANewRoundWhileStoppingForAFailureRejoinsOnceStopped) {
  ToStoppingAfterFailure();
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(110))), IsEmpty());
  EXPECT_EQ(state_.after_stop(), AfterStop::kRejoin);
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(120))),
              ElementsAre("Join"));
}

TEST_F(ElasticStateTest, AStopSignalWinsOverANewRoundAndAClosedJob) {
  ToStoppingAfterFailure();
  state_.OnSignal(SIGTERM, At(105));
  EXPECT_EQ(state_.after_stop(), AfterStop::kExitSignal);
  state_.OnRdzv(RoundChangedTo(1), At(110));
  state_.OnRdzv(JobClosed(false, "closed"), At(111));
  EXPECT_EQ(state_.after_stop(), AfterStop::kExitSignal);
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(120))),
              ElementsAre("Exit 143"));
}

TEST_F(ElasticStateTest, AStopSignalWhileAwaitingTheDecisionExitsAtOnce) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  EXPECT_THAT(Names(state_.OnSignal(SIGHUP, At(120))), ElementsAre("Signal HUP", "Exit 129"));
}

TEST_F(ElasticStateTest, AJobThatClosesWhileStoppingExitsFailedOnceStopped) {
  ToStoppingAfterFailure();
  EXPECT_THAT(Names(state_.OnRdzv(JobClosed(false, "restarts ran out (1/1)"), At(110))), IsEmpty());
  Actions exit = state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(120));
  EXPECT_THAT(Names(exit), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(exit).why, "restarts ran out (1/1)");
}

TEST_F(ElasticStateTest, ThreeUnansweredHeartbeatsWhileStoppingExitOnceStopped) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  const absl::Status down = absl::UnavailableError("down");
  state_.OnRdzv(Beat(down), At(200));
  state_.OnRdzv(Beat(down), At(300));
  EXPECT_THAT(Names(state_.OnRdzv(Beat(down), At(400))), ElementsAre("Exit 1"));
}

TEST_F(ElasticStateTest, TheReportNamesARootCauseOnAnotherNode) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  rdzv::WatchEvent event;
  rdzv::JobClosed* closed = event.mutable_job_closed();
  closed->set_reason("restarts ran out");
  closed->mutable_root_cause()->set_rank(5);
  closed->mutable_root_cause()->set_host("node-b");
  closed->mutable_root_cause()->set_exit_code(3);
  closed->mutable_root_cause()->set_message("CUDA error");
  Actions exit = state_.OnRdzv(rdzv_event::Pushed{1, event}, At(120));
  EXPECT_THAT(
      Find<action::Exit>(exit).report,
      HasSubstr("Root cause on another node: rank 5 on node-b (exit code 3): CUDA error\n"));

  ElasticState local(Options());
  local.Start(At(0));
  local.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(1));
  local.OnWorkersStarted(1, std::nullopt, At(1));
  local.OnWorkerExit(kExit1, Failure(0), At(2));
  closed->mutable_root_cause()->set_rank(0);
  EXPECT_THAT(Find<action::Exit>(local.OnRdzv(rdzv_event::Pushed{1, event}, At(3))).report,
              Not(HasSubstr("another node")))
      << "the root cause is this node's own";
}

// ---- Finishing ----

TEST_F(ElasticStateTest, ANodeWhoseWorkersSucceededExitsZeroOnceTheRendezvousKnows) {
  ToFinishing();
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::DoneReported{absl::OkStatus()}, At(110))),
              ElementsAre("Exit 0"));
}

TEST_F(ElasticStateTest, AHostingNodeStaysUntilTheJobCloses) {
  ElasticState host(Options(/*hosts=*/true));
  host.Start(At(0));
  host.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(1));
  host.OnWorkersStarted(1, std::nullopt, At(1));
  host.OnWorkerExit(kSuccess, Failure(0, 0), At(2));
  EXPECT_THAT(host.OnRdzv(rdzv_event::DoneReported{absl::OkStatus()}, At(3)), IsEmpty());
  EXPECT_EQ(host.phase(), AgentPhase::kFinishing);
  EXPECT_THAT(Names(host.OnRdzv(JobClosed(true, "every node finished"), At(4))),
              ElementsAre("Exit 0"));
}

// ha=1: a node that may run a member of the job's own etcd stays, as a host
// does, so that the job keeps its quorum; it is otherwise a node as any.
TEST_F(ElasticStateTest, ANodeThatStaysUntilClosedWaitsForTheCloseOnceFinished) {
  ElasticOptions options = Options();
  options.stays_until_closed = true;
  ElasticState member(options);
  member.Start(At(0));
  member.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(1));
  member.OnWorkersStarted(1, std::nullopt, At(1));
  member.OnWorkerExit(kSuccess, Failure(0, 0), At(2));
  EXPECT_THAT(member.OnRdzv(rdzv_event::DoneReported{absl::OkStatus()}, At(3)), IsEmpty());
  EXPECT_EQ(member.phase(), AgentPhase::kFinishing);
  EXPECT_THAT(Names(member.OnRdzv(JobClosed(true, "every node finished"), At(4))),
              ElementsAre("Exit 0"));
}

TEST_F(ElasticStateTest, ANodeThatFinishedAsTheJobMovedOnJoinsTheNextRound) {
  ToFinishing();
  Actions aborted =
      state_.OnRdzv(rdzv_event::DoneReported{absl::AbortedError("round 1 began")}, At(110));
  EXPECT_THAT(Names(aborted), IsEmpty());
  EXPECT_THAT(Logs(aborted),
              ElementsAre("INFO the job moved on while this node finished: round 1 began"));
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(120))), ElementsAre("Join"));
}

TEST_F(ElasticStateTest, WorkersThatSucceededExitZeroEvenIfTheRendezvousCannotBeTold) {
  ToFinishing();
  for (int64_t at : {110, 1'110}) {
    state_.OnRdzv(rdzv_event::DoneReported{absl::UnavailableError("down")}, At(at));
    EXPECT_THAT(Names(state_.OnTimer(At(at + 1'000))), ElementsAre("ReportDone"));
  }
  Actions actions =
      state_.OnRdzv(rdzv_event::DoneReported{absl::UnavailableError("down")}, At(2'110));
  EXPECT_THAT(Names(actions), ElementsAre("Exit 0"));
  EXPECT_THAT(Logs(actions),
              ElementsAre("WARN workers succeeded but the rendezvous could not be told: down"));
}

TEST_F(ElasticStateTest, UnansweredHeartbeatsWhileFinishingLeaveTheDecisionToReportDone) {
  ToFinishing();
  const absl::Status down = absl::UnavailableError("down");
  for (int i = 0; i < 5; ++i) state_.OnRdzv(Beat(down), At(200 + i));
  EXPECT_EQ(state_.phase(), AgentPhase::kFinishing);
}

// Found by the simulator (seed 499853 before the fix): in host mode, a node
// whose workers finished as the job moved on (its ReportDone answered
// Aborted) waited for the next round's push; the node that hosted the
// rendezvous left first, and it waited for ever, its heartbeats unanswered.
TEST_F(ElasticStateTest, AFinishingNodeWithNothingPendingGivesUpOnAGoneRendezvous) {
  ToFinishing();
  state_.OnRdzv(rdzv_event::DoneReported{absl::AbortedError("round 1 is over")}, At(110));
  ASSERT_EQ(state_.phase(), AgentPhase::kFinishing);
  const absl::Status down = absl::UnavailableError("connection refused");
  state_.OnRdzv(Beat(down), At(200));
  state_.OnRdzv(Beat(down), At(300));
  EXPECT_THAT(Names(state_.OnRdzv(Beat(down), At(400))), ElementsAre("Exit 1"));
}

TEST_F(ElasticStateTest, AJobThatFailsWhileThisNodeFinishedExitsFailed) {
  ToFinishing();
  EXPECT_THAT(Names(state_.OnRdzv(JobClosed(false, "node b failed"), At(110))),
              ElementsAre("Exit 1"));
}

TEST_F(ElasticStateTest, AStopSignalWhileFinishingExitsAt128PlusItAndLeaves) {
  ToFinishing();
  Actions actions = state_.OnSignal(SIGQUIT, At(110));
  EXPECT_THAT(Names(actions), ElementsAre("Signal QUIT", "Exit 131"));
  EXPECT_TRUE(Find<action::Exit>(actions).leave_reason);
}

// ---- Exiting ----

TEST_F(ElasticStateTest, NothingHappensOnceTheAgentExits) {
  ToFinishing();
  state_.OnRdzv(rdzv_event::DoneReported{absl::OkStatus()}, At(110));
  ASSERT_TRUE(state_.done());
  EXPECT_EQ(state_.NextDeadline(), std::nullopt);
  EXPECT_THAT(state_.OnSignal(SIGTERM, At(120)), IsEmpty());
  EXPECT_THAT(state_.OnTimer(At(1'000'000)), IsEmpty());
  EXPECT_THAT(state_.OnRdzv(RoundChangedTo(9), At(120)), IsEmpty());
  EXPECT_THAT(state_.OnRdzv(JobClosed(false, "x"), At(120)), IsEmpty());
  EXPECT_THAT(state_.OnRdzv(Beat(absl::UnavailableError("down")), At(120)), IsEmpty());
  EXPECT_THAT(state_.OnRdzv(rdzv_event::Joined{Assigned(9)}, At(120)), IsEmpty());
  EXPECT_THAT(state_.OnWorkerExit(kExit1, Failure(0), At(120)), IsEmpty());
}

// ---- Riding out an outage of a rendezvous that runs apart (musterd, etcd) ----

class RideOutTest : public ElasticStateTest {
 protected:
  RideOutTest() { ride_out_ = true; }
};

const absl::Status kDown = absl::UnavailableError("connection refused");

TEST_F(RideOutTest, WorkersKeepRunningThroughAnOutageOfAnyLength) {
  ToRunning();
  state_.OnRdzv(WatchStarted(1), At(20));
  Actions lost = state_.OnRdzv(rdzv_event::WatchEnded{1, kDown}, At(1'000));
  EXPECT_THAT(Logs(lost), ElementsAre("WARN the rendezvous at rdzv:29400 does not answer "
                                      "(connection refused); this node's 2 worker(s) keep "
                                      "running, and it waits for the rendezvous to come back"));
  // An hour of unanswered heartbeats and watches, every timer on time: no
  // stop, no exit, no more lines.
  while (*state_.NextDeadline() < At(3'600'000)) {
    const absl::Time t = *state_.NextDeadline();
    for (const Action& action : state_.OnTimer(t)) {
      Actions answered;
      if (std::holds_alternative<action::SendHeartbeat>(action)) {
        answered = state_.OnRdzv(Beat(kDown), t);
      } else if (const auto* watch = std::get_if<action::OpenWatch>(&action)) {
        answered = state_.OnRdzv(rdzv_event::WatchEnded{watch->generation, kDown}, t);
      } else {
        FAIL() << "an action other than a heartbeat or a watch at " << t;
      }
      ASSERT_THAT(answered, IsEmpty()) << "at " << t;
    }
  }
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
  EXPECT_EQ(state_.live_workers(), 2);
  EXPECT_THAT(Logs(state_.OnRdzv(Beat(0), At(3'600'000))),
              ElementsAre("INFO the rendezvous at rdzv:29400 answers again, after 3599.0 s away"));
}

TEST_F(RideOutTest, AReopenedWatchEndsTheOutage) {
  ToRunning();
  state_.OnRdzv(rdzv_event::WatchEnded{1, kDown}, At(1'000));
  EXPECT_THAT(Names(state_.OnTimer(At(2'000))), ElementsAre("OpenWatch"));
  EXPECT_THAT(Logs(state_.OnRdzv(WatchStarted(2), At(2'100))),
              ElementsAre("INFO the rendezvous at rdzv:29400 answers again, after 1.1 s away"));
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
}

TEST_F(RideOutTest, AFailureDuringTheOutageIsReportedWhenTheRendezvousComesBack) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  Actions unanswered = state_.OnRdzv(rdzv_event::FailureReported{kDown}, At(120));
  EXPECT_THAT(Names(unanswered), IsEmpty()) << "no exit: the report waits for the rendezvous";
  EXPECT_THAT(Logs(unanswered),
              ElementsAre(HasSubstr("the failure report is retried until join_timeout (600 s "
                                    "left)")));
  Actions again = state_.OnTimer(At(1'120));
  ASSERT_THAT(Names(again), ElementsAre("ReportFailure"));
  EXPECT_EQ(Find<action::ReportFailure>(again).failure.rank, 0);
  EXPECT_EQ(Find<action::ReportFailure>(again).round, 0);
  EXPECT_THAT(state_.OnRdzv(rdzv_event::FailureReported{kDown}, At(1'130)), IsEmpty());
  EXPECT_THAT(Names(state_.OnTimer(At(2'130))), ElementsAre("ReportFailure"));
  EXPECT_THAT(Logs(state_.OnRdzv(rdzv_event::FailureReported{absl::OkStatus()}, At(2'200))),
              ElementsAre(HasSubstr("answers again")));
  EXPECT_THAT(Names(state_.OnTimer(At(10'000))), Not(Contains("ReportFailure")));
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(10'100))), ElementsAre("Join"));
}

TEST_F(RideOutTest, AFailureThatCannotBeReportedWithinJoinTimeoutEndsTheAgent) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  state_.OnRdzv(rdzv_event::FailureReported{kDown}, At(120));
  // Every timer on time, every report and heartbeat unanswered.
  Actions last;
  while (!state_.done() && state_.NextDeadline() && *state_.NextDeadline() < At(700'000)) {
    const absl::Time t = *state_.NextDeadline();
    for (const Action& action : state_.OnTimer(t)) {
      if (std::holds_alternative<action::ReportFailure>(action)) {
        last = state_.OnRdzv(rdzv_event::FailureReported{kDown}, t + absl::Milliseconds(10));
      } else if (std::holds_alternative<action::SendHeartbeat>(action)) {
        state_.OnRdzv(Beat(kDown), t + absl::Milliseconds(10));
      }
    }
  }
  ASSERT_TRUE(state_.done());
  EXPECT_THAT(Names(last), ElementsAre("Exit 1"));
  EXPECT_THAT(Logs(last), Contains(HasSubstr("could not report the failure to the rendezvous")));
  EXPECT_THAT(Find<action::Exit>(last).report, HasSubstr("train.py FAILED"));
}

TEST_F(RideOutTest, AJoinDuringTheOutageIsRetriedUntilJoinTimeout) {
  ToRunning(1);
  state_.OnRdzv(RoundChangedTo(1), At(100));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110))),
              ElementsAre("Join"));
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::Joined{kDown}, At(200))), IsEmpty());
  Actions retried = state_.OnTimer(At(1'200));
  ASSERT_THAT(Names(retried), ElementsAre("Join"));
  EXPECT_EQ(Find<action::Join>(retried).timeout, absl::Milliseconds(600'000 - 1'090))
      << "what is left of join_timeout since the join began";
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::Joined{Assigned(1, 0, true)}, At(1'300))),
              ElementsAre("StartWorkers"));
}

TEST_F(RideOutTest, AJoinStillUnansweredAtJoinTimeoutEndsTheAgent) {
  ToRunning(1);
  state_.OnRdzv(RoundChangedTo(1), At(100));
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  Actions exit = state_.OnRdzv(rdzv_event::Joined{kDown}, At(110 + 600'000));
  EXPECT_THAT(Names(exit), ElementsAre("Exit 1"));
}

TEST_F(RideOutTest, TheReportThatTheWorkersFinishedIsRetriedToo) {
  ToFinishing();
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::DoneReported{kDown}, At(110))), IsEmpty());
  EXPECT_THAT(Names(state_.OnTimer(At(1'110))), ElementsAre("ReportDone"));
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::DoneReported{absl::OkStatus()}, At(1'200))),
              ElementsAre("Exit 0"));
}

// Found by the simulator (tests/sim, seed 719 before the fix): an agent
// stopped while its workers succeeded reported them done on a broken
// connection; its heartbeat then said the job was closed, which it took for
// a failed close, and it exited 1 though the job had succeeded. The answer
// now says how the job closed (rdzv::kJobSucceeded).
TEST_F(RideOutTest, AHeartbeatThatSaysTheJobSucceededEndsAFinishingNodeWithZero) {
  ToFinishing();
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::DoneReported{kDown}, At(110))), IsEmpty());
  const absl::Status closed =
      absl::FailedPreconditionError("job 'job' succeeded and is closed (every node finished)");
  EXPECT_THAT(Names(state_.OnRdzv(Beat(closed), At(500))), ElementsAre("Exit 0"));
}

TEST_F(RideOutTest, AReportDoneAnsweredThatTheJobClosedEndsTheNodeAsTheJobEnded) {
  ToFinishing();
  state_.OnRdzv(rdzv_event::DoneReported{kDown}, At(110));
  ASSERT_THAT(Names(state_.OnTimer(At(1'110))), ElementsAre("ReportDone"));
  Actions done = state_.OnRdzv(rdzv_event::DoneReported{absl::FailedPreconditionError(
                                   "job 'job' succeeded and is closed (every node finished)")},
                               At(1'200));
  EXPECT_THAT(Names(done), ElementsAre("Exit 0"));
  EXPECT_THAT(Logs(done), Contains("INFO the job closed as this node finished: job 'job' "
                                   "succeeded and is closed (every node finished)"));

  ElasticState other(Options());
  other.Start(At(0));
  other.OnRdzv(rdzv_event::Joined{Assigned(0, 0, true)}, At(1));
  other.OnWorkersStarted(1, std::nullopt, At(1));
  other.OnWorkerExit(kSuccess, Failure(0, 0), At(100));
  EXPECT_THAT(Names(other.OnRdzv(rdzv_event::DoneReported{absl::FailedPreconditionError(
                                     "job 'job' is closed (rank 3 failed; restarts ran out)")},
                                 At(200))),
              ElementsAre("Exit 1"));
}

// Found by the simulator (seed 3): a spare waiting while the job succeeded
// was refused its join, and exited 1, which fails a Slurm step.
TEST_F(ElasticStateTest, OnlyTheWordsBeforeTheReasonSayTheJobSucceeded) {
  // The reason is free text (an operator's, a node's leave reason).
  ToRunning(1);
  state_.OnRdzv(
      Beat(absl::FailedPreconditionError("job 'job' is closed (stopped by an operator: job "
                                         "'x' succeeded and is closed (y))")),
      At(100));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110))),
              ElementsAre("Exit 1"));
}

TEST_F(ElasticStateTest, AJoinRefusedBecauseTheJobSucceededExitsZero) {
  ToJoining();
  Actions refused = state_.OnRdzv(
      rdzv_event::Joined{absl::FailedPreconditionError(
          "job 'job' succeeded and is closed (every node finished); start a new job with a "
          "different --rdzv-id")},
      At(1));
  EXPECT_THAT(Names(refused), ElementsAre("Exit 0"));
}

// Found by the simulator (seed 169140 before the fix): an agent stopped
// (SIGSTOP) while its assignment arrived started that round's workers when
// it ran again, though the job had moved on twice, with a lower restart
// count than the rounds that ran meanwhile.
TEST_F(ElasticStateTest, AnAssignmentThatWaitedForAStoppedAgentIsCheckedFirst) {
  ToJoining();  // its progress line was due at 2 s: it ran again at 30 s
  Actions joined = state_.OnRdzv(rdzv_event::Joined{Assigned(1)}, At(30'000));
  EXPECT_THAT(Names(joined), ElementsAre("Heartbeat"));
  EXPECT_THAT(Logs(joined), ElementsAre(HasSubstr("asking the rendezvous whether that round")));
  const uint64_t seq = Find<action::SendHeartbeat>(joined).seq;
  // An answer to an older heartbeat (sent before it stopped) does not tell.
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::HeartbeatAnswered{1, seq - 1}, At(30'005))),
              Not(Contains("StartWorkers")));
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::HeartbeatAnswered{1, seq}, At(30'010))),
              ElementsAre("OpenWatch", "StartWorkers"));

  // Its late timer may run first, when it runs again: the same.
  ElasticState timer_first(Options());
  timer_first.Start(At(0));
  timer_first.OnTimer(At(30'000));
  Actions joined_late = timer_first.OnRdzv(rdzv_event::Joined{Assigned(1)}, At(30'000));
  EXPECT_THAT(Names(joined_late), ElementsAre("Heartbeat"));
  EXPECT_GT(Find<action::SendHeartbeat>(joined_late).seq, 0u);
}

TEST_F(ElasticStateTest, AStaleAssignmentIsDroppedAndTheNodeJoinsAgain) {
  for (const absl::StatusOr<int64_t>& answer :
       {absl::StatusOr<int64_t>(3),
        absl::StatusOr<int64_t>(absl::NotFoundError("node n was dropped from job 'job'")),
        absl::StatusOr<int64_t>(absl::UnavailableError("connection reset"))}) {
    ElasticState state(Options());
    state.Start(At(0));
    const uint64_t seq =
        Find<action::SendHeartbeat>(state.OnRdzv(rdzv_event::Joined{Assigned(1)}, At(30'000))).seq;
    Actions again = state.OnRdzv(rdzv_event::HeartbeatAnswered{answer, seq}, At(30'010));
    EXPECT_THAT(Names(again), ElementsAre("Join")) << answer.status();
    EXPECT_THAT(Logs(again), Contains(HasSubstr("round 1 is over or cannot be checked")))
        << answer.status();
  }
}

// Found by the simulator (tests/sim, seed 933 before the fix): a node whose
// failure report reached a musterd that had just restarted was stopped
// (SIGSTOP) before it heard of the next round; dropped meanwhile, it waited
// for a decision that would never come, for ever.
TEST_F(RideOutTest, ANodeDroppedWhileAwaitingTheDecisionRejoins) {
  ToStoppingAfterFailure(1);
  state_.OnRdzv(rdzv_event::FailureReported{absl::OkStatus()}, At(150));
  ASSERT_EQ(state_.after_stop(), AfterStop::kAwaitDecision);
  Actions dropped = state_.OnRdzv(
      Beat(absl::NotFoundError("node n was dropped from job 'job': node host-n silent for 30 s")),
      At(40'000));
  EXPECT_THAT(Names(dropped), ElementsAre("Join"));
  EXPECT_THAT(Logs(dropped), ElementsAre(HasSubstr("the rendezvous dropped this node")));
}

TEST_F(RideOutTest, ARendezvousBackWithoutTheJobRestartsTheWorkersSayingWhy) {
  ToRunning(1);
  state_.OnRdzv(Beat(kDown), At(100));
  Actions forgotten = state_.OnRdzv(Beat(absl::NotFoundError("no job 'job'")), At(5'100));
  EXPECT_THAT(Names(forgotten), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(forgotten), Contains(HasSubstr("came back without this job")));
}

TEST_F(RideOutTest, AnAgentThatWasStoppedLearnsItWasDroppedNotThatTheServerForgot) {
  ToRunning(1);
  state_.OnRdzv(WatchStarted(1), At(20));
  // SIGSTOP: the loop's timer fires 30 s late. The agent says so first.
  const absl::Time due = *state_.NextDeadline();
  Actions late = state_.OnTimer(due + absl::Seconds(30));
  EXPECT_THAT(Logs(late), Contains(HasSubstr("this agent did not run for 30.0 s (it was stopped, "
                                             "or starved of CPU)")));
  // Its connection was closed by the server's pings meanwhile.
  state_.OnRdzv(rdzv_event::WatchEnded{1, kDown}, due + absl::Seconds(30));
  Actions dropped =
      state_.OnRdzv(Beat(absl::NotFoundError(absl::StrCat("node n1 ", rdzv::kDroppedFromJob,
                                                          " 'job': node host silent for 30 s"))),
                    due + absl::Seconds(31));
  EXPECT_THAT(Names(dropped), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(dropped), Contains(HasSubstr("the rendezvous dropped this node (node n1 was "
                                                "dropped from job 'job': node host silent")));
  EXPECT_THAT(Logs(dropped), Not(Contains(HasSubstr("came back without this job"))));
}

TEST_F(ElasticStateTest, WorkersThatSigkillCannotEndAreGivenUpOnAndTheJobGoesOn) {
  ToRunning();
  state_.OnWorkerExit(kExit1, Failure(0), At(100));  // a failure: stop the other, report
  EXPECT_THAT(Names(state_.OnTimer(At(100 + kGraceMs))), ElementsAre("Signal KILL"));
  // The other worker is in D state: no exit comes.
  const absl::Time give_up = At(100 + kGraceMs) + ElasticState::kKillWait;
  EXPECT_EQ(state_.NextDeadline(), std::min(give_up, *state_.NextDeadline()));
  EXPECT_THAT(Names(state_.OnTimer(give_up - absl::Milliseconds(1))), Not(Contains("Abandon")));
  Actions given_up = state_.OnTimer(give_up);
  EXPECT_THAT(Names(given_up), Contains("Abandon"));
  EXPECT_THAT(Logs(given_up), Contains(HasSubstr("1 worker(s) still not reaped 10 s after SIGKILL: "
                                                 "stuck in the kernel")));
  EXPECT_EQ(state_.live_workers(), 0);
  // The rendezvous' decision is awaited as for any stopped attempt: a new round starts workers.
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), give_up)), Contains("Join"));
}

TEST_F(ElasticStateTest, ASecondStopSignalKillsAndAnUnkillableWorkerDoesNotHoldTheExit) {
  ToRunning();
  state_.OnSignal(SIGINT, At(100));
  state_.OnSignal(SIGINT, At(200));
  EXPECT_THAT(Names(state_.OnTimer(At(100 + kGraceMs))), Not(Contains("Signal KILL")))
      << "killed already";
  std::vector<std::string> exit = Names(state_.OnTimer(At(200) + ElasticState::kKillWait));
  EXPECT_THAT(exit, Contains("Abandon"));
  ASSERT_FALSE(exit.empty());
  EXPECT_EQ(exit.back(), "Exit 130");
}

TEST_F(ElasticStateTest, ATimerOnTimeSaysNothingOfStalls) {
  ToRunning();
  for (int i = 0; i < 10; ++i) {
    const absl::Time due = *state_.NextDeadline();
    EXPECT_THAT(Logs(state_.OnTimer(due + absl::Milliseconds(500))), IsEmpty()) << i;
  }
}

TEST_F(ElasticStateTest, AFirstJoinWhoseServerWentAwayIsRetriedUntilJoinTimeout) {
  ToJoining();
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::Joined{kDown}, At(100))), IsEmpty());
  EXPECT_THAT(Names(state_.OnTimer(At(1'100))), ElementsAre("Join"));
  Actions exit =
      state_.OnRdzv(rdzv_event::Joined{absl::DeadlineExceededError("deadline")}, At(605'000));
  EXPECT_THAT(Find<action::Exit>(exit).why, HasSubstr("no rendezvous answered"));
}

TEST_F(ElasticStateTest, ANodeOfAnAgentsRendezvousDoesNotRetryItsJoinOnceInTheJob) {
  ToRunning(1);  // its assignments do not say to ride out
  state_.OnRdzv(RoundChangedTo(1), At(100));
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  EXPECT_THAT(Names(state_.OnRdzv(rdzv_event::Joined{kDown}, At(200))), ElementsAre("Exit 1"));
}

// ---- --preflight allreduce ----

// ---- Outages and partitions: the round's other nodes are asked ----

ElasticOptions AskingPeers() {
  ElasticOptions options = Options();
  options.ask_peers = true;
  options.heartbeat_timeout = absl::Seconds(30);
  return options;
}

class PeersTest : public ElasticStateTest {
 public:
  static PeerAnswer Peer(const std::string& node, int64_t round, bool reaches) {
    PeerAnswer answer;
    answer.node = node;
    answer.answered = true;
    answer.round = round;
    answer.reaches_rendezvous = reaches;
    return answer;
  }

 protected:
  PeersTest() : ElasticStateTest(AskingPeers()) { ride_out_ = true; }

  // Running in round 0, the watch stream open; then it breaks at 1 s and
  // the round's other nodes are asked at once.
  void ToCutOff() {
    ToRunning(1);
    state_.OnRdzv(WatchStarted(1), At(20));
    state_.OnRdzv(rdzv_event::WatchEnded{1, kDown}, At(1'000));
    ASSERT_EQ(state_.NextDeadline(), At(1'000));
    EXPECT_THAT(Names(state_.OnTimer(At(1'000))), Contains("AskPeers 0"));
  }
  static PeerAnswer Silent(const std::string& node) {
    PeerAnswer answer;
    answer.node = node;
    return answer;
  }
};

TEST_F(PeersTest, WorkersRideOutAnOutageThatCutsEveryNodeOfTheRound) {
  ToCutOff();
  EXPECT_THAT(state_.OnPeersAnswered(0, {Peer("b", 0, false), Peer("c", 0, false)}, At(2'000)),
              IsEmpty());
  // Asked again while it lasts: keep_alive_interval after each answer.
  EXPECT_THAT(Names(state_.OnTimer(At(1'999 + kKeepAliveMs))), Not(Contains("AskPeers 0")));
  EXPECT_THAT(Names(state_.OnTimer(At(2'000 + kKeepAliveMs))), Contains("AskPeers 0"));
  EXPECT_THAT(state_.OnPeersAnswered(0, {Peer("b", 0, false), Peer("c", 0, false)}, At(7'000)),
              IsEmpty());
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
  // Back: no more asking.
  state_.OnRdzv(Beat(0), At(8'000));
  EXPECT_THAT(Names(state_.OnTimer(At(1'000 + 2 * kKeepAliveMs))), Not(Contains("AskPeers 0")));
}

// Found by the netns test (test_netns.PartitionFromMusterd): asked again every
// keep_alive_interval (0.5 s there) while the answers take up to 1 s, the
// edge dropped each question for the next one, and the node never decided.
TEST_F(PeersTest, NoQuestionIsAskedWhileOneIsOpen) {
  ToCutOff();
  for (int64_t t = 1'000; t <= 1'000 + 4 * kKeepAliveMs; t += 500) {
    EXPECT_THAT(Names(state_.OnTimer(At(t))), Not(Contains("AskPeers 0"))) << t;
  }
  EXPECT_THAT(Names(state_.OnPeersAnswered(0, {Silent("b")}, At(22'000))),
              ElementsAre("Signal TERM"));
}

// Found by test_durability.MusterdRestart once real agents asked: the peer
// that reconnected to the restarted musterd first answered that it reached
// it, and the node that had not yet stopped its workers, for nothing. In
// the same round still, a peer that reaches the rendezvous shows that no
// newer round has started.
TEST_F(PeersTest, APeerThatReachesTheRendezvousInTheSameRoundKeepsTheWorkersRunning) {
  ToCutOff();
  Actions kept = state_.OnPeersAnswered(0, {Peer("b", 0, false), Peer("c", 0, true)}, At(2'000));
  EXPECT_THAT(Names(kept), Not(Contains("Signal TERM")));
  EXPECT_THAT(Logs(kept), ElementsAre(HasSubstr("node c of its round reaches the rendezvous")));
  EXPECT_THAT(Names(state_.OnTimer(At(2'000 + kKeepAliveMs))), Contains("AskPeers 0"));
  // Said once.
  EXPECT_THAT(state_.OnPeersAnswered(0, {Peer("b", 0, false), Peer("c", 0, true)},
                                     At(3'000 + kKeepAliveMs)),
              IsEmpty());
}

TEST_F(PeersTest, ANodeCutOffAloneStopsItsWorkersOnceAPeerIsInANewerRoundAndRejoins) {
  ToCutOff();
  state_.OnPeersAnswered(0, {Peer("b", 0, true), Peer("c", 0, true)}, At(2'000));
  state_.OnTimer(At(2'000 + kKeepAliveMs));
  Actions stop =
      state_.OnPeersAnswered(0, {Peer("b", 1, true), Peer("c", 0, true)}, At(3'000 + kKeepAliveMs));
  EXPECT_THAT(Names(stop), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(stop), ElementsAre(HasSubstr("node b is in round 1 already")));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(3'100 + kKeepAliveMs))),
              ElementsAre("Join"));
}

TEST_F(PeersTest, APeerInANewerRoundStopsTheWorkers) {
  ToCutOff();
  Actions stop = state_.OnPeersAnswered(0, {Peer("b", 0, false), Peer("c", 1, false)}, At(2'000));
  EXPECT_THAT(Names(stop), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(stop), ElementsAre(HasSubstr("node c is in round 1 already")));
}

TEST_F(PeersTest, APeerThatDoesNotAnswerStopsTheWorkers) {
  // Cut off from all (the peer of the round may be dead: the round is broken too).
  ToCutOff();
  Actions stop = state_.OnPeersAnswered(0, {Peer("b", 0, false), Silent("c")}, At(2'000));
  EXPECT_THAT(Names(stop), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(stop), ElementsAre(HasSubstr("node c of its round does not answer either")));
}

TEST_F(PeersTest, ANodeAloneInItsRoundRidesOutHeartbeatTimeoutAtMost) {
  ToCutOff();
  EXPECT_THAT(state_.OnPeersAnswered(0, {}, At(2'000)), IsEmpty());
  EXPECT_THAT(state_.OnPeersAnswered(0, {}, At(30'999)), IsEmpty());
  Actions stop = state_.OnPeersAnswered(0, {}, At(31'000));
  EXPECT_THAT(Names(stop), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(stop), ElementsAre(HasSubstr("for heartbeat_timeout (30 s)")));
}

TEST_F(PeersTest, LateAnswersChangeNothing) {
  ToCutOff();
  // For another round, or once the rendezvous answers again.
  EXPECT_THAT(state_.OnPeersAnswered(1, {Silent("b")}, At(2'000)), IsEmpty());
  state_.OnRdzv(Beat(0), At(2'500));
  EXPECT_THAT(state_.OnPeersAnswered(0, {Silent("b")}, At(3'000)), IsEmpty());
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
}

TEST_F(PeersTest, WhatANodeTellsItsPeers) {
  ToRunning(1);
  PeerAnswer answer = state_.AnswerPeer();
  EXPECT_TRUE(answer.answered);
  EXPECT_EQ(answer.round, 0);
  EXPECT_TRUE(answer.reaches_rendezvous);
  state_.OnRdzv(WatchStarted(1), At(20));
  state_.OnRdzv(rdzv_event::WatchEnded{1, kDown}, At(1'000));
  EXPECT_FALSE(state_.AnswerPeer().reaches_rendezvous);
  // Told of a newer round (it is stopping its workers): it says that one.
  rdzv::WatchEvent moved;
  moved.mutable_round_changed()->set_new_round(3);
  state_.OnRdzv(rdzv_event::Pushed{1, moved}, At(1'100));
  EXPECT_EQ(state_.AnswerPeer().round, 3);
}

TEST_F(RideOutTest, WithoutAskingPeersANodeCutOffAloneRidesItOut) {
  ToRunning(1);
  state_.OnRdzv(WatchStarted(1), At(20));
  state_.OnRdzv(rdzv_event::WatchEnded{1, kDown}, At(1'000));
  EXPECT_THAT(Names(state_.OnTimer(At(1'000))), Not(Contains("AskPeers 0")));
}

// Found by the simulator (etcd): the etcd backend's watch outlives an
// outage of etcd (its client opens it again), so an agent cut off from etcd
// heard nothing, sent no heartbeat and never asked its peers: its old round
// ran beside the newer one for as long as the cut lasted.
class WatchOutlivesOutagesTest : public ElasticStateTest {
 protected:
  static ElasticOptions HeartbeatingWithWatch() {
    ElasticOptions options = AskingPeers();
    options.heartbeat_with_watch = true;
    return options;
  }
  WatchOutlivesOutagesTest() : ElasticStateTest(HeartbeatingWithWatch()) { ride_out_ = true; }
};

TEST_F(WatchOutlivesOutagesTest, HeartbeatsGoOnWhileTheWatchIsOpen) {
  ToRunning(1);
  state_.OnRdzv(WatchStarted(1), At(20));
  EXPECT_THAT(Names(state_.OnTimer(At(10 + kKeepAliveMs))), ElementsAre("Heartbeat"));
  EXPECT_THAT(state_.OnRdzv(Beat(0), At(20 + kKeepAliveMs)), IsEmpty());
  EXPECT_THAT(Names(state_.OnTimer(At(10 + 2 * kKeepAliveMs))), ElementsAre("Heartbeat"));
}

TEST_F(WatchOutlivesOutagesTest, AnUnansweredHeartbeatWhileTheWatchIsOpenAsksThePeers) {
  ToRunning(1);
  state_.OnRdzv(WatchStarted(1), At(20));
  EXPECT_THAT(Names(state_.OnTimer(At(10 + kKeepAliveMs))), ElementsAre("Heartbeat"));
  Actions unanswered = state_.OnRdzv(Beat(kDown), At(6'000));
  EXPECT_THAT(Logs(unanswered), Contains(HasSubstr("does not answer")));
  EXPECT_THAT(Names(state_.OnTimer(At(6'000))), Contains("AskPeers 0"));
  EXPECT_THAT(Names(state_.OnPeersAnswered(0, {PeersTest::Peer("b", 1, true)}, At(7'000))),
              ElementsAre("Signal TERM"));
  EXPECT_EQ(state_.after_stop(), AfterStop::kRejoin);
}

class PreflightTest : public ElasticStateTest {
 protected:
  static ElasticOptions WithPreflight() {
    ElasticOptions options = Options();
    options.preflight = true;
    return options;
  }
  PreflightTest() : ElasticStateTest(WithPreflight()) {}
  // An assignment of a round that runs the pre-flight (it seats a new node).
  static rdzv::Assignment WithPreflight(rdzv::Assignment assignment) {
    assignment.set_preflight(true);
    return assignment;
  }
  // The pre-flight's `workers` run in round `round`.
  Actions ToPreflight(int workers = 2, int64_t round = 0) {
    ToJoining();
    Actions joined = state_.OnRdzv(rdzv_event::Joined{WithPreflight(Assigned(round))}, At(10));
    EXPECT_THAT(state_.OnWorkersStarted(workers, std::nullopt, At(10)), IsEmpty());
    return joined;
  }
};

TEST_F(PreflightTest, TheFirstRoundRunsThePreflightAndThenTheScript) {
  Actions joined = ToPreflight();
  EXPECT_THAT(Names(joined), ElementsAre("OpenWatch", "StartWorkers"));
  EXPECT_TRUE(Find<action::StartWorkers>(joined).preflight);
  EXPECT_TRUE(state_.in_preflight());
  EXPECT_THAT(Names(state_.OnWorkerExit(kSuccess, Failure(0, 0), At(100))), IsEmpty());
  Actions passed = state_.OnWorkerExit(kSuccess, Failure(1, 0), At(110));
  ASSERT_THAT(Names(passed), ElementsAre("StartWorkers"));
  EXPECT_FALSE(Find<action::StartWorkers>(passed).preflight);
  EXPECT_EQ(Find<action::StartWorkers>(passed).attempt, 0) << "the pre-flight is no attempt";
  EXPECT_THAT(Logs(passed), Contains(HasSubstr("pre-flight all-reduce passed")));
  EXPECT_FALSE(state_.in_preflight());
  EXPECT_THAT(state_.OnWorkersStarted(2, std::nullopt, At(120)), IsEmpty());
  EXPECT_EQ(state_.phase(), AgentPhase::kRunning);
  state_.OnWorkerExit(kSuccess, Failure(0, 0), At(200));
  EXPECT_THAT(Names(state_.OnWorkerExit(kSuccess, Failure(1, 0), At(210))),
              ElementsAre("ReportDone"))
      << "the script's own success ends the round";
}

TEST_F(PreflightTest, AFailedPreflightReportsAFailureNoRestartMendsAndNeverStartsTheScript) {
  ToPreflight();
  Actions failed = state_.OnWorkerExit(kExit1, Failure(0), At(100));
  EXPECT_THAT(Names(failed), ElementsAre("ReportFailure", "Signal TERM"));
  EXPECT_TRUE(Find<action::ReportFailure>(failed).failure.preflight);
  EXPECT_THAT(Logs(failed), Contains(HasSubstr("the script is not started")));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110))), IsEmpty());
  Actions closed = state_.OnRdzv(JobClosed(false, "pre-flight failed"), At(120));
  ASSERT_THAT(Names(closed), ElementsAre("Exit 1"));
  const auto& exit = Find<action::Exit>(closed);
  EXPECT_THAT(exit.report, HasSubstr("muster-allreduce (the pre-flight, --preflight) FAILED"));
  EXPECT_THAT(exit.why, HasSubstr("pre-flight failed"));
}

TEST_F(PreflightTest, APreflightThatCannotStartIsAPreflightFailure) {
  ToJoining();
  state_.OnRdzv(rdzv_event::Joined{WithPreflight(Assigned(0))}, At(10));
  WorkerFailure missing = Failure(0, 127);
  Actions started = state_.OnWorkersStarted(0, missing, At(10));
  EXPECT_THAT(Names(started), ElementsAre("ReportFailure", "Signal TERM"));
  EXPECT_TRUE(Find<action::ReportFailure>(started).failure.preflight);
}

TEST_F(PreflightTest, ARoundThatSeatsNoNewNodeRunsTheScriptAtOnce) {
  ToJoining();
  Actions joined = state_.OnRdzv(rdzv_event::Joined{Assigned(3, 1)}, At(10));
  EXPECT_FALSE(Find<action::StartWorkers>(joined).preflight)
      << "the rendezvous decides for every node of the round alike";
  EXPECT_FALSE(state_.in_preflight());
}

TEST_F(PreflightTest, ALaterRoundThatSeatsANewNodeRunsItAgain) {
  ToJoining();
  Actions joined = state_.OnRdzv(rdzv_event::Joined{WithPreflight(Assigned(3, 1))}, At(10));
  EXPECT_TRUE(Find<action::StartWorkers>(joined).preflight);
}

TEST_F(PreflightTest, ARoundChangeDuringThePreflightRejoinsWithoutIt) {
  ToPreflight();
  state_.OnRdzv(RoundChangedTo(1), At(100));
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(120))),
              ElementsAre("Join"));
  Actions rejoined = state_.OnRdzv(rdzv_event::Joined{Assigned(1)}, At(130));
  EXPECT_FALSE(Find<action::StartWorkers>(rejoined).preflight);
  EXPECT_FALSE(state_.in_preflight());
}

// ---- Progress (MUSTER_PROGRESS_FILE) ----

class ProgressTest : public ElasticStateTest {
 protected:
  static ElasticOptions WithPoll() {
    ElasticOptions options = Options();
    options.progress_poll = absl::Seconds(1);
    return options;
  }
  ProgressTest() : ElasticStateTest(WithPoll()) {}
  static NodeProgress Wrote(int64_t step, int64_t at_ms) {
    return NodeProgress{step, 10 * step, At(at_ms)};
  }
};

TEST_F(ProgressTest, TheFilesAreReadEverySecondWhileTheScriptRuns) {
  ToRunning();
  EXPECT_EQ(state_.NextDeadline(), At(1'010));
  EXPECT_THAT(Names(state_.OnTimer(At(1'010))), ElementsAre("ReadProgress"));
  EXPECT_EQ(state_.NextDeadline(), At(2'010));
  state_.OnWorkerExit(kExit1, Failure(0), At(1'500));  // stopping: no more reads
  EXPECT_THAT(Names(state_.OnTimer(At(2'010))), Not(Contains("ReadProgress")));
}

TEST_F(ProgressTest, TheFirstStepOfARoundIsReportedAtOnceThenAtMostEveryFiveSeconds) {
  ToRunning();
  Actions first = state_.OnProgress(Wrote(7, 900), At(1'010));
  ASSERT_THAT(Names(first), ElementsAre("Heartbeat+progress"));
  const rdzv::Progress& report = *Find<action::SendHeartbeat>(first).progress;
  EXPECT_EQ(report.step(), 7);
  EXPECT_EQ(report.count(), 70);
  EXPECT_EQ(report.age_ms(), 110);
  EXPECT_EQ(report.round(), 0);
  EXPECT_THAT(state_.OnProgress(Wrote(8, 2'000), At(2'010)), IsEmpty()) << "too soon";
  EXPECT_THAT(state_.OnProgress(Wrote(8, 2'000), At(6'010)), IsEmpty()) << "nothing new";
  EXPECT_THAT(Names(state_.OnProgress(Wrote(9, 6'000), At(6'010))),
              ElementsAre("Heartbeat+progress"));
  EXPECT_EQ(state_.progress().step, 9);
}

TEST_F(ProgressTest, ANewRoundReportsItsFirstStepAtOnceAgain) {
  ToRunning();
  state_.OnProgress(Wrote(100, 1'000), At(1'010));
  state_.OnRdzv(RoundChangedTo(1), At(1'100));
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(1'110));
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(1'120));
  state_.OnRdzv(rdzv_event::Joined{Assigned(1, 1)}, At(1'200));
  state_.OnWorkersStarted(2, std::nullopt, At(1'210));
  EXPECT_EQ(state_.progress().step, -1);
  // From its checkpoint: a lower step, the round's first.
  Actions actions = state_.OnProgress(Wrote(50, 1'500), At(1'600));
  ASSERT_THAT(Names(actions), ElementsAre("Heartbeat+progress"));
  EXPECT_EQ(Find<action::SendHeartbeat>(actions).progress->round(), 1);
}

TEST_F(ProgressTest, ThePreflightReportsNoProgress) {
  ElasticOptions options = WithPoll();
  options.preflight = true;
  ElasticState state(options);
  state.Start(At(0));
  rdzv::Assignment assignment = Assigned(0);
  assignment.set_preflight(true);
  state.OnRdzv(rdzv_event::Joined{assignment}, At(10));
  state.OnWorkersStarted(2, std::nullopt, At(10));
  ASSERT_TRUE(state.in_preflight());
  EXPECT_THAT(state.OnProgress(Wrote(1, 20), At(30)), IsEmpty());
  EXPECT_NE(state.NextDeadline(), At(1'010));
}

RdzvEvent Closed(bool no_progress, bool progressed, int64_t last_step) {
  rdzv::WatchEvent event;
  rdzv::JobClosed* closed = event.mutable_job_closed();
  closed->set_reason("rank 0 on node-a failed with exit code 1");
  closed->set_no_progress(no_progress);
  closed->set_progressed(progressed);
  closed->set_last_step(last_step);
  closed->set_goodput(0.8);
  return rdzv_event::Pushed{1, event};
}

TEST_F(ProgressTest, AStuckJobExitsWithTheNoProgressCode) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  Actions actions = state_.OnRdzv(Closed(true, false, -1), At(120));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 70"));
  EXPECT_THAT(Find<action::Exit>(actions).summary, HasSubstr("do not requeue"));
}

TEST_F(ProgressTest, AJobThatMadeProgressExitsWithTheRequeueCode) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  Actions actions = state_.OnRdzv(Closed(false, true, 1'234), At(120));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 75"));
  EXPECT_THAT(Find<action::Exit>(actions).summary,
              AllOf(HasSubstr("last step: 1234"), HasSubstr("goodput 80%"),
                    HasSubstr("a requeue resumes it")));
}

TEST_F(ProgressTest, AJobWithNoStepReportedExitsOneAsBefore) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  Actions actions = state_.OnRdzv(Closed(false, false, -1), At(120));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 1"));
  EXPECT_EQ(Find<action::Exit>(actions).summary, "");
}

TEST_F(ProgressTest, ASuccessSaysTheLastStepThisNodeReached) {
  ToRunning(1);
  state_.OnProgress(Wrote(42, 500), At(1'000));
  state_.OnWorkerExit(kSuccess, Failure(0, 0), At(1'100));
  Actions actions = state_.OnRdzv(rdzv_event::DoneReported{absl::OkStatus()}, At(1'200));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 0"));
  EXPECT_THAT(Find<action::Exit>(actions).summary, HasSubstr("reached: 42"));
}

// ---- Bad nodes ----

RdzvEvent Excluded(bool job_ends = false) {
  rdzv::WatchEvent event;
  rdzv::Exclusion* exclusion = event.mutable_node_excluded()->mutable_exclusion();
  exclusion->set_host("node-a");
  exclusion->set_cause("its workers were the root cause of 3 failures of the job in a row");
  event.mutable_node_excluded()->set_job_ends(job_ends);
  return rdzv_event::Pushed{1, event};
}

TEST_F(ElasticStateTest, ARoundChangeWhileTheWorkersWereStartingStopsThemAndRejoins) {
  ToJoining();
  Actions joined = state_.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(10));
  EXPECT_THAT(Names(joined), ElementsAre("OpenWatch", "StartWorkers"));
  // The agent holds the start (the GPUs of the last round, --preload's
  // imports) while the job moves on.
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(20))), IsEmpty());
  Actions started = state_.OnWorkersStarted(2, std::nullopt, At(300));
  EXPECT_THAT(Names(started), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(started), Contains(HasSubstr("round 0 is over already")));
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(310));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(320))),
              ElementsAre("Join"));
  // The heartbeat's answer tells of the same round: nothing more.
  EXPECT_THAT(Names(state_.OnRdzv(RoundChangedTo(1), At(330))), IsEmpty());
}

TEST_F(ElasticStateTest, ARoundChangeBeforeAStartThatFailedRejoinsOnceStopped) {
  ToJoining();
  state_.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(10));
  state_.OnRdzv(RoundChangedTo(1), At(20));
  Actions started = state_.OnWorkersStarted(1, Failure(1, 127), At(30));
  EXPECT_THAT(Names(started), ElementsAre("ReportFailure", "Signal TERM"));
  EXPECT_THAT(Names(state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(40))),
              ElementsAre("Join"))
      << "the decision it would wait for came already";
}

TEST_F(ElasticStateTest, AnExcludedNodeStopsItsWorkersAndExitsNamingTheCause) {
  ToRunning();
  Actions actions = state_.OnRdzv(Excluded(), At(100));
  EXPECT_THAT(Names(actions), ElementsAre("Signal TERM"));
  EXPECT_THAT(Logs(actions), Contains(HasSubstr("excluded this node's host node-a")));
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  Actions exited = state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(120));
  ASSERT_THAT(Names(exited), ElementsAre("Exit 69"));
  const action::Exit& exit = Find<action::Exit>(exited);
  EXPECT_THAT(exit.why, AllOf(HasSubstr("node-a"), HasSubstr("root cause of 3 failures")));
  ASSERT_TRUE(exit.excluded);
  EXPECT_EQ(exit.excluded->host(), "node-a");
  EXPECT_FALSE(exit.leave_reason) << "the rendezvous removed it already";
}

TEST_F(ElasticStateTest, AFailureReportRefusedForAnExclusionExitsWithTheExcludedCode) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  Actions refused = state_.OnRdzv(rdzv_event::FailureReported{absl::NotFoundError(
                                      absl::StrCat("node a was dropped from job 'x': node node-a ",
                                                   rdzv::kExcludedFromJob, " 'x' (a bad node)"))},
                                  At(120));
  ASSERT_THAT(Names(refused), ElementsAre("Exit 69"))
      << "another node's report of the same round excluded this one first";
}

TEST_F(ElasticStateTest, AnExclusionWhileStoppingWinsOverTheJobsClose) {
  ToStoppingAfterFailure();
  state_.OnRdzv(Excluded(), At(105));
  state_.OnRdzv(JobClosed(false, "no restarts left"), At(106));
  Actions exited = state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  ASSERT_THAT(Names(exited), ElementsAre("Exit 69"));
  EXPECT_THAT(Find<action::Exit>(exited).report, HasSubstr("train.py")) << "its own failure";
}

TEST_F(ElasticStateTest, AnExclusionByTheFailureThatEndsTheJobEndsTheNodeAsTheJobEnds) {
  ToStoppingAfterFailure();
  state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(110));
  Actions excluded = state_.OnRdzv(Excluded(/*job_ends=*/true), At(120));
  EXPECT_THAT(Names(excluded), IsEmpty()) << "the JobClosed that follows decides";
  EXPECT_THAT(Logs(excluded), Contains(AllOf(HasSubstr("excluded this node's host node-a"),
                                             HasSubstr("the same failure ends the job"))));
  Actions closed = state_.OnRdzv(JobClosed(false, "no restarts left"), At(121));
  ASSERT_THAT(Names(closed), ElementsAre("Exit 1")) << "as every other node of the job";
  const action::Exit& exit = Find<action::Exit>(closed);
  ASSERT_TRUE(exit.excluded) << "--on-node-excluded still runs";
  EXPECT_EQ(exit.excluded->host(), "node-a");
}

TEST_F(ElasticStateTest, AnExcludedNodeThatHostsTheRendezvousStaysUntilTheJobEnds) {
  ElasticState host(Options(/*hosts=*/true));
  host.Start(At(0));
  host.OnRdzv(rdzv_event::Joined{Assigned(0)}, At(10));
  host.OnWorkersStarted(1, std::nullopt, At(10));
  host.OnRdzv(WatchStarted(1), At(11));
  host.OnRdzv(Excluded(), At(100));
  Actions stopped = host.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  EXPECT_THAT(Names(stopped), IsEmpty()) << "the other nodes still need its rendezvous";
  EXPECT_THAT(Logs(stopped), Contains(HasSubstr("stays, without workers")));
  // Out of the job, it is pushed nothing: its heartbeats find the close.
  EXPECT_THAT(Names(host.OnTimer(At(110 + kKeepAliveMs))), ElementsAre("Heartbeat"));
  EXPECT_THAT(Names(host.OnRdzv(Beat(absl::NotFoundError("dropped")), At(5'200))), IsEmpty());
  Actions closed =
      host.OnRdzv(Beat(absl::FailedPreconditionError("job 'x' is closed: done")), At(9'000));
  ASSERT_THAT(Names(closed), ElementsAre("Exit 69"));
}

TEST_F(ElasticStateTest, AJoinThatFailsForAnExclusionExitsWithTheExcludedCode) {
  ToJoining();
  Actions actions = state_.OnRdzv(
      rdzv_event::Joined{absl::AbortedError(absl::StrCat(
          "removed from job 'x': node node-a ", rdzv::kExcludedFromJob, " 'x' (a bad node)"))},
      At(1));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 69"));
}

TEST_F(ElasticStateTest, AGpuFaultLeavesTheJobAskingForExclusionThenExits) {
  ToRunning();
  Actions actions =
      state_.OnNodeFault("GPU 1 (GPU-x): Xid 79, the GPU has fallen off the bus", At(100));
  EXPECT_THAT(Names(actions), ElementsAre("Signal TERM"));
  EXPECT_THAT(Find<action::ExcludeSelf>(actions).cause, HasSubstr("Xid 79"));
  EXPECT_THAT(state_.OnNodeFault("again", At(101)), IsEmpty()) << "said once";
  state_.OnWorkerExit(kByTerm, Failure(0, 0, SIGTERM), At(110));
  Actions exited = state_.OnWorkerExit(kByTerm, Failure(1, 0, SIGTERM), At(120));
  ASSERT_THAT(Names(exited), ElementsAre("Exit 69"));
  EXPECT_THAT(Find<action::Exit>(exited).why,
              AllOf(HasSubstr("its own health check failed"), HasSubstr("Xid 79")));
}

class HealthCheckTest : public ElasticStateTest {
 protected:
  static ElasticOptions WithHealthCheck() {
    ElasticOptions options = Options();
    options.health_check = true;
    return options;
  }
  HealthCheckTest() : ElasticStateTest(WithHealthCheck()) {}
};

TEST_F(HealthCheckTest, AHealthyNodeJoinsOnceItsGpusAreChecked) {
  Actions start = state_.Start(At(0));
  ASSERT_EQ(start.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<action::CheckHealth>(start[0]));
  EXPECT_EQ(state_.phase(), AgentPhase::kJoining);
  Actions checked = state_.OnHealthChecked({}, At(50));
  ASSERT_THAT(Names(checked), ElementsAre("Join"));
  EXPECT_EQ(Find<action::Join>(checked).health_fault, "");
  EXPECT_THAT(state_.OnHealthChecked({}, At(60)), IsEmpty()) << "answered once";
}

TEST_F(HealthCheckTest, ASickNodeTellsTheRendezvousAndExitsWithTheExcludedCode) {
  state_.Start(At(0));
  Actions checked =
      state_.OnHealthChecked({"GPU 0 (GPU-x): Xid 79, the GPU has fallen off the bus"}, At(50));
  ASSERT_THAT(Names(checked), ElementsAre("Join"));
  EXPECT_THAT(Find<action::Join>(checked).health_fault, HasSubstr("Xid 79"));
  EXPECT_THAT(Logs(checked), Contains(HasSubstr("failed their health check")));
  Actions refused =
      state_.OnRdzv(rdzv_event::Joined{absl::FailedPreconditionError(absl::StrCat(
                        "host node-a ", rdzv::kExcludedFromJob, " 'x': its GPUs failed"))},
                    At(60));
  ASSERT_THAT(Names(refused), ElementsAre("Exit 69"));
  EXPECT_THAT(Find<action::Exit>(refused).why, HasSubstr("Xid 79"));
}

TEST_F(HealthCheckTest, ACheckThatNeverAnswersIsGivenUpOnAndTheNodeJoins) {
  state_.Start(At(0));
  EXPECT_EQ(state_.NextDeadline(), At(0) + ElasticState::kHealthCheckWait);
  Actions late = state_.OnTimer(At(0) + ElasticState::kHealthCheckWait);
  EXPECT_THAT(Names(late), ElementsAre("Join"));
  EXPECT_THAT(Logs(late), Contains(HasSubstr("did not answer")));
}

TEST_F(ElasticStateTest, AJoinRefusedForAnExcludedHostExitsWithTheExcludedCode) {
  ToJoining();
  Actions actions = state_.OnRdzv(
      rdzv_event::Joined{absl::FailedPreconditionError(absl::StrCat(
          "host node-a ", rdzv::kExcludedFromJob, " 'x': its workers were the root cause"))},
      At(1));
  ASSERT_THAT(Names(actions), ElementsAre("Exit 69"));
  EXPECT_THAT(Find<action::Exit>(actions).why, HasSubstr("refused this node"));
  EXPECT_TRUE(Find<action::Exit>(actions).excluded);
}

}  // namespace
}  // namespace muster
