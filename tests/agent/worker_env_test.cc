#include "agent/worker_env.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muster {
namespace {

using ::testing::ElementsAre;

std::map<std::string, std::string> AsMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> out;
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    out[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return out;
}

NodePlacement TwoNodes() {
  NodePlacement placement;
  placement.group_rank = 1;
  placement.group_world_size = 2;
  placement.rank_base = 4;
  placement.world_size = 6;
  placement.master_addr = "10.0.0.1";
  placement.master_port = 29501;
  placement.restart_count = 2;
  placement.max_restarts = 3;
  return placement;
}

WorkerIdentity Worker(int local_rank, int local_world_size) {
  WorkerIdentity worker;
  worker.local_rank = local_rank;
  worker.local_world_size = local_world_size;
  worker.run_id = "job7";
  worker.role = "trainer";
  worker.error_file = "/logs/attempt_2/1/error.json";
  worker.progress_file = "/logs/attempt_2/1/progress";
  return worker;
}

TEST(WorkerEnvironmentTest, SetsEveryTorchrunVariable) {
  auto env = AsMap(WorkerEnvironment({"PATH=/bin"}, TwoNodes(), Worker(1, 2)));
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["ROLE_RANK"], "5");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "6");
  EXPECT_EQ(env["ROLE_NAME"], "trainer");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(env["WORLD_SIZE"], "6");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29501");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job7");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/logs/attempt_2/1/error.json");
  EXPECT_EQ(env["MUSTER_PROGRESS_FILE"], "/logs/attempt_2/1/progress");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["PATH"], "/bin");
}

TEST(WorkerEnvironmentTest, OursReplaceTheAgentsButUserSettingsStay) {
  auto env = AsMap(
      WorkerEnvironment({"RANK=99", "OMP_NUM_THREADS=4", "NCCL_ASYNC_ERROR_HANDLING=0", "X=a=b"},
                        TwoNodes(), Worker(0, 2)));
  EXPECT_EQ(env["RANK"], "4");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(env["X"], "a=b");
}

TEST(WorkerEnvironmentTest, OneWorkerGetsNoOmpSetting) {
  auto env = AsMap(WorkerEnvironment({}, TwoNodes(), Worker(0, 1)));
  EXPECT_FALSE(env.contains("OMP_NUM_THREADS"));
}

// --preload's interpreter imports with what every worker of the node gets
// alike (libgomp reads OMP_NUM_THREADS as it loads), and no rank's own.
TEST(WorkerEnvironmentTest, ThePreloadedInterpreterGetsTheNodesSettingsOnly) {
  auto env = AsMap(PreloadEnvironment({"PATH=/bin", "NCCL_ASYNC_ERROR_HANDLING=0"}, 2));
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["NCCL_ASYNC_ERROR_HANDLING"], "0") << "the user's setting stays";
  EXPECT_FALSE(env.contains("RANK"));
  EXPECT_FALSE(env.contains("LOCAL_RANK"));
  EXPECT_FALSE(AsMap(PreloadEnvironment({"OMP_NUM_THREADS=4"}, 2)).contains("RANK"));
  EXPECT_EQ(AsMap(PreloadEnvironment({"OMP_NUM_THREADS=4"}, 2))["OMP_NUM_THREADS"], "4");
  EXPECT_FALSE(AsMap(PreloadEnvironment({}, 1)).contains("OMP_NUM_THREADS"));
}

TEST(WorkerEnvironmentTest, EachVariableOnce) {
  std::vector<std::string> env = WorkerEnvironment({"RANK=1", "RANK=2"}, TwoNodes(), Worker(0, 2));
  EXPECT_EQ(env.size(), AsMap(env).size());
}

// --signals-to-handle reaches workers as torchrun 2.9 and later pass it.
TEST(WorkerEnvironmentTest, SignalsToHandle) {
  WorkerIdentity worker = Worker(0, 2);
  EXPECT_FALSE(
      AsMap(WorkerEnvironment({}, TwoNodes(), worker)).contains("TORCHELASTIC_SIGNALS_TO_HANDLE"));
  worker.signals_to_handle = "SIGTERM,SIGUSR1";
  EXPECT_EQ(AsMap(WorkerEnvironment({"TORCHELASTIC_SIGNALS_TO_HANDLE=SIGINT"}, TwoNodes(),
                                    worker))["TORCHELASTIC_SIGNALS_TO_HANDLE"],
            "SIGTERM,SIGUSR1");
}

// --virtual-local-rank, as torchrun's _set_local_rank_env.
TEST(WorkerEnvironmentTest, VirtualLocalRankNarrowsTheDevices) {
  WorkerIdentity worker = Worker(1, 2);
  worker.virtual_local_rank = true;
  auto env = AsMap(WorkerEnvironment({"CUDA_VISIBLE_DEVICES=4, 6"}, TwoNodes(), worker));
  EXPECT_EQ(env["LOCAL_RANK"], "0");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "6");
  EXPECT_EQ(env["RANK"], "5");  // the rest as ever
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
  // Unset: the worker's own index.
  EXPECT_EQ(AsMap(WorkerEnvironment({}, TwoNodes(), worker))["CUDA_VISIBLE_DEVICES"], "1");
  // Off: LOCAL_RANK as ever, CUDA_VISIBLE_DEVICES as the agent has it.
  worker.virtual_local_rank = false;
  env = AsMap(WorkerEnvironment({"CUDA_VISIBLE_DEVICES=4,6"}, TwoNodes(), worker));
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "4,6");
}

TEST(WorkerEnvironmentTest, VirtualLocalRankNeedsADeviceForEachWorker) {
  EXPECT_EQ(VirtualLocalRankProblem(std::nullopt, 8), "");
  EXPECT_EQ(VirtualLocalRankProblem("0,1", 2), "");
  EXPECT_EQ(VirtualLocalRankProblem("0,1,2", 4),
            "--virtual-local-rank gives each worker one device of CUDA_VISIBLE_DEVICES=0,1,2, "
            "which names 3 for 4 workers; give --nproc-per-node 3 or name a device for each "
            "worker");
}

TEST(WorkerCommandTest, PythonScript) {
  LaunchConfig config;
  config.script = "train.py";
  config.script_args = {"--lr", "0.1", "--shard=${local_rank}"};
  EXPECT_THAT(WorkerCommand(config, "/usr/bin/python3", 3),
              ElementsAre("/usr/bin/python3", "-u", "train.py", "--lr", "0.1", "--shard=3"));
}

TEST(WorkerCommandTest, Module) {
  LaunchConfig config;
  config.module = true;
  config.script = "pkg.train";
  EXPECT_THAT(WorkerCommand(config, "python3", 0), ElementsAre("python3", "-u", "-m", "pkg.train"));
}

TEST(WorkerCommandTest, NoPython) {
  LaunchConfig config;
  config.no_python = true;
  config.script = "./a.out";
  config.script_args = {"${local_rank}${local_rank}"};
  EXPECT_THAT(WorkerCommand(config, "./a.out", 1), ElementsAre("./a.out", "11"));
}

// torchrun runs every argument through string.Template: $local_rank too, and $$ is a $.
TEST(WorkerCommandTest, ArgumentsGoThroughTorchrunsTemplate) {
  LaunchConfig config;
  config.no_python = true;
  config.script = "./a.out";
  config.script_args = {"$local_rank", "$$HOME", "${rank}", "$5"};
  EXPECT_THAT(WorkerCommand(config, "./a.out", 2),
              ElementsAre("./a.out", "2", "$HOME", "${rank}", "$5"));
  config.no_python = false;
  config.script = "train_$local_rank.py";
  EXPECT_THAT(WorkerCommand(config, "python3", 2),
              ElementsAre("python3", "-u", "train_2.py", "2", "$HOME", "${rank}", "$5"));
}

TEST(EnvEntriesTest, FindAndSetMatchTheWholeName) {
  std::vector<std::string> env = {"PATH=/bin", "TORCH_NCCL=x", "TORCH=1", "EMPTY="};
  EXPECT_EQ(FindEnv(env, "TORCH"), "1");
  EXPECT_EQ(FindEnv(env, "EMPTY"), "");
  EXPECT_EQ(FindEnv(env, "TORC"), std::nullopt);
  EXPECT_EQ(FindEnv(env, "MISSING"), std::nullopt);
  SetEnv(env, "TORCH", "2");
  SetEnv(env, "NEW", "a=b");
  EXPECT_THAT(env, ElementsAre("PATH=/bin", "TORCH_NCCL=x", "TORCH=2", "EMPTY=", "NEW=a=b"));
  EXPECT_EQ(FindEnv(env, "NEW"), "a=b");
}

}  // namespace
}  // namespace muster
