// The rendezvous over real gRPC on loopback: RendezvousServer and
// RendezvousClient, the way agents use them. Every wait is bounded. The
// fixture's hub runs on a FakeClock: no deadline passes unless a test moves
// the clock.
#include "rendezvous/server/service.h"

#include <arpa/inet.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_segs_in (glibc's is older)
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/unique_handle.h"
#include "rendezvous/client/client.h"
#include "rendezvous/rules/protocol.h"
#include "tests/rendezvous/server/fake_time_hub.h"
#include "tests/rendezvous/server/pending.h"
#include "tests/rendezvous/server/requests.h"
#include "tests/reserved_port.h"

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// The longest any single step may take before the test fails.
constexpr absl::Duration kWait = kPendingWait;

// Records a watch stream's events and its end.
class WatchLog {
 public:
  void Start(RendezvousClient& client, const std::string& job, const std::string& node,
             int64_t known_round, const std::string& secret = "") {
    WatchRequest request;
    request.set_job_id(job);
    request.set_node_id(node);
    request.set_node_secret(secret);
    request.set_known_round(known_round);
    client.Watch(
        request,
        [state = state_](const WatchEvent& event) {
          absl::MutexLock lock(&state->mu);
          if (event.has_watch_started()) {
            // The server says it counts the open stream as a heartbeat: once.
            state->started_once = !state->started_round.has_value();
            state->started_round = event.watch_started().round();
          } else {
            state->events.push_back(event);
          }
        },
        [state = state_](absl::Status status) {
          absl::MutexLock lock(&state->mu);
          state->end = std::move(status);
        });
  }

  // The first `n` events, once they arrived; fails the test after kWait.
  std::vector<WatchEvent> WaitForEvents(size_t n) {
    absl::MutexLock lock(&state_->mu);
    state_->want = n;
    if (!state_->mu.AwaitWithTimeout(absl::Condition(&State::Enough, state_.get()), kWait)) {
      ADD_FAILURE() << "got " << state_->events.size() << " watch events, want " << n;
    }
    return state_->events;
  }

  // The round the server's WatchStarted event named; fails the test after
  // kWait, or when that event came twice.
  std::optional<int64_t> WaitForStart() {
    absl::MutexLock lock(&state_->mu);
    if (!state_->mu.AwaitWithTimeout(absl::Condition(&State::Started, state_.get()), kWait)) {
      ADD_FAILURE() << "no WatchStarted event";
      return std::nullopt;
    }
    EXPECT_TRUE(state_->started_once) << "WatchStarted came twice";
    return state_->started_round;
  }

  // How the stream ended; fails the test after kWait.
  absl::Status WaitForEnd() {
    absl::MutexLock lock(&state_->mu);
    if (!state_->mu.AwaitWithTimeout(absl::Condition(&State::Ended, state_.get()), kWait)) {
      ADD_FAILURE() << "the watch stream did not end";
      return absl::InternalError("test: watch did not end");
    }
    return *state_->end;
  }

 private:
  struct State {
    static bool Enough(State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
      return s->events.size() >= s->want;
    }
    static bool Ended(State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->end.has_value(); }
    static bool Started(State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
      return s->started_round.has_value();
    }

    absl::Mutex mu;
    std::vector<WatchEvent> events ABSL_GUARDED_BY(mu);  // all but WatchStarted
    std::optional<int64_t> started_round ABSL_GUARDED_BY(mu);
    bool started_once ABSL_GUARDED_BY(mu) = false;
    std::optional<absl::Status> end ABSL_GUARDED_BY(mu);
    size_t want ABSL_GUARDED_BY(mu) = 0;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

JoinRequest MakeRangeJoin(const std::string& job, const std::string& node, int min, int max,
                          int local_world_size = 1, int port = 29500) {
  JoinRequest request;
  request.set_job_id(job);
  JobConfig* config = request.mutable_config();
  config->set_min_nodes(min);
  config->set_max_nodes(max);
  config->set_max_restarts(3);
  config->set_last_call_timeout_ms(0);
  config->set_join_timeout_ms(60'000);
  config->set_heartbeat_timeout_ms(60'000);
  NodeInfo* info = request.mutable_node();
  info->set_node_id(node);
  info->set_host("host-" + node);
  info->set_local_world_size(local_world_size);
  info->set_node_rank_hint(-1);
  info->set_master_port_candidate(port);
  request.set_protocol_version(kProtocolVersion);
  return request;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.hub = FakeTimeHub(&clock_);
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        RendezvousServer::Start("127.0.0.1", 0, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
  }

  std::unique_ptr<RendezvousClient> NewClient() { return RendezvousClient::Create(target_); }

  // Moves the hub's time on by `d` and runs the deadlines that passed; what
  // they send has left the hub (not yet reached the clients) on return.
  void AdvanceHubClock(absl::Duration d) {
    clock_.Advance(d);
    server_->hub()->RunDueTimers();
  }

  // Waits until the hub has a deadline to run: a call that starts a timer
  // (the end of a watch stream, say) has reached it. False after kWait.
  bool WaitForHubDeadline() {
    const absl::Time give_up = absl::Now() + kWait;
    while (absl::Now() < give_up) {
      if (server_->hub()->NextDeadline().has_value()) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  static absl::StatusOr<Assignment> Join(RendezvousClient& client, const JoinRequest& request) {
    Pending<absl::StatusOr<Assignment>> join;
    client.Join(request, kRpc, join.Callback());
    return join.Wait();
  }

  static absl::StatusOr<StatusResponse> JobStatus(RendezvousClient& client,
                                                  const std::string& job) {
    StatusRequest request;
    request.set_job_id(job);
    Pending<absl::StatusOr<StatusResponse>> status;
    client.Status(request, kRpc, status.Callback());
    return status.Wait();
  }

  // Polls the job's status until `pred` holds; false after kWait.
  static bool WaitForStatus(RendezvousClient& client, const std::string& job,
                            const std::function<bool(const StatusResponse&)>& pred) {
    const absl::Time give_up = absl::Now() + kWait;
    while (absl::Now() < give_up) {
      absl::StatusOr<StatusResponse> status = JobStatus(client, job);
      if (status.ok() && pred(*status)) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  static absl::Status ReportFailure(RendezvousClient& client, const std::string& job,
                                    const std::string& node, int64_t round,
                                    const std::string& secret) {
    ReportFailureRequest request;
    request.set_job_id(job);
    request.set_node_id(node);
    request.set_node_secret(secret);
    request.set_round(round);
    request.mutable_failure()->set_rank(0);
    request.mutable_failure()->set_host("host-" + node);
    request.mutable_failure()->set_exit_code(1);
    Pending<absl::Status> done;
    client.ReportFailure(request, kRpc, done.Callback());
    return done.Wait();
  }

  static absl::Status ReportDone(RendezvousClient& client, const std::string& job,
                                 const std::string& node, int64_t round,
                                 const std::string& secret) {
    ReportDoneRequest request;
    request.set_job_id(job);
    request.set_node_id(node);
    request.set_node_secret(secret);
    request.set_round(round);
    Pending<absl::Status> done;
    client.ReportDone(request, kRpc, done.Callback());
    return done.Wait();
  }

  FakeClock clock_;  // outlives server_, whose hub reads it
  std::unique_ptr<RendezvousServer> server_;
  std::string target_;
};

TEST_F(ServiceTest, OneNodeStandaloneJobCompletes) {
  auto client = NewClient();
  absl::StatusOr<Assignment> assignment =
      Join(*client, MakeRangeJoin("solo", "a", 1, 1, /*local_world_size=*/4, /*port=*/31234));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  EXPECT_EQ(assignment->round(), 0);
  EXPECT_EQ(assignment->group_rank(), 0);
  EXPECT_EQ(assignment->group_world_size(), 1);
  EXPECT_EQ(assignment->rank_base(), 0);
  EXPECT_EQ(assignment->world_size(), 4);
  EXPECT_EQ(assignment->master_addr(), "127.0.0.1");  // the peer address, none advertised
  EXPECT_EQ(assignment->master_port(), 31234);

  HeartbeatRequest beat;
  beat.set_job_id("solo");
  beat.set_node_id("a");
  beat.set_node_secret(assignment->node_secret());
  Pending<absl::StatusOr<int64_t>> round;
  client->Heartbeat(beat, kRpc, round.Callback());
  absl::StatusOr<int64_t> heartbeat = round.Wait();
  ASSERT_TRUE(heartbeat.ok()) << heartbeat.status();
  EXPECT_EQ(*heartbeat, 0);

  EXPECT_TRUE(ReportDone(*client, "solo", "a", 0, assignment->node_secret()).ok());
  absl::StatusOr<StatusResponse> status = JobStatus(*client, "solo");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), "closed");
}

TEST_F(ServiceTest, TwoNodesGetDistinctRanksAndTheSameMaster) {
  auto client_a = NewClient();
  auto client_b = NewClient();
  Pending<absl::StatusOr<Assignment>> join_a;
  Pending<absl::StatusOr<Assignment>> join_b;
  client_a->Join(MakeRangeJoin("pair", "a", 2, 2, 2, 40001), kRpc, join_a.Callback());
  client_b->Join(MakeRangeJoin("pair", "b", 2, 2, 2, 40002), kRpc, join_b.Callback());
  absl::StatusOr<Assignment> a = join_a.Wait();
  absl::StatusOr<Assignment> b = join_b.Wait();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT((std::set<int>{a->group_rank(), b->group_rank()}), UnorderedElementsAre(0, 1));
  EXPECT_THAT((std::set<int>{a->rank_base(), b->rank_base()}), UnorderedElementsAre(0, 2));
  EXPECT_EQ(a->world_size(), 4);
  EXPECT_EQ(b->world_size(), 4);
  EXPECT_EQ(a->master_addr(), b->master_addr());
  EXPECT_EQ(a->master_port(), b->master_port());
  EXPECT_EQ(a->master_port(), 40001);  // host-a sorts first: it is group rank 0
}

TEST_F(ServiceTest, WatchSeesTheOtherNodesFailureAndTheJobsClose) {
  auto client_a = NewClient();
  auto client_b = NewClient();
  JoinRequest request_a = MakeRangeJoin("watched", "a", 2, 2);
  JoinRequest request_b = MakeRangeJoin("watched", "b", 2, 2);
  {
    Pending<absl::StatusOr<Assignment>> join_a;
    client_a->Join(request_a, kRpc, join_a.Callback());
    absl::StatusOr<Assignment> b = Join(*client_b, request_b);
    ASSERT_TRUE(b.ok());
    absl::StatusOr<Assignment> a = join_a.Wait();
    ASSERT_TRUE(a.ok());
    request_a.set_node_secret(a->node_secret());  // what every later call carries
    request_b.set_node_secret(b->node_secret());
  }
  WatchLog watch;
  watch.Start(*client_a, "watched", "a", 0, request_a.node_secret());
  // Whichever reaches the server first, the event arrives: pushed, or as the
  // watch's catch-up.
  ASSERT_TRUE(ReportFailure(*client_b, "watched", "b", 0, request_b.node_secret()).ok());

  std::vector<WatchEvent> events = watch.WaitForEvents(1);
  ASSERT_GE(events.size(), 1u);
  ASSERT_TRUE(events[0].has_round_changed());
  EXPECT_EQ(events[0].round_changed().new_round(), 1);
  EXPECT_EQ(events[0].round_changed().reason(), RoundChanged::WORKER_FAILED);
  EXPECT_THAT(events[0].round_changed().detail(), HasSubstr("host-b"));

  Pending<absl::StatusOr<Assignment>> rejoin_a;
  client_a->Join(request_a, kRpc, rejoin_a.Callback());
  absl::StatusOr<Assignment> b = Join(*client_b, request_b);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<Assignment> a = rejoin_a.Wait();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->round(), 1);
  EXPECT_EQ(a->restart_count(), 1);

  ASSERT_TRUE(ReportDone(*client_a, "watched", "a", 1, request_a.node_secret()).ok());
  ASSERT_TRUE(ReportDone(*client_b, "watched", "b", 1, request_b.node_secret()).ok());
  events = watch.WaitForEvents(2);
  ASSERT_EQ(events.size(), 2u);
  ASSERT_TRUE(events[1].has_job_closed());
  EXPECT_TRUE(events[1].job_closed().succeeded());
  EXPECT_TRUE(watch.WaitForEnd().ok()) << "the stream ends after JobClosed";
}

TEST_F(ServiceTest, AnOpenWatchIsTheNodesHeartbeatAndItsEndStartsTheTimeout) {
  auto client_a = NewClient();
  auto client_b = NewClient();
  JoinRequest request_a = MakeRangeJoin("beat", "a", 1, 2);
  JoinRequest request_b = MakeRangeJoin("beat", "b", 1, 2);
  for (JoinRequest* request : {&request_a, &request_b}) {
    request->mutable_config()->set_heartbeat_timeout_ms(1'000);
    request->mutable_config()->set_last_call_timeout_ms(10'000);
  }
  Pending<absl::StatusOr<Assignment>> join_a;
  client_a->Join(request_a, kRpc, join_a.Callback());
  absl::StatusOr<Assignment> b = Join(*client_b, request_b);  // max reached: no last call
  ASSERT_TRUE(b.ok());
  absl::StatusOr<Assignment> a = join_a.Wait();
  ASSERT_TRUE(a.ok());
  WatchLog watch_a, watch_b;
  watch_a.Start(*client_a, "beat", "a", 0, a->node_secret());
  watch_b.Start(*client_b, "beat", "b", 0, b->node_secret());
  ASSERT_EQ(watch_a.WaitForStart(), 0);
  ASSERT_EQ(watch_b.WaitForStart(), 0);

  // Three heartbeat timeouts without a Heartbeat call: the streams keep both in.
  for (int i = 0; i < 3; ++i) AdvanceHubClock(absl::Seconds(1));
  absl::StatusOr<StatusResponse> status = JobStatus(*client_a, "beat");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->round(), 0);
  EXPECT_EQ(status->participants(), 2);

  // b's agent goes away: its stream ends, and a second later it is lost.
  client_b.reset();
  // With both streams open the running job had no deadline: the first is b's
  // heartbeat timeout, which the end of its stream starts.
  ASSERT_TRUE(WaitForHubDeadline()) << "the end of b's stream did not reach the hub";
  AdvanceHubClock(absl::Seconds(1));
  std::vector<WatchEvent> events = watch_a.WaitForEvents(1);
  ASSERT_GE(events.size(), 1u);
  ASSERT_TRUE(events[0].has_round_changed());
  EXPECT_EQ(events[0].round_changed().reason(), RoundChanged::NODE_LOST);
  EXPECT_THAT(events[0].round_changed().detail(), HasSubstr("host-b"));
}

TEST_F(ServiceTest, WatchOpenedLateStartsWithTheMissedEvent) {
  auto client = NewClient();
  absl::StatusOr<Assignment> a = Join(*client, MakeRangeJoin("late", "a", 1, 1));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(ReportFailure(*client, "late", "a", 0, a->node_secret()).ok());
  WatchLog watch;
  watch.Start(*client, "late", "a", 0, a->node_secret());
  EXPECT_EQ(watch.WaitForStart(), 1) << "the job's round as the watch opened";
  std::vector<WatchEvent> events = watch.WaitForEvents(1);
  ASSERT_GE(events.size(), 1u);
  EXPECT_EQ(events[0].round_changed().new_round(), 1);

  WatchLog stranger;
  stranger.Start(*client, "late", "nobody", 0);
  EXPECT_EQ(stranger.WaitForEnd().code(), absl::StatusCode::kNotFound);
}

TEST_F(ServiceTest, JoinToAClosedJobFailsWithFailedPrecondition) {
  auto client = NewClient();
  absl::StatusOr<Assignment> a = Join(*client, MakeRangeJoin("over", "a", 1, 1));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(ReportDone(*client, "over", "a", 0, a->node_secret()).ok());
  absl::StatusOr<Assignment> late = Join(*client, MakeRangeJoin("over", "b", 1, 1));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("closed"));
}

TEST_F(ServiceTest, ConfigMismatchFailsWithFailedPrecondition) {
  auto client = NewClient();
  Pending<absl::StatusOr<Assignment>> first;
  client->Join(MakeRangeJoin("cfg", "a", 2, 2), kRpc, first.Callback());
  ASSERT_TRUE(
      WaitForStatus(*client, "cfg", [](const StatusResponse& s) { return s.participants() == 1; }));
  absl::StatusOr<Assignment> other = Join(*client, MakeRangeJoin("cfg", "b", 2, 3));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("--nnodes 2:3"));
  absl::StatusOr<Assignment> bad = Join(*client, MakeRangeJoin("has space", "c", 1, 1));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(first.Done());
}

class ServiceShutdownTest : public ServiceTest {
 protected:
  // Shuts the server down (see RendezvousHub::Jobs) while a join waits and a
  // watch is open; returns how each ended.
  std::pair<absl::Status, absl::Status> ShutDownWithAJoinAndAWatch(RendezvousHub::Jobs jobs) {
    auto client_owner = NewClient();
    RendezvousClient& client = *client_owner;
    RendezvousServer& server = *server_;
    // A node watches its running job (a node watches once it has its secret),
    // while another node's join waits.
    absl::StatusOr<Assignment> running = Join(client, MakeRangeJoin("cut-running", "a", 1, 1));
    EXPECT_TRUE(running.ok()) << running.status();
    Pending<absl::StatusOr<Assignment>> join;
    client.Join(MakeRangeJoin("cut", "a", 2, 2), kRpc, join.Callback());
    EXPECT_TRUE(WaitForStatus(client, "cut",
                              [](const StatusResponse& s) { return s.participants() == 1; }));
    WatchLog watch;
    // WatchStarted proves the watch is open on the server before it shuts down
    // (a call still in flight then would be cancelled by gRPC itself instead).
    watch.Start(client, "cut-running", "a", 0, running->node_secret());
    EXPECT_EQ(watch.WaitForStart(), 0);

    absl::Notification shut;
    std::thread shutdown([&server, &shut, jobs] {
      server.Shutdown(absl::Seconds(1), jobs);
      shut.Notify();
    });
    const bool finished = shut.WaitForNotificationWithTimeout(kWait);
    if (!finished) {
      shutdown.detach();
      ADD_FAILURE() << "RendezvousServer::Shutdown hung";
      return {};
    }
    shutdown.join();
    return {join.Wait().status(), watch.WaitForEnd()};
  }
};

TEST_F(ServiceShutdownTest, AShutdownThatLosesTheJobsFailsPendingJoinsAndWatchesForGood) {
  auto [join, watch] = ShutDownWithAJoinAndAWatch(RendezvousHub::Jobs::kLost);
  EXPECT_EQ(join.code(), absl::StatusCode::kFailedPrecondition) << join;
  EXPECT_THAT(join.message(), HasSubstr("shutting down and keeps no state"));
  EXPECT_EQ(watch.code(), absl::StatusCode::kFailedPrecondition) << watch;
}

TEST_F(ServiceShutdownTest, AShutdownThatKeepsTheJobsTellsPendingJoinsAndWatchesToCallAgain) {
  auto [join, watch] = ShutDownWithAJoinAndAWatch(RendezvousHub::Jobs::kKept);
  EXPECT_EQ(join.code(), absl::StatusCode::kUnavailable) << join;
  EXPECT_THAT(join.message(), HasSubstr("keeps this job"));
  EXPECT_EQ(watch.code(), absl::StatusCode::kUnavailable) << watch;
}

// Stands in for a rendezvous server that is not up yet on a port of
// 127.0.0.1: it resets every connection it accepts, so a client's attempt
// fails as one to a closed port does, and the test sees each attempt.
class NotServingYet {
 public:
  // 0 when the listener could not be set up.
  int port() const { return port_; }

  // Waits for the next connection attempt and resets it. False when none
  // came within `timeout`.
  bool TurnAwayNext(absl::Duration timeout) {
    pollfd ready = {.fd = listener_.get(), .events = POLLIN, .revents = 0};
    if (poll(&ready, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) return false;
    UniqueFd connection(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) return false;
    const linger reset = {.l_onoff = 1, .l_linger = 0};  // close sends RST, leaves no TIME_WAIT
    setsockopt(connection.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    return true;
  }

  // Stops listening, for the real server to; the port stays held until the
  // test ends, so no other test's bind to port 0 takes it in between.
  void Close() { listener_.reset(); }

 private:
  const ReservedPort reserved_;
  UniqueFd listener_ = reserved_.Listen();
  const int port_ = listener_.valid() ? reserved_.port() : 0;
};

TEST(ServiceStartTest, JoinWaitsForAServerThatStartsWithinTheDeadline) {
  NotServingYet not_yet;
  const int port = not_yet.port();
  ASSERT_GT(port, 0);
  auto client = RendezvousClient::Create("127.0.0.1:" + std::to_string(port));
  Pending<absl::StatusOr<Assignment>> join;
  client->Join(MakeRangeJoin("early", "a", 1, 1), kRpc, join.Callback());
  // A second attempt: the client saw its first one fail, and kept the join.
  ASSERT_TRUE(not_yet.TurnAwayNext(kWait)) << "the client never tried to connect";
  ASSERT_TRUE(not_yet.TurnAwayNext(kWait)) << "the client did not try again";
  EXPECT_FALSE(join.Done()) << "nothing listens yet";
  not_yet.Close();
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start("127.0.0.1", port);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<Assignment> assignment = join.Wait();
  EXPECT_TRUE(assignment.ok()) << assignment.status();
  client.reset();  // before the server: no call left in flight
}

TEST_F(ServiceTest, SecondServerOnTheSamePortFailsWithAlreadyExists) {
  absl::StatusOr<std::unique_ptr<RendezvousServer>> second =
      RendezvousServer::Start("127.0.0.1", server_->port());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  // The first one still serves.
  auto client = NewClient();
  EXPECT_TRUE(Join(*client, MakeRangeJoin("still", "a", 1, 1)).ok());
}

// The server's side of every connection it accepted on `port`, found among
// this process's descriptors (the server runs in this test).
std::vector<int> AcceptedSockets(int port) {
  std::vector<int> found;
  for (int fd = 3; fd < 1024; ++fd) {
    int listening = 1;
    socklen_t length = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || listening) continue;
    // gRPC may serve 127.0.0.1 on a dual-stack socket (::ffff:127.0.0.1).
    sockaddr_in6 addr{};
    length = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) continue;
    const int local_port = addr.sin6_family == AF_INET6 ? ntohs(addr.sin6_port)
                           : addr.sin6_family == AF_INET
                               ? ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port)
                               : -1;
    if (local_port == port) found.push_back(fd);
  }
  return found;
}

TEST_F(ServiceTest, AcceptedConnectionsHaveTcpKeepaliveEverySecond) {
  auto client = NewClient();
  ASSERT_TRUE(Join(*client, MakeRangeJoin("probed", "a", 1, 1)).ok());  // connects
  const std::vector<int> accepted = AcceptedSockets(server_->port());
  ASSERT_FALSE(accepted.empty()) << "no accepted connection on port " << server_->port();
  for (int fd : accepted) {
    int on = 0, idle = 0, interval = 0, probes = 0;
    unsigned user_timeout = 0;
    socklen_t length = sizeof on;
    ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &length), 0);
    EXPECT_EQ(on, 1) << "fd " << fd;
    length = sizeof idle;
    ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &length), 0);
    ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, &length), 0);
    ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, &length), 0);
    length = sizeof user_timeout;
    ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, &length), 0);
    EXPECT_EQ(idle, 1);
    EXPECT_EQ(interval, 1);
    EXPECT_EQ(probes, 3);
    EXPECT_EQ(user_timeout, 4'000u);
  }
}

// Segments a socket has received or sent (TCP_INFO), from `fd`'s side.
std::pair<uint32_t, uint32_t> SegmentsInOut(int fd) {
  tcp_info info{};
  socklen_t length = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return {0, 0};
  return {info.tcpi_segs_in, info.tcpi_segs_out};
}

// An idle connection with a watch open: the server's kernel probes it every
// second (keepalive), and the client pings every `keepalive`. Counts what
// the server's side of the connection saw over 3.5 s.
//
// Real time on purpose: the traffic comes from the kernel's keepalive timer
// and gRPC's ping timer, which no fake clock reaches, and it is their rate
// that is counted. No hub deadline falls in the window (the open watch is the
// node's heartbeat), so the hub's clock plays no part.
std::pair<uint32_t, uint32_t> IdleTraffic(const ServerOptions& options, absl::Duration keepalive) {
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start("127.0.0.1", 0, options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return {0, 0};
  auto client = RendezvousClient::Create("127.0.0.1:" + std::to_string((*server)->port()), [&] {
    ClientOptions client_options;
    client_options.keepalive = keepalive;
    return client_options;
  }());
  JoinRequest join = MakeRangeJoin("idle", "a", 1, 1);
  absl::StatusOr<Assignment> assigned = client->JoinSync(join, kRpc);
  EXPECT_TRUE(assigned.ok());
  WatchLog watch;
  watch.Start(*client, "idle", "a", 0, assigned.ok() ? assigned->node_secret() : "");
  EXPECT_EQ(watch.WaitForStart(), 0);
  const std::vector<int> accepted = AcceptedSockets((*server)->port());
  EXPECT_EQ(accepted.size(), 1u);
  if (accepted.size() != 1) return {0, 0};
  const auto [in_before, out_before] = SegmentsInOut(accepted[0]);
  absl::SleepFor(absl::Milliseconds(3'500));
  const auto [in_after, out_after] = SegmentsInOut(accepted[0]);
  return {in_after - in_before, out_after - out_before};
}

TEST(KeepaliveTest, TheServersKernelProbesAnIdleConnectionEverySecond) {
  // The client pings only every minute: what the server sends is the probes.
  const auto [in, out] = IdleTraffic(ServerOptions{}, absl::Minutes(1));
  EXPECT_GE(out, 3u) << "keepalive probes sent in 3.5 s";
  EXPECT_GE(in, 3u) << "their answers";
}

TEST(KeepaliveTest, TheClientPingsTheServerEveryKeepaliveInterval) {
  ServerOptions no_probes;
  no_probes.keepalive_interval = absl::ZeroDuration();
  const auto [in, out] = IdleTraffic(no_probes, absl::Seconds(1));
  EXPECT_GE(in, 3u) << "HTTP/2 pings received in 3.5 s";
  EXPECT_GE(out, 3u) << "their answers";
}

TEST(KeepaliveTest, AnIdleConnectionWithoutProbesOrPingsIsSilent) {
  // The control: the two tests above count traffic that the keepalives make.
  ServerOptions no_probes;
  no_probes.keepalive_interval = absl::ZeroDuration();
  const auto [in, out] = IdleTraffic(no_probes, absl::Minutes(1));
  EXPECT_LE(in, 1u) << "at most a late ACK of the watch's start";
  EXPECT_LE(out, 1u);
}

TEST_F(ServiceTest, ClientDestructorWithAPendingJoinReturnsPromptly) {
  auto client = NewClient();
  Pending<absl::StatusOr<Assignment>> join;
  client->Join(MakeRangeJoin("gone", "a", 2, 2), absl::Seconds(60), join.Callback());
  auto observer = NewClient();
  ASSERT_TRUE(WaitForStatus(*observer, "gone",
                            [](const StatusResponse& s) { return s.participants() == 1; }));

  absl::Notification destroyed;
  std::thread destroy([&client, &destroyed] {
    client.reset();
    destroyed.Notify();
  });
  if (!destroyed.WaitForNotificationWithTimeout(kWait)) {
    destroy.detach();
    FAIL() << "~RendezvousClient hung with a pending join";
  }
  destroy.join();
  EXPECT_EQ(join.Wait(absl::ZeroDuration()).status().code(), absl::StatusCode::kCancelled)
      << "the callback ran before the destructor returned";
}

TEST_F(ServiceTest, CancelledJoinDoesNotPutItsNodeInARound) {
  auto gone = NewClient();
  Pending<absl::StatusOr<Assignment>> ghost;
  gone->Join(MakeRangeJoin("ghost", "a", 2, 2), absl::Seconds(60), ghost.Callback());
  auto client = NewClient();
  ASSERT_TRUE(WaitForStatus(*client, "ghost",
                            [](const StatusResponse& s) { return s.participants() == 1; }));
  gone.reset();  // the agent of "a" ended while it waited
  ASSERT_TRUE(WaitForStatus(*client, "ghost", [](const StatusResponse& s) {
    return s.participants() == 0;
  })) << "the server still counts the node whose join was cancelled";

  Pending<absl::StatusOr<Assignment>> join_b;
  client->Join(MakeRangeJoin("ghost", "b", 2, 2), kRpc, join_b.Callback());
  auto client_c = NewClient();
  absl::StatusOr<Assignment> c = Join(*client_c, MakeRangeJoin("ghost", "c", 2, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Assignment> b = join_b.Wait();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->group_world_size(), 2);
  EXPECT_NE(b->group_rank(), c->group_rank());
}

// ---------------------------------------------------------------- protocol version

// A channel of its own: its own connection to the server, so its calls
// count against one peer's bounds and no other's.
std::unique_ptr<Rendezvous::Stub> RawStub(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return Rendezvous::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

grpc::Status RawJoin(Rendezvous::Stub& stub, const JoinRequest& request, JoinResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kRpc));
  return stub.Join(&context, request, response);
}

TEST_F(ServiceTest, ServerRefusesAJoinOfAnotherProtocolVersionNamingBoth) {
  std::unique_ptr<Rendezvous::Stub> stub = RawStub(target_);
  JoinRequest old = MakeRangeJoin("versions", "a", 1, 1);
  old.clear_protocol_version();  // as an agent older than versions sends it
  JoinResponse response;
  grpc::Status status = RawJoin(*stub, old, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(
      status.error_message(),
      testing::AllOf(HasSubstr("version 0"), HasSubstr(absl::StrCat("version ", kProtocolVersion)),
                     HasSubstr("run the same muster version on every node")));
  EXPECT_FALSE(response.has_assignment());
}

TEST_F(ServiceTest, JoinAnswerCarriesTheServersProtocolVersionAndTheNodesSecret) {
  std::unique_ptr<Rendezvous::Stub> stub = RawStub(target_);
  JoinResponse response;
  grpc::Status status = RawJoin(*stub, MakeRangeJoin("versions", "a", 1, 1), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.protocol_version(), kProtocolVersion);
  EXPECT_EQ(response.assignment().node_secret().size(), 32u);
}

// A rendezvous from before protocol versions: it answers joins, with no version.
class OldServer final : public Rendezvous::CallbackService {
 public:
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context, const JoinRequest*,
                                 JoinResponse* response) override {
    response->mutable_assignment()->set_world_size(1);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

TEST(ClientProtocolTest, AgentRefusesAnAnswerOfAnotherProtocolVersionNamingBoth) {
  OldServer old;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&old);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  const std::string target = "127.0.0.1:" + std::to_string(port);
  auto client = RendezvousClient::Create(target);
  absl::StatusOr<Assignment> assignment = client->JoinSync(MakeRangeJoin("old", "a", 1, 1), kRpc);
  EXPECT_EQ(assignment.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      assignment.status().message(),
      testing::AllOf(HasSubstr(target), HasSubstr("protocol version 0"),
                     HasSubstr(absl::StrCat("this agent speaks version ", kProtocolVersion)),
                     HasSubstr("run the same muster version on every node")));
  client.reset();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

// ---------------------------------------------------------------- per-connection bounds

// A watch stream on a raw stub, so that one connection can hold several.
class RawWatch final : public grpc::ClientReadReactor<WatchEvent> {
 public:
  RawWatch(Rendezvous::Stub& stub, const std::string& job, const std::string& node,
           const std::string& secret) {
    request_.set_job_id(job);
    request_.set_node_id(node);
    request_.set_node_secret(secret);
    stub.async()->Watch(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  ~RawWatch() override {
    context_.TryCancel();
    done_.WaitForNotificationWithTimeout(kWait);
  }

  bool WaitForStart() { return started_.WaitForNotificationWithTimeout(kWait); }
  // Whether the watch opened (rather than ended), within kWait.
  bool Opened() {
    const absl::Time give_up = absl::Now() + kWait;
    while (absl::Now() < give_up) {
      if (started_.HasBeenNotified()) return true;
      if (done_.HasBeenNotified()) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
  // How the stream ended; kInternal after kWait.
  grpc::Status WaitForEnd() {
    if (!done_.WaitForNotificationWithTimeout(kWait)) return grpc::Status(grpc::INTERNAL, "hung");
    return status_;
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (event_.has_watch_started() && !started_.HasBeenNotified()) started_.Notify();
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

 private:
  grpc::ClientContext context_;
  WatchRequest request_;
  WatchEvent event_;
  absl::Notification started_;
  absl::Notification done_;
  grpc::Status status_;  // written before done_
};

class PeerBoundsTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.hub = FakeTimeHub(&clock_);
    options.per_peer = PeerBounds{.pending_joins = 2, .open_watches = 2};
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        RendezvousServer::Start("127.0.0.1", 0, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    target_ = "127.0.0.1:" + std::to_string(server_->port());
  }
};

TEST_F(PeerBoundsTest, AConnectionHoldsAtMostItsBoundOfPendingJoinsUntilTheyFinish) {
  std::unique_ptr<Rendezvous::Stub> stub = RawStub(target_);
  struct Call {
    grpc::ClientContext context;
    JoinResponse response;
    Pending<absl::Status> done;
  };
  std::vector<std::unique_ptr<Call>> calls;
  const JoinRequest requests[] = {MakeRangeJoin("bounded", "n0", 3, 3),
                                  MakeRangeJoin("bounded", "n1", 3, 3),
                                  MakeRangeJoin("bounded", "n2", 3, 3)};
  auto other = NewClient();
  for (const JoinRequest& request : requests) {
    if (calls.size() == 2) {  // the first two are in before the third starts
      ASSERT_TRUE(WaitForStatus(*other, "bounded",
                                [](const StatusResponse& s) { return s.participants() == 2; }));
    }
    auto call = std::make_unique<Call>();
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + kRpc));
    stub->async()->Join(&call->context, &request, &call->response,
                        [done = call->done.Callback()](grpc::Status status) {
                          done(absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                            status.error_message()));
                        });
    calls.push_back(std::move(call));
  }
  const absl::Status third = calls[2]->done.Wait();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(), HasSubstr("holds 2 pending joins"));
  EXPECT_FALSE(calls[0]->done.Done());
  EXPECT_FALSE(calls[1]->done.Done());

  // Another connection may join; its join completes the round, which ends
  // the first connection's calls and gives their places back.
  ASSERT_TRUE(Join(*other, MakeRangeJoin("bounded", "other", 3, 3)).ok());
  EXPECT_TRUE(calls[0]->done.Wait().ok());
  EXPECT_TRUE(calls[1]->done.Wait().ok());
  // The places come back as the server finishes the calls: a moment after
  // the client sees them end.
  int joined = 0;
  for (int i = 0; joined < 2 && i < 500; ++i) {
    JoinResponse response;
    grpc::Status again =
        RawJoin(*stub, MakeRangeJoin(absl::StrCat("after-", i), "n0", 1, 1), &response);
    if (again.ok()) {
      ++joined;
    } else {
      EXPECT_EQ(again.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << again.error_message();
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  EXPECT_EQ(joined, 2) << "the finished joins' places were not given back";
}

TEST_F(PeerBoundsTest, AConnectionHoldsAtMostItsBoundOfOpenWatchesUntilOneEnds) {
  std::unique_ptr<Rendezvous::Stub> stub = RawStub(target_);
  auto client = NewClient();
  Pending<absl::StatusOr<Assignment>> join_a;
  client->Join(MakeRangeJoin("watched", "a", 2, 2), kRpc, join_a.Callback());
  absl::StatusOr<Assignment> b = Join(*NewClient(), MakeRangeJoin("watched", "b", 2, 2));
  absl::StatusOr<Assignment> a = join_a.Wait();
  ASSERT_TRUE(a.ok() && b.ok());

  auto watch_a = std::make_unique<RawWatch>(*stub, "watched", "a", a->node_secret());
  RawWatch watch_b(*stub, "watched", "b", b->node_secret());
  ASSERT_TRUE(watch_a->WaitForStart());
  ASSERT_TRUE(watch_b.WaitForStart());
  RawWatch third(*stub, "watched", "a", a->node_secret());
  const grpc::Status refused = third.WaitForEnd();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("holds 2 open watches"));

  watch_a->Cancel();
  EXPECT_EQ(watch_a->WaitForEnd().error_code(), grpc::StatusCode::CANCELLED);
  watch_a.reset();
  // The place comes back as the server finishes the stream: a moment after
  // the client sees it end.
  const absl::Time give_up = absl::Now() + kWait;
  bool reopened = false;
  while (!reopened && absl::Now() < give_up) {
    RawWatch again(*stub, "watched", "a", a->node_secret());
    reopened = again.Opened();
    if (!reopened) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(reopened) << "the ended watch's place was not given back";
}

TEST_F(ServiceTest, CallsWithoutTheNodesSecretAreRefusedOverGrpc) {
  auto client = NewClient();
  absl::StatusOr<Assignment> a = Join(*client, MakeRangeJoin("secret", "a", 1, 1));
  ASSERT_TRUE(a.ok());
  HeartbeatRequest beat;
  beat.set_job_id("secret");
  beat.set_node_id("a");
  beat.set_node_secret("guessed");
  Pending<absl::StatusOr<int64_t>> round;
  client->Heartbeat(beat, kRpc, round.Callback());
  EXPECT_EQ(round.Wait().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReportDone(*client, "secret", "a", 0, "guessed").code(),
            absl::StatusCode::kPermissionDenied);
  WatchLog watch;
  watch.Start(*client, "secret", "a", 0, "guessed");
  EXPECT_EQ(watch.WaitForEnd().code(), absl::StatusCode::kPermissionDenied);
  JoinRequest impostor = MakeRangeJoin("secret", "a", 1, 1);
  absl::StatusOr<Assignment> stolen = Join(*NewClient(), impostor);
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(stolen.status().message(), HasSubstr("held by another agent"));
  EXPECT_TRUE(ReportDone(*client, "secret", "a", 0, a->node_secret()).ok());
}

}  // namespace
}  // namespace muster::rdzv
