// The phases of one scale run, in the order rdzv_scale runs them: join,
// watch streams settle, an idle second, liveness, a restart round, a
// server restart, watch streams close; and the same joins straight into a
// hub. Each records its figures, and its error if it finds one, in a
// RunResult.
#ifndef MUSTER_BENCH_SCALE_PHASES_H_
#define MUSTER_BENCH_SCALE_PHASES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/server_under_test.h"
#include "bench/sim_nodes.h"
#include "rendezvous/server/service.h"

namespace muster::rdzv::scale {

struct RunConfig {
  int nodes = 0;
  int channels = 0;                   // 0: one per node, as real agents have
  int heartbeat_seconds = 20;         // covers a ping from every node (one per 10 s)
  double heartbeat_interval_s = 1.0;  // each node's
  // Liveness by unary Heartbeat calls (the fallback agents use while their
  // watch stream is down), or by the open watch streams with the server's
  // keepalive pings every heartbeat_interval_s (what agents do).
  bool unary_heartbeats = false;
  // The server's HTTP/2 keepalive ping of every connection (ServerOptions::
  // ping_interval, musterd --ping-interval); 0: none.
  double server_ping_s = 12.0;  // musterd's default
  // Each node's HTTP/2 keepalive ping of the server (an agent's default).
  double client_ping_s = absl::ToDoubleSeconds(kAgentKeepalive);
  absl::Duration timeout = absl::Seconds(60);
  bool watch = true;
  bool server_deadlock_detection = false;  // musterd and muster turn it off
  bool marks = false;                      // phase boundaries on stderr, for `perf report --time`
  std::string job_suffix;                  // with one server for every run, each run's own job
  // Where the server keeps its jobs (a fresh directory per run); empty: not kept.
  std::string state_dir;
  bool restart_round = false;   // RestartRoundPhase
  bool server_restart = false;  // ServerRestartPhase
  // How long a node waits to open its watch again after it ended by itself:
  // an agent's kWatchRetry (agent/elastic_state.cc).
  absl::Duration watch_retry = absl::Seconds(1);
};

struct RunResult {
  int nodes = 0;
  std::string error;  // empty: every check passed
  double send_all_ms = 0;
  double first_assignment_ms = 0;
  double last_assignment_ms = -1;  // -1: not measured
  double server_join_cpu_ms = -1;
  double client_join_cpu_ms = 0;
  double server_hwm_mib = -1;
  double idle_cpu_pct = -1;
  double heartbeat_cpu_pct = -1;
  double client_heartbeat_cpu_pct = -1;
  int64_t heartbeats_ok = 0;
  int64_t heartbeats_failed = 0;
  double heartbeat_p50_ms = 0;
  double heartbeat_p99_ms = 0;
  double segments_per_connection_s = -1;  // watch liveness: TCP segments seen
  double machine_heartbeat_cpu_pct = -1;  // watch liveness: the whole machine, kernel included
  int watch_events = 0;
  int expected_watch_events = 0;  // the RoundChanged of a restart round, one per node
  int64_t journal_bytes = -1;     // the journal's size after the run

  // RestartRoundPhase, from the ReportFailure sent (-1: not measured).
  double report_answered_ms = -1;     // its answer
  double last_round_changed_ms = -1;  // the last node's RoundChanged
  double last_rejoin_ms = -1;         // the last node's new assignment
  double restart_server_cpu_ms = -1;
  double restart_client_cpu_ms = -1;

  // ServerRestartPhase, from the new server's spawn (-1: not measured).
  double kill_to_spawn_ms = -1;      // from the SIGKILL (the old one reaped in between)
  double restart_listening_ms = -1;  // it reported its port
  double first_rewatch_ms = -1;      // the first node's WatchStarted
  double last_rewatch_ms = -1;       // the last node's
  int rewatch_opens = 0;             // watches opened in all during the outage
  int rewatch_failed = 0;            // of those, ended by themselves
  std::string rewatch_failure;       // the first of those's status
};

// The server's options for `config`. Watch liveness: the server pings each
// connection once per heartbeat interval. Unary heartbeats: the pings are
// left out, as before them.
ServerOptions ServerOptionsFor(const RunConfig& config);

// Every node joins; times the first Join sent to the last answer, the CPU
// the server and the clients spent, and checks the assignments agree. Ends
// the process (exit 2) if joins outlive their cancellation.
void JoinPhase(const RunConfig& config, const ServerUnderTest& server, Fleet* fleet,
               RunResult* result);

// Waits up to 10 s for every watch stream to start (with config.watch;
// else 100 ms).
void SettlePhase(const RunConfig& config, const WatchSet& watches, RunResult* result);

// The server's CPU over one second with nothing to do.
void IdlePhase(const ServerUnderTest& server, RunResult* result);

// config.heartbeat_seconds of liveness, as config.unary_heartbeats says:
// Heartbeat calls from every node once per interval, or none at all while
// the server's keepalive probes each connection. Nothing with 0 seconds.
void LivenessPhase(const RunConfig& config, const Fleet& fleet, int64_t round,
                   const ServerUnderTest& server, RunResult* result);

// With config.restart_round: node 0 reports a worker failure in `round`
// while every watch is open; each node's watch says the round moved on,
// and the node joins again at once with its secret, keeping its watch
// stream, as an agent does once its workers have stopped. Times the report
// sent to the last new assignment, and checks every node was told the same
// new round and the assignments agree on it and on restart count 1. Ends
// the process (exit 2) if rejoins outlive their cancellation.
void RestartRoundPhase(const RunConfig& config, const ServerUnderTest& server, Fleet* fleet,
                       int64_t round, WatchSet* watches, RunResult* result);

// With config.server_restart: SIGKILLs the server while every watch is
// open and starts another on its port and state directory at once; each
// node opens its watch again config.watch_retry after it ended (and again
// as long as that fails), as an agent does. Times the new server's spawn to
// the last node's WatchStarted (within config.timeout), then checks with a
// Status call that the job kept its round and restart count.
void ServerRestartPhase(const RunConfig& config, ServerUnderTest* server, const Fleet& fleet,
                        WatchSet* watches, RunResult* result);

// Checks no stream saw the round move on (but for a restart round's) or
// ended early, then cancels them. Ends the process (exit 2) if streams
// outlive their cancellation.
void CloseWatchesPhase(const RunConfig& config, WatchSet* watches, RunResult* result);

// N joins straight into a RendezvousHub in this process: the rendezvous core
// (state machine, lock, timer thread) with no gRPC, to tell their costs
// apart; with a journal in `state_dir` unless it is empty.
absl::StatusOr<double> HubOnlyJoinMs(int n, absl::Duration timeout, const std::string& state_dir);

}  // namespace muster::rdzv::scale

#endif  // MUSTER_BENCH_SCALE_PHASES_H_
