// A worker process, started the way a supervisor must start it: its own
// process group (so a Ctrl-C to the terminal reaches the agent, not the
// workers directly), PR_SET_PDEATHSIG so it dies with the agent, stdout and
// stderr on pipes, and a clean signal mask.
#ifndef MUSTER_AGENT_CHILD_PROCESS_H_
#define MUSTER_AGENT_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/process_runner.h"
#include "common/unique_handle.h"

namespace muster {

// Decodes a status from waitpid().
ExitStatus DecodeWaitStatus(int wait_status);

// Finds `name` the way execvp would: as given when it has a '/', else in the
// directories of `path_env` (a PATH value). Errors name the file and say why.
absl::StatusOr<std::string> ResolveExecutable(const std::string& name, const std::string& path_env);

// A pipe, both ends close-on-exec.
absl::Status MakePipe(UniqueFd* read_end, UniqueFd* write_end);

class ChildProcess final : public Process {
 public:
  // Starts the child (clone with CLONE_VM|CLONE_VFORK, then exec). Call from
  // the thread that lives as long as the agent: PR_SET_PDEATHSIG fires when
  // the *thread* that started the child exits. REQUIRES: the
  // caller blocks the signals it handles; the child unblocks them all.
  // Errors: the exec's errno, e.g. kPermissionDenied for a file that is not executable.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const SpawnOptions& options);
  // A child started another way (forked from a preloaded interpreter and
  // reparented to this process): the leader of its own group, its output
  // on the read ends `out` and `err`.
  static std::unique_ptr<ChildProcess> Adopt(pid_t pid, UniqueFd out, UniqueFd err);

  // A child still running is killed (its whole group) and reaped.
  ~ChildProcess() override;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const override { return pid_; }
  bool exited() const override { return exited_; }
  const ExitStatus& exit_status() const { return exit_status_; }
  // Records the exit a waitpid() elsewhere (the agent's reaper) collected.
  void MarkExited(ExitStatus status) override;

  // Sends `sig` to the child's process group; ESRCH (already gone) is fine.
  void SignalGroup(int sig) const override;
  void Abandon() override { abandoned_ = true; }

  // Read ends of the output pipes, non-blocking, close-on-exec; invalid once taken.
  UniqueFd TakeStdout() override { return std::move(stdout_); }
  UniqueFd TakeStderr() override { return std::move(stderr_); }

 private:
  ChildProcess() = default;
  void MakeNonBlocking();
  pid_t pid_ = -1;
  bool exited_ = false;
  bool abandoned_ = false;
  ExitStatus exit_status_;
  UniqueFd stdout_;
  UniqueFd stderr_;
};

}  // namespace muster

#endif  // MUSTER_AGENT_CHILD_PROCESS_H_
