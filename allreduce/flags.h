// muster-allreduce's command line, parsed with no side effect (unit-tested).
#ifndef MUSTER_ALLREDUCE_FLAGS_H_
#define MUSTER_ALLREDUCE_FLAGS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allreduce/run.h"

namespace muster::allreduce {

struct ParsedFlags {
  AllReduceOptions options;
  // Set for --help: print it to stdout and exit 0.
  std::optional<std::string> print;
};

// muster-allreduce's flags (`args` without the program's name), nccl-tests'
// spellings (-b -e -f -d -n -w). Errors are usage errors (exit 2). The
// sizes and the type stay text: the run parses them, and every rank
// compares their text.
absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_FLAGS_H_
