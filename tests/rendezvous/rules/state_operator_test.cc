// What the state tells and lets an operator do (musterctl): job events and
// their history, a job's status with its nodes, the list of jobs, a stop.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/rules/job_events.h"
#include "rendezvous/rules/state.h"
#include "tests/rendezvous/rules/state_fixture.h"

namespace muster::rdzv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// "kind round node" of each event, for one comparison.
std::vector<std::string> Summary(const std::vector<JobEvent>& events) {
  std::vector<std::string> out;
  for (const JobEvent& event : events) {
    out.push_back(absl::StrCat(JobEventKindName(event.kind()), " ", event.round(),
                               event.node_id().empty() ? "" : " ", event.node_id()));
  }
  return out;
}

class OperatorTest : public StateTest {
 protected:
  // Every event of job_ the calls made, in order.
  void Collect(const Effects& effects) {
    for (const JobEvent& event : effects.events) {
      if (event.job_id() == job_) events_.push_back(event);
    }
  }
  std::vector<JobEvent> events_;
};

TEST_F(OperatorTest, AJobThatFailsOnceThenFinishesTellsItsEventsInOrder) {
  config_ = Config(3, 3, /*max_restarts=*/1);
  for (const char* node : {"a", "b", "c"}) Collect(Join(node, At(0)));
  Collect(Fail("b", 0, At(100), /*rank=*/1));
  for (const char* node : {"a", "b", "c"}) Collect(Join(node, At(200)));
  for (const char* node : {"a", "b", "c"}) Collect(Done(node, 1, At(300)));
  EXPECT_THAT(Summary(events_), ElementsAre("node_joined 0 a", "node_joined 0 b", "node_joined 0 c",
                                            "round_started 0", "worker_failed 0 b",
                                            "round_started 1", "job_closed 1"));
  EXPECT_EQ(events_[0].detail(), "node host-a joined with 1 worker");
  EXPECT_EQ(events_[0].time_unix_ms(), absl::ToUnixMillis(At(0)));
  EXPECT_THAT(events_[4].detail(), HasSubstr("rank 1 on host-b failed with exit code 1; "
                                             "restart 1 of 1"));
  EXPECT_TRUE(events_[6].succeeded());
  EXPECT_EQ(events_[6].detail(), "every node finished");
  for (const JobEvent& event : events_) EXPECT_EQ(event.job_id(), job_);

  // A watch that starts now gets the same events from the history.
  absl::StatusOr<std::vector<JobEvent>> history = state_.History(job_);
  ASSERT_TRUE(history.ok());
  EXPECT_EQ(Summary(*history), Summary(events_));
  EXPECT_TRUE(IsFinalEvent(history->back()));
  EXPECT_EQ(state_.History("other").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(OperatorTest, ALostNodeAndAForgottenJobAreEvents) {
  config_ = Config(1, 2);
  Form({"a", "b"}, At(0));
  Collect(Leave("b", At(10), "maintenance"));
  EXPECT_THAT(Summary(events_), ElementsAre("node_lost 0 b"));
  EXPECT_EQ(events_[0].detail(), "node host-b left: maintenance");
  events_.clear();
  job_ = "empty";
  Join("x", At(20));
  Collect(Leave("x", At(30)));
  Collect(Advance(At(30) + absl::Milliseconds(kJoinTimeoutMs)));
  EXPECT_THAT(Summary(events_), ElementsAre("node_lost 0 x", "job_forgotten 0"));
  EXPECT_TRUE(IsFinalEvent(events_.back()));
}

TEST_F(OperatorTest, TheHistoryKeepsTheLastEventsOnly) {
  config_ = Config(1, 1, /*max_restarts=*/100);
  Form({"a"}, At(0));
  for (int round = 0; round < 40; ++round) {
    Fail("a", round, At(10 * round + 1));
    Join("a", At(10 * round + 2));
  }
  absl::StatusOr<std::vector<JobEvent>> history = state_.History(job_);
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), kMaxJobHistory);
  EXPECT_EQ(Summary(*history).back(), "round_started 40");
  EXPECT_EQ(JobStatus().recent_failures_size(), static_cast<int>(kMaxRecentFailures));
}

TEST_F(OperatorTest, StatusListsTheNodesInRankOrderWithTheirTimes) {
  config_ = Config(2, 3);
  Join(Spec("b").Lws(2), At(0));
  Join(Spec("a").Lws(3), At(5));
  Advance(At(5 + kLastCallMs));  // round 0: host-a, host-b
  Join("c", At(2000));           // a spare: it waits for the next round... which opens
  absl::StatusOr<StatusResponse> status = state_.Status(job_, At(2500), /*nodes=*/true);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->created_unix_ms(), absl::ToUnixMillis(At(0)));
  EXPECT_EQ(status->node_count(), 3);
  ASSERT_EQ(status->nodes_size(), 3);
  // c's join opened round 1; a and b are asked back, c is in it.
  EXPECT_EQ(status->state(), "open");
  EXPECT_EQ(status->round_since_unix_ms(), absl::ToUnixMillis(At(2000)));
  EXPECT_EQ(status->nodes(0).node_id(), "b");
  EXPECT_EQ(status->nodes(0).state(), "rejoining");
  EXPECT_EQ(status->nodes(0).joined_unix_ms(), absl::ToUnixMillis(At(0)));
  EXPECT_EQ(status->nodes(2).node_id(), "c");
  EXPECT_EQ(status->nodes(2).state(), "joined");
  EXPECT_EQ(status->nodes(2).group_rank(), -1);

  Join(Spec("a").Lws(3), At(2600));
  Join(Spec("b").Lws(2), At(2700));  // round 1 formed: a, b, c by host name
  status = state_.Status(job_, At(3000), /*nodes=*/true);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), "running");
  EXPECT_EQ(status->world_size(), 6);
  std::vector<std::string> rows;
  for (const NodeStatus& node : status->nodes()) {
    rows.push_back(absl::StrCat(node.node_id(), " ", node.state(), " ", node.group_rank(), " ",
                                node.rank_base(), " ", node.local_world_size()));
  }
  EXPECT_THAT(rows, ElementsAre("a running 0 0 3", "b running 1 3 2", "c running 2 5 1"));
  EXPECT_EQ(status->nodes(0).last_seen_unix_ms(), absl::ToUnixMillis(At(2700)));
  Effects effects;
  state_.SetWatching({job_, "a"}, true, At(2800), &effects);
  status = state_.Status(job_, At(3000), /*nodes=*/true);
  EXPECT_TRUE(status->nodes(0).watching());
  EXPECT_EQ(status->nodes(0).last_seen_unix_ms(), absl::ToUnixMillis(At(3000)))
      << "an open watch stream is a node seen now";
  EXPECT_THAT(state_.Status(job_)->nodes(), IsEmpty()) << "nodes only when asked";
}

TEST_F(OperatorTest, ListJobsGivesOneNamespaceAndNoMessages) {
  config_ = Config(1, 1, /*max_restarts=*/1);
  for (const char* id : {"1000/x", "1000/y", "1001/x"}) {
    job_ = id;
    Form({"a"}, At(0));
  }
  job_ = "1000/y";
  Fail("a", 0, At(10));
  ListJobsResponse list = state_.ListJobs("1000/", At(20));
  EXPECT_EQ(list.total(), 2);
  ASSERT_EQ(list.jobs_size(), 2);
  EXPECT_EQ(list.jobs(0).job_id(), "1000/x");
  EXPECT_EQ(list.jobs(1).job_id(), "1000/y");
  ASSERT_EQ(list.jobs(1).recent_failures_size(), 1);
  EXPECT_EQ(list.jobs(1).recent_failures(0).message(), "") << "messages only for one job";
  EXPECT_EQ(list.jobs(1).nodes_size(), 0);
  EXPECT_EQ(state_.ListJobs("", At(20)).total(), 3);
  EXPECT_EQ(state_.ListJobs("9/", At(20)).total(), 0);
}

TEST_F(OperatorTest, StopClosesTheJobAndTellsEveryNode) {
  Form({"a", "b"}, At(0));
  Effects effects;
  ASSERT_TRUE(state_.Stop(job_, "maintenance\nat 3am", At(10), &effects).ok());
  Keep(effects);
  auto pushed = Pushed(effects);
  for (const char* node : {"a", "b"}) {
    ASSERT_EQ(pushed[node].size(), 1u) << node;
    const JobClosed& closed = pushed[node][0].job_closed();
    EXPECT_FALSE(closed.succeeded());
    EXPECT_THAT(closed.reason(), HasSubstr("stopped by an operator: maintenance"));
    EXPECT_FALSE(closed.has_root_cause());
  }
  EXPECT_THAT(Summary(effects.events), ElementsAre("job_closed 0"));
  EXPECT_EQ(JobStatus().state(), "closed");
  EXPECT_EQ(JobStatus().restart_count(), 0) << "a stop uses no restart";

  Effects again;
  absl::Status twice = state_.Stop(job_, "", At(20), &again);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.message(), HasSubstr("closed already"));
  EXPECT_TRUE(again.empty());
  EXPECT_EQ(state_.Stop("no-such-job", "", At(20), &again).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(again.empty());
}

}  // namespace
}  // namespace muster::rdzv
