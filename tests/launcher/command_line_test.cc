#include "launcher/command_line.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/launcher/env.h"

namespace muster {
namespace {

using ::testing::HasSubstr;

// What sbatch --nodes 2 --gres gpu:4 and srun --ntasks-per-node 1 set, on node 1.
const Env kSlurmNode1 = {{"SLURM_JOB_ID", "4242"},
                         {"SLURM_NNODES", "2"},
                         {"SLURM_NODEID", "1"},
                         {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                         {"SLURM_GPUS_ON_NODE", "4"},
                         {"SLURM_NTASKS_PER_NODE", "1"},
                         {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};

absl::StatusOr<CommandLine> Read(std::vector<std::string> args, const Env& env) {
  args.insert(args.begin(), "muster");
  return ReadCommandLine(args, [&env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

CommandLine Ok(std::vector<std::string> args, const Env& env) {
  absl::StatusOr<CommandLine> read = Read(std::move(args), env);
  EXPECT_TRUE(read.ok()) << read.status();
  return read.ok() ? *std::move(read) : CommandLine{};
}

TEST(ReadCommandLineTest, OutsideSlurmIsTheCommandLineAlone) {
  const CommandLine command = Ok({"--nnodes", "2", "train.py"}, {});
  EXPECT_FALSE(command.slurm);
  EXPECT_EQ(command.parsed.config.min_nodes, 2);
  EXPECT_EQ(command.parsed.config.rdzv_endpoint, "");
  EXPECT_FALSE(command.parsed.config.rdzv_conf.is_host);
  EXPECT_FALSE(command.parsed.config.in_slurm);
}

TEST(ReadCommandLineTest, TheAllocationFillsWhatNoFlagGives) {
  const CommandLine command = Ok({"train.py"}, kSlurmNode1);
  ASSERT_TRUE(command.slurm);
  const LaunchConfig& config = command.parsed.config;
  EXPECT_TRUE(config.in_slurm);  // munge, where munged runs
  EXPECT_EQ(config.min_nodes, 2);
  EXPECT_EQ(config.max_nodes, 2);
  EXPECT_EQ(config.node_rank, 1);
  EXPECT_EQ(config.rdzv_id, "4242");
  EXPECT_EQ(config.rdzv_backend, RdzvBackend::kMuster);
  EXPECT_EQ(config.rdzv_endpoint, "gpu07:24242");
  EXPECT_EQ(config.nproc_per_node, 4);
}

TEST(ReadCommandLineTest, FlagsAndTheUsersPetVariablesWinOverTheAllocation) {
  const CommandLine command =
      Ok({"--nproc-per-node", "2", "train.py"}, With(kSlurmNode1, "PET_RDZV_ID", "mine"));
  EXPECT_EQ(command.parsed.config.nproc_per_node, 2);
  EXPECT_EQ(command.parsed.config.rdzv_id, "mine");
}

TEST(ReadCommandLineTest, OnlyNodeZeroHostsTheAllocationsRendezvous) {
  EXPECT_EQ(Ok({"train.py"}, kSlurmNode1).parsed.config.rdzv_conf.is_host, false);
  EXPECT_EQ(
      Ok({"train.py"}, With(kSlurmNode1, "SLURM_NODEID", "0")).parsed.config.rdzv_conf.is_host,
      true);
}

TEST(ReadCommandLineTest, AnEndpointOfTheUsersLeavesHostingToTheUsualRules) {
  const CommandLine command = Ok({"--rdzv-endpoint", "gpu08:5000", "train.py"}, kSlurmNode1);
  EXPECT_EQ(command.parsed.config.rdzv_endpoint, "gpu08:5000");
  EXPECT_FALSE(command.parsed.config.rdzv_conf.is_host);
}

TEST(ReadCommandLineTest, IsHostGivenIsKeptOnSlurmsEndpoint) {
  const CommandLine command = Ok({"--rdzv-conf", "is_host=1", "train.py"}, kSlurmNode1);
  EXPECT_EQ(command.parsed.config.rdzv_conf.is_host, true);
}

TEST(ReadCommandLineTest, StandaloneIgnoresTheAllocation) {
  for (const Env& env : {kSlurmNode1, With(kSlurmNode1, "PET_STANDALONE", "1")}) {
    const std::vector<std::string> args =
        env.count("PET_STANDALONE") ? std::vector<std::string>{"train.py"}
                                    : std::vector<std::string>{"--standalone", "train.py"};
    const CommandLine command = Ok(args, env);
    EXPECT_FALSE(command.slurm);
    EXPECT_TRUE(command.parsed.config.standalone);
    EXPECT_EQ(command.parsed.config.min_nodes, 1);
  }
}

TEST(ReadCommandLineTest, MusterIgnoreSlurmIgnoresTheAllocation) {
  const CommandLine command = Ok({"train.py"}, With(kSlurmNode1, "MUSTER_IGNORE_SLURM", "1"));
  EXPECT_FALSE(command.slurm);
  EXPECT_EQ(command.parsed.config.min_nodes, 1);
  EXPECT_EQ(command.parsed.config.rdzv_endpoint, "");
}

TEST(ReadCommandLineTest, AnInconsistentAllocationSaysHowToIgnoreIt) {
  absl::StatusOr<CommandLine> read = Read({"train.py"}, With(kSlurmNode1, "SLURM_NODEID", "5"));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("MUSTER_IGNORE_SLURM=1"));
}

TEST(ReadCommandLineTest, ParseErrorsComeThrough) {
  absl::StatusOr<CommandLine> read = Read({"--nnodes", "3:1", "train.py"}, {});
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr("--nnodes"));
}

}  // namespace
}  // namespace muster
