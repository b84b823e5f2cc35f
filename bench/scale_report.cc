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

double Median(std::vector<double> values) {
  if (values.empty()) return -1;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf(
      "\n| nodes | join to last assignment (median, range) | hub alone, no gRPC | server "
      "peak RSS | heartbeat CPU, server | checks |\n|---:|---:|---:|---:|---:|---|\n");
  for (const Row& row : rows) {
    const std::vector<double> joins = row.Collect(&RunResult::last_assignment_ms);
    const std::string range =
        joins.size() > 1
            ? absl::StrFormat(" (%.0f–%.0f)", *std::min_element(joins.begin(), joins.end()),
                              *std::max_element(joins.begin(), joins.end()))
            : "";
    std::printf("| %d | %s%s | %s | %s | %s | %s |\n", row.nodes,
                row.join_ms() < 0 ? "-" : absl::StrFormat("%.0f ms", row.join_ms()).c_str(),
                range.c_str(),
                row.hub_only_ms < 0 ? "-" : absl::StrFormat("%.1f ms", row.hub_only_ms).c_str(),
                row.hwm_mib() < 0 ? "-" : absl::StrFormat("%.1f MiB", row.hwm_mib()).c_str(),
                row.heartbeat_cpu_pct() < 0
                    ? "not measured"
                    : absl::StrFormat("%.1f%% of a core", row.heartbeat_cpu_pct()).c_str(),
                row.error.empty() ? "ok" : "FAILED");
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

void PrintSetup(const RunConfig& base, int repeat, const ServerPlace& place) {
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
      "medians below\n\n",
      kLocalWorldSize, base.watch ? "a watch stream per node" : "no watch streams",
      base.heartbeat_seconds, base.heartbeat_interval_s,
      base.unary_heartbeats ? "a unary Heartbeat call (server keepalive off)"
                            : "a TCP keepalive probe on its connection",
      repeat);
  std::fflush(stdout);
}

void PrintRun(const RunConfig& config, int repetition, const RunResult& result) {
  std::printf(
      "N=%d #%d: join %.1f ms (all sent by %.1f ms, first answer at %.1f ms; CPU: server "
      "%.0f ms, clients %.0f ms); server peak RSS %.1f MiB, idle %.1f%% of a core\n",
      config.nodes, repetition, result.last_assignment_ms, result.send_all_ms,
      result.first_assignment_ms, result.server_join_cpu_ms, result.client_join_cpu_ms,
      result.server_hwm_mib, result.idle_cpu_pct);
  if (result.heartbeat_cpu_pct >= 0 && !config.unary_heartbeats) {
    std::printf(
        "  liveness by watch stream, TCP keepalive probes every %g s and a ping from each "
        "node every %g s: server %.1f%% of a core (clients %.1f%%; the whole machine, "
        "kernel and other processes included, %.1f%%); %.2f TCP segments per connection "
        "and second\n",
        config.heartbeat_interval_s, absl::ToDoubleSeconds(kAgentKeepalive),
        result.heartbeat_cpu_pct, result.client_heartbeat_cpu_pct, result.machine_heartbeat_cpu_pct,
        result.segments_per_connection_s);
  } else if (result.heartbeat_cpu_pct >= 0) {
    std::printf("  unary heartbeats: server %.1f%% of a core (clients %.1f%%); %" PRId64
                " ok, %" PRId64 " failed; latency p50 %.2f ms, p99 %.2f ms\n",
                result.heartbeat_cpu_pct, result.client_heartbeat_cpu_pct, result.heartbeats_ok,
                result.heartbeats_failed, result.heartbeat_p50_ms, result.heartbeat_p99_ms);
  }
  if (!result.error.empty()) std::printf("  ERROR: %s\n", result.error.c_str());
  std::fflush(stdout);
}

void PrintHubOnly(int nodes, const absl::StatusOr<double>& ms) {
  if (ms.ok()) {
    std::printf(
        "N=%d: the same joins straight into an in-process RendezvousHub (no gRPC): %.1f ms\n",
        nodes, *ms);
  } else {
    std::printf("N=%d: hub alone: %s\n", nodes, ms.status().ToString().c_str());
  }
  std::fflush(stdout);
}

void PrintSummary(const RunConfig& base, const std::vector<Row>& rows) {
  PrintTable(rows);
  const Row* target = nullptr;
  for (const Row& row : rows) {
    if (row.nodes == kTargetNodes) target = &row;
  }
  if (target == nullptr) {
    std::printf("targets (issue 3) are for %d nodes: not measured in this run\n", kTargetNodes);
  } else {
    PrintTargets(base, *target);
  }
}

}  // namespace muster::rdzv::scale
