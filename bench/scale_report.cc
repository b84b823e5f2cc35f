#include "bench/scale_report.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/proc_stats.h"
#include "bench/sim_nodes.h"

namespace muster::rdzv::scale {
namespace {

// Targets and reference from issue 3 ("Measure", Scale).
constexpr int kTargetNodes = 10'000;
constexpr double kTargetJoinMs = 1000.0;
constexpr double kTargetHeartbeatCpuPct = 10.0;
constexpr int kPytorchHosts = 4'000;
constexpr double kPytorchJoinMs = 10'000.0;

// Goals from issue 12 ("Measure", durability).
constexpr double kGoalJournalJoinMs = 1500.0;  // 10,000 joins with --state-dir
constexpr int kSmallRestartNodes = 1'000;
constexpr double kGoalSmallRestartMs = 100.0;   // restart round, 1,000 nodes
constexpr double kGoalLargeRestartMs = 1000.0;  // restart round, 10,000 nodes

const char* Journal(bool journal) { return journal ? "journal" : "no journal"; }

// `ms` with `decimals` digits after the point.
std::string Ms(double ms, int decimals = 0) {
  return ms < 0 ? "-" : absl::StrFormat("%.*f ms", decimals, ms);
}

// The median and, with more than one run, the range of `field`, with
// `decimals` digits after the point.
std::string MedianRange(const Row& row, double RunResult::*field, int decimals = 0) {
  const std::vector<double> values = row.Collect(field);
  if (values.empty()) return "-";
  auto number = [decimals](double value) { return absl::StrFormat("%.*f", decimals, value); };
  std::string text = absl::StrCat(number(row.MedianOf(field)), " ms");
  if (values.size() > 1) {
    absl::StrAppend(&text, " (", number(*std::min_element(values.begin(), values.end())), "–",
                    number(*std::max_element(values.begin(), values.end())), ")");
  }
  return text;
}

double Median(std::vector<double> values) {
  if (values.empty()) return -1;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf(
      "\n| nodes | server state | join to last assignment (median, range) | hub alone, no gRPC | "
      "server peak RSS | heartbeat CPU, server | checks |\n|---:|---|---:|---:|---:|---:|---|\n");
  for (const Row& row : rows) {
    std::printf("| %d | %s | %s | %s | %s | %s | %s |\n", row.nodes, Journal(row.journal),
                MedianRange(row, &RunResult::last_assignment_ms).c_str(),
                Ms(row.hub_only_ms, 1).c_str(),
                row.hwm_mib() < 0 ? "-" : absl::StrFormat("%.1f MiB", row.hwm_mib()).c_str(),
                row.heartbeat_cpu_pct() < 0
                    ? "not measured"
                    : absl::StrFormat("%.1f%% of a core", row.heartbeat_cpu_pct()).c_str(),
                row.error.empty() ? "ok" : "FAILED");
  }
  std::printf("\n");
}

// Restart rounds and server restarts, where any run measured them.
void PrintDurabilityTable(const std::vector<Row>& rows) {
  bool any = false;
  for (const Row& row : rows) {
    any = any || !row.Collect(&RunResult::last_rejoin_ms).empty() ||
          !row.Collect(&RunResult::last_rewatch_ms).empty();
  }
  if (!any) return;
  std::printf(
      "| nodes | server state | restart round: report to last new assignment (median, range) | "
      "to last RoundChanged | server restart: spawn to listening | spawn to last watch "
      "started again (median, range) |\n|---:|---|---:|---:|---:|---:|\n");
  for (const Row& row : rows) {
    std::printf("| %d | %s | %s | %s | %s | %s |\n", row.nodes, Journal(row.journal),
                MedianRange(row, &RunResult::last_rejoin_ms, 1).c_str(),
                MedianRange(row, &RunResult::last_round_changed_ms, 1).c_str(),
                MedianRange(row, &RunResult::restart_listening_ms).c_str(),
                MedianRange(row, &RunResult::last_rewatch_ms).c_str());
  }
  std::printf("\n");
}

void PrintTargets(const RunConfig& base, const Row& target) {
  const bool valid = target.error.empty();
  const double join_ms = target.join_ms();
  const double cpu = target.heartbeat_cpu_pct();
  std::printf("target: join of %d nodes in at most %.0f ms: %.0f ms, %s\n", kTargetNodes,
              kTargetJoinMs, join_ms,
              !valid                     ? "invalid run"
              : join_ms <= kTargetJoinMs ? "met"
                                         : "not met");
  std::printf("target: %d nodes heartbeating once a second under %.0f%% of a core: %s\n",
              kTargetNodes, kTargetHeartbeatCpuPct,
              cpu < 0                          ? "not measured"
              : base.heartbeat_interval_s != 1 ? "not measured (--heartbeat-interval is not 1)"
              : !valid                         ? "invalid run"
                                               : absl::StrFormat("%.1f%%, %s", cpu,
                                         cpu < kTargetHeartbeatCpuPct ? "met" : "not met")
                             .c_str());
  if (valid) {
    std::printf(
        "reference (quoted in issue 3, not measured here): PyTorch's fixed rendezvous "
        "takes %.0f s for %d hosts; muster took %.2f s for %d nodes here: %.1fx less "
        "time for %.1fx the nodes (different setups: a ratio of quotes, not a race)\n",
        kPytorchJoinMs / 1000, kPytorchHosts, join_ms / 1000, kTargetNodes,
        kPytorchJoinMs / join_ms, static_cast<double>(kTargetNodes) / kPytorchHosts);
  }
}

// Goal `goal_ms` for `what`, against `row`'s median of `field`.
void PrintGoal(const std::string& what, double goal_ms, const Row& row, double RunResult::*field) {
  const double ms = row.MedianOf(field);
  std::printf("goal (issue 12): %s in at most %.0f ms: %s, %s\n", what.c_str(), goal_ms,
              ms < 0 ? "not measured" : absl::StrFormat("%.1f ms", ms).c_str(),
              ms < 0 || !row.error.empty() ? "invalid run"
              : ms <= goal_ms              ? "met"
                                           : "not met");
}

void PrintDurabilityTargets(const std::vector<Row>& rows, const Row* journaled) {
  if (journaled != nullptr) {
    PrintGoal(absl::StrCat("join of ", kTargetNodes, " nodes with a journal"), kGoalJournalJoinMs,
              *journaled, &RunResult::last_assignment_ms);
  }
  for (const Row& row : rows) {
    if (row.Collect(&RunResult::last_rejoin_ms).empty()) continue;
    if (row.nodes == kSmallRestartNodes || row.nodes == kTargetNodes) {
      PrintGoal(absl::StrCat("restart round of ", row.nodes, " nodes, ", Journal(row.journal)),
                row.nodes == kTargetNodes ? kGoalLargeRestartMs : kGoalSmallRestartMs, row,
                &RunResult::last_rejoin_ms);
    }
  }
  // With --baseline: each N's journaled medians against its plain ones.
  for (const Row& row : rows) {
    for (const Row& other : rows) {
      if (!row.journal || other.journal || other.nodes != row.nodes) continue;
      for (const auto& [what, field] : {std::pair{"join", &RunResult::last_assignment_ms},
                                        std::pair{"restart round", &RunResult::last_rejoin_ms}}) {
        const double with = row.MedianOf(field);
        const double without = other.MedianOf(field);
        if (with > 0 && without > 0) {
          std::printf("  %s of %d nodes with a journal / without: %.1f ms / %.1f ms = %.2fx\n",
                      what, row.nodes, with, without, with / without);
        }
      }
    }
  }
}

}  // namespace

std::vector<double> Row::Collect(double RunResult::*field) const {
  std::vector<double> values;
  for (const RunResult& r : runs) {
    if (r.*field >= 0) values.push_back(r.*field);
  }
  return values;
}
double Row::join_ms() const { return Median(Collect(&RunResult::last_assignment_ms)); }
double Row::heartbeat_cpu_pct() const { return Median(Collect(&RunResult::heartbeat_cpu_pct)); }
double Row::hwm_mib() const { return Median(Collect(&RunResult::server_hwm_mib)); }
double Row::MedianOf(double RunResult::*field) const { return Median(Collect(field)); }

void PrintSetup(const RunConfig& base, int repeat, const ServerPlace& place,
                const StateSetup& state) {
  const bool external = !place.connect.empty();
  const bool in_process = place.mode == "in-process";
  std::printf(
      "rdzv_scale: simulated nodes in one process, %s; loopback; %u cores shared by "
      "clients and server; load average %s\n",
      base.channels == 0
          ? "a gRPC channel (TCP connection) per node"
          : absl::StrCat("sharing ", base.channels, " gRPC channels (TCP connections)").c_str(),
      std::thread::hardware_concurrency(), LoadAverage().c_str());
  std::printf("server: %s; Abseil deadlock detection in the server: %s\n",
              external     ? "external (--connect): peak RSS is its whole life's"
              : in_process ? "in this process: RSS and CPU include the clients"
                           : "a child process of its own, fresh for every run",
              external                                        ? "as that server set it"
              : in_process || !base.server_deadlock_detection ? "off"
                                                              : "on, as Debian's Abseil ships it");
  std::printf(
      "each run: join (min=max=N, %d workers/node, last call 0) -> %s -> 1 s idle -> "
      "%d s of liveness, each node checked once every %g s by %s; %d run(s) per N, "
      "medians below\n",
      kLocalWorldSize, base.watch ? "a watch stream per node" : "no watch streams",
      base.heartbeat_seconds, base.heartbeat_interval_s,
      base.unary_heartbeats ? "a unary Heartbeat call (server keepalive off)"
                            : "a TCP keepalive probe on its connection",
      repeat);
  if (base.restart_round) {
    std::printf(
        "then a restart round: node 0 reports a worker failure, every node's watch says the "
        "round moved on, each node joins again at once with its secret (an agent stops its "
        "workers first), its watch stream staying open\n");
  }
  if (base.server_restart) {
    std::printf(
        "then a server restart (journaled runs): SIGKILL, a new child on the same port and "
        "state directory at once; each node opens its watch again %g s after it ended (an "
        "agent's retry is 1 s), and again while that fails; a Status call checks the job\n",
        absl::ToDoubleSeconds(base.watch_retry));
  }
  if (!state.parent.empty()) {
    std::printf(
        "server state: %s, in a fresh directory of %s per run (as musterd --state-dir); one "
        "256-byte append + fdatasync there: %s\n",
        state.baseline ? "each run without a journal, then one with" : "a journal for every run",
        state.parent.c_str(),
        state.fdatasync_ms >= 0
            ? absl::StrFormat("%.2f ms (median of 50)", state.fdatasync_ms).c_str()
            : state.fdatasync_error.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

void PrintRun(const RunConfig& config, int repetition, const RunResult& result) {
  std::printf(
      "N=%d%s #%d: join %.1f ms (all sent by %.1f ms, first answer at %.1f ms; CPU: server "
      "%.0f ms, clients %.0f ms); server peak RSS %.1f MiB, idle %.1f%% of a core\n",
      config.nodes, config.state_dir.empty() ? "" : " journal", repetition,
      result.last_assignment_ms, result.send_all_ms, result.first_assignment_ms,
      result.server_join_cpu_ms, result.client_join_cpu_ms, result.server_hwm_mib,
      result.idle_cpu_pct);
  if (result.heartbeat_cpu_pct >= 0 && !config.unary_heartbeats) {
    std::printf(
        "  liveness by watch stream, TCP keepalive probes every %g s, a ping from each "
        "node every %g s and from the server every %g s: server %.1f%% of a core (clients "
        "%.1f%%; the whole machine, kernel and other processes included, %.1f%%); %.2f TCP "
        "segments per connection and second\n",
        config.heartbeat_interval_s, config.client_ping_s, config.server_ping_s,
        result.heartbeat_cpu_pct, result.client_heartbeat_cpu_pct, result.machine_heartbeat_cpu_pct,
        result.segments_per_connection_s);
  } else if (result.heartbeat_cpu_pct >= 0) {
    std::printf("  unary heartbeats: server %.1f%% of a core (clients %.1f%%); %" PRId64
                " ok, %" PRId64 " failed; latency p50 %.2f ms, p99 %.2f ms\n",
                result.heartbeat_cpu_pct, result.client_heartbeat_cpu_pct, result.heartbeats_ok,
                result.heartbeats_failed, result.heartbeat_p50_ms, result.heartbeat_p99_ms);
  }
  if (result.last_rejoin_ms >= 0) {
    std::printf(
        "  restart round: failure report answered at %.1f ms, last RoundChanged at %.1f ms, "
        "last new assignment at %.1f ms (round and restart count 1 agreed; CPU: server %.0f ms, "
        "clients %.0f ms)\n",
        result.report_answered_ms, result.last_round_changed_ms, result.last_rejoin_ms,
        result.restart_server_cpu_ms, result.restart_client_cpu_ms);
  }
  if (result.last_rewatch_ms >= 0) {
    std::printf(
        "  server restart: SIGKILL to new child %.1f ms; from its spawn: listening at %.1f ms, "
        "watches started again from %.1f to %.1f ms (%d watch opens for %d nodes, retry %g s, "
        "%d failed%s%s); Status: same round and restart count\n",
        result.kill_to_spawn_ms, result.restart_listening_ms, result.first_rewatch_ms,
        result.last_rewatch_ms, result.rewatch_opens, config.nodes,
        absl::ToDoubleSeconds(config.watch_retry), result.rewatch_failed,
        result.rewatch_failed > 0 ? ", the first with " : "", result.rewatch_failure.c_str());
  }
  if (result.journal_bytes >= 0) {
    std::printf("  journal: %lld bytes after the run\n",
                static_cast<long long>(result.journal_bytes));
  }
  if (!result.error.empty()) std::printf("  ERROR: %s\n", result.error.c_str());
  std::fflush(stdout);
}

void PrintHubOnly(int nodes, bool journal, const absl::StatusOr<double>& ms) {
  if (ms.ok()) {
    std::printf(
        "N=%d: the same joins straight into an in-process RendezvousHub (no gRPC%s): %.1f ms\n",
        nodes, journal ? ", with a journal" : "", *ms);
  } else {
    std::printf("N=%d: hub alone%s: %s\n", nodes, journal ? " with a journal" : "",
                ms.status().ToString().c_str());
  }
  std::fflush(stdout);
}

void PrintSummary(const RunConfig& base, const std::vector<Row>& rows) {
  PrintTable(rows);
  PrintDurabilityTable(rows);
  const Row* target = nullptr;
  const Row* journaled = nullptr;
  for (const Row& row : rows) {
    if (row.nodes != kTargetNodes) continue;
    (row.journal ? journaled : target) = &row;
  }
  if (target == nullptr) {
    std::printf("targets (issue 3) are for %d nodes without a journal: not measured in this run\n",
                kTargetNodes);
  } else {
    PrintTargets(base, *target);
  }
  PrintDurabilityTargets(rows, journaled);
}

}  // namespace muster::rdzv::scale
