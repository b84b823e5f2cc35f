// What muster-allreduce prints: nccl-tests' table, one row per size as it
// finishes, and the --json file.
#ifndef MUSTER_ALLREDUCE_REPORT_H_
#define MUSTER_ALLREDUCE_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "allreduce/sweep.h"

namespace muster::allreduce {

struct SizeResult {
  int64_t bytes = 0;
  int64_t count = 0;
  DataType type = DataType::kFloat;
  double time_us = 0;  // out-of-place, averaged over iterations and ranks
  int64_t wrong = 0;   // summed over ranks
  double inplace_time_us = 0;
  int64_t inplace_wrong = 0;
};

// The two header lines of the table.
std::string TableHeader();
// One row: size, count, type, redop, then time, algbw, busbw and wrong for
// out-of-place and in-place.
std::string TableRow(const SizeResult& result, int ranks);
// The mean busbw over every row, out-of-place and in-place (nccl-tests'
// "Avg bus bandwidth").
double AverageBusBandwidth(const std::vector<SizeResult>& results, int ranks);

struct RunSummary {
  std::string backend;
  int world_size = 0;
  std::vector<std::string> hosts;    // by rank
  std::vector<std::string> devices;  // by rank: a GPU's bus id, or "cpu"
  std::vector<SizeResult> results;
};
// {"backend", "world_size", "hosts", "devices", "avg_busbw_gbps",
//  "results": [{"bytes", "count", "dtype", "time_us", "algbw_gbps",
//  "busbw_gbps", "wrong", "inplace": {"time_us", "algbw_gbps", "busbw_gbps",
//  "wrong"}}]}
std::string JsonReport(const RunSummary& summary);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_REPORT_H_
