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
// Not run in CI: timed thresholds are printed, not asserted.
#include <signal.h>

#include <cstdio>
#include <memory>
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

RunResult RunOne(const RunConfig& config, const ServerUnderTest& server) {
  RunResult result;
  result.nodes = config.nodes;
  absl::StatusOr<Fleet> fleet = NewFleet(
      server.target(), config.channels == 0 ? config.nodes : config.channels,
      absl::StrCat("scale-", config.nodes, config.job_suffix), config.nodes, config.timeout);
  if (!fleet.ok()) {
    result.error = std::string(fleet.status().message());
    return result;
  }
  JoinPhase(config, server, &*fleet, &result);
  WatchSet watches;
  if (result.error.empty()) {
    const int64_t round = fleet->nodes[0]->join_response.assignment().round();
    if (config.watch) watches.Open(*fleet, round);
    SettlePhase(config, watches, &result);
    IdlePhase(server, &result);
    LivenessPhase(config, *fleet, round, server, &result);
  }
  CloseWatchesPhase(config, &watches, &result);
  const absl::StatusOr<double> hwm = ProcessStatusMiB(server.pid(), "VmHWM");
  if (hwm.ok()) result.server_hwm_mib = *hwm;
  return result;
}

// `repeat` runs of `nodes` nodes, each against a fresh server (or the one of
// --connect, in a job of its own), then the hub alone.
Row MeasureNodes(const RunConfig& base, int nodes, int repeat, const ServerPlace& place) {
  RunConfig config = base;
  config.nodes = nodes;
  Row row;
  row.nodes = nodes;
  const absl::Duration limit = config.timeout * 2 + absl::Seconds(config.heartbeat_seconds + 30);
  for (int rep = 1; rep <= repeat && row.error.empty(); ++rep) {
    absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = StartServerUnderTest(
        place, ServerOptionsFor(config), limit, config.server_deadlock_detection);
    if (!server.ok()) {
      row.error = server.status().ToString();
      break;
    }
    if (!place.connect.empty()) config.job_suffix = absl::StrCat("-", rep);
    RunResult result = RunOne(config, **server);
    server->reset();
    PrintRun(config, rep, result);
    if (!result.error.empty()) row.error = result.error;
    row.runs.push_back(std::move(result));
  }
  const absl::StatusOr<double> hub_ms = HubOnlyJoinMs(nodes, config.timeout);
  if (hub_ms.ok()) row.hub_only_ms = *hub_ms;
  PrintHubOnly(nodes, hub_ms);
  return row;
}

int BenchMain(const RunConfig& base, const std::vector<int>& node_counts, int repeat,
              const ServerPlace& place) {
  PrintSetup(base, repeat, place);
  std::vector<Row> rows;
  for (int n : node_counts) rows.push_back(MeasureNodes(base, n, repeat, place));
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
  std::vector<int> node_counts = {100, 1000, 10000};
  scale::RunConfig config;
  scale::ServerPlace place;
  int timeout_s = 60;
  bool no_watch = false;
  int repeat = 3;
  bool serve = false;
  app.add_option("--nodes", node_counts, "node counts, comma separated")
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
  app.add_option("--timeout", timeout_s, "seconds each join phase may take; bounds the whole run")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--repeat", repeat,
                 "runs per N, each with a fresh server; the table shows medians")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_flag("--no-watch", no_watch, "do not open a watch stream per node");
  app.add_option("--server", place.mode, "where the server runs")
      ->capture_default_str()
      ->check(CLI::IsMember({"child", "in-process"}));
  app.add_option("--connect", place.connect, "use a running server (musterd) at HOST:PORT instead");
  app.add_option("--server-pid", place.connect_pid,
                 "with --connect: the server's pid, for CPU and RSS");
  app.add_flag("--server-deadlock-detection,!--no-server-deadlock-detection",
               config.server_deadlock_detection,
               "leave Abseil's mutex deadlock detection on in the server child, as Debian's build "
               "ships it; off (the default) is what musterd and muster run with")
      ->default_val(false);
  app.add_flag("--marks", config.marks,
               "print phase times (CLOCK_MONOTONIC) on stderr, for perf record -k CLOCK_MONOTONIC");
  app.add_flag("--serve", serve, "internal: run only the server, for the parent bench")->group("");
  CLI11_PARSE(app, argc, argv);
  config.timeout = absl::Seconds(timeout_s);
  config.watch = !no_watch;
  config.unary_heartbeats = liveness == "unary";
  if (serve) {
    muster::rdzv::ServerOptions options;
    options.keepalive_interval = absl::Seconds(keepalive_interval_s);
    return scale::ServeMain(config.timeout, config.server_deadlock_detection, options);
  }
  if (no_watch && !config.unary_heartbeats) {
    std::fprintf(stderr,
                 "rdzv_scale: --no-watch needs --liveness unary (the watch stream is the "
                 "heartbeat otherwise)\n");
    return 2;
  }
  if (!place.connect.empty() && place.connect_pid <= 0) {
    std::fprintf(stderr, "rdzv_scale: --connect needs --server-pid\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  // This process only simulates clients: Abseil's deadlock detection
  // (on in Debian's build) would make the load generator the bottleneck.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  muster::SetLogLevel(spdlog::level::warn);
  return scale::BenchMain(config, node_counts, repeat, place);
}
