// muster-allreduce: proves every rank reaches every other and measures the
// all-reduce bandwidth, like nccl-tests' all_reduce_perf. Reads only the
// standard environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT), so it runs the same under muster, torchrun or srun.
//
// Exit status: 0 every result correct; 1 a wrong result, or a rank failed;
// 2 bad options or environment. Rank 0 sends its verdict to every rank, so
// each rank's status says it. main parses the flags; the run is run.h's.
#include <cstdio>
#include <new>
#include <string>

#include "CLI/CLI.hpp"
#include "allreduce/backend.h"
#include "allreduce/run.h"

namespace muster::allreduce {
namespace {

int Main(int argc, char** argv) {
  AllReduceOptions options;
  std::string backend = BackendName(options.backend);
  CLI::App app(
      "muster-allreduce: an all-reduce across every rank of the job, checked and timed "
      "like nccl-tests' all_reduce_perf. Run it under muster, torchrun or srun.");
  app.add_option("-b,--minbytes", options.min_bytes, "smallest size: 8, 64K, 1G")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", options.max_bytes, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", options.factor, "factor between sizes")->capture_default_str();
  app.add_option("-d,--datatype", options.dtype, "float, half, bfloat16 or double")
      ->capture_default_str();
  app.add_option("-n,--iters", options.iterations, "timed iterations per size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  app.add_option("-w,--warmup_iters", options.warmup, "untimed iterations first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1'000'000));
  app.add_option("--backend", backend,
                 "nccl, shm (shared memory, one machine), tcp, or auto: NCCL where every rank "
                 "has a GPU, else shared memory where all run on one machine, else TCP")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "nccl", "shm", "tcp"}));
  app.add_option("--timeout", options.timeout_s, "seconds to wait for a rank before failing")
      ->capture_default_str()
      ->check(CLI::Range(1, 86'400));
  app.add_option("--json", options.json, "write the results to FILE as JSON (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  absl::StatusOr<Backend> asked = ParseBackend(backend);  // CLI11 checked the name already
  if (!asked.ok()) {
    std::fprintf(stderr, "muster-allreduce: error: %s\n",
                 std::string(asked.status().message()).c_str());
    return kExitUsage;
  }
  options.backend = *asked;
  return RunAllReduce(options);
}

}  // namespace
}  // namespace muster::allreduce

int main(int argc, char** argv) {
  try {
    return muster::allreduce::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "muster-allreduce: error: out of memory for the buffers; lower -e\n");
    return muster::allreduce::kExitUsage;
  }
}
