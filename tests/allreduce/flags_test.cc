// muster-allreduce's command line: nccl-tests' spellings, parsed with no side effect.
#include "allreduce/flags.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::allreduce {
namespace {

using ::testing::HasSubstr;

TEST(AllReduceFlagsTest, TheDefaults) {
  absl::StatusOr<ParsedFlags> parsed = ParseFlags({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->print.has_value());
  const AllReduceOptions& options = parsed->options;
  EXPECT_EQ(options.min_bytes, "8");
  EXPECT_EQ(options.max_bytes, "32M");
  EXPECT_EQ(options.factor, 2);
  EXPECT_EQ(options.dtype, "float");
  EXPECT_EQ(options.iterations, 20);
  EXPECT_EQ(options.warmup, 5);
  EXPECT_EQ(options.backend, Backend::kAuto);
  EXPECT_EQ(options.timeout_s, 60);
  EXPECT_TRUE(options.json.empty());
}

TEST(AllReduceFlagsTest, NcclTestsSpellingsShortAndLong) {
  absl::StatusOr<ParsedFlags> parsed =
      ParseFlags({"-b", "64K", "-e", "1G", "-f", "4", "-d", "half", "-n", "3", "-w", "0",
                  "--backend", "shm", "--timeout", "5", "--json", "/r.json"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const AllReduceOptions& options = parsed->options;
  EXPECT_EQ(options.min_bytes, "64K");
  EXPECT_EQ(options.max_bytes, "1G");
  EXPECT_EQ(options.factor, 4);
  EXPECT_EQ(options.dtype, "half");
  EXPECT_EQ(options.iterations, 3);
  EXPECT_EQ(options.warmup, 0);
  EXPECT_EQ(options.backend, Backend::kShm);
  EXPECT_EQ(options.timeout_s, 5);
  EXPECT_EQ(options.json, "/r.json");
  absl::StatusOr<ParsedFlags> longs =
      ParseFlags({"--minbytes", "1M", "--maxbytes", "2M", "--stepfactor", "2", "--datatype",
                  "double", "--iters", "7", "--warmup_iters", "1"});
  ASSERT_TRUE(longs.ok()) << longs.status();
  EXPECT_EQ(longs->options.iterations, 7);
  EXPECT_EQ(longs->options.dtype, "double");
}

TEST(AllReduceFlagsTest, HelpIsPrinted) {
  absl::StatusOr<ParsedFlags> parsed = ParseFlags({"--help"});
  ASSERT_TRUE(parsed.ok() && parsed->print.has_value());
  EXPECT_THAT(*parsed->print, HasSubstr("--maxbytes"));
}

TEST(AllReduceFlagsTest, BadValuesAreUsageErrors) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--backend", "mpi"},
                                             {"-n", "0"},
                                             {"-w", "-1"},
                                             {"--timeout", "0"},
                                             {"--no-such-flag"}}) {
    absl::StatusOr<ParsedFlags> parsed = ParseFlags(args);
    ASSERT_FALSE(parsed.ok()) << args[0];
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << parsed.status();
    EXPECT_THAT(parsed.status().message(), HasSubstr("see muster-allreduce --help"));
  }
}

}  // namespace
}  // namespace muster::allreduce
