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
#include <vector>

#include "allreduce/flags.h"
#include "allreduce/run.h"

namespace muster::allreduce {
namespace {

int Main(int argc, char** argv) {
  absl::StatusOr<ParsedFlags> parsed = ParseFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) {
    std::fprintf(stderr, "muster-allreduce: error: %s\n",
                 std::string(parsed.status().message()).c_str());
    return kExitUsage;
  }
  if (parsed->print) {
    std::fputs(parsed->print->c_str(), stdout);
    return 0;
  }
  return RunAllReduce(parsed->options);
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
