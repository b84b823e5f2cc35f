// muster's command line: torchrun's options (and their PET_* environment variables) turned into a
// validated LaunchConfig. Pure apart from --standalone's random id: no process environment, files
// or clocks, only the inputs given.
#ifndef MUSTER_LAUNCHER_OPTIONS_H_
#define MUSTER_LAUNCHER_OPTIONS_H_

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/config.h"

namespace muster {

struct ParsedCommandLine {
  // The launch to run. Meaningless when help or version is set (it then holds the defaults).
  LaunchConfig config;
  // Set for -h/--help: the text to print before exiting 0. Wins over every other option.
  std::optional<std::string> help;
  // --print-completion SHELL was given (and --help was not): print
  // CompletionScript(SHELL) (launcher/completion.h), exit 0.
  std::optional<std::string> completion_shell;
  // --version was given (and neither of the above): print the version, exit 0.
  bool version = false;
  // Things the user asked for that were overridden, one line each, no trailing newline
  // (e.g. --rdzv-endpoint given with --standalone). The caller prints them.
  std::vector<std::string> warnings;
  // The options given as flags (not from the environment), by their
  // variable's name (PET_MASTER_PORT for --master-port).
  std::set<std::string> flags_given;
};

// One option as a shell's completion sees it: every spelling ("-r",
// "--redirects"), and the help's name for its value ("" for a flag;
// "static|c10d|muster|etcd" where it is a choice).
struct OptionSummary {
  std::vector<std::string> spellings;
  std::string value_name;
};
std::vector<OptionSummary> OptionSummaries();

// Returns the value of the environment variable `name`, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Parses `muster [options] SCRIPT [script args...]`. args[0] is the program name and is ignored.
//
// Options are torchrun's (see TORCHRUN.md), each accepted with dashes or underscores, as
// `--opt value` or `--opt=value`, plus muster's --shutdown-timeout. Parsing stops at the first
// argument that is not an option (or after `--`): that is SCRIPT, and everything after it goes to
// script_args untouched, option-like or not.
//
// An option absent from the command line is read from env as PET_<NAME> (PET_NPROC_PER_NODE,
// PET_STANDALONE=1 for a flag); a set-but-empty variable counts as unset. The shutdown grace comes
// from --shutdown-timeout, else PET_SHUTDOWN_TIMEOUT, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else
// 30 s. The token file comes from --rdzv-conf token_file=PATH, else MUSTER_TOKEN_FILE (only its
// path: the file is read when the launch starts). `env` may be empty (no environment).
//
// --standalone sets backend kMuster, endpoint "localhost:0" and a random 16-hex-digit rdzv_id,
// overriding (with a warning) any --rdzv-backend/--rdzv-endpoint/--rdzv-id given.
//
// Errors: InvalidArgumentError with a one-line message that names the offending option (and the
// PET_ variable when the value came from there), what is wrong and how to fix it. Never throws.
absl::StatusOr<ParsedCommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                                   const EnvLookup& env);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_OPTIONS_H_
