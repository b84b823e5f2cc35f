// One run of muster-allreduce, from its options to its exit status: the
// environment, the bootstrap, the backend, the sweep, the table and the
// verdict.
#ifndef MUSTER_ALLREDUCE_RUN_H_
#define MUSTER_ALLREDUCE_RUN_H_

#include <string>

#include "allreduce/backend.h"

namespace muster::allreduce {

// Exit status: 0 every result correct.
inline constexpr int kExitWrong = 1;  // a wrong result, or a rank failed
inline constexpr int kExitUsage = 2;  // bad options or environment

// The command line, as given (the sizes and the type are parsed by the run,
// and their text is what every rank compares).
struct AllReduceOptions {
  std::string min_bytes = "8";
  std::string max_bytes = "32M";
  int factor = 2;
  std::string dtype = "float";
  int iterations = 20;
  int warmup = 5;
  Backend backend = Backend::kAuto;
  int timeout_s = 60;
  std::string json;  // rank 0 writes the results there, when set
};

// Runs this rank's part: reads the standard environment (ReadWorkerEnv),
// bootstraps with rank 0, runs the sweep on the backend rank 0 chose, and on
// rank 0 prints the table and the verdict (and writes `json`). Returns the
// exit status; errors are printed to stderr, one line naming the rank.
int RunAllReduce(const AllReduceOptions& options);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_RUN_H_
