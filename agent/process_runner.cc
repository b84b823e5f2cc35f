#include "agent/process_runner.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>

#include "agent/child_process.h"
#include "common/status.h"

namespace muster {
namespace {

class RealProcessRunner final : public ProcessRunner {
 public:
  absl::StatusOr<std::unique_ptr<Process>> Spawn(const SpawnOptions& options) override {
    absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(options);
    if (!child.ok()) return child.status();
    return std::unique_ptr<Process>(*std::move(child));
  }

  std::optional<ChildExit> NextExit() override {
    siginfo_t info = {};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) {
      return std::nullopt;
    }
    ChildExit exit;
    exit.pid = info.si_pid;
    if (info.si_code == CLD_EXITED) {
      exit.status.exit_code = info.si_status;
    } else {
      exit.status.signal = info.si_status;  // CLD_KILLED or CLD_DUMPED
    }
    return exit;
  }

  void Reap(pid_t pid) override {
    int wait_status = 0;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
  }
};

}  // namespace

absl::StatusOr<ProcessRunner*> ProcessRunner::Real() {
  static RealProcessRunner* const runner = new RealProcessRunner();
  // Orphaned grandchildren (a worker's own children) are reparented to us and reaped.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return ErrnoToStatus(errno, "PR_SET_CHILD_SUBREAPER");
  return runner;
}

}  // namespace muster
