#include "bench/scale_phases.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/proc_stats.h"
#include "rendezvous/server/hub.h"
#include "rendezvous/server/journal.h"

namespace muster::rdzv::scale {
namespace {

constexpr absl::Duration kHeartbeatDeadline = absl::Seconds(10);

// With --marks: "mark <phase> <CLOCK_MONOTONIC seconds>", to match `perf record -k
// CLOCK_MONOTONIC`.
void Mark(const RunConfig& config, const char* phase) {
  if (!config.marks) return;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  std::fprintf(stderr, "mark N=%d %s %ld.%06ld\n", config.nodes, phase,
               static_cast<long>(now.tv_sec), now.tv_nsec / 1000);
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

double Percentile(std::vector<float> values, double p) {
  if (values.empty()) return 0;
  const size_t k = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  std::nth_element(values.begin(), values.begin() + k, values.end());
  return values[k];
}

// The unary heartbeats of one window: each call's latency, and what failed.
struct HeartbeatTally {
  explicit HeartbeatTally(int64_t total) : latency_ms(total, -1.0f) {}

  std::vector<float> latency_ms;  // by call; -1: not answered
  std::atomic<int64_t> ok{0}, failed{0};
  Countdown pending;
  absl::Mutex mu;
  std::string first_failure ABSL_GUARDED_BY(mu);
};

// Sends heartbeat `index`; its answer must name `round`.
void SendHeartbeat(Rendezvous::Stub* stub, const HeartbeatRequest& request, int64_t index,
                   int64_t round, HeartbeatTally* tally) {
  struct Call {
    grpc::ClientContext context;
    HeartbeatResponse response;
    SteadyClock::time_point sent;
  };
  auto* call = new Call();
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + kHeartbeatDeadline));
  call->sent = SteadyClock::now();
  stub->async()->Heartbeat(
      &call->context, &request, &call->response, [call, index, round, tally](grpc::Status status) {
        tally->latency_ms[index] = static_cast<float>(MsSince(call->sent, SteadyClock::now()));
        if (status.ok() && call->response.round() == round) {
          tally->ok.fetch_add(1);
        } else {
          tally->failed.fetch_add(1);
          absl::MutexLock lock(&tally->mu);
          if (tally->first_failure.empty()) {
            tally->first_failure = status.ok()
                                       ? absl::StrCat("heartbeat answered round ",
                                                      call->response.round(), ", not ", round)
                                       : absl::StrCat("heartbeat failed: ", status.error_message());
          }
        }
        delete call;
        tally->pending.Done();
      });
}

// Heartbeats for config.heartbeat_seconds, each node once per interval, spread evenly.
void UnaryHeartbeats(const RunConfig& config, const Fleet& fleet, int64_t round,
                     const ServerUnderTest& server, RunResult* result) {
  const int n = config.nodes;
  // Node i at start + (k + i/N) * interval, for k while that is within the window.
  const double rate = n / config.heartbeat_interval_s;  // heartbeats per second, all nodes
  const int64_t total = static_cast<int64_t>(rate * config.heartbeat_seconds);
  std::vector<HeartbeatRequest> requests(n);
  for (int i = 0; i < n; ++i) {
    requests[i].set_job_id(fleet.nodes[i]->join.job_id());
    requests[i].set_node_id(fleet.nodes[i]->join.node().node_id());
    requests[i].set_node_secret(fleet.nodes[i]->join_response.assignment().node_secret());
  }
  HeartbeatTally tally(total);
  tally.pending.Add(static_cast<int>(total));

  const absl::StatusOr<double> cpu_start = ProcessCpuSeconds(server.pid());
  const double self_start = SelfCpuSeconds();
  const SteadyClock::time_point start = SteadyClock::now();
  int64_t sent = 0;
  const SteadyClock::time_point give_up = start + std::chrono::seconds(config.heartbeat_seconds) +
                                          absl::ToChronoNanoseconds(config.timeout);
  while (sent < total) {
    const int64_t due =
        std::min<int64_t>(total, static_cast<int64_t>(SecondsSince(start) * rate) + 1);
    for (; sent < due; ++sent) {
      const int i = static_cast<int>(sent % n);
      SendHeartbeat(fleet.stub(i), requests[i], sent, round, &tally);
    }
    if (SteadyClock::now() > give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  tally.pending.Add(static_cast<int>(sent - total));  // those never sent
  if (!tally.pending.WaitUntil(absl::Now() + config.timeout)) {
    result->error =
        absl::StrCat(tally.pending.left(), " heartbeats still unanswered after the timeout");
    // The calls in flight still hold `tally` and `requests`: each ends by its
    // own deadline, and until then neither may be freed.
    if (!tally.pending.WaitUntil(absl::Now() + kHeartbeatDeadline + absl::Seconds(5))) {
      std::fprintf(stderr, "rdzv_scale: %d heartbeats never ended\n", tally.pending.left());
      std::_Exit(2);
    }
    return;
  }
  const double wall_s = SecondsSince(start);
  const absl::StatusOr<double> cpu_end = ProcessCpuSeconds(server.pid());
  if (cpu_start.ok() && cpu_end.ok()) {
    result->heartbeat_cpu_pct = 100.0 * (*cpu_end - *cpu_start) / wall_s;
  }
  result->client_heartbeat_cpu_pct = 100.0 * (SelfCpuSeconds() - self_start) / wall_s;
  result->heartbeats_ok = tally.ok.load();
  result->heartbeats_failed = tally.failed.load() + (total - sent);
  std::vector<float> answered;
  answered.reserve(total);
  for (float ms : tally.latency_ms) {
    if (ms >= 0) answered.push_back(ms);
  }
  result->heartbeat_p50_ms = Percentile(answered, 0.50);
  result->heartbeat_p99_ms = Percentile(answered, 0.99);
  absl::MutexLock lock(&tally.mu);
  if (sent < total) {
    result->error = absl::StrCat("only ", sent, " of ", total, " heartbeats sent in time");
  } else if (!tally.first_failure.empty()) {
    result->error =
        absl::StrCat(tally.failed.load(), " heartbeats failed; first: ", tally.first_failure);
  }
}

// Liveness by watch stream, as agents do it: no calls at all. The server's
// kernel probes every connection once per interval (TCP keepalive), and each
// node's channel pings the server every 10 s (HTTP/2 PING, channel.h), to
// find a server that vanished. Reads the server's CPU and the
// whole machine's over the window, and checks the probes happened: each
// probe and its answer are a TCP segment.
void KeepaliveWindow(const RunConfig& config, int connections, const ServerUnderTest& server,
                     RunResult* result) {
  const absl::StatusOr<double> cpu_start = ProcessCpuSeconds(server.pid());
  const absl::StatusOr<int64_t> segments_start = TcpOutSegments();
  const absl::StatusOr<double> machine_start = MachineBusySeconds();
  const double self_start = SelfCpuSeconds();
  const SteadyClock::time_point start = SteadyClock::now();
  absl::SleepFor(absl::Seconds(config.heartbeat_seconds));
  const double wall_s = SecondsSince(start);
  const absl::StatusOr<double> cpu_end = ProcessCpuSeconds(server.pid());
  const absl::StatusOr<int64_t> segments_end = TcpOutSegments();
  const absl::StatusOr<double> machine_end = MachineBusySeconds();
  if (cpu_start.ok() && cpu_end.ok()) {
    result->heartbeat_cpu_pct = 100.0 * (*cpu_end - *cpu_start) / wall_s;
  }
  if (machine_start.ok() && machine_end.ok()) {
    result->machine_heartbeat_cpu_pct = 100.0 * (*machine_end - *machine_start) / wall_s;
  }
  result->client_heartbeat_cpu_pct = 100.0 * (SelfCpuSeconds() - self_start) / wall_s;
  if (!segments_start.ok() || !segments_end.ok()) {
    result->error = "cannot read /proc/net/snmp: keepalive pings not verified";
    return;
  }
  result->segments_per_connection_s =
      static_cast<double>(*segments_end - *segments_start) / connections / wall_s;
  // A probe and its answer per interval; the kernel's keepalive timers are
  // coarse (a probe is due an interval after the last segment), hence 3/4.
  const double expected = 2.0 / config.heartbeat_interval_s;
  if (result->segments_per_connection_s < 0.75 * expected) {
    result->error =
        absl::StrCat("only ", absl::StrFormat("%.2f", result->segments_per_connection_s),
                     " TCP segments per connection and second; keepalive pings every ",
                     config.heartbeat_interval_s, " s need ", expected);
  }
}

}  // namespace

ServerOptions ServerOptionsFor(const RunConfig& config) {
  ServerOptions options;
  options.keepalive_interval =
      config.unary_heartbeats ? absl::Hours(1) : absl::Seconds(config.heartbeat_interval_s);
  options.ping_interval = absl::Seconds(config.server_ping_s);
  return options;
}

void JoinPhase(const RunConfig& config, const ServerUnderTest& server, Fleet* fleet,
               RunResult* result) {
  Countdown joins;
  joins.Add(config.nodes);
  Mark(config, "join-start");
  const absl::StatusOr<double> server_cpu_start = ProcessCpuSeconds(server.pid());
  const double client_cpu_start = SelfCpuSeconds();
  const SteadyClock::time_point start = SteadyClock::now();
  const absl::Time deadline = absl::Now() + config.timeout;
  SendJoins(deadline, fleet, &joins);
  result->send_all_ms = MsSince(start, SteadyClock::now());
  const bool all_answered = joins.WaitUntil(deadline + absl::Seconds(5));
  Mark(config, "join-end");
  const absl::StatusOr<double> server_cpu_end = ProcessCpuSeconds(server.pid());
  if (server_cpu_start.ok() && server_cpu_end.ok()) {
    result->server_join_cpu_ms = 1000 * (*server_cpu_end - *server_cpu_start);
  }
  result->client_join_cpu_ms = 1000 * (SelfCpuSeconds() - client_cpu_start);
  if (!all_answered) {
    for (auto& node : fleet->nodes) node->join_context.TryCancel();
    if (!joins.WaitUntil(absl::Now() + absl::Seconds(10))) {
      std::fprintf(stderr, "rdzv_scale: %d joins never ended, even cancelled\n", joins.left());
      std::_Exit(2);  // contexts are still in gRPC's hands: they cannot be freed
    }
  }
  SteadyClock::time_point first = SteadyClock::time_point::max();
  SteadyClock::time_point last = SteadyClock::time_point::min();
  for (const auto& node : fleet->nodes) {
    first = std::min(first, node->answered);
    last = std::max(last, node->answered);
  }
  result->first_assignment_ms = MsSince(start, first);
  result->last_assignment_ms = MsSince(start, last);
  if (absl::Status joined = CheckJoins(*fleet); !joined.ok()) {
    result->error = std::string(joined.message());
  }
}

void SettlePhase(const RunConfig& config, const WatchSet& watches, RunResult* result) {
  const absl::Time settle_end = absl::Now() + absl::Seconds(10);
  int started = 0;
  do {
    absl::SleepFor(absl::Milliseconds(100));
    started = watches.started();
  } while (config.watch && started < config.nodes && absl::Now() < settle_end);
  if (config.watch && started != config.nodes) {
    result->error =
        absl::StrCat("only ", started, " of ", config.nodes, " watch streams started within 10 s");
  }
}

void IdlePhase(const ServerUnderTest& server, RunResult* result) {
  const absl::StatusOr<double> idle_start = ProcessCpuSeconds(server.pid());
  const SteadyClock::time_point idle_t0 = SteadyClock::now();
  absl::SleepFor(absl::Seconds(1));
  const absl::StatusOr<double> idle_end = ProcessCpuSeconds(server.pid());
  if (idle_start.ok() && idle_end.ok()) {
    result->idle_cpu_pct = 100.0 * (*idle_end - *idle_start) / SecondsSince(idle_t0);
  }
}

void LivenessPhase(const RunConfig& config, const Fleet& fleet, int64_t round,
                   const ServerUnderTest& server, RunResult* result) {
  if (config.heartbeat_seconds <= 0) return;
  Mark(config, "heartbeat-start");
  if (config.unary_heartbeats) {
    UnaryHeartbeats(config, fleet, round, server, result);
  } else {
    KeepaliveWindow(config, static_cast<int>(fleet.stubs.size()), server, result);
  }
  Mark(config, "heartbeat-end");
}

void RestartRoundPhase(const RunConfig& config, const ServerUnderTest& server, Fleet* fleet,
                       int64_t round, WatchSet* watches, RunResult* result) {
  if (!config.restart_round || !result->error.empty()) return;
  const int n = config.nodes;
  // What the watch hook and the rejoins' callbacks record; shared, so that
  // a late callback of theirs never outlives it.
  struct Tally {
    explicit Tally(int n) : changed_to(n, -1), changed_at(n) {}
    Countdown rejoins;
    std::vector<int64_t> changed_to;  // by node: the round its RoundChanged named
    std::vector<SteadyClock::time_point> changed_at;
    std::atomic<int> unexpected{0};
    absl::Mutex mu;
    std::string first_problem ABSL_GUARDED_BY(mu);
    void Problem(const std::string& what) {
      unexpected.fetch_add(1);
      absl::MutexLock lock(&mu);
      if (first_problem.empty()) first_problem = what;
    }
  };
  auto tally = std::make_shared<Tally>(n);
  tally->rejoins.Add(n);
  const absl::Time deadline = absl::Now() + config.timeout;
  // As an agent: the round moved on, so it joins again with its secret (an
  // agent first stops its workers); its watch stream stays open, and goes
  // on to the new round.
  watches->SetOnEvent([tally, fleet, deadline](int node, const WatchEvent& event) {
    if (!event.has_round_changed()) {
      tally->Problem(absl::StrCat("node ", node, " got a watch event that is no RoundChanged"));
      return;
    }
    if (fleet->nodes[node]->rejoining.exchange(true)) {
      tally->Problem(absl::StrCat("node ", node, " was told twice that the round moved on"));
      return;
    }
    tally->changed_at[node] = SteadyClock::now();
    tally->changed_to[node] = event.round_changed().new_round();
    if (event.round_changed().reason() != RoundChanged::WORKER_FAILED) {
      tally->Problem(absl::StrCat("node ", node, " was told the round moved on for reason ",
                                  event.round_changed().reason(), ", not a worker's failure"));
    }
    SendRejoin(deadline, fleet, node, [tally](int) { tally->rejoins.Done(); });
  });

  struct Report {
    grpc::ClientContext context;
    ReportFailureRequest request;
    ReportFailureResponse response;
    grpc::Status status;
    SteadyClock::time_point answered;
    Countdown pending;
  };
  auto report = std::make_shared<Report>();
  const SimNode& reporter = *fleet->nodes[0];
  report->request.set_job_id(reporter.join.job_id());
  report->request.set_node_id(reporter.join.node().node_id());
  report->request.set_round(round);
  report->request.set_node_secret(reporter.assignment().node_secret());
  Failure* failure = report->request.mutable_failure();
  failure->set_rank(reporter.assignment().rank_base());
  failure->set_local_rank(0);
  failure->set_host(reporter.join.node().host());
  failure->set_pid(4242);
  failure->set_exit_code(1);
  failure->set_time_unix_ms(absl::ToUnixMillis(absl::Now()));
  failure->set_message("rdzv_scale --restart-round: a simulated worker failure");
  report->context.set_deadline(absl::ToChronoTime(deadline));
  report->pending.Add(1);

  Mark(config, "restart-round-start");
  const absl::StatusOr<double> cpu_start = ProcessCpuSeconds(server.pid());
  const double client_cpu_start = SelfCpuSeconds();
  const SteadyClock::time_point start = SteadyClock::now();
  fleet->stub(0)->async()->ReportFailure(&report->context, &report->request, &report->response,
                                         [report](grpc::Status status) {
                                           report->answered = SteadyClock::now();
                                           report->status = std::move(status);
                                           report->pending.Done();
                                         });
  const bool all_rejoined = tally->rejoins.WaitUntil(deadline + absl::Seconds(5));
  Mark(config, "restart-round-end");
  const absl::StatusOr<double> cpu_end = ProcessCpuSeconds(server.pid());
  if (cpu_start.ok() && cpu_end.ok()) {
    result->restart_server_cpu_ms = 1000 * (*cpu_end - *cpu_start);
  }
  result->restart_client_cpu_ms = 1000 * (SelfCpuSeconds() - client_cpu_start);
  if (!report->pending.WaitUntil(absl::Now() + absl::Seconds(10))) {
    std::fprintf(stderr, "rdzv_scale: the failure report never ended\n");
    std::_Exit(2);
  }
  int told = n;
  if (!all_rejoined) {
    // Nodes never told: claimed here, so no rejoin of theirs starts; those
    // told are cancelled.
    for (int i = 0; i < n; ++i) {
      if (!fleet->nodes[i]->rejoining.exchange(true)) {
        --told;
        tally->rejoins.Done();
      } else {
        fleet->nodes[i]->rejoin_context.TryCancel();
      }
    }
    if (!tally->rejoins.WaitUntil(absl::Now() + absl::Seconds(10))) {
      std::fprintf(stderr, "rdzv_scale: %d rejoins never ended, even cancelled\n",
                   tally->rejoins.left());
      std::_Exit(2);  // contexts are still in gRPC's hands: they cannot be freed
    }
  }
  watches->SetOnEvent(nullptr);
  result->expected_watch_events = n;

  if (report->status.ok()) result->report_answered_ms = MsSince(start, report->answered);
  SteadyClock::time_point last_changed = start, last_rejoin = start;
  for (int i = 0; i < n; ++i) {
    if (tally->changed_to[i] >= 0) last_changed = std::max(last_changed, tally->changed_at[i]);
    last_rejoin = std::max(last_rejoin, fleet->nodes[i]->rejoin_answered);
  }
  result->last_round_changed_ms = MsSince(start, last_changed);
  if (!report->status.ok()) {
    result->error = absl::StrCat("the failure report failed: ", report->status.error_message());
    return;
  }
  if (!all_rejoined) {
    result->error = absl::StrCat("restart round: ", told, " of ", n,
                                 " nodes were told the round moved on, and not all of them had "
                                 "their new assignment within the timeout");
    return;
  }
  result->last_rejoin_ms = MsSince(start, last_rejoin);
  {
    absl::MutexLock lock(&tally->mu);
    if (!tally->first_problem.empty()) {
      result->error = absl::StrCat("restart round: ", tally->unexpected.load(),
                                   " unexpected watch events; first: ", tally->first_problem);
      return;
    }
  }
  const int64_t new_round = tally->changed_to[0];
  for (int i = 0; i < n; ++i) {
    if (tally->changed_to[i] != new_round) {
      result->error = absl::StrCat("restart round: node ", i, " was told round ",
                                   tally->changed_to[i], ", node 0 round ", new_round);
      return;
    }
  }
  if (new_round <= round) {
    result->error = absl::StrCat("restart round: told round ", new_round, " after round ", round);
    return;
  }
  if (absl::Status rejoined = CheckRejoins(*fleet, new_round, 1); !rejoined.ok()) {
    result->error = absl::StrCat("restart round: ", rejoined.message());
  }
}

void ServerRestartPhase(const RunConfig& config, ServerUnderTest* server, const Fleet& fleet,
                        WatchSet* watches, RunResult* result) {
  if (!config.server_restart || !result->error.empty()) return;
  const int n = config.nodes;
  const Assignment& before = fleet.nodes[0]->assignment();
  const int64_t round = before.round();
  const int restart_count = before.restart_count();
  // The agents' side of the outage: each node opens its watch again
  // watch_retry after it ended, until one starts. The server is killed
  // while this runs, so it sees every stream end.
  const int reopened_before = watches->reopened();
  std::atomic<bool> stop{false};
  std::thread reopener([&] {
    const absl::Time end = absl::Now() + config.timeout + absl::Seconds(5);
    while (!stop.load() && absl::Now() < end) {
      watches->ReopenEnded(fleet, round, config.watch_retry);
      absl::SleepFor(absl::Milliseconds(2));
    }
  });
  Mark(config, "server-restart-start");
  RestartTimes times;
  const absl::Status restarted = server->KillAndRestart(&times);
  int started = 0;
  SteadyClock::time_point first = times.spawned, last = times.spawned;
  if (restarted.ok()) {
    const absl::Time end = absl::Now() + config.timeout;
    while (absl::Now() < end) {
      started = watches->StartedSince(times.spawned, &first, &last);
      if (started == n) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  stop.store(true);
  reopener.join();
  Mark(config, "server-restart-end");
  result->rewatch_opens = watches->reopened() - reopened_before;
  result->rewatch_failed = watches->ReopenedFailed(&result->rewatch_failure);
  if (!restarted.ok()) {
    result->error = absl::StrCat("server restart: ", restarted.message());
    return;
  }
  result->kill_to_spawn_ms = MsSince(times.killed, times.spawned);
  result->restart_listening_ms = MsSince(times.spawned, times.listening);
  if (started != n) {
    result->error = absl::StrCat("server restart: only ", started, " of ", n,
                                 " watch streams started again within the timeout");
    return;
  }
  result->first_rewatch_ms = MsSince(times.spawned, first);
  result->last_rewatch_ms = MsSince(times.spawned, last);

  // The job as the new server has it: the same round and restart count.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  StatusRequest request;
  request.set_job_id(fleet.nodes[0]->join.job_id());
  StatusResponse response;
  const grpc::Status status = fleet.stub(0)->Status(&context, request, &response);
  if (!status.ok()) {
    result->error = absl::StrCat("server restart: Status failed: ", status.error_message());
  } else if (response.round() != round || response.restart_count() != restart_count ||
             response.state() != "running" || response.participants() != n) {
    result->error =
        absl::StrCat("server restart: the job is ", response.state(), " in round ",
                     response.round(), " (restart ", response.restart_count(), ", ",
                     response.participants(), " participants); before the kill it ran round ",
                     round, " (restart ", restart_count, ", ", n, " participants)");
  }
}

void CloseWatchesPhase(const RunConfig& config, WatchSet* watches, RunResult* result) {
  result->watch_events = watches->events();
  if (result->error.empty() && result->watch_events != result->expected_watch_events) {
    result->error = absl::StrCat(result->watch_events - result->expected_watch_events,
                                 " unexpected watch events (the round moved on)");
  }
  if (!config.watch) return;
  // Every stream should still be open: the server ends one only when the job moves on.
  if (absl::Status open = watches->CheckAllOpen(); !open.ok() && result->error.empty()) {
    result->error = std::string(open.message());
  }
  if (!watches->CancelAndWait(absl::Now() + absl::Seconds(10))) {
    std::fprintf(stderr, "rdzv_scale: %d watch streams never ended, even cancelled\n",
                 watches->open());
    std::_Exit(2);
  }
}

absl::StatusOr<double> HubOnlyJoinMs(int n, absl::Duration timeout, const std::string& state_dir) {
  std::vector<JoinRequest> requests;
  requests.reserve(n);
  for (int i = 0; i < n; ++i) {
    requests.push_back(NodeJoinRequest(absl::StrCat("hub-only-", n), n, i, timeout));
  }
  HubOptions options;
  if (!state_dir.empty()) {
    Replayed replayed;
    absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(state_dir, &replayed);
    if (!journal.ok()) return journal.status();
    options.journal = *std::move(journal);
    options.on_journal_failure = [](const absl::Status& status) {
      std::fprintf(stderr, "rdzv_scale: the hub's journal failed: %s\n", status.ToString().c_str());
    };
  }
  RendezvousHub hub(std::move(options));
  Countdown pending;
  pending.Add(n);
  std::atomic<int> ok{0};
  const SteadyClock::time_point start = SteadyClock::now();
  for (int i = 0; i < n; ++i) {
    hub.Join(requests[i], "127.0.0.1", hub.NewTicket(), [&](absl::StatusOr<Assignment> result) {
      if (result.ok()) ok.fetch_add(1);
      pending.Done();
    });
  }
  const bool done = pending.WaitUntil(absl::Now() + timeout);
  const double ms = MsSince(start, SteadyClock::now());
  hub.Shutdown();  // ends what is still pending, so `pending` outlives every callback
  if (!done || ok.load() != n) {
    return absl::DeadlineExceededError(absl::StrCat(ok.load(), " of ", n, " hub joins done"));
  }
  return ms;
}

}  // namespace muster::rdzv::scale
