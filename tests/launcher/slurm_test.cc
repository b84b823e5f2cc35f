#include "launcher/slurm.h"

#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/launcher/env.h"

namespace muster {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<std::optional<SlurmJob>> Detect(const Env& vars) {
  return DetectSlurm([&](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

// What sbatch --nodes 2 --gres gpu:4 and srun --ntasks-per-node 1 set.
const Env kTwoNodes = {{"SLURM_JOB_ID", "4242"},
                       {"SLURM_NNODES", "2"},
                       {"SLURM_NODEID", "1"},
                       {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                       {"SLURM_GPUS_ON_NODE", "4"},
                       {"SLURM_NTASKS_PER_NODE", "1"},
                       {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};

TEST(DetectSlurmTest, OutsideAnAllocationThereIsNothing) {
  absl::StatusOr<std::optional<SlurmJob>> job = Detect({{"PATH", "/bin"}});
  ASSERT_TRUE(job.ok());
  EXPECT_FALSE(job->has_value());
}

TEST(DetectSlurmTest, ReadsTheJobTheNodesAndTheGpus) {
  absl::StatusOr<std::optional<SlurmJob>> job = Detect(kTwoNodes);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(job->has_value());
  const SlurmJob& j = **job;
  EXPECT_EQ(j.job_id, "4242");
  EXPECT_EQ(j.nnodes, 2);
  EXPECT_EQ(j.node_id, 1);
  EXPECT_THAT(j.hosts, ElementsAre("gpu07", "gpu08"));
  EXPECT_EQ(j.rendezvous_host(), "gpu07");
  EXPECT_EQ(j.nproc, 4);
  EXPECT_EQ(j.port, 20000 + 4242);
  EXPECT_THAT(j.Describe(), AllOf(HasSubstr("SLURM_JOB_ID"), HasSubstr("gpu07:24242"),
                                  HasSubstr("SLURM_GPUS_ON_NODE=4"), HasSubstr("override")));
}

TEST(DetectSlurmTest, GpusFromEachVariableInTurn) {
  Env base = Without(kTwoNodes, "SLURM_GPUS_ON_NODE");
  EXPECT_EQ((*Detect(With(base, "SLURM_GPUS_PER_NODE", "a100:8")))->nproc, 8);
  EXPECT_EQ((*Detect(With(base, "SLURM_GPUS_PER_NODE", "gpu:2")))->nproc, 2);
  EXPECT_EQ((*Detect(With(base, "CUDA_VISIBLE_DEVICES", "0,1,2")))->nproc, 3);
  EXPECT_EQ((*Detect(base))->nproc, 1);
  EXPECT_EQ(Detect(With(base, "SLURM_GPUS_PER_NODE", "gpu:many")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DetectSlurmTest, TheOlderNodelistVariableAndArrayJobIds) {
  Env old = Without(kTwoNodes, "SLURM_JOB_NODELIST");
  old["SLURM_NODELIST"] = "a1-ib,a2-ib";
  EXPECT_THAT((*Detect(old))->hosts, ElementsAre("a1-ib", "a2-ib"));
  const int port = SlurmRendezvousPort("4242_7");
  EXPECT_GE(port, 20000);
  EXPECT_LT(port, 30000);
  EXPECT_EQ(port, SlurmRendezvousPort("4242_7")) << "every node derives the same port";
}

TEST(DetectSlurmTest, OneNodeWithoutANodeIdIsNodeZero) {
  // What salloc --nodes=1 leaves in its shell.
  Env one = {{"SLURM_JOB_ID", "7"}, {"SLURM_NNODES", "1"}, {"SLURM_JOB_NODELIST", "gpu01"}};
  absl::StatusOr<std::optional<SlurmJob>> job = Detect(one);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)->node_id, 0);
}

TEST(DetectSlurmTest, InconsistentEnvironmentsNameTheVariables) {
  struct Case {
    Env vars;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {With(kTwoNodes, "SLURM_JOB_NODELIST", "n[1-3]"),
            "SLURM_NNODES=2 but SLURM_JOB_NODELIST"},
           {With(kTwoNodes, "SLURM_NODEID", "2"), "SLURM_NODEID=2 but SLURM_NNODES=2"},
           {With(kTwoNodes, "SLURM_NNODES", "two"), "SLURM_NNODES=two"},
           {Without(kTwoNodes, "SLURM_NODEID"), "SLURM_NODEID=(unset)"},
           {With(kTwoNodes, "SLURM_JOB_NODELIST", "gpu[1-"), "SLURM_JOB_NODELIST"},
           {With(kTwoNodes, "SLURM_NTASKS_PER_NODE", "2"), "SLURM_NTASKS_PER_NODE=2"},
           {With(kTwoNodes, "SLURM_STEP_TASKS_PER_NODE", "2(x2)"), "more than one muster"},
       }) {
    absl::StatusOr<std::optional<SlurmJob>> job = Detect(c.vars);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_THAT(job.status().message(), AllOf(HasSubstr(c.says), HasSubstr("Slurm"))) << c.says;
  }
}

}  // namespace
}  // namespace muster
