#include "launcher/accelerate_config.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/accelerate_file.h"
#include "launcher/command_line.h"
#include "tests/launcher/env.h"

namespace muster {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Key;
using ::testing::Not;
using ::testing::Pair;

constexpr char kMultiGpu[] = R"(compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
mixed_precision: bf16
num_machines: 1
num_processes: 4
machine_rank: 0
gpu_ids: all
same_network: true
enable_cpu_affinity: true
rdzv_backend: static
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: max-autotune
  dynamo_use_fullgraph: true
)";

// The variables of `env` as an environment.
EnvLookup LookupIn(Env env) {
  return [env = std::move(env)](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

ConfigValue Parse(const std::string& text, const std::string& name = "config.yaml") {
  absl::StatusOr<ConfigValue> parsed = ParseAccelerateConfig(text, name);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? *parsed : ConfigValue{};
}

struct Machine {
  Env env;
  int slurm_nodes = 0;
  std::set<std::string> flags;
  std::vector<int> busy_ports;
};

// The torchrun options accelerate passes whatever the environment says.
Env WithAcceleratesOwn(Env options, bool slurm = false) {
  options.insert({{"PET_MAX_RESTARTS", "0"},
                  {"PET_MONITOR_INTERVAL", "0.1"},
                  {"PET_ROLE", "default"},
                  {"PET_TEE", "0"},
                  {"PET_RDZV_CONF", ""},
                  {"PET_LOG_DIR", ""},
                  {"PET_MODULE", ""},
                  {"PET_NO_PYTHON", ""}});
  if (!slurm) options.insert({"PET_RDZV_BACKEND", "static"});
  return options;
}

absl::StatusOr<AccelerateLaunch> Translate(const std::string& text, const Machine& machine = {},
                                           const std::string& name = "config.yaml") {
  AccelerateInputs inputs;
  inputs.env = LookupIn(machine.env);
  inputs.slurm_nodes = machine.slurm_nodes;
  inputs.flags = machine.flags;
  inputs.free_port = [] { return 40123; };
  inputs.port_in_use = [&machine](int port) {
    return std::find(machine.busy_ports.begin(), machine.busy_ports.end(), port) !=
           machine.busy_ports.end();
  };
  inputs.cwd = "/home/me/project";
  inputs.physical_cores = 16;
  return TranslateAccelerateConfig(Parse(text, name), name, inputs);
}

AccelerateLaunch Ok(const std::string& text, const Machine& machine = {},
                    const std::string& name = "config.yaml") {
  absl::StatusOr<AccelerateLaunch> launch = Translate(text, machine, name);
  EXPECT_TRUE(launch.ok()) << launch.status();
  return launch.ok() ? *launch : AccelerateLaunch{};
}

std::string Error(const std::string& text, const Machine& machine = {}) {
  absl::StatusOr<AccelerateLaunch> launch = Translate(text, machine);
  EXPECT_FALSE(launch.ok());
  EXPECT_EQ(launch.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(launch.status().message());
}

TEST(ConfigValueTest, RendersAsPythonsStr) {
  EXPECT_EQ(ConfigValue::Bool(true).PythonStr(), "True");
  EXPECT_EQ(ConfigValue::Int(-3).PythonStr(), "-3");
  EXPECT_EQ(ConfigValue::Float(1.0).PythonStr(), "1.0");
  EXPECT_EQ(ConfigValue::Float(0.5).PythonStr(), "0.5");
  EXPECT_EQ(ConfigValue::Float(1e-5).PythonStr(), "1e-05");
  EXPECT_EQ(ConfigValue::Float(0.0001).PythonStr(), "0.0001");
  EXPECT_EQ(ConfigValue::Float(1e16).PythonStr(), "1e+16");
  EXPECT_EQ(ConfigValue::Float(123456789012345.0).PythonStr(), "123456789012345.0");
  EXPECT_EQ(ConfigValue::Float(-2.5e20).PythonStr(), "-2.5e+20");
  EXPECT_EQ(ConfigValue::Float(HUGE_VAL).PythonStr(), "inf");
  EXPECT_EQ(ConfigValue::None().PythonStr(), "None");
  ConfigValue list;
  list.kind = ConfigValue::Kind::kList;
  list.items = {ConfigValue::String("BertLayer"), ConfigValue::String("it's"), ConfigValue::Int(2)};
  EXPECT_EQ(list.PythonStr(), "['BertLayer', \"it's\", 2]");
}

TEST(ConfigValueTest, PlainScalarsAreTypedAsPyYamlSafeLoaderTypesThem) {
  EXPECT_EQ(TypePlainScalar("NO", false).kind, ConfigValue::Kind::kBool);  // YAML 1.1
  EXPECT_FALSE(TypePlainScalar("off", false).boolean);
  EXPECT_TRUE(TypePlainScalar("Yes", false).boolean);
  EXPECT_EQ(TypePlainScalar("~", false).kind, ConfigValue::Kind::kNone);
  EXPECT_EQ(TypePlainScalar("", false).kind, ConfigValue::Kind::kNone);
  EXPECT_EQ(TypePlainScalar("1_000", false).integer, 1000);
  EXPECT_EQ(TypePlainScalar("0x1f", false).integer, 31);
  EXPECT_EQ(TypePlainScalar("010", false).integer, 8);
  EXPECT_EQ(TypePlainScalar("1.0", false).kind, ConfigValue::Kind::kFloat);
  EXPECT_EQ(TypePlainScalar("1e8", false).kind, ConfigValue::Kind::kString);  // no dot: a string
  EXPECT_EQ(TypePlainScalar("0,1", false).text, "0,1");
  // Each as PyYAML 6 (python3-yaml) reads it.
  const std::map<std::string, std::string> seen = {
      {"1.5e+3", "1500.0"},  {"1.5e3", "'1.5e3'"}, {".5", "0.5"},      {"-.inf", "-inf"},
      {"+1_0", "10"},        {"0o17", "'0o17'"},   {"1.", "1.0"},      {"_1", "'_1'"},
      {"0b101", "5"},        {"0x_1F", "31"},      {"08", "'08'"},     {"-0", "0"},
      {"1_000.5", "1000.5"}, {".e1", "'.e1'"},     {"1e+5", "'1e+5'"}, {"0.", "0.0"},
      {"-.5", "'-.5'"}};
  for (const auto& [text, python] : seen) {
    const ConfigValue value = TypePlainScalar(text, false);
    const std::string shown =
        value.kind == ConfigValue::Kind::kString ? "'" + value.text + "'" : value.PythonStr();
    EXPECT_EQ(shown, python) << text;
  }
  EXPECT_EQ(TypePlainScalar("1e8", true).kind, ConfigValue::Kind::kFloat);  // JSON's number
  EXPECT_EQ(TypePlainScalar("NO", true).kind, ConfigValue::Kind::kString);
}

TEST(AccelerateFileTest, QuotedScalarsStayStringsAndJsonReadsAsJson) {
  const ConfigValue yaml = Parse("downcast_bf16: 'no'\nfp16: no\nnested:\n  a: [1, 'b']\n");
  ASSERT_EQ(yaml.kind, ConfigValue::Kind::kMap);
  ASSERT_EQ(yaml.fields.size(), 3u);
  EXPECT_EQ(yaml.fields[0].second.PythonStr(), "no");
  EXPECT_EQ(yaml.fields[1].second.PythonStr(), "False");
  EXPECT_EQ(yaml.fields[2].second.PythonStr(), "{'a': [1, 'b']}");
  const ConfigValue json = Parse(R"({"num_processes": 2, "gpu_ids": "0,1", "x": 1e3})", "c.json");
  EXPECT_EQ(json.fields[0].second.integer, 2);
  EXPECT_EQ(json.fields[1].second.text, "0,1");
  EXPECT_EQ(json.fields[2].second.PythonStr(), "1000.0");
}

TEST(AccelerateFileTest, OnlyASmallRegularFileIsRead) {
  const std::string dir = ::testing::TempDir();
  absl::StatusOr<ConfigValue> read = ReadAccelerateConfig(dir);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr("not a file"));
  const std::string big = dir + "/accelerate_config_test_big.yaml";
  {
    std::ofstream out(big);
    out << "a: " << std::string(2 << 20, 'x') << "\n";
  }
  read = ReadAccelerateConfig(big);
  std::remove(big.c_str());
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr("over 1 MiB"));
  EXPECT_EQ(ReadAccelerateConfig(dir + "/no/such/file.yaml").status().code(),
            absl::StatusCode::kNotFound);
  // A device is no file, whatever it would give.
  EXPECT_EQ(ReadAccelerateConfig("/dev/zero").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AccelerateFileTest, BadYamlNamesTheFileAndLine) {
  absl::StatusOr<ConfigValue> parsed = ParseAccelerateConfig("a: 1\nb: [1,\n", "bad.yaml");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("bad.yaml:"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("not YAML"));
  EXPECT_FALSE(ParseAccelerateConfig("a: &x 1\nb: *x\n", "alias.yaml").ok());
  absl::StatusOr<ConfigValue> two = ParseAccelerateConfig("a: 1\n---\nb: 2\n", "two.yaml");
  ASSERT_FALSE(two.ok());
  EXPECT_THAT(two.status().message(), HasSubstr("several YAML documents"));
}

TEST(AccelerateConfigTest, AMultiGpuConfigGivesAcceleratesVariables) {
  const AccelerateLaunch launch = Ok(kMultiGpu);
  EXPECT_EQ(launch.env, (Env{{"ACCELERATE_MIXED_PRECISION", "bf16"},
                             {"ACCELERATE_DYNAMO_BACKEND", "INDUCTOR"},
                             {"ACCELERATE_DYNAMO_MODE", "max-autotune"},
                             {"ACCELERATE_DYNAMO_USE_FULLGRAPH", "True"},
                             {"ACCELERATE_DYNAMO_USE_DYNAMIC", "False"},
                             {"ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "False"},
                             {"OMP_NUM_THREADS", "1"}}));
  // accelerate 1.14 takes neither same_network nor enable_cpu_affinity from
  // the file: its argparse defaults are not None.
  EXPECT_EQ(launch.options,
            WithAcceleratesOwn({{"PET_NPROC_PER_NODE", "4"}, {"PET_MASTER_PORT", "29500"}}));
  EXPECT_THAT(launch.warnings, IsEmpty());
}

TEST(AccelerateConfigTest, OmpNumThreadsComesFromTheEnvironmentAsAccelerateReadsIt) {
  Machine machine;
  machine.env["OMP_NUM_THREADS"] = "6";
  EXPECT_THAT(Ok(kMultiGpu, machine).env, Contains(Pair("OMP_NUM_THREADS", "6")));
  // use_cpu with no OMP_NUM_THREADS: the physical cores shared by the local processes.
  const std::string on_cpu = std::string(kMultiGpu) + "use_cpu: true\n";
  EXPECT_THAT(Ok(on_cpu).env, Contains(Pair("OMP_NUM_THREADS", "4")));  // 16 cores / 4
}

TEST(AccelerateConfigTest, SeveralMachinesRendezvousAtTheMainProcess) {
  const std::string config = R"(distributed_type: MULTI_GPU
num_machines: 2
num_processes: 16
machine_rank: 1
main_process_ip: 10.0.0.1
main_process_port: 6000
)";
  EXPECT_EQ(Ok(config).options, WithAcceleratesOwn({{"PET_NPROC_PER_NODE", "8"},
                                                    {"PET_NNODES", "2"},
                                                    {"PET_NODE_RANK", "1"},
                                                    {"PET_RDZV_ENDPOINT", "10.0.0.1:6000"}}));
  EXPECT_THAT(Error("distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 4\n"),
              HasSubstr("no main_process_ip"));
  // Machine 0 checks its own port, as accelerate does: in use is an error there.
  Machine busy;
  busy.busy_ports = {6000};
  std::string head = config;
  head.replace(head.find("machine_rank: 1"), 15, "machine_rank: 0");
  EXPECT_THAT(Error(head, busy), HasSubstr("port 6000 of this machine is in use"));
  // A flag naming the head stands for the file's: neither checked nor needed.
  busy.flags = {"PET_RDZV_ENDPOINT"};
  EXPECT_THAT(Ok(head, busy).options, Not(Contains(Key("PET_RDZV_ENDPOINT"))));
  EXPECT_TRUE(
      Translate("distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 4\n", busy).ok());
}

TEST(AccelerateConfigTest, InsideSlurmTheAllocationGivesTheNodesAndRendezvous) {
  Machine slurm;
  slurm.slurm_nodes = 2;
  const std::string config = R"(distributed_type: MULTI_GPU
num_machines: 2
num_processes: 16
machine_rank: 0
main_process_ip: 10.0.0.1
)";
  AccelerateLaunch launch = Ok(config, slurm);
  EXPECT_EQ(launch.options, WithAcceleratesOwn({{"PET_NPROC_PER_NODE", "8"}}, true));
  EXPECT_THAT(launch.warnings, IsEmpty());
  // An allocation of another size stands, said once.
  slurm.slurm_nodes = 4;
  launch = Ok(config, slurm);
  EXPECT_THAT(launch.warnings,
              ElementsAre(HasSubstr("num_machines is 2 but the allocation has 4 nodes")));
  // No num_processes: the allocation's count of workers.
  EXPECT_TRUE(Translate("distributed_type: MULTI_GPU\nnum_machines: 2\n", slurm).ok());
}

TEST(AccelerateConfigTest, NoNumProcessesIsAnErrorUnlessAFlagGivesTheWorkers) {
  EXPECT_THAT(Error("distributed_type: MULTI_GPU\n"),
              AllOf(HasSubstr("no num_processes"), HasSubstr("--nproc-per-node N")));
  Machine flagged;
  flagged.flags = {"PET_NPROC_PER_NODE"};
  EXPECT_THAT(Ok("distributed_type: MULTI_GPU\n", flagged).options,
              Not(Contains(Key("PET_NPROC_PER_NODE"))));
  EXPECT_THAT(Error("distributed_type: MULTI_GPU\nnum_processes: 1\nnum_machines: 2\n"
                    "main_process_ip: h\n"),
              HasSubstr("leaves a machine without a worker"));
}

TEST(AccelerateConfigTest, PortZeroIsAFreePortAndAFlagsPortIsNotChecked) {
  EXPECT_THAT(Ok(std::string(kMultiGpu) + "main_process_port: 0\n").options,
              Contains(Pair("PET_MASTER_PORT", "40123")));
  EXPECT_THAT(Error(std::string(kMultiGpu) + "main_process_port: 70000\n"),
              HasSubstr("main_process_port 70000 is no TCP port"));
  Machine busy;
  busy.busy_ports = {29500};
  busy.flags = {"PET_MASTER_PORT"};
  const AccelerateLaunch launch = Ok(kMultiGpu, busy);
  EXPECT_THAT(launch.options, Not(Contains(Key("PET_STANDALONE"))));
  EXPECT_THAT(launch.warnings, IsEmpty());
}

TEST(AccelerateConfigTest, OneMachineWhosePortIsTakenGoesStandalone) {
  Machine busy;
  busy.busy_ports = {29500};
  const AccelerateLaunch launch = Ok(kMultiGpu, busy);
  EXPECT_THAT(launch.options, Contains(Pair("PET_STANDALONE", "1")));
  EXPECT_THAT(launch.options, Not(Contains(Key("PET_MASTER_PORT"))));
  EXPECT_THAT(launch.warnings, ElementsAre(HasSubstr("port 29500 is in use")));
}

TEST(AccelerateConfigTest, AnFsdpConfigGivesAcceleratesVariables) {
  const AccelerateLaunch launch = Ok(R"(distributed_type: FSDP
debug: true
num_processes: 2
mixed_precision: 'no'
gpu_ids: 0,1
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  transformer_layer_cls_to_wrap: BertLayer
  fsdp_offload_params: true
  fsdp_version: 2
  reshard_after_forward: false
parallelism_config:
  parallelism_config_dp_shard_size: 2
  parallelism_config_cp_size: 2
)");
  const Env& env = launch.env;
  EXPECT_THAT(env, Contains(Pair("ACCELERATE_DEBUG_MODE", "true")));
  EXPECT_THAT(env, Contains(Pair("CUDA_VISIBLE_DEVICES", "0,1")));
  EXPECT_THAT(env, Contains(Pair("ACCELERATE_MIXED_PRECISION", "no")));
  EXPECT_THAT(env, Contains(Pair("ACCELERATE_USE_FSDP", "true")));
  EXPECT_THAT(env, Contains(Pair("FSDP_VERSION", "2")));
  EXPECT_THAT(env, Contains(Pair("FSDP_SHARDING_STRATEGY", "FULL_SHARD")));
  EXPECT_THAT(env, Contains(Pair("FSDP_TRANSFORMER_CLS_TO_WRAP", "BertLayer")));
  EXPECT_THAT(env, Contains(Pair("FSDP_OFFLOAD_PARAMS", "true")));
  EXPECT_THAT(env, Contains(Pair("FSDP_RESHARD_AFTER_FORWARD", "false")));
  EXPECT_THAT(env, Contains(Pair("FSDP_MIN_NUM_PARAMS", "100000000")));
  EXPECT_THAT(env, Not(Contains(Key("FSDP_STATE_DICT_TYPE"))));
  EXPECT_THAT(env, Contains(Pair("ACCELERATE_USE_PARALLELISM_CONFIG", "true")));
  EXPECT_THAT(env, Contains(Pair("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2")));
  EXPECT_THAT(env, Contains(Pair("PARALLELISM_CONFIG_TP_SIZE", "1")));
  EXPECT_THAT(env, Contains(Pair("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")));
  EXPECT_THAT(env, Not(Contains(Key("PARALLELISM_CONFIG_SP_SEQ_LENGTH"))));
  EXPECT_THAT(Error("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n"
                    "  sync_module_states: false\n"),
              HasSubstr("fsdp_cpu_ram_efficient_loading needs fsdp_sync_module_states"));
}

TEST(AccelerateConfigTest, ADeepSpeedConfigGivesAcceleratesVariablesAndNoDynamo) {
  Machine machine;
  machine.env["PYTHONPATH"] = "/opt/lib::/srv";
  const AccelerateLaunch launch = Ok(R"(distributed_type: DEEPSPEED
num_processes: 2
mixed_precision: fp16
deepspeed_config:
  zero_stage: 2
  gradient_clipping: 1.0
  offload_optimizer_device: CPU
  zero3_init_flag: false
)",
                                     machine);
  EXPECT_EQ(launch.env,
            (Env{{"ACCELERATE_MIXED_PRECISION", "fp16"},
                 {"PYTHONPATH", "/opt/lib:/srv:/home/me/project"},
                 {"ACCELERATE_CONFIG_DS_FIELDS",
                  "zero_stage,gradient_clipping,offload_optimizer_device,zero3_init_flag,"
                  "mixed_precision"},
                 {"ACCELERATE_USE_DEEPSPEED", "true"},
                 {"ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"},
                 {"ACCELERATE_GRADIENT_CLIPPING", "1.0"},
                 {"ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "cpu"},
                 {"ACCELERATE_DEEPSPEED_ZERO3_INIT", "false"}}));
  // Several machines are DeepSpeed's own launchers' (pdsh by default), but for standard.
  const std::string two = R"(distributed_type: DEEPSPEED
num_machines: 2
num_processes: 4
main_process_ip: head
)";
  EXPECT_THAT(Error(two), AllOf(HasSubstr("deepspeed_multinode_launcher pdsh"),
                                HasSubstr("accelerate launch --config_file")));
  EXPECT_TRUE(
      Translate(two + "deepspeed_config:\n  deepspeed_multinode_launcher: standard\n").ok());
}

TEST(AccelerateConfigTest, Fp8SetsEveryFp8Variable) {
  const AccelerateLaunch launch = Ok(R"(distributed_type: MULTI_GPU
num_processes: 2
mixed_precision: fp8
fp8_config:
  backend: TE
  amax_history_len: 32
)");
  EXPECT_THAT(launch.env, Contains(Pair("ACCELERATE_FP8_BACKEND", "TE")));
  EXPECT_THAT(launch.env, Contains(Pair("ACCELERATE_FP8_AMAX_HISTORY_LEN", "32")));
  EXPECT_THAT(launch.env, Contains(Pair("ACCELERATE_FP8_FORMAT", "HYBRID")));
  EXPECT_THAT(launch.env, Contains(Pair("ACCELERATE_FP8_OVERRIDE_WGRAD", "False")));
}

TEST(AccelerateConfigTest, LegacyKeysConvertAsAccelerateConvertsThem) {
  const AccelerateLaunch launch =
      Ok("distributed_type: MULTI_GPU\nnum_processes: 2\nfp16: true\ndynamo_backend: EAGER\n");
  EXPECT_THAT(launch.env, Contains(Pair("ACCELERATE_MIXED_PRECISION", "fp16")));
  EXPECT_THAT(launch.env, Contains(Pair("ACCELERATE_DYNAMO_BACKEND", "EAGER")));
}

TEST(AccelerateConfigTest, UnknownKeysAreOneWarning) {
  const AccelerateLaunch launch =
      Ok(std::string(kMultiGpu) + "colour: blue\nflavour: sour\nfsdp_config:\n  shape: round\n");
  EXPECT_THAT(launch.warnings,
              ElementsAre(HasSubstr("ignoring colour, flavour: no key of accelerate 1.14's config"),
                          HasSubstr("ignoring fsdp_config.shape")));
}

TEST(AccelerateConfigTest, PathsMusterDoesNotServeNameTheLauncherToUse) {
  EXPECT_THAT(Error("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: MULTI_GPU\n"),
              HasSubstr("accelerate launch --config_file FILE`, which submits the job"));
  EXPECT_THAT(Error("distributed_type: XLA\n"), HasSubstr("runs on TPUs"));
  EXPECT_THAT(Error("distributed_type: MULTI_CPU\n"), HasSubstr("mpirun"));
  EXPECT_THAT(Error("distributed_type: 'NO'\n"), HasSubstr("run the script with python"));
  EXPECT_THAT(Error("distributed_type: NO\n"), HasSubstr("False is not accelerate's"));
  EXPECT_THAT(Error("distributed_type: MULTI_NPU\n"), HasSubstr("not a path muster serves"));
  EXPECT_THAT(Error("num_processes: 2\n"), HasSubstr("no distributed_type"));
  EXPECT_THAT(Error("- a\n- b\n"), HasSubstr("not a mapping"));
}

TEST(AccelerateConfigTest, BadValuesNameTheKeyAndTheFix) {
  EXPECT_THAT(Error("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: fp32\n"),
              AllOf(HasSubstr("mixed_precision fp32"), HasSubstr("give no, fp16, bf16 or fp8")));
  EXPECT_THAT(Error("distributed_type: MULTI_GPU\nnum_processes: 2\n"
                    "dynamo_config:\n  dynamo_backend: NO\n"),
              AllOf(HasSubstr("dynamo_backend FALSE"), HasSubstr("quote the word")));
  EXPECT_THAT(Error("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: no\n"),
              AllOf(HasSubstr("mixed_precision false"), HasSubstr("quote the word, e.g. 'no'")));
  EXPECT_THAT(Error("distributed_type: MULTI_GPU\nnum_processes: two\n"),
              HasSubstr("num_processes is two, not a whole number"));
  EXPECT_THAT(Error("distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: '3'\n"),
              HasSubstr("gpu_ids 3 is one GPU for MULTI_GPU"));
}

TEST(AccelerateConfigTest, TheDefaultPathIsAcceleratesUnderHfHome) {
  EXPECT_EQ(DefaultAccelerateConfigPath(LookupIn({{"HOME", "/home/me"}})),
            "/home/me/.cache/huggingface/accelerate/default_config.yaml");
  EXPECT_EQ(DefaultAccelerateConfigPath(LookupIn({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/c"}})),
            "/c/huggingface/accelerate/default_config.yaml");
  EXPECT_EQ(DefaultAccelerateConfigPath(LookupIn({{"HOME", "/h"}, {"HF_HOME", "/hf"}})),
            "/hf/accelerate/default_config.yaml");
}

TEST(AccelerateConfigTest, MusterFlagsWinOverTheFileAndTheFileOverPetVariables) {
  AccelerateLaunch launch = Ok(kMultiGpu);
  const Env env = {{"PET_NPROC_PER_NODE", "7"}, {"PET_MAX_RESTARTS", "3"}, {"PET_REDIRECTS", "3"}};
  absl::StatusOr<CommandLine> read =
      ReadCommandLine({"muster", "--master-port", "7000", "train.py"}, LookupIn(env), &launch);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->parsed.config.nproc_per_node, 4);  // the file, over PET_
  EXPECT_EQ(read->parsed.config.master_port, 7000);  // the flag, over the file
  EXPECT_EQ(read->parsed.config.max_restarts, 0);    // accelerate's own, over PET_
  EXPECT_TRUE(read->parsed.config.redirects.all);    // PET_, which accelerate does not pass
  EXPECT_EQ(read->parsed.flags_given, (std::set<std::string>{"PET_MASTER_PORT"}));
}

}  // namespace
}  // namespace muster
