// Rank 0's gather: what it makes of what the other ranks send it. At the
// start, each rank's Hello: whom it takes, and the Welcome every rank gets
// (two ranks on one GPU, a backend some rank cannot use, stop the job).
// After each size, each rank's report: the row of the table. Pure: the
// sockets are bootstrap.cc's and run.cc's.
#ifndef MUSTER_ALLREDUCE_GATHER_H_
#define MUSTER_ALLREDUCE_GATHER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allreduce/allreduce.pb.h"
#include "allreduce/backend.h"
#include "allreduce/report.h"
#include "allreduce/runner.h"
#include "allreduce/sweep.h"

namespace muster::allreduce {

// What rank 0 does with a Hello.
enum class HelloVerdict {
  kTake,      // one of this job's ranks, not seen before
  kTurnAway,  // another job's rank, at this job's port: told why, and this job goes on
  kStopJob,   // this job is set up wrong: told why, as is every rank, and the job stops
};

struct HelloCheck {
  HelloVerdict verdict = HelloVerdict::kTake;
  absl::Status reason;  // what the rank is told (kInvalidArgument); OK for kTake
};

// Checks `hello` against rank 0's own `root` Hello: the same job (else
// kTurnAway), the same WORLD_SIZE and a RANK in range that has not arrived
// yet (`arrived[r]`; else kStopJob), the same sweep (else kStopJob).
// `root_endpoint` is where rank 0 listens ("10.0.0.1:29501"), for messages.
// REQUIRES: arrived.size() == root.world_size().
HelloCheck CheckHello(const Hello& root, const Hello& hello, const std::vector<bool>& arrived,
                      absl::string_view root_endpoint);

// "job <id>", or "a job with no id": for messages.
std::string JobName(const std::string& job);

// The Welcome for every rank, from every rank's Hello (by rank; rank 0's is
// hellos[0]) and the address each connected from (rank 0's: MASTER_ADDR):
// the peers and the backend (ChooseBackend, rank 0's machine against each
// rank's). It leaves the backend's own fields (nccl_id, shm_name) to the
// caller. Errors, which every rank is told: two ranks on one GPU
// (CheckDistinctDevices), a backend asked that some rank cannot use.
// REQUIRES: hellos.size() == addrs.size() >= 1.
absl::StatusOr<Welcome> PlanWelcome(const std::vector<Hello>& hellos,
                                    const std::vector<std::string>& addrs, Backend asked);

// Rank 0's row for one size, before the other ranks' reports: its own result.
SizeResult OwnRow(const SweepSize& size, DataType type, const LocalResult& local);

// Adds another rank's report to `row`: times and wrong values summed.
// kUnavailable "<rank_name> failed: <its error>" when that rank failed;
// `row` is then unchanged.
absl::Status AddReport(const SizeReport& report, absl::string_view rank_name, SizeResult& row);

// The times of `row` averaged over `world_size` ranks, once every rank's
// report is in; wrong values stay summed.
void AverageTimes(int world_size, SizeResult& row);

// Wrong values over every row, out-of-place and in-place: 0 is the verdict OK.
int64_t WrongValues(const std::vector<SizeResult>& rows);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_GATHER_H_
