#include "allreduce/flags.h"

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "allreduce/backend.h"

namespace muster::allreduce {

absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args) {
  ParsedFlags parsed;
  AllReduceOptions& options = parsed.options;
  std::string backend = BackendName(options.backend);
  CLI::App app(
      "muster-allreduce: an all-reduce across every rank of the job, checked and timed "
      "like nccl-tests' all_reduce_perf. Run it under muster, torchrun or srun.",
      "muster-allreduce");
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
  // CLI11 wants the arguments reversed.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    parsed.print = app.help();
    return parsed;
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(absl::StrCat(error.what(), "; see muster-allreduce --help"));
  }
  absl::StatusOr<Backend> asked = ParseBackend(backend);  // CLI11 checked the name already
  if (!asked.ok()) return asked.status();
  options.backend = *asked;
  return parsed;
}

}  // namespace muster::allreduce
