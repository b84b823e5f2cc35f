#include "launcher/options.h"

#include <signal.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/launcher/env.h"

namespace muster {
namespace {

using ::std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::Not;

// Parses `muster <args...>` with `env` as the whole environment.
absl::StatusOr<ParsedCommandLine> Parse(std::vector<std::string> args, const Env& env = {}) {
  args.insert(args.begin(), "muster");
  return ParseCommandLine(args, [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// The config for `muster <args...>`, which must parse.
LaunchConfig Config(const std::vector<std::string>& args, const Env& env = {}) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse(args, env);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok()) return LaunchConfig{};
  EXPECT_FALSE(parsed->help.has_value());
  EXPECT_FALSE(parsed->version);
  return parsed->config;
}

// The error message for `muster <args...>`, which must fail with InvalidArgument and one line.
std::string Error(const std::vector<std::string>& args, const Env& env = {}) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse(args, env);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
  std::string message(parsed.status().message());
  EXPECT_THAT(message, Not(HasSubstr("\n")));
  return message;
}

TEST(ParseCommandLineTest, DefaultsMatchTorchrun) {
  LaunchConfig config = Config({"train.py"});
  EXPECT_EQ(config.min_nodes, 1);
  EXPECT_EQ(config.max_nodes, 1);
  EXPECT_EQ(config.nproc_kind, NprocKind::kCount);
  EXPECT_EQ(config.nproc_per_node, 1);
  EXPECT_EQ(config.rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(config.rdzv_endpoint, "");
  EXPECT_EQ(config.rdzv_id, "none");
  EXPECT_EQ(config.rdzv_conf.join_timeout, milliseconds(600'000));
  EXPECT_EQ(config.rdzv_conf.last_call_timeout, milliseconds(30'000));
  EXPECT_EQ(config.rdzv_conf.close_timeout, milliseconds(30'000));
  EXPECT_EQ(config.rdzv_conf.keep_alive_interval, milliseconds(5'000));
  EXPECT_EQ(config.rdzv_conf.keep_alive_max_attempt, 3);
  EXPECT_EQ(config.rdzv_conf.read_timeout, milliseconds(60'000));
  EXPECT_FALSE(config.rdzv_conf.is_host.has_value());
  EXPECT_FALSE(config.standalone);
  EXPECT_EQ(config.max_restarts, 0);
  EXPECT_DOUBLE_EQ(config.monitor_interval_s, 0.1);
  EXPECT_EQ(config.start_method, "spawn");
  EXPECT_EQ(config.role, "default");
  EXPECT_FALSE(config.module);
  EXPECT_FALSE(config.no_python);
  EXPECT_FALSE(config.run_path);
  EXPECT_EQ(config.log_dir, "");
  EXPECT_FALSE(config.redirects.For(0).out || config.redirects.For(0).err);
  EXPECT_FALSE(config.tee.For(0).out || config.tee.For(0).err);
  EXPECT_FALSE(config.local_ranks_filter.has_value());
  EXPECT_EQ(config.node_rank, 0);
  EXPECT_FALSE(config.node_rank_given);
  EXPECT_EQ(config.master_addr, "127.0.0.1");
  EXPECT_EQ(config.master_port, 29500);
  EXPECT_EQ(config.local_addr, "");
  EXPECT_EQ(config.shutdown_grace, milliseconds(30'000));
  EXPECT_EQ(config.log_line_prefix_template, "");
  EXPECT_THAT(config.duplicate_stdout_filters, IsEmpty());
  EXPECT_THAT(config.duplicate_stderr_filters, IsEmpty());
  EXPECT_FALSE(config.console_events);
  EXPECT_THAT(config.signals_to_handle, ElementsAre(SIGTERM, SIGINT, SIGHUP, SIGQUIT));
  EXPECT_EQ(config.signals_to_handle_text, "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  EXPECT_FALSE(config.virtual_local_rank);
  EXPECT_EQ(config.script, "train.py");
  EXPECT_THAT(config.script_args, IsEmpty());
}

// One option, every way of spelling it, and what a value does to the config.
struct OptionCase {
  std::vector<std::string> spellings;
  std::string env;
  std::string value;  // empty for a flag
  std::function<void(const LaunchConfig&)> check;
};

std::vector<OptionCase> AllOptions() {
  return {
      {{"--nnodes"},
       "PET_NNODES",
       "2:4",
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.min_nodes, 2);
         EXPECT_EQ(c.max_nodes, 4);
       }},
      {{"--nproc-per-node", "--nproc_per_node"},
       "PET_NPROC_PER_NODE",
       "4",
       [](const LaunchConfig& c) { EXPECT_EQ(c.nproc_per_node, 4); }},
      {{"--node-rank", "--node_rank"},
       "PET_NODE_RANK",
       "3",
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.node_rank, 3);
         EXPECT_TRUE(c.node_rank_given);
       }},
      {{"--local-addr", "--local_addr"},
       "PET_LOCAL_ADDR",
       "10.0.0.5",
       [](const LaunchConfig& c) { EXPECT_EQ(c.local_addr, "10.0.0.5"); }},
      {{"--rdzv-backend", "--rdzv_backend"},
       "PET_RDZV_BACKEND",
       "c10d",
       [](const LaunchConfig& c) { EXPECT_EQ(c.rdzv_backend, RdzvBackend::kMuster); }},
      {{"--rdzv-endpoint", "--rdzv_endpoint"},
       "PET_RDZV_ENDPOINT",
       "node1:29400",
       [](const LaunchConfig& c) { EXPECT_EQ(c.rdzv_endpoint, "node1:29400"); }},
      {{"--rdzv-id", "--rdzv_id"},
       "PET_RDZV_ID",
       "job7",
       [](const LaunchConfig& c) { EXPECT_EQ(c.rdzv_id, "job7"); }},
      {{"--rdzv-conf", "--rdzv_conf"},
       "PET_RDZV_CONF",
       "join_timeout=5",
       [](const LaunchConfig& c) { EXPECT_EQ(c.rdzv_conf.join_timeout, milliseconds(5000)); }},
      {{"--standalone"},
       "PET_STANDALONE",
       "",
       [](const LaunchConfig& c) { EXPECT_TRUE(c.standalone); }},
      {{"--master-addr", "--master_addr"},
       "PET_MASTER_ADDR",
       "10.1.1.1",
       [](const LaunchConfig& c) { EXPECT_EQ(c.master_addr, "10.1.1.1"); }},
      {{"--master-port", "--master_port"},
       "PET_MASTER_PORT",
       "1234",
       [](const LaunchConfig& c) { EXPECT_EQ(c.master_port, 1234); }},
      {{"-m", "--module"}, "PET_MODULE", "", [](const LaunchConfig& c) { EXPECT_TRUE(c.module); }},
      {{"--no-python", "--no_python"},
       "PET_NO_PYTHON",
       "",
       [](const LaunchConfig& c) { EXPECT_TRUE(c.no_python); }},
      {{"--run-path", "--run_path"},
       "PET_RUN_PATH",
       "",
       [](const LaunchConfig& c) { EXPECT_TRUE(c.run_path); }},
      {{"--role"},
       "PET_ROLE",
       "trainer",
       [](const LaunchConfig& c) { EXPECT_EQ(c.role, "trainer"); }},
      {{"--start-method", "--start_method"},
       "PET_START_METHOD",
       "fork",
       [](const LaunchConfig& c) { EXPECT_EQ(c.start_method, "fork"); }},
      {{"--max-restarts", "--max_restarts"},
       "PET_MAX_RESTARTS",
       "3",
       [](const LaunchConfig& c) { EXPECT_EQ(c.max_restarts, 3); }},
      {{"--monitor-interval", "--monitor_interval"},
       "PET_MONITOR_INTERVAL",
       "0.5",
       [](const LaunchConfig& c) { EXPECT_DOUBLE_EQ(c.monitor_interval_s, 0.5); }},
      {{"--shutdown-timeout", "--shutdown_timeout"},
       "PET_SHUTDOWN_TIMEOUT",
       "2.5",
       [](const LaunchConfig& c) { EXPECT_EQ(c.shutdown_grace, milliseconds(2500)); }},
      {{"--log-dir", "--log_dir"},
       "PET_LOG_DIR",
       "/tmp/logs",
       [](const LaunchConfig& c) { EXPECT_EQ(c.log_dir, "/tmp/logs"); }},
      {{"-r", "--redirects"},
       "PET_REDIRECTS",
       "3",
       [](const LaunchConfig& c) {
         EXPECT_TRUE(c.redirects.For(5).out);
         EXPECT_TRUE(c.redirects.For(5).err);
       }},
      {{"-t", "--tee"},
       "PET_TEE",
       "2",
       [](const LaunchConfig& c) {
         EXPECT_FALSE(c.tee.For(0).out);
         EXPECT_TRUE(c.tee.For(0).err);
       }},
      {{"--local-ranks-filter", "--local_ranks_filter"},
       "PET_LOCAL_RANKS_FILTER",
       "0,3",
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.local_ranks_filter, (std::set<int>{0, 3}));
       }},
      {{"--log-line-prefix-template", "--log_line_prefix_template"},
       "PET_LOG_LINE_PREFIX_TEMPLATE",
       "[${role_name}${local_rank}]:",
       [](const LaunchConfig& c) {
         EXPECT_EQ(c.log_line_prefix_template, "[${role_name}${local_rank}]:");
       }},
      {{"--duplicate-stdout-filters", "--duplicate_stdout_filters"},
       "PET_DUPLICATE_STDOUT_FILTERS",
       "loss,,acc,step",
       [](const LaunchConfig& c) {
         EXPECT_THAT(c.duplicate_stdout_filters, ElementsAre("loss,acc", "step"));
         EXPECT_THAT(c.duplicate_stderr_filters, IsEmpty());
       }},
      {{"--duplicate-stderr-filters", "--duplicate_stderr_filters"},
       "PET_DUPLICATE_STDERR_FILTERS",
       "NCCL WARN",
       [](const LaunchConfig& c) {
         EXPECT_THAT(c.duplicate_stderr_filters, ElementsAre("NCCL WARN"));
       }},
      {{"--event-log-handler", "--event_log_handler"},
       "PET_EVENT_LOG_HANDLER",
       "console",
       [](const LaunchConfig& c) { EXPECT_TRUE(c.console_events); }},
      {{"--signals-to-handle", "--signals_to_handle"},
       "PET_SIGNALS_TO_HANDLE",
       "SIGTERM, SIGUSR1",
       [](const LaunchConfig& c) {
         EXPECT_THAT(c.signals_to_handle, ElementsAre(SIGTERM, SIGUSR1));
         EXPECT_EQ(c.signals_to_handle_text, "SIGTERM, SIGUSR1");
       }},
      {{"--virtual-local-rank", "--virtual_local_rank"},
       "PET_VIRTUAL_LOCAL_RANK",
       "",
       [](const LaunchConfig& c) { EXPECT_TRUE(c.virtual_local_rank); }},
  };
}

TEST(ParseCommandLineTest, EverySpellingAndFormOfEveryOption) {
  for (const OptionCase& option : AllOptions()) {
    for (const std::string& spelling : option.spellings) {
      std::vector<std::vector<std::string>> forms;
      if (option.value.empty()) {
        forms.push_back({spelling});
      } else if (spelling.size() == 2) {  // -r 3 and -r3
        forms.push_back({spelling, option.value});
        forms.push_back({spelling + option.value});
      } else {  // --opt value and --opt=value
        forms.push_back({spelling, option.value});
        forms.push_back({spelling + "=" + option.value});
      }
      for (std::vector<std::string> args : forms) {
        SCOPED_TRACE(testing::PrintToString(args));
        args.push_back("train.py");
        option.check(Config(args));
      }
    }
  }
}

TEST(ParseCommandLineTest, EveryOptionFromItsPetVariable) {
  for (const OptionCase& option : AllOptions()) {
    SCOPED_TRACE(option.env);
    option.check(Config({"train.py"}, {{option.env, option.value.empty() ? "1" : option.value}}));
  }
}

// As torchrun: the flag, else PET_LOG_LINE_PREFIX_TEMPLATE, else torch's own variable.
TEST(ParseCommandLineTest, LogLinePrefixTemplateFallsBackToTorchsVariable) {
  const Env torch = {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]: "}};
  EXPECT_EQ(Config({"t.py"}, torch).log_line_prefix_template, "[rank${rank}]: ");
  EXPECT_EQ(
      Config({"--log-line-prefix-template", "${rank}|", "t.py"}, torch).log_line_prefix_template,
      "${rank}|");
  EXPECT_EQ(Config({"--log-line-prefix-template=", "t.py"}, torch).log_line_prefix_template,
            "[rank${rank}]: ");
}

TEST(ParseCommandLineTest, DuplicateFiltersSplitAsTorchrunSplitsThem) {
  EXPECT_THAT(Config({"--duplicate-stdout-filters", "a,,,b", "t.py"}).duplicate_stdout_filters,
              ElementsAre("a,", "b"));
  // An empty filter is in every line.
  EXPECT_THAT(Config({"--duplicate-stdout-filters=", "t.py"}).duplicate_stdout_filters,
              ElementsAre(""));
}

TEST(ParseCommandLineTest, SignalsToHandleErrors) {
  EXPECT_THAT(Error({"--signals-to-handle", "SIGTERM,sigusr1", "t.py"}),
              AllOf(HasSubstr("sigusr1 is not a signal muster can handle"),
                    HasSubstr("SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2")));
  EXPECT_THAT(Error({"--signals-to-handle", "SIGKILL", "t.py"}), HasSubstr("SIGKILL is not"));
  EXPECT_THAT(Error({"--signals-to-handle", "SIGTERM,", "t.py"}),
              HasSubstr("an empty signal name"));
  EXPECT_THAT(Config({"--signals-to-handle", "SIGUSR2,SIGUSR2", "t.py"}).signals_to_handle,
              ElementsAre(SIGUSR2));
}

// No PET_ variable, as torchrun's has none.
TEST(ParseCommandLineTest, NumaBinding) {
  EXPECT_EQ(Config({"t.py"}).numa_binding, NumaBinding::kNone);
  EXPECT_EQ(Config({"--numa-binding", "node", "t.py"}).numa_binding, NumaBinding::kNode);
  EXPECT_EQ(Config({"--numa_binding=socket", "t.py"}).numa_binding, NumaBinding::kSocket);
  EXPECT_EQ(Config({"--numa-binding", "exclusive", "t.py"}).numa_binding, NumaBinding::kExclusive);
  EXPECT_EQ(Config({"--numa-binding", "core-complex", "t.py"}).numa_binding,
            NumaBinding::kCoreComplex);
  EXPECT_EQ(Config({"t.py"}, {{"PET_NUMA_BINDING", "node"}}).numa_binding, NumaBinding::kNone);
  EXPECT_THAT(Error({"--numa-binding", "Node", "t.py"}),
              HasSubstr("give --numa-binding node, socket, exclusive or core-complex"));
}

// torchrun loads --logs-specs from a Python entry point; muster has the default layout only.
TEST(ParseCommandLineTest, LogsSpecsDefaultOnly) {
  EXPECT_EQ(Config({"--logs-specs", "default", "t.py"}).script, "t.py");
  EXPECT_EQ(Config({"--logs_specs=default", "t.py"}).script, "t.py");
  EXPECT_THAT(Error({"--logs-specs", "DOESNOT_EXIST", "t.py"}),
              AllOf(HasSubstr("--logs-specs DOESNOT_EXIST"), HasSubstr("Python entry point"),
                    HasSubstr("give --logs-specs default")));
}

TEST(ParseCommandLineTest, EventLogHandlers) {
  EXPECT_FALSE(Config({"--event-log-handler", "null", "t.py"}).console_events);
  EXPECT_FALSE(Config({"--event-log-handler", "dynamic_rendezvous", "t.py"}).console_events);
  EXPECT_THAT(
      Error({"--event-log-handler", "scribe", "t.py"}),
      AllOf(HasSubstr("unknown event log handler"), HasSubstr("null (the default) or console")));
}

TEST(ParseCommandLineTest, CommandLineWinsOverEnvironment) {
  LaunchConfig config =
      Config({"--nproc-per-node", "2", "--rdzv-id=cli", "train.py"},
             {{"PET_NPROC_PER_NODE", "8"}, {"PET_RDZV_ID", "env"}, {"PET_MAX_RESTARTS", "4"}});
  EXPECT_EQ(config.nproc_per_node, 2);
  EXPECT_EQ(config.rdzv_id, "cli");
  EXPECT_EQ(config.max_restarts, 4);  // not on the command line, so from the environment
}

TEST(ParseCommandLineTest, EnvironmentValueOverriddenOnCommandLineIsNotChecked) {
  EXPECT_EQ(Config({"--nnodes", "2", "train.py"}, {{"PET_NNODES", "garbage"}}).max_nodes, 2);
}

TEST(ParseCommandLineTest, EmptyEnvironmentVariableCountsAsUnset) {
  LaunchConfig config = Config({"train.py"}, {{"PET_NNODES", ""}, {"PET_STANDALONE", ""}});
  EXPECT_EQ(config.max_nodes, 1);
  EXPECT_FALSE(config.standalone);
}

TEST(ParseCommandLineTest, EnvironmentFlagValues) {
  EXPECT_FALSE(Config({"train.py"}, {{"PET_STANDALONE", "0"}}).standalone);
  EXPECT_FALSE(Config({"train.py"}, {{"PET_NO_PYTHON", "false"}}).no_python);
  EXPECT_TRUE(Config({"train.py"}, {{"PET_NO_PYTHON", "TRUE"}}).no_python);
  EXPECT_THAT(
      Error({"train.py"}, {{"PET_STANDALONE", "yes"}}),
      AllOf(HasSubstr("PET_STANDALONE=yes"), HasSubstr("--standalone"), HasSubstr("1 or 0")));
}

TEST(ParseCommandLineTest, ErrorFromEnvironmentNamesVariableAndOption) {
  EXPECT_THAT(Error({"train.py"}, {{"PET_NNODES", "3:1"}}),
              AllOf(HasSubstr("PET_NNODES=3:1"), HasSubstr("--nnodes"),
                    HasSubstr("MIN is greater than MAX")));
}

TEST(ParseCommandLineTest, NullEnvLookupMeansNoEnvironment) {
  absl::StatusOr<ParsedCommandLine> parsed = ParseCommandLine({"muster", "train.py"}, nullptr);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.script, "train.py");
}

TEST(ParseCommandLineTest, LastOccurrenceWins) {
  LaunchConfig config = Config({"--nnodes", "2", "--nnodes=3", "train.py"});
  EXPECT_EQ(config.max_nodes, 3);
}

TEST(ParseCommandLineTest, ScriptArgsPassedUntouchedEvenWhenOptionLike) {
  LaunchConfig config =
      Config({"--nnodes", "2", "x.py", "--nnodes", "5", "-m", "--help", "--", "--nnodes=", "a b"});
  EXPECT_EQ(config.max_nodes, 2);
  EXPECT_FALSE(config.module);
  EXPECT_EQ(config.script, "x.py");
  EXPECT_THAT(config.script_args,
              ElementsAre("--nnodes", "5", "-m", "--help", "--", "--nnodes=", "a b"));
}

TEST(ParseCommandLineTest, ModuleNameIsTheScript) {
  LaunchConfig config = Config({"-m", "pkg.train", "--lr", "0.1"});
  EXPECT_TRUE(config.module);
  EXPECT_EQ(config.script, "pkg.train");
  EXPECT_THAT(config.script_args, ElementsAre("--lr", "0.1"));
}

TEST(ParseCommandLineTest, DoubleDashEndsOptions) {
  LaunchConfig config = Config({"--nnodes", "2", "--", "--weird-script", "a"});
  EXPECT_EQ(config.script, "--weird-script");
  EXPECT_THAT(config.script_args, ElementsAre("a"));
}

TEST(ParseCommandLineTest, EmptyValueAfterEqualsDoesNotTakeTheScript) {
  LaunchConfig config = Config({"--rdzv-endpoint=", "--log-dir=", "train.py", "a"});
  EXPECT_EQ(config.rdzv_endpoint, "");
  EXPECT_EQ(config.log_dir, "");
  EXPECT_EQ(config.script, "train.py");
  EXPECT_THAT(config.script_args, ElementsAre("a"));
}

TEST(ParseCommandLineTest, UnknownOptionBeforeScript) {
  EXPECT_EQ(Error({"--foo", "train.py"}),
            "unknown option --foo; muster's own options go before the script, see muster --help");
  EXPECT_THAT(Error({"--foo=3", "train.py"}), HasSubstr("unknown option --foo;"));
  EXPECT_THAT(Error({"-x", "train.py"}), HasSubstr("unknown option -x;"));
  EXPECT_THAT(Error({"--nnodes", "2", "--bogus", "train.py", "--ok"}),
              HasSubstr("unknown option --bogus"));
}

TEST(ParseCommandLineTest, UnknownOptionSuggestsCloseMatch) {
  EXPECT_THAT(Error({"--nproc-per-mode", "4", "train.py"}),
              HasSubstr("did you mean --nproc-per-node?"));
  EXPECT_THAT(Error({"--max-restrts=3", "train.py"}), HasSubstr("did you mean --max-restarts?"));
}

// As argparse (torchrun): an unambiguous start of a long option is that option.
TEST(ParseCommandLineTest, AbbreviatedLongOptions) {
  LaunchConfig config = Config({"--redirect", "3", "--max-restart=2", "--nproc", "4",
                                "--rdzv-end=h:1", "--stand", "train.py", "--redirect", "1"});
  EXPECT_TRUE(config.redirects.For(5).out && config.redirects.For(5).err);
  EXPECT_EQ(config.max_restarts, 2);
  EXPECT_EQ(config.nproc_per_node, 4);
  EXPECT_TRUE(config.standalone);
  EXPECT_EQ(config.script, "train.py");
  EXPECT_THAT(config.script_args, ElementsAre("--redirect", "1"));
  EXPECT_EQ(Config({"--nproc_per", "2", "--node_r", "1", "t.py"}).node_rank, 1);
  EXPECT_EQ(Config({"--rdzv-id", "--redir", "t.py"}).rdzv_id, "--redir");  // a value, not an option
  EXPECT_EQ(Config({"--", "--redir", "t.py"}).script, "--redir");
}

TEST(ParseCommandLineTest, AmbiguousAbbreviationNamesTheCandidates) {
  EXPECT_EQ(Error({"--rdzv", "x", "train.py"}),
            "ambiguous option --rdzv: it could be --rdzv-backend, --rdzv-endpoint, --rdzv-id, "
            "--rdzv-conf; write more of its name");
  EXPECT_THAT(Error({"--st=1", "train.py"}),
              HasSubstr("ambiguous option --st: it could be --standalone, --start-method"));
}

TEST(ParseCommandLineTest, NoScript) {
  const std::string expected = "no training script given; usage: muster [options] SCRIPT [args...]";
  EXPECT_EQ(Error({"--standalone"}), expected);
  EXPECT_EQ(Error({}), expected);
  EXPECT_EQ(Error({"--nnodes", "2", "--"}), expected);
  EXPECT_EQ(Error({"-m"}), expected);
  absl::StatusOr<ParsedCommandLine> no_program_name = ParseCommandLine({}, nullptr);
  EXPECT_EQ(no_program_name.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseCommandLineTest, OptionWithoutValueAtTheEnd) {
  EXPECT_THAT(Error({"--nnodes"}),
              AllOf(HasSubstr("--nnodes needs a value"), HasSubstr("--nnodes N|MIN:MAX")));
  EXPECT_THAT(Error({"--nnodes", "2", "-r"}), HasSubstr("--redirects needs a value"));
  EXPECT_THAT(Error({"--rdzv_conf"}), HasSubstr("--rdzv-conf needs a value"));
  EXPECT_THAT(Error({"-mr"}), HasSubstr("--redirects needs a value"));
}

TEST(ParseCommandLineTest, OptionWhoseValueIsAnotherOption) {
  EXPECT_THAT(Error({"--rdzv-id", "--standalone", "train.py"}),
              AllOf(HasSubstr("--rdzv-id is missing its value"), HasSubstr("--standalone")));
  EXPECT_THAT(Error({"--log-dir", "-m", "train.py"}), HasSubstr("--log-dir is missing its value"));
}

TEST(ParseCommandLineTest, Nnodes) {
  LaunchConfig single = Config({"--nnodes", "3", "train.py"});
  EXPECT_EQ(single.min_nodes, 3);
  EXPECT_EQ(single.max_nodes, 3);
  LaunchConfig range = Config({"--nnodes=1:8", "train.py"});
  EXPECT_EQ(range.min_nodes, 1);
  EXPECT_EQ(range.max_nodes, 8);
}

TEST(ParseCommandLineTest, NnodesErrors) {
  EXPECT_EQ(
      Error({"--nnodes", "3:1", "train.py"}),
      "--nnodes 3:1: MIN is greater than MAX; give --nnodes N or MIN:MAX with 0 < MIN <= MAX");
  for (const std::string bad : {"0", "a", "1:", ":2", "-1", "0:2", "1:2:3", "", "2.5"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--nnodes", bad, "train.py"}),
                AllOf(HasSubstr("--nnodes"), HasSubstr("give --nnodes N or MIN:MAX")));
  }
}

TEST(ParseCommandLineTest, NprocPerNodeKinds) {
  EXPECT_EQ(Config({"--nproc-per-node", "gpu", "t.py"}).nproc_kind, NprocKind::kGpu);
  EXPECT_EQ(Config({"--nproc-per-node", "cpu", "t.py"}).nproc_kind, NprocKind::kCpu);
  EXPECT_EQ(Config({"--nproc-per-node", "auto", "t.py"}).nproc_kind, NprocKind::kAuto);
  LaunchConfig count = Config({"--nproc_per_node=8", "t.py"});
  EXPECT_EQ(count.nproc_kind, NprocKind::kCount);
  EXPECT_EQ(count.nproc_per_node, 8);
}

TEST(ParseCommandLineTest, NprocPerNodeErrors) {
  for (const std::string bad : {"0", "-2", "x", "GPU", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--nproc-per-node", bad, "t.py"}),
                AllOf(HasSubstr("--nproc-per-node " + bad + ":"), HasSubstr("gpu, cpu or auto")));
  }
}

TEST(ParseCommandLineTest, RdzvBackends) {
  EXPECT_EQ(Config({"--rdzv-backend", "static", "t.py"}).rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(Config({"--rdzv-backend", "c10d", "t.py"}).rdzv_backend, RdzvBackend::kMuster);
  EXPECT_EQ(Config({"--rdzv-backend", "muster", "t.py"}).rdzv_backend, RdzvBackend::kMuster);
  EXPECT_EQ(Config({"--rdzv-backend", "etcd", "t.py"}).rdzv_backend, RdzvBackend::kEtcd);
  EXPECT_EQ(Config({"--rdzv-backend", "etcd-v2", "t.py"}).rdzv_backend, RdzvBackend::kEtcd);
  EXPECT_THAT(Error({"--rdzv-backend", "zookeeper", "t.py"}),
              AllOf(HasSubstr("--rdzv-backend zookeeper"), HasSubstr("static, c10d, muster")));
}

TEST(ParseCommandLineTest, AnEtcdEndpointIsAListOfMembersKeptAsGiven) {
  // Parsed (and checked) when the launch starts: etcd's grammar, not muster's.
  const std::string members = "https://e1:2379,e2,[::1]:2380";
  EXPECT_EQ(Config({"--rdzv-backend", "etcd", "--rdzv-endpoint", members, "t.py"}).rdzv_endpoint,
            members);
}

TEST(ParseCommandLineTest, RdzvConfTakesEtcdsKeys) {
  const LaunchConfig config =
      Config({"--rdzv-conf",
              "user=trainer,password=s3cret,protocol=HTTPS,ca_cert=/c,ssl_cert=/n,"
              "ssl_cert_key=/k",
              "t.py"});
  EXPECT_EQ(config.rdzv_conf.etcd_user, "trainer");
  EXPECT_EQ(config.rdzv_conf.etcd_password, "s3cret");
  EXPECT_EQ(config.rdzv_conf.etcd_protocol, "https");
  // torchrun's etcd-v2 spellings of cacert, cert and key.
  EXPECT_EQ(config.rdzv_conf.cacert, "/c");
  EXPECT_EQ(config.rdzv_conf.cert, "/n");
  EXPECT_EQ(config.rdzv_conf.key, "/k");
  EXPECT_THAT(Error({"--rdzv-conf", "protocol=ftp", "t.py"}),
              HasSubstr("protocol needs http or https, not ftp"));
}

TEST(ParseCommandLineTest, RdzvEndpointShapesKeptAsGiven) {
  for (const std::string good : {"node1", "node1:29400", "10.0.0.1:0", "[::1]", "[::1]:29400",
                                 "[fe80::1%eth0]:1", "my_host.example.com:65535"}) {
    SCOPED_TRACE(good);
    EXPECT_EQ(Config({"--rdzv-endpoint", good, "t.py"}).rdzv_endpoint, good);
  }
}

TEST(ParseCommandLineTest, RdzvEndpointErrors) {
  for (const std::string bad :
       {"::1:29400", "host:", "host:65536", "host:x", "host:-1", ":29400", "[::1", "[::1]x", "[]:1",
        "[host]:1", "ho st:1", "a/b", "host: 5", "host:+5"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--rdzv-endpoint", bad, "t.py"}),
                AllOf(HasSubstr("--rdzv-endpoint"), HasSubstr("HOST[:PORT] or [IPV6][:PORT]")));
  }
  EXPECT_THAT(Error({"--rdzv-endpoint", "fe80::1", "t.py"}), HasSubstr("in brackets"));
}

TEST(ParseCommandLineTest, RdzvConfValues) {
  LaunchConfig config =
      Config({"--rdzv-conf",
              "join_timeout=900, last_call_timeout=0.5,close_timeout=0,heartbeat_timeout=12,"
              "keep_alive_interval=1.25,read_timeout=7,keep_alive_max_attempt=9,is_host=true",
              "t.py"});
  EXPECT_EQ(config.rdzv_conf.join_timeout, milliseconds(900'000));
  EXPECT_EQ(config.rdzv_conf.last_call_timeout, milliseconds(500));
  EXPECT_EQ(config.rdzv_conf.close_timeout, milliseconds(0));
  EXPECT_EQ(config.rdzv_conf.heartbeat_timeout, milliseconds(12'000));
  EXPECT_EQ(config.rdzv_conf.keep_alive_interval, milliseconds(1250));
  EXPECT_EQ(config.rdzv_conf.read_timeout, milliseconds(7000));
  EXPECT_EQ(config.rdzv_conf.keep_alive_max_attempt, 9);
  EXPECT_EQ(config.rdzv_conf.is_host, true);
  EXPECT_EQ(Config({"--rdzv-conf", "is_host=0", "t.py"}).rdzv_conf.is_host, false);
  // Keys not given keep their defaults; an empty value is no configuration.
  EXPECT_EQ(Config({"--rdzv-conf", "is_host=0", "t.py"}).rdzv_conf.join_timeout,
            milliseconds(600'000));
  EXPECT_EQ(Config({"--rdzv-conf=", "t.py"}).rdzv_conf.join_timeout, milliseconds(600'000));
}

TEST(ParseCommandLineTest, HaTakesABooleanAndIsOffUnlessGiven) {
  EXPECT_FALSE(Config({"t.py"}).rdzv_conf.ha.has_value());
  EXPECT_EQ(Config({"--rdzv-conf", "ha=1", "t.py"}).rdzv_conf.ha, true);
  EXPECT_EQ(Config({"--rdzv-conf", "ha=false", "t.py"}).rdzv_conf.ha, false);
  EXPECT_THAT(Error({"--rdzv-conf", "ha=maybe", "t.py"}),
              HasSubstr("ha needs 1, 0, true, false, yes or no, not maybe"));
}

TEST(ParseCommandLineTest, TokenFileFromRdzvConfWinsOverMusterTokenFile) {
  EXPECT_EQ(Config({"t.py"}).rdzv_conf.token_file, "");
  EXPECT_EQ(Config({"--rdzv-conf", "token_file=/a/tok", "t.py"}).rdzv_conf.token_file, "/a/tok");
  EXPECT_EQ(Config({"t.py"}, {{"MUSTER_TOKEN_FILE", "/e/tok"}}).rdzv_conf.token_file, "/e/tok");
  EXPECT_EQ(Config({"--rdzv-conf", "token_file=/a/tok", "t.py"}, {{"MUSTER_TOKEN_FILE", "/e/tok"}})
                .rdzv_conf.token_file,
            "/a/tok");
  EXPECT_EQ(Config({"t.py"}, {{"PET_RDZV_CONF", "token_file=/p/tok"}}).rdzv_conf.token_file,
            "/p/tok");
  EXPECT_EQ(Config({"t.py"}, {{"MUSTER_TOKEN_FILE", ""}}).rdzv_conf.token_file, "")
      << "set but empty is unset";
  EXPECT_THAT(Error({"--rdzv-conf", "token_file=", "t.py"}), HasSubstr("has no value"));
}

TEST(ParseCommandLineTest, TlsFilesTakeTorchrunsEtcdKeyNames) {
  const LaunchConfig config =
      Config({"--rdzv-conf", "cacert=/t/ca.pem,cert=/t/node.pem,key=/t/node.key", "t.py"});
  EXPECT_EQ(config.rdzv_conf.cacert, "/t/ca.pem");
  EXPECT_EQ(config.rdzv_conf.cert, "/t/node.pem");
  EXPECT_EQ(config.rdzv_conf.key, "/t/node.key");
  // Only paths here: whether they go together is checked when the launch starts.
  EXPECT_EQ(Config({"--rdzv-conf", "cert=/t/node.pem", "t.py"}).rdzv_conf.cert, "/t/node.pem");
  EXPECT_EQ(Config({"t.py"}).rdzv_conf.cacert, "");
  EXPECT_THAT(Error({"--rdzv-conf", "cacert=", "t.py"}), HasSubstr("has no value"));
}

TEST(ParseCommandLineTest, RdzvConfAuthAndMungeSocket) {
  EXPECT_EQ(Config({"t.py"}).rdzv_conf.auth, RdzvAuth::kAuto);
  EXPECT_EQ(Config({"--rdzv-conf", "auth=none", "t.py"}).rdzv_conf.auth, RdzvAuth::kNone);
  EXPECT_EQ(Config({"--rdzv-conf", "auth=token", "t.py"}).rdzv_conf.auth, RdzvAuth::kToken);
  EXPECT_EQ(Config({"--rdzv-conf", "auth=munge,munge_socket=/m.sock", "t.py"}).rdzv_conf.auth,
            RdzvAuth::kMunge);
  EXPECT_EQ(Config({"--rdzv-conf", "munge_socket=/m.sock", "t.py"}).rdzv_conf.munge_socket,
            "/m.sock");
  EXPECT_THAT(Error({"--rdzv-conf", "auth=kerberos", "t.py"}),
              HasSubstr("auth needs none, token or munge, not kerberos"));
}

TEST(ParseCommandLineTest, RdzvConfEventLog) {
  EXPECT_EQ(Config({"t.py"}).rdzv_conf.event_log, "");
  EXPECT_EQ(Config({"--rdzv-conf", "event_log=/var/log/job.jsonl", "t.py"}).rdzv_conf.event_log,
            "/var/log/job.jsonl");
  EXPECT_THAT(Error({"--rdzv-conf", "event_log=", "t.py"}), HasSubstr("event_log"));
}

TEST(ParseCommandLineTest, RdzvConfErrorsNameTheKeyAndListTheKeys) {
  struct Case {
    std::string conf;
    std::string named;
  };
  for (const Case& c : std::vector<Case>{{"join_timeout", "join_timeout"},
                                         {"store_type=redis", "store_type"},
                                         {"join_timeout=abc", "join_timeout"},
                                         {"join_timeout=-1", "join_timeout"},
                                         {"join_timeout=", "join_timeout"},
                                         {"read_timeout=inf", "read_timeout"},
                                         {"keep_alive_max_attempt=0", "keep_alive_max_attempt"},
                                         {"keep_alive_max_attempt=1.5", "keep_alive_max_attempt"},
                                         {"is_host=maybe", "is_host"},
                                         {"=5", "=5"},
                                         {"is_host=1,", "empty entry"}}) {
    SCOPED_TRACE(c.conf);
    EXPECT_THAT(Error({"--rdzv-conf", c.conf, "t.py"}),
                AllOf(HasSubstr("--rdzv-conf"), HasSubstr(c.named),
                      HasSubstr("keys: join_timeout, last_call_timeout"),
                      HasSubstr("keep_alive_max_attempt (integer >= 1)")));
  }
}

// torchrun ignores a key no backend reads; muster too, with one warning line each.
TEST(ParseCommandLineTest, RdzvConfUnknownKeyIsIgnoredWithAWarning) {
  absl::StatusOr<ParsedCommandLine> parsed =
      Parse({"--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=5,colour=blue", "t.py"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.rdzv_conf.join_timeout, milliseconds(5000));
  ASSERT_THAT(parsed->warnings, ElementsAre(HasSubstr("ignoring the unknown key colour")));
  EXPECT_THAT(parsed->warnings[0], Not(HasSubstr("\n")));
}

// test/distributed/launcher/test_run.py passes the quotes of a shell line
// through a Python list: torchrun 1.13 and 2.x run it, so muster must.
TEST(ParseCommandLineTest, RdzvConfOfTorchsOwnLauncherTestRuns) {
  absl::StatusOr<ParsedCommandLine> parsed =
      Parse({"--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:29400",
             "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'", "t.py"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.rdzv_conf.last_call_timeout, milliseconds(1000));
  EXPECT_THAT(parsed->warnings, ElementsAre(HasSubstr(R"(unknown key '\'join_timeout')")));
}

TEST(ParseCommandLineTest, RdzvConfTorchrunKeysWithAndWithoutAMeaningHere) {
  // static: torchrun's `timeout` is its store's, which is muster's join timeout.
  EXPECT_EQ(Config({"--rdzv-conf", "timeout=7", "t.py"}).rdzv_conf.join_timeout,
            milliseconds(7000));
  EXPECT_EQ(Config({"--rdzv-conf", "timeout=7,join_timeout=9", "t.py"}).rdzv_conf.join_timeout,
            milliseconds(9000));
  EXPECT_THAT(Error({"--rdzv-conf", "timeout=0", "t.py"}), HasSubstr("timeout needs seconds > 0"));
  // torchrun's etcd (v1) backend: the whole rendezvous' deadline.
  EXPECT_EQ(
      Config({"--rdzv-backend=etcd", "--rdzv-conf", "timeout=8", "t.py"}).rdzv_conf.join_timeout,
      milliseconds(8000));
  // c10d reads no `timeout`, in torchrun or here.
  EXPECT_EQ(
      Config({"--rdzv-backend=c10d", "--rdzv-conf", "timeout=x", "t.py"}).rdzv_conf.join_timeout,
      milliseconds(600'000));
  // is_host as torchrun's get_as_bool reads it.
  EXPECT_EQ(Config({"--rdzv-conf", "is_host=Yes", "t.py"}).rdzv_conf.is_host, true);
  EXPECT_EQ(Config({"--rdzv-conf", "is_host=n", "t.py"}).rdzv_conf.is_host, false);
  absl::StatusOr<ParsedCommandLine> quiet =
      Parse({"--rdzv-conf", "store_type=TCP,use_libuv=0,rank=3,read_timeout=9", "t.py"});
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  EXPECT_THAT(quiet->warnings, IsEmpty());
  absl::StatusOr<ParsedCommandLine> noted =
      Parse({"--rdzv-conf", "store_type=file,etcd_prefix=/x", "t.py"});
  ASSERT_TRUE(noted.ok()) << noted.status();
  EXPECT_THAT(noted->warnings, ElementsAre(HasSubstr("store_type=file is ignored"),
                                           HasSubstr("etcd_prefix is torchrun's etcd (v1)")));
}

// torchrun passes these on as arguments of its own and crashes; muster names the option.
TEST(ParseCommandLineTest, RdzvConfKeysThatAreOptions) {
  EXPECT_THAT(Error({"--rdzv-conf", "local_addr=10.0.0.1", "t.py"}),
              HasSubstr("local_addr is not a rendezvous setting but an option; give --local-addr"));
  EXPECT_THAT(Error({"--rdzv-conf", "min_nodes=2", "t.py"}), HasSubstr("give --nnodes MIN:MAX"));
}

// A node whose heartbeat timeout is zero would never be found dead.
TEST(ParseCommandLineTest, RdzvConfHeartbeatTimeoutUnderASecondIsRefused) {
  for (const char* conf : {"heartbeat_timeout=0", "heartbeat_timeout=0.5"}) {
    SCOPED_TRACE(conf);
    EXPECT_THAT(Error({"--rdzv-conf", conf, "t.py"}),
                AllOf(HasSubstr("heartbeat_timeout needs at least 1 second"),
                      HasSubstr("heartbeat_timeout=1 or more")));
  }
}

TEST(ParseCommandLineTest, StandaloneSetsEmbeddedRendezvous) {
  absl::StatusOr<ParsedCommandLine> first = Parse({"--standalone", "t.py"});
  absl::StatusOr<ParsedCommandLine> second = Parse({"--standalone", "t.py"});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(first->config.standalone);
  EXPECT_EQ(first->config.rdzv_backend, RdzvBackend::kMuster);
  EXPECT_EQ(first->config.rdzv_endpoint, "localhost:0");
  EXPECT_THAT(first->config.rdzv_id, MatchesRegex("[0-9a-f]{16}"));
  EXPECT_NE(first->config.rdzv_id, second->config.rdzv_id);
  EXPECT_THAT(first->warnings, IsEmpty());
}

TEST(ParseCommandLineTest, StandaloneAcceptsOneNode) {
  EXPECT_TRUE(Config({"--standalone", "--nnodes", "1", "t.py"}).standalone);
  EXPECT_TRUE(Config({"--standalone", "--nnodes=1:1", "t.py"}).standalone);
}

TEST(ParseCommandLineTest, StandaloneRejectsSeveralNodes) {
  for (const std::string nodes : {"2", "1:2"}) {
    SCOPED_TRACE(nodes);
    EXPECT_THAT(Error({"--standalone", "--nnodes", nodes, "t.py"}),
                AllOf(HasSubstr("--nnodes " + nodes),
                      HasSubstr("--standalone runs exactly one node"), HasSubstr("drop --nnodes")));
  }
  EXPECT_THAT(Error({"--nnodes", "2", "t.py"}, {{"PET_STANDALONE", "1"}}),
              HasSubstr("--standalone runs exactly one node"));
}

TEST(ParseCommandLineTest, StandaloneOverridesRdzvOptionsWithWarnings) {
  absl::StatusOr<ParsedCommandLine> parsed =
      Parse({"--standalone", "--rdzv-backend", "etcd", "--rdzv-endpoint", "node9:1", "t.py"},
            {{"PET_RDZV_ID", "job"}});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->config.rdzv_backend, RdzvBackend::kMuster);
  EXPECT_EQ(parsed->config.rdzv_endpoint, "localhost:0");
  EXPECT_NE(parsed->config.rdzv_id, "job");
  EXPECT_THAT(parsed->warnings,
              ElementsAre(HasSubstr("--standalone ignores --rdzv-backend etcd"),
                          HasSubstr("--standalone ignores --rdzv-endpoint node9:1"),
                          AllOf(HasSubstr("PET_RDZV_ID=job"), HasSubstr("--rdzv-id"))));
}

TEST(ParseCommandLineTest, FlagGivenAValue) {
  EXPECT_FALSE(Config({"--standalone=false", "t.py"}).standalone);
  EXPECT_TRUE(Config({"--standalone=1", "t.py"}).standalone);
  EXPECT_THAT(Error({"--standalone=maybe", "t.py"}),
              AllOf(HasSubstr("--standalone=maybe"), HasSubstr("a flag takes no value")));
}

TEST(ParseCommandLineTest, MaxRestartsErrors) {
  for (const std::string bad : {"-1", "x", "1.5"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--max-restarts", bad, "t.py"}),
                AllOf(HasSubstr("--max-restarts " + bad), HasSubstr("N >= 0")));
  }
}

TEST(ParseCommandLineTest, RulesOfProgressAndBadNodes) {
  const LaunchConfig defaults = Config({"t.py"});
  EXPECT_EQ(defaults.max_no_progress_restarts, 0) << "off unless asked";
  EXPECT_EQ(defaults.max_node_failures, 3);
  EXPECT_EQ(defaults.on_node_excluded, "");
  const LaunchConfig given =
      Config({"--max-no-progress-restarts", "2", "--max_node_failures=0", "--on-node-excluded",
              "scontrol update nodename=$MUSTER_EXCLUDED_HOST state=drain", "t.py"});
  EXPECT_EQ(given.max_no_progress_restarts, 2);
  EXPECT_EQ(given.max_node_failures, 0);
  EXPECT_EQ(given.on_node_excluded, "scontrol update nodename=$MUSTER_EXCLUDED_HOST state=drain");
  for (const std::string bad : {"-1", "x", "1000001"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--max-no-progress-restarts", bad, "t.py"}),
                AllOf(HasSubstr("--max-no-progress-restarts " + bad), HasSubstr("0 to 1000000")));
    EXPECT_THAT(Error({"--max-node-failures", bad, "t.py"}),
                AllOf(HasSubstr("--max-node-failures " + bad), HasSubstr("0: never exclude")));
  }
  EXPECT_THAT(Error({"--on-node-excluded", " ", "t.py"}), HasSubstr("an empty command"));
}

TEST(ParseCommandLineTest, PreloadTakesModuleNames) {
  EXPECT_THAT(Config({"t.py"}).preload, IsEmpty()) << "off unless asked";
  EXPECT_THAT(Config({"--preload", "torch", "t.py"}).preload, ElementsAre("torch"));
  EXPECT_THAT(Config({"--preload= torch , numpy.linalg,_x1", "t.py"}).preload,
              ElementsAre("torch", "numpy.linalg", "_x1"));
  EXPECT_THAT(Config({"--preload", "none", "t.py"}).preload, IsEmpty());
  for (const std::string bad : {"to rch", "torch,,numpy", "1torch", "torch.", ".torch", "os;rm"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--preload", bad, "t.py"}),
                AllOf(HasSubstr("is not a module name"), HasSubstr("give --preload MODULES")));
  }
}

TEST(ParseCommandLineTest, GpuReleaseWait) {
  EXPECT_EQ(Config({"t.py"}).gpu_release_wait, std::chrono::milliseconds(50'000));
  EXPECT_EQ(Config({"--gpu-release-wait", "2.5", "t.py"}).gpu_release_wait,
            std::chrono::milliseconds(2'500));
  EXPECT_EQ(Config({"--gpu_release_wait=0", "t.py"}).gpu_release_wait.count(), 0);
  EXPECT_THAT(Error({"--gpu-release-wait", "-1", "t.py"}),
              AllOf(HasSubstr("--gpu-release-wait -1"), HasSubstr("0: no wait")));
}

TEST(ParseCommandLineTest, MonitorIntervalErrors) {
  for (const std::string bad : {"0", "-1", "x", "nan"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--monitor-interval", bad, "t.py"}), HasSubstr("--monitor-interval " + bad));
  }
}

TEST(ParseCommandLineTest, StartMethodAndRole) {
  EXPECT_EQ(Config({"--start-method", "forkserver", "t.py"}).start_method, "forkserver");
  EXPECT_THAT(Error({"--start-method", "thread", "t.py"}),
              AllOf(HasSubstr("--start-method thread"), HasSubstr("spawn, fork or forkserver")));
  EXPECT_THAT(Error({"--role=", "t.py"}), HasSubstr("--role ''"));
}

TEST(ParseCommandLineTest, ModuleAndNoPythonConflict) {
  const std::string expected =
      "-m and --no-python cannot be used together: -m runs python -m MODULE, --no-python runs "
      "SCRIPT directly";
  EXPECT_THAT(Error({"-m", "--no-python", "pkg"}), HasSubstr(expected));
  EXPECT_THAT(Error({"--module", "pkg"}, {{"PET_NO_PYTHON", "1"}}), HasSubstr(expected));
  EXPECT_TRUE(Config({"--run-path", "--no-python", "t.py"}).run_path);
}

TEST(ParseCommandLineTest, RedirectsEveryRank) {
  LaunchConfig config = Config({"-r", "1", "--tee=0", "t.py"});
  EXPECT_TRUE(config.redirects.For(0).out);
  EXPECT_FALSE(config.redirects.For(0).err);
  EXPECT_TRUE(config.redirects.For(7).out);
  EXPECT_FALSE(config.tee.For(0).out || config.tee.For(0).err);
}

TEST(ParseCommandLineTest, RedirectsPerRank) {
  LaunchConfig config = Config({"-r", "0:1,1:2", "-t", " 3 : 3 ", "t.py"});
  ASSERT_FALSE(config.redirects.all.has_value());
  EXPECT_EQ(config.redirects.per_rank.size(), 2u);
  EXPECT_TRUE(config.redirects.For(0).out);
  EXPECT_FALSE(config.redirects.For(0).err);
  EXPECT_FALSE(config.redirects.For(1).out);
  EXPECT_TRUE(config.redirects.For(1).err);
  EXPECT_FALSE(config.redirects.For(2).out || config.redirects.For(2).err);
  EXPECT_TRUE(config.tee.For(3).out && config.tee.For(3).err);
}

TEST(ParseCommandLineTest, RedirectsErrors) {
  for (const std::string bad : {"7", "a", "0:9", "x:1", "-1:1", "0:1,0:2", "0:1:2", "", "0:1,"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(
        Error({"-r", bad, "t.py"}),
        AllOf(HasSubstr("--redirects"), HasSubstr("LOCAL_RANK:VALUE pairs such as 0:1,1:2")));
    EXPECT_THAT(Error({"--tee", bad, "t.py"}),
                AllOf(HasSubstr("--tee"), HasSubstr("give --tee 0")));
  }
}

TEST(ParseCommandLineTest, LocalRanksFilter) {
  EXPECT_EQ(Config({"--local-ranks-filter", "0", "t.py"}).local_ranks_filter, std::set<int>{0});
  EXPECT_EQ(Config({"--local-ranks-filter", " 3, 0 ", "t.py"}).local_ranks_filter,
            (std::set<int>{0, 3}));
  EXPECT_FALSE(Config({"--local-ranks-filter=", "t.py"}).local_ranks_filter.has_value());
  for (const std::string bad : {"a", "-1", "0,,1", "1.5"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--local-ranks-filter", bad, "t.py"}),
                AllOf(HasSubstr("--local-ranks-filter"), HasSubstr("e.g. 0 or 0,3")));
  }
}

TEST(ParseCommandLineTest, NodeRankAndStaticRendezvousAddresses) {
  LaunchConfig config =
      Config({"--node-rank", "0", "--master-addr", "[::1]", "--master-port", "65535", "t.py"});
  EXPECT_TRUE(config.node_rank_given);  // given, even though it equals the default
  EXPECT_EQ(config.master_addr, "[::1]");
  EXPECT_EQ(config.master_port, 65535);
  EXPECT_THAT(Error({"--node-rank", "-1", "t.py"}),
              HasSubstr("--node-rank -1: must be at least 0"));
  for (const std::string bad : {"0", "65536", "x"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Error({"--master-port", bad, "t.py"}),
                AllOf(HasSubstr("--master-port " + bad), HasSubstr("1..65535")));
  }
  EXPECT_THAT(Error({"--master-addr", "", "t.py"}), HasSubstr("--master-addr ''"));
}

TEST(ParseCommandLineTest, ShutdownGraceSources) {
  EXPECT_EQ(Config({"t.py"}).shutdown_grace, milliseconds(30'000));
  EXPECT_EQ(Config({"t.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5"}}).shutdown_grace,
            milliseconds(5000));
  EXPECT_EQ(
      Config({"t.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5"}, {"PET_SHUTDOWN_TIMEOUT", "6"}})
          .shutdown_grace,
      milliseconds(6000));
  EXPECT_EQ(Config({"--shutdown-timeout", "0.25", "t.py"},
                   {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5"}, {"PET_SHUTDOWN_TIMEOUT", "6"}})
                .shutdown_grace,
            milliseconds(250));
  EXPECT_EQ(Config({"--shutdown-timeout=0", "t.py"}).shutdown_grace, milliseconds(0));
}

TEST(ParseCommandLineTest, ShutdownGraceErrors) {
  EXPECT_THAT(Error({"--shutdown-timeout", "-1", "t.py"}),
              AllOf(HasSubstr("--shutdown-timeout -1"), HasSubstr("must be 0 or more")));
  EXPECT_THAT(Error({"--shutdown-timeout", "1e12", "t.py"}), HasSubstr("must be at most"));
  EXPECT_THAT(Error({"t.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"}}),
              AllOf(HasSubstr("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon"),
                    HasSubstr("not a number of seconds")));
}

TEST(ParseCommandLineTest, HelpListsEveryOption) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse({"--help"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(parsed->help.has_value());
  const std::string& help = *parsed->help;
  for (const OptionCase& option : AllOptions()) {
    // The dashed long spelling: "-m" and "--module" are listed as "-m, --module".
    const std::string& name =
        option.spellings.front().size() == 2 ? option.spellings.back() : option.spellings.front();
    EXPECT_THAT(help, HasSubstr(name + (option.value.empty() ? "" : " "))) << name;
  }
  EXPECT_THAT(help, AllOf(HasSubstr("Usage: muster [options] SCRIPT"), HasSubstr("-m, --module"),
                          HasSubstr("--version"), HasSubstr("PET_<NAME>"),
                          HasSubstr("Options go before SCRIPT"), HasSubstr("[default: 1:1]"),
                          HasSubstr("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"), HasSubstr("--logs-specs"),
                          HasSubstr("(torchrun 1.10)"), HasSubstr("(torchrun 2.9)")));
}

TEST(ParseCommandLineTest, HelpWinsOverOtherProblems) {
  for (std::vector<std::string> args :
       {std::vector<std::string>{"-h"}, {"--nnodes", "0", "--help"}, {"--bogus", "-h", "t.py"}}) {
    SCOPED_TRACE(testing::PrintToString(args));
    absl::StatusOr<ParsedCommandLine> parsed = Parse(args);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(parsed->help.has_value());
  }
}

TEST(ParseCommandLineTest, Version) {
  absl::StatusOr<ParsedCommandLine> parsed = Parse({"--version"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->version);
  EXPECT_FALSE(parsed->help.has_value());
  absl::StatusOr<ParsedCommandLine> as_script_arg = Parse({"t.py", "--version"});
  ASSERT_TRUE(as_script_arg.ok()) << as_script_arg.status();
  EXPECT_FALSE(as_script_arg->version);
}

TEST(ParseCommandLineTest, PrintCompletion) {
  for (const char* shell : {"bash", "zsh", "tcsh"}) {
    // As torchrun's: no script needed, and it ends the parse.
    absl::StatusOr<ParsedCommandLine> parsed = Parse({"--print-completion", shell});
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->completion_shell, shell);
  }
  absl::StatusOr<ParsedCommandLine> spelled = Parse({"--print_completion=zsh", "--version"});
  ASSERT_TRUE(spelled.ok()) << spelled.status();
  EXPECT_EQ(spelled->completion_shell, "zsh");
  EXPECT_FALSE(spelled->version);
  absl::StatusOr<ParsedCommandLine> help = Parse({"--print-completion", "bash", "--help"});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_TRUE(help->help.has_value()) << "help wins";
  EXPECT_THAT(Error({"--print-completion", "fish"}),
              AllOf(HasSubstr("--print-completion 'fish'"), HasSubstr("bash, zsh and tcsh")));
  EXPECT_THAT(Error({"--print-completion"}), HasSubstr("--print-completion needs a value"));
}

TEST(ParseCommandLineTest, OddInputsNeverThrow) {
  for (std::vector<std::string> args :
       std::vector<std::vector<std::string>>{{"-"},
                                             {"---"},
                                             {"--="},
                                             {"-="},
                                             {"--nnodes="},
                                             {"\n"},
                                             {"--nnodes", "\n", "t.py"},
                                             {"-mrt"},
                                             {"-r"},
                                             {"--", "--"},
                                             {"--standalone", "--standalone", "t.py"},
                                             {"-h=", "t.py"},
                                             {"--help=no"},
                                             {"-r=3", "t.py"},
                                             {std::string("a\0b", 3)}}) {
    SCOPED_TRACE(testing::PrintToString(args));
    absl::StatusOr<ParsedCommandLine> parsed = Parse(args);
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(parsed.status().message()), Not(HasSubstr("\n")));
    }
  }
}

}  // namespace
}  // namespace muster
