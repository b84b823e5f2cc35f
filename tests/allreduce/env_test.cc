#include "allreduce/env.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::allreduce {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::StatusOr<WorkerEnv> Read(const std::map<std::string, std::string>& vars) {
  return ReadWorkerEnv([&](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

const std::map<std::string, std::string> kGood = {{"RANK", "3"},
                                                  {"WORLD_SIZE", "8"},
                                                  {"LOCAL_RANK", "1"},
                                                  {"MASTER_ADDR", "10.0.0.1"},
                                                  {"MASTER_PORT", "29500"}};

TEST(ReadWorkerEnvTest, ReadsTheStandardVariables) {
  absl::StatusOr<WorkerEnv> env = Read(kGood);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
}

TEST(ReadWorkerEnvTest, BootstrapsOnMasterPort) {
  absl::StatusOr<WorkerEnv> env = Read(kGood);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->bootstrap_port, 29500);
  EXPECT_FALSE(env->agent_store);
  EXPECT_EQ(BootstrapPortName(*env), "MASTER_PORT 29500");
}

TEST(ReadWorkerEnvTest, BootstrapsOnTheNextPortWhereTheLaunchersStoreHoldsMasterPort) {
  auto vars = kGood;
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  absl::StatusOr<WorkerEnv> env = Read(vars);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->bootstrap_port, 29501);
  EXPECT_THAT(BootstrapPortName(*env),
              AllOf(HasSubstr("MASTER_PORT+1 29501"), HasSubstr("TORCHELASTIC_USE_AGENT_STORE")));
  // As in PyTorch, anything but "True" is false: muster sets "False".
  for (const char* value : {"False", "true", "1", ""}) {
    vars["TORCHELASTIC_USE_AGENT_STORE"] = value;
    env = Read(vars);
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_EQ(env->bootstrap_port, 29500) << value;
  }
}

// What srun sets for task 5 of 8 in job 4242, step 3, on the second node.
const std::map<std::string, std::string> kSrun = {{"SLURM_PROCID", "5"},
                                                  {"SLURM_NTASKS", "8"},
                                                  {"SLURM_STEP_NUM_TASKS", "8"},
                                                  {"SLURM_LOCALID", "1"},
                                                  {"SLURM_STEP_NODELIST", "gpu[07-10]"},
                                                  {"SLURM_JOB_NODELIST", "gpu[01-10]"},
                                                  {"SLURM_JOB_ID", "4242"},
                                                  {"SLURM_STEP_ID", "3"}};

TEST(ReadWorkerEnvTest, UnderSrunSlurmsVariablesStandIn) {
  absl::StatusOr<WorkerEnv> env = Read(kSrun);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "gpu07");  // the step's first node, not the job's
  EXPECT_EQ(env->master_port, 10000 + 42 * 100 + 3);
  EXPECT_EQ(env->bootstrap_port, env->master_port);
  EXPECT_EQ(env->job, "Slurm job 4242 step 3");
  EXPECT_THAT(env->under,
              AllOf(HasSubstr("under srun"), HasSubstr("RANK 5 (SLURM_PROCID)"),
                    HasSubstr("WORLD_SIZE 8 (SLURM_STEP_NUM_TASKS)"),
                    HasSubstr("MASTER_ADDR gpu07 (the first host of SLURM_STEP_NODELIST)")));
}

TEST(ReadWorkerEnvTest, UnderSrunEachStepHasAPortInItsOwnRange) {
  auto vars = kSrun;
  for (const auto& [job, step, port] : std::vector<std::tuple<const char*, const char*, int>>{
           {"4242", "4", 14204},
           {"4242", "104", 14204},  // steps wrap at 100
           {"99", "0", 19900},
           {"100", "0", 10000},
           {"4294967295", "99", 10000 + 95 * 100 + 99},
           {"123456789012345678", "7", 10000 + 78 * 100 + 7},  // no overflow
           {"4242", "x", 14200},                               // not a number: step 0
       }) {
    vars["SLURM_JOB_ID"] = job;
    vars["SLURM_STEP_ID"] = step;
    absl::StatusOr<WorkerEnv> env = Read(vars);
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_EQ(env->master_port, port) << job << "." << step;
    EXPECT_GE(env->master_port, 10000);
    EXPECT_LE(env->master_port, 19999);
  }
}

TEST(ReadWorkerEnvTest, UnderSrunTheStandardVariablesWin) {
  auto vars = kSrun;
  vars["MASTER_ADDR"] = "10.0.0.9";
  vars["MASTER_PORT"] = "29500";
  absl::StatusOr<WorkerEnv> env = Read(vars);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->master_addr, "10.0.0.9");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_EQ(env->rank, 5);
  EXPECT_THAT(env->under, ::testing::Not(HasSubstr("MASTER")));
  // A launcher inside the step (muster, torchrun) sets RANK: Slurm's are ignored.
  absl::StatusOr<WorkerEnv> launched = Read([] {
    auto both = kGood;
    both.insert(kSrun.begin(), kSrun.end());
    return both;
  }());
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_EQ(launched->rank, 3);
  EXPECT_EQ(launched->world_size, 8);
  EXPECT_EQ(launched->master_addr, "10.0.0.1");
  EXPECT_TRUE(launched->under.empty());
}

TEST(ReadWorkerEnvTest, TheBatchScriptItselfIsNoSrunTask) {
  // sbatch's script has SLURM_PROCID=0 and SLURM_NTASKS, but no step.
  auto batch = kSrun;
  batch["SLURM_PROCID"] = "0";
  batch.erase("SLURM_STEP_NUM_TASKS");
  batch.erase("SLURM_STEP_ID");
  batch.erase("SLURM_STEP_NODELIST");
  EXPECT_THAT(Read(batch).status().message(),
              AllOf(HasSubstr("WORLD_SIZE is not set"), HasSubstr("srun")));
}

TEST(ReadWorkerEnvTest, TheJobIsTheLaunchersRunId) {
  auto vars = kGood;
  vars["TORCHELASTIC_RUN_ID"] = "check-7";
  EXPECT_EQ(Read(vars)->job, "check-7");
  EXPECT_EQ(Read(kGood)->job, "");
}

TEST(ReadWorkerEnvTest, UnderSrunMissingOrBadVariablesAreNamed) {
  for (const char* job : {"", "abc", "-3"}) {
    auto bad_job = kSrun;
    bad_job["SLURM_JOB_ID"] = job;
    EXPECT_THAT(Read(bad_job).status().message(),
                AllOf(HasSubstr("SLURM_JOB_ID"), HasSubstr("set MASTER_PORT")))
        << job;
    bad_job["MASTER_PORT"] = "29500";  // then no port is needed from it
    EXPECT_TRUE(Read(bad_job).ok()) << job;
  }
  auto bad_list = kSrun;
  bad_list["SLURM_STEP_NODELIST"] = "gpu[07-";
  EXPECT_THAT(Read(bad_list).status().message(), HasSubstr("SLURM_STEP_NODELIST"));
  auto no_list = kSrun;
  no_list.erase("SLURM_STEP_NODELIST");
  no_list.erase("SLURM_JOB_NODELIST");
  EXPECT_THAT(Read(no_list).status().message(), HasSubstr("MASTER_ADDR is not set"));
}

TEST(ReadWorkerEnvTest, OneRankNeedsNoMaster) {
  absl::StatusOr<WorkerEnv> env = Read({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->local_rank, 0);
}

TEST(ReadWorkerEnvTest, EachBadVariableIsNamedWithTheFix) {
  auto without = [](const char* name) {
    auto vars = kGood;
    vars.erase(name);
    return vars;
  };
  auto with = [](const char* name, const char* value) {
    auto vars = kGood;
    vars[name] = value;
    return vars;
  };
  struct Case {
    std::map<std::string, std::string> vars;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {without("WORLD_SIZE"), "WORLD_SIZE is not set"},
           {without("RANK"), "RANK is not set"},
           {without("MASTER_ADDR"), "MASTER_ADDR is not set"},
           {without("MASTER_PORT"), "MASTER_PORT is not set"},
           {with("RANK", "8"), "RANK=8 but WORLD_SIZE=8"},
           {with("MASTER_PORT", "http"), "MASTER_PORT='http' is not a number"},
           {with("MASTER_PORT", "70000"), "MASTER_PORT='70000'"},
           {with("WORLD_SIZE", "0"), "WORLD_SIZE='0'"},
           {with("LOCAL_RANK", "-1"), "LOCAL_RANK='-1'"},
           {[] {
              auto vars = kGood;
              vars["MASTER_PORT"] = "65535";
              vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
              return vars;
            }(),
            "MASTER_PORT+1"},
       }) {
    absl::StatusOr<WorkerEnv> env = Read(c.vars);
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_THAT(env.status().message(), AllOf(HasSubstr(c.says), HasSubstr("launcher"))) << c.says;
  }
}

}  // namespace
}  // namespace muster::allreduce
