// muster: the launcher and node agent. Reads torchrun's command line (with
// Slurm's allocation as defaults) and runs the launch (launcher/run.h).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "agent/exit_codes.h"
#include "common/process_env.h"
#include "common/release_mode.h"
#include "launcher/accelerate_file.h"
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

// With --accelerate-config: the file's variables set in this process's
// environment, as `accelerate launch` sets them in its own (the workers
// inherit them; CUDA_VISIBLE_DEVICES narrows the GPUs muster counts too),
// then the command line read again with the file's torchrun options.
absl::StatusOr<CommandLine> WithAccelerateConfig(const std::vector<std::string>& args,
                                                 CommandLine command) {
  const std::string& file = command.parsed.config.accelerate_config;
  if (file.empty() || command.parsed.help || command.parsed.version ||
      command.parsed.completion_shell) {
    return command;
  }
  absl::StatusOr<AccelerateLaunch> launch = LoadAccelerateConfig(
      file, command.slurm ? command.slurm->nnodes : 0, command.parsed.flags_given);
  if (!launch.ok()) return launch.status();
  for (const std::string& warning : launch->warnings) {
    std::fprintf(stderr, "muster: warning: %s\n", warning.c_str());
  }
  for (const auto& [name, value] : launch->env) setenv(name.c_str(), value.c_str(), 1);
  return ReadCommandLine(args, GetEnv, &*launch);
}

int Main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  absl::StatusOr<CommandLine> command = ReadCommandLine(args, GetEnv);
  if (command.ok()) command = WithAccelerateConfig(args, *std::move(command));
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
