#include "worker/env.h"

#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::worker {
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
}  // namespace muster::worker
