// What rdzv_scale prints: the setup, a line or two per run, the hub-only
// figure per N, then a table of medians and the targets of issue 3.
#ifndef MUSTER_BENCH_SCALE_REPORT_H_
#define MUSTER_BENCH_SCALE_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/scale_phases.h"
#include "bench/server_under_test.h"

namespace muster::rdzv::scale {

// Every repetition of one N, and what the table shows of them.
struct Row {
  int nodes = 0;
  std::vector<RunResult> runs;
  double hub_only_ms = -1;
  std::string error;  // empty: every run passed

  // The field of every run that measured it (>= 0).
  std::vector<double> Collect(double RunResult::*field) const;
  // Medians; -1 where no run measured it.
  double join_ms() const;
  double heartbeat_cpu_pct() const;
  double hwm_mib() const;
};

// What every run does, and where: the lines before the first run.
void PrintSetup(const RunConfig& base, int repeat, const ServerPlace& place);

// One run of config.nodes nodes, repetition `repetition` (from 1).
void PrintRun(const RunConfig& config, int repetition, const RunResult& result);

// The hub-only join time of `nodes` nodes, or why it is missing.
void PrintHubOnly(int nodes, const absl::StatusOr<double>& ms);

// The table of medians, one line per N, and the targets.
void PrintSummary(const RunConfig& base, const std::vector<Row>& rows);

}  // namespace muster::rdzv::scale

#endif  // MUSTER_BENCH_SCALE_REPORT_H_
