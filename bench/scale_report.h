// What rdzv_scale prints: the setup, a line or two per run, the hub-only
// figure per N, then a table of medians and the targets of issues 3 and 12.
#ifndef MUSTER_BENCH_SCALE_REPORT_H_
#define MUSTER_BENCH_SCALE_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/scale_phases.h"
#include "bench/server_under_test.h"

namespace muster::rdzv::scale {

// Every repetition of one N, with a journal or without, and what the table
// shows of them.
struct Row {
  int nodes = 0;
  bool journal = false;  // the server kept its jobs (--state-dir)
  std::vector<RunResult> runs;
  double hub_only_ms = -1;
  std::string error;  // empty: every run passed

  // The field of every run that measured it (>= 0).
  std::vector<double> Collect(double RunResult::*field) const;
  // Medians; -1 where no run measured it.
  double join_ms() const;
  double heartbeat_cpu_pct() const;
  double hwm_mib() const;
  // The median of `field` over the runs that measured it; -1 if none did.
  double MedianOf(double RunResult::*field) const;
};

// Where the journals go, and what the disk under them costs.
struct StateSetup {
  std::string parent;        // --state-dir; empty: no journal
  bool baseline = false;     // each journaled run alternates with one without
  double fdatasync_ms = -1;  // FdatasyncMs; -1: not measured
  std::string fdatasync_error;
};

// What every run does, and where: the lines before the first run.
void PrintSetup(const RunConfig& base, int repeat, const ServerPlace& place,
                const StateSetup& state);

// One run of config.nodes nodes, repetition `repetition` (from 1).
void PrintRun(const RunConfig& config, int repetition, const RunResult& result);

// The hub-only join time of `nodes` nodes, with a journal or without, or why it is missing.
void PrintHubOnly(int nodes, bool journal, const absl::StatusOr<double>& ms);

// The table of medians, one line per N, and the targets.
void PrintSummary(const RunConfig& base, const std::vector<Row>& rows);

}  // namespace muster::rdzv::scale

#endif  // MUSTER_BENCH_SCALE_REPORT_H_
