// The simulator: runs schedules drawn from consecutive seeds and checks
// every invariant after every step (simulation.h). Ends with one line,
// "N schedules, M violations"; exits 1 when M > 0. A schedule that breaks
// an invariant is printed with its seed, then shrunk to its fewest faults
// and printed again with its steps: `--seed S --trace` replays it.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "tests/sim/simulation.h"

namespace {

using muster::sim::Breakage;

void Print(const std::string& text) { std::printf("%s\n", text.c_str()); }

// One schedule that broke an invariant: what it was, what broke, and the
// shortest schedule that still breaks it, step by step.
void Report(const muster::sim::Schedule& schedule, const muster::sim::Outcome& outcome,
            const muster::sim::RunOptions& options, bool shrink) {
  Print("VIOLATION in " + muster::sim::Describe(schedule));
  for (const std::string& violation : outcome.violations) Print("  " + violation);
  if (!shrink) return;
  const muster::sim::Schedule shortest = muster::sim::Shrink(schedule, options);
  muster::sim::RunOptions traced = options;
  traced.trace = true;
  const muster::sim::Outcome replay = muster::sim::Simulate(shortest, traced);
  Print("shortest schedule that shows it: " + muster::sim::Describe(shortest));
  for (const std::string& line : replay.trace) Print("    " + line);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"muster's deterministic simulator: schedules of faults against the real rules"};
  uint64_t first = 1;
  uint64_t schedules = 10'000;
  std::optional<uint64_t> seed;
  bool trace = false;
  bool shrink = true;
  std::string breakage = "none";
  app.add_option("--first", first, "the first seed (default 1)");
  app.add_option("--schedules", schedules, "how many seeds from --first (default 10000)");
  app.add_option("--seed", seed, "run only this seed (a replay)");
  app.add_flag("--trace", trace, "print every step of each schedule run");
  app.add_flag("!--no-shrink", shrink, "do not shrink a schedule that breaks an invariant");
  bool verbose = false;
  app.add_flag("--verbose", verbose, "keep the rendezvous' own log lines (stderr)");
  app.add_option("--break", breakage,
                 "break a rule on purpose, to check the checker: none, restart-count")
      ->check(CLI::IsMember({"none", "restart-count"}));
  CLI11_PARSE(app, argc, argv);
  muster::SetLogLevel(verbose ? spdlog::level::debug : spdlog::level::off);

  muster::sim::RunOptions options;
  options.breakage =
      breakage == "restart-count" ? Breakage::kRestartCountNotJournaled : Breakage::kNone;
  options.trace = trace;
  if (seed) {
    first = *seed;
    schedules = 1;
  }
  const absl::Time started = absl::Now();
  uint64_t violations = 0;
  uint64_t failing = 0;
  uint64_t digest = 0;
  int64_t steps = 0;
  for (uint64_t s = first; s < first + schedules; ++s) {
    const muster::sim::Schedule schedule = muster::sim::DrawSchedule(s);
    const muster::sim::Outcome outcome = muster::sim::Simulate(schedule, options);
    digest = digest * 31 + outcome.digest;
    steps += outcome.steps;
    if (trace) {
      Print(muster::sim::Describe(schedule));
      for (const std::string& line : outcome.trace) Print("    " + line);
    }
    if (outcome.violations.empty()) continue;
    violations += outcome.violations.size();
    // The first few are shrunk: each takes as many runs as it has faults, squared.
    Report(schedule, outcome, options, shrink && ++failing <= 3);
  }
  std::printf("seeds %llu..%llu, %lld steps, digest %016llx, %.1f s\n",
              static_cast<unsigned long long>(first),
              static_cast<unsigned long long>(first + schedules - 1), static_cast<long long>(steps),
              static_cast<unsigned long long>(digest),
              absl::ToDoubleSeconds(absl::Now() - started));
  std::printf("%llu schedules, %llu violations\n", static_cast<unsigned long long>(schedules),
              static_cast<unsigned long long>(violations));
  return violations == 0 ? 0 : 1;
}
