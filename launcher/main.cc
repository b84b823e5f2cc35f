// muster: the launcher and node agent. Reads torchrun's command line (with
// Slurm's allocation as defaults) and runs the launch (launcher/run.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "agent/exit_codes.h"
#include "common/process_env.h"
#include "common/release_mode.h"
#include "launcher/command_line.h"
#include "launcher/completion.h"
#include "launcher/run.h"
#include "rendezvous/grpc/exit.h"

namespace muster {
namespace {

int UsageError(absl::string_view message) {
  std::fprintf(stderr, "muster: error: %.*s\n", static_cast<int>(message.size()), message.data());
  return kExitUsage;
}

int Main(int argc, char** argv) {
  absl::StatusOr<CommandLine> command =
      ReadCommandLine(std::vector<std::string>(argv, argv + argc), GetEnv);
  if (!command.ok()) return UsageError(command.status().message());
  const ParsedCommandLine& parsed = command->parsed;
  if (parsed.help) {
    std::fputs(parsed.help->c_str(), stdout);
    return kExitSuccess;
  }
  if (parsed.completion_shell) {
    std::fputs(CompletionScript(*parsed.completion_shell, OptionSummaries()).c_str(), stdout);
    return kExitSuccess;
  }
  if (parsed.version) {
    std::printf("muster %s\n", MUSTER_VERSION);
    return kExitSuccess;
  }
  for (const std::string& warning : parsed.warnings) {
    std::fprintf(stderr, "muster: warning: %s\n", warning.c_str());
  }
  if (command->slurm) std::fprintf(stderr, "%s\n", command->slurm->Describe().c_str());

  absl::StatusOr<int> code = RunLaunch(std::move(command->parsed.config));
  if (!code.ok()) return UsageError(code.status().message());
  return *code;
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) {
  muster::EnterReleaseMode();
  return muster::rdzv::FinishGrpc(muster::Main(argc, argv));
}
