// rdzv_scale: N simulated agents against one rendezvous server on loopback.
//
// For each N, `--repeat` runs, each against a fresh server: every node joins
// job "scale-N" (min = max = N, 8 workers per node, no last call); the bench
// times the first Join sent to the last assignment received and checks the
// assignments agree. Every node then opens its watch stream (as an agent
// does), and liveness runs for --heartbeat-seconds as agents do it: no
// calls, the server's kernel probing each connection every
// --heartbeat-interval and each node's channel pinging the server every
// 10 s (--liveness unary instead: a Heartbeat call per node and interval).
// The bench reads the server process's CPU over that window from
// /proc/<pid>/stat, the whole machine's from /proc/stat, and its peak RSS
// (VmHWM) at the end. Last, the same joins go straight into an in-process
// RendezvousHub, to tell the rendezvous core's cost from gRPC's.
//
// The server runs in a child process (this binary re-executed with --serve),
// so its RSS and CPU are its own; --server in-process or --connect (a
// musterd started by hand, with --server-pid) are the alternatives
// (server_under_test.h).
//
// The simulated nodes are light (callback stubs, one process), but each has
// its own gRPC channel and TCP connection with an agent's channel arguments,
// as real agents do; --channels K shares K connections among them instead
// (sim_nodes.h). Each phase of a run is a function of scale_phases.h.
//
// With --state-dir the server keeps its jobs in a journal, a fresh directory
// per run, as musterd --state-dir does (--baseline: each run also without,
// for the ratio). --restart-round adds a restart round after liveness: a
// worker failure reported, every node told by its watch and joining again;
// --server-restart then SIGKILLs the server child and starts another on the
// same port and journal, and times the nodes' watches coming back.
//
// Not run in CI: timed thresholds are printed, not asserted.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/proc_stats.h"
#include "bench/scale_phases.h"
#include "bench/scale_report.h"
#include "bench/server_under_test.h"
#include "bench/sim_nodes.h"
#include "common/log.h"

namespace muster::rdzv::scale {
namespace {

RunResult RunOne(const RunConfig& config, ServerUnderTest* server) {
  RunResult result;
  result.nodes = config.nodes;
  absl::StatusOr<Fleet> fleet =
      NewFleet(server->target(), config.channels == 0 ? config.nodes : config.channels,
               absl::StrCat("scale-", config.nodes, config.job_suffix), config.nodes,
               config.timeout, absl::Seconds(config.client_ping_s));
  if (!fleet.ok()) {
    result.error = std::string(fleet.status().message());
    return result;
  }
  JoinPhase(config, *server, &*fleet, &result);
  WatchSet watches;
  if (result.error.empty()) {
    const int64_t round = fleet->nodes[0]->join_response.assignment().round();
    if (config.watch) watches.Open(*fleet, round);
    SettlePhase(config, watches, &result);
    IdlePhase(*server, &result);
    LivenessPhase(config, *fleet, round, *server, &result);
    RestartRoundPhase(config, *server, &*fleet, round, &watches, &result);
    ServerRestartPhase(config, server, *fleet, &watches, &result);
  }
  CloseWatchesPhase(config, &watches, &result);
  const absl::StatusOr<double> hwm = ProcessStatusMiB(server->pid(), "VmHWM");
  if (hwm.ok()) result.server_hwm_mib = *hwm;
  return result;
}

// What to run: node counts, repetitions, where the server runs and keeps
// its jobs.
struct Plan {
  std::vector<int> node_counts;
  int repeat = 3;
  ServerPlace place;
  StateSetup state;
};

// `repeat` runs of `nodes` nodes, each against a fresh server (or the one of
// --connect, in a job of its own), then the hub alone. With a state
// directory, each run's server keeps its jobs in a fresh directory of it;
// with a baseline too, each repetition runs without a journal, then with
// one, which gives two rows.
std::vector<Row> MeasureNodes(const RunConfig& base, int nodes, const Plan& plan) {
  std::vector<bool> variants;
  if (plan.state.parent.empty() || plan.state.baseline) variants.push_back(false);
  if (!plan.state.parent.empty()) variants.push_back(true);
  std::vector<Row> rows(variants.size());
  for (size_t v = 0; v < variants.size(); ++v) {
    rows[v].nodes = nodes;
    rows[v].journal = variants[v];
  }
  // Join, restart round and server restart each within the timeout; liveness; slack.
  const absl::Duration limit = base.timeout * 4 + absl::Seconds(base.heartbeat_seconds + 60);
  const std::string prefix = absl::StrCat("scale-", nodes);
  auto failed = [&rows] {
    for (const Row& row : rows) {
      if (!row.error.empty()) return true;
    }
    return false;
  };
  for (int rep = 1; rep <= plan.repeat && !failed(); ++rep) {
    for (size_t v = 0; v < variants.size() && !failed(); ++v) {
      Row& row = rows[v];
      RunConfig config = base;
      config.nodes = nodes;
      // Without a journal the job would be lost with the server.
      config.server_restart = base.server_restart && variants[v];
      std::optional<ScratchStateDir> state;
      if (variants[v]) {
        absl::StatusOr<ScratchStateDir> made = ScratchStateDir::Make(plan.state.parent, prefix);
        if (!made.ok()) {
          row.error = made.status().ToString();
          break;
        }
        state.emplace(*std::move(made));
        config.state_dir = state->path();
      }
      absl::StatusOr<std::unique_ptr<ServerUnderTest>> server =
          StartServerUnderTest(plan.place, ServerOptionsFor(config), limit,
                               config.server_deadlock_detection, config.state_dir);
      if (!server.ok()) {
        row.error = server.status().ToString();
        break;
      }
      if (!plan.place.connect.empty()) config.job_suffix = absl::StrCat("-", rep);
      RunResult result = RunOne(config, server->get());
      server->reset();
      if (state) result.journal_bytes = state->JournalBytes();
      state.reset();
      PrintRun(config, rep, result);
      if (!result.error.empty()) row.error = result.error;
      row.runs.push_back(std::move(result));
    }
  }
  for (Row& row : rows) {
    std::optional<ScratchStateDir> state;
    if (row.journal) {
      absl::StatusOr<ScratchStateDir> made =
          ScratchStateDir::Make(plan.state.parent, absl::StrCat("hub-only-", nodes));
      if (!made.ok()) {
        PrintHubOnly(nodes, true, made.status());
        continue;
      }
      state.emplace(*std::move(made));
    }
    const absl::StatusOr<double> hub_ms =
        HubOnlyJoinMs(nodes, base.timeout, state ? state->path() : std::string());
    if (hub_ms.ok()) row.hub_only_ms = *hub_ms;
    PrintHubOnly(nodes, row.journal, hub_ms);
  }
  return rows;
}

int BenchMain(const RunConfig& base, const Plan& plan) {
  PrintSetup(base, plan.repeat, plan.place, plan.state);
  std::vector<Row> rows;
  for (int n : plan.node_counts) {
    for (Row& row : MeasureNodes(base, n, plan)) rows.push_back(std::move(row));
  }
  PrintSummary(base, rows);
  for (const Row& row : rows) {
    if (!row.error.empty()) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace muster::rdzv::scale

int main(int argc, char** argv) {
  namespace scale = muster::rdzv::scale;
  CLI::App app("rdzv_scale: N simulated agents against one rendezvous server on loopback");
  scale::Plan plan;
  plan.node_counts = {100, 1000, 10000};
  scale::RunConfig config;
  int timeout_s = 60;
  bool no_watch = false;
  bool serve = false;
  int serve_port = 0;
  double watch_retry_s = 1;
  app.add_option("--nodes", plan.node_counts, "node counts, comma separated")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 100'000));
  app.add_option("--heartbeat-seconds", config.heartbeat_seconds, "seconds of heartbeats (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 600));
  app.add_option("--heartbeat-interval", config.heartbeat_interval_s,
                 "seconds between two heartbeats of one node (the targets are for 1; agents "
                 "default to 5)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 60.0));
  app.add_option("--channels", config.channels,
                 "gRPC channels (TCP connections) shared by the simulated nodes; 0: one per node")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  std::string liveness = "watch";
  app.add_option("--liveness", liveness,
                 "how nodes prove they are alive: watch (the open watch stream, and the server's "
                 "keepalive ping every --heartbeat-interval; what agents do) or unary (a "
                 "Heartbeat call every --heartbeat-interval: the agents' fallback)")
      ->capture_default_str()
      ->check(CLI::IsMember({"watch", "unary"}));
  double keepalive_interval_s = 1;
  app.add_option("--keepalive-interval", keepalive_interval_s)->group("");
  app.add_option("--server-ping", config.server_ping_s,
                 "seconds between the server's pings of each connection (musterd "
                 "--ping-interval, which finds a stopped agent); 0: no pings")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--client-ping", config.client_ping_s,
                 "seconds between each node's pings of the server (an agent's default: "
                 "heartbeat_timeout / 3)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--timeout", timeout_s,
                 "seconds each join phase (join, restart round, watches after a server "
                 "restart) may take; bounds the whole run")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--repeat", plan.repeat,
                 "runs per N, each with a fresh server; the table shows medians")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_flag("--no-watch", no_watch, "do not open a watch stream per node");
  app.add_option("--server", plan.place.mode, "where the server runs")
      ->capture_default_str()
      ->check(CLI::IsMember({"child", "in-process"}));
  app.add_option("--connect", plan.place.connect,
                 "use a running server (musterd) at HOST:PORT instead");
  app.add_option("--server-pid", plan.place.connect_pid,
                 "with --connect: the server's pid, for CPU and RSS");
  app.add_option("--state-dir", plan.state.parent,
                 "keep the jobs of each run's server in a journal in a fresh directory made in "
                 "DIR, as musterd --state-dir does (each removed after its run); DIR must be on "
                 "the disk to measure, not a tmpfs. With --serve: the directory itself")
      ->type_name("DIR");
  app.add_flag("--baseline", plan.state.baseline,
               "with --state-dir: run each repetition without a journal too, just before the one "
               "with, and print both and their ratio");
  app.add_flag("--restart-round", config.restart_round,
               "after liveness, node 0 reports a worker failure: time until every node has "
               "joined the next round again (as agents do)");
  app.add_flag("--server-restart", config.server_restart,
               "then (with --state-dir and --server child) SIGKILL the server and start another "
               "on its port and state directory: time until every node watches again");
  app.add_option("--watch-retry", watch_retry_s,
                 "seconds a node waits to open its watch again after it ended (agents: 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60.0));
  app.add_flag("--server-deadlock-detection,!--no-server-deadlock-detection",
               config.server_deadlock_detection,
               "leave Abseil's mutex deadlock detection on in the server child, as Debian's build "
               "ships it; off (the default) is what musterd and muster run with")
      ->default_val(false);
  app.add_flag("--marks", config.marks,
               "print phase times (CLOCK_MONOTONIC) on stderr, for perf record -k CLOCK_MONOTONIC");
  app.add_flag("--serve", serve, "internal: run only the server, for the parent bench")->group("");
  app.add_option("--serve-port", serve_port, "internal: the port --serve listens on")->group("");
  CLI11_PARSE(app, argc, argv);
  config.timeout = absl::Seconds(timeout_s);
  config.watch = !no_watch;
  config.unary_heartbeats = liveness == "unary";
  config.watch_retry = absl::Seconds(watch_retry_s);
  if (serve) {
    muster::rdzv::ServerOptions options;
    options.keepalive_interval = absl::Seconds(keepalive_interval_s);
    options.ping_interval = absl::Seconds(config.server_ping_s);
    return scale::ServeMain(config.timeout, config.server_deadlock_detection, options, serve_port,
                            plan.state.parent);
  }
  if (no_watch && !config.unary_heartbeats) {
    std::fprintf(stderr,
                 "rdzv_scale: --no-watch needs --liveness unary (the watch stream is the "
                 "heartbeat otherwise)\n");
    return 2;
  }
  if (no_watch && (config.restart_round || config.server_restart)) {
    std::fprintf(stderr,
                 "rdzv_scale: --restart-round and --server-restart need the watch streams "
                 "(drop --no-watch)\n");
    return 2;
  }
  if (!plan.place.connect.empty() && plan.place.connect_pid <= 0) {
    std::fprintf(stderr, "rdzv_scale: --connect needs --server-pid\n");
    return 2;
  }
  if (!plan.place.connect.empty() && !plan.state.parent.empty()) {
    std::fprintf(stderr,
                 "rdzv_scale: --state-dir is for a server this bench starts; give the musterd of "
                 "--connect its own --state-dir\n");
    return 2;
  }
  if (plan.state.baseline && plan.state.parent.empty()) {
    std::fprintf(stderr, "rdzv_scale: --baseline needs --state-dir\n");
    return 2;
  }
  if (config.server_restart &&
      (plan.state.parent.empty() || plan.place.mode != "child" || !plan.place.connect.empty())) {
    std::fprintf(stderr,
                 "rdzv_scale: --server-restart needs --state-dir and the server in a child "
                 "process (--server child, no --connect)\n");
    return 2;
  }
  if (!plan.state.parent.empty()) {
    const absl::StatusOr<double> sync_ms = scale::FdatasyncMs(plan.state.parent, 50);
    if (sync_ms.ok()) {
      plan.state.fdatasync_ms = *sync_ms;
    } else {
      plan.state.fdatasync_error = sync_ms.status().ToString();
    }
  }
  signal(SIGPIPE, SIG_IGN);
  // This process only simulates clients: Abseil's deadlock detection
  // (on in Debian's build) would make the load generator the bottleneck.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  muster::SetLogLevel(spdlog::level::warn);
  return scale::BenchMain(config, plan);
}
