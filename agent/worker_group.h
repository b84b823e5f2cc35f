// The workers of one attempt on this node: started through a ProcessRunner
// with the torchrun environment, their output carried from pipes to the
// console and the log files, their error files read when they fail.
// Log layout, as torchrun's: <run_dir>/attempt_<n>/<local_rank>/{stdout,stderr}.log, error.json.
#ifndef MUSTER_AGENT_WORKER_GROUP_H_
#define MUSTER_AGENT_WORKER_GROUP_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/config.h"
#include "agent/event_loop.h"
#include "agent/failure_report.h"
#include "agent/numa.h"
#include "agent/output.h"
#include "agent/process_runner.h"
#include "agent/worker_env.h"
#include "common/log.h"

namespace muster {

struct WorkerGroupOptions {
  const LaunchConfig* config = nullptr;  // -r, -t, filters, role, the script's arguments
  int nproc = 1;
  std::string program;                // what each worker execs
  std::string host;                   // for failure reports
  std::string run_dir;                // where attempt_<n> directories go
  std::vector<std::string> base_env;  // KEY=VALUE: what every worker's environment starts from
  int console_out = 1;                // where shown output goes; not owned
  int console_err = 2;
  // --numa-binding: each local rank's CPUs and memory nodes; empty: unbound.
  std::vector<CpuBinding> numa;
  // Where the workers' MUSTER_PROGRESS_FILEs go (attempt_<n>.<local_rank>):
  // a private directory on a tmpfs, where a write costs microseconds (on
  // ext4 a rewrite of a truncated file is flushed at its close); empty: in
  // each rank's log directory.
  std::string progress_dir;
};

class WorkerGroup {
 public:
  struct Worker {
    int local_rank = 0;
    int rank = 0;
    std::unique_ptr<Process> process;
    std::string error_file;
    std::string progress_file;  // MUSTER_PROGRESS_FILE; empty for the pre-flight's
    UniqueFd out_fd, err_fd;
    std::optional<WorkerOutput> out, err;
    // Why muster killed it, when it did (WorkerFailure's fields of the same names).
    std::string killed_for, stack, stack_file;
    absl::Time started;
  };
  struct Started {
    int count = 0;
    // The first worker that could not be started (exit code 127, the
    // reason as its message); the ones after it were not tried.
    std::optional<WorkerFailure> failure;
  };

  // `runner`, `loop` and `clock` outlive the group.
  WorkerGroup(WorkerGroupOptions options, ProcessRunner& runner, EventLoop& loop, Clock& clock);
  // Workers still running are killed and reaped.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // What a start runs instead of the script: the pre-flight (--preflight).
  struct Instead {
    std::vector<std::string> argv;  // argv[0]: the path exec'd
    std::string dir;                // its logs' directory under run_dir, for attempt_<n>
  };

  // Replaces the previous attempt's workers (REQUIRES: all exited) with
  // this one's, started in local-rank order: the script's, or `instead`'s
  // when given.
  Started Start(const NodePlacement& placement, int attempt, const Instead* instead = nullptr);

  // The running worker whose pid this is; nullptr for any other pid.
  Worker* Find(pid_t pid);
  // The running worker whose process group `pid` is in (the worker itself,
  // or a process it started that stayed in its group); nullptr for any other.
  Worker* FindByGroup(pid_t pid);
  // The directory of `worker`'s logs and error file.
  std::string RankDir(const Worker& worker) const;
  // Records the exit of `worker`, drains and closes its output, and
  // describes it as a failure (with its error file read when it failed).
  WorkerFailure Exited(Worker& worker, ExitStatus status);
  // Sends `sig` to every running worker's process group.
  void SignalAll(int sig);
  // Takes the stacks of every thread of each of `workers` (stack_capture.h),
  // at most `limit` in all, and keeps them with each worker (its `stack`)
  // and in <rank dir>/stack.txt, ready for the failure report.
  void CaptureStacks(const std::vector<Worker*>& workers, absl::Duration limit);
  // The workers still running.
  std::vector<Worker*> Running();

  // Gives up on every worker still running (SIGKILL did not end it; see
  // Process::Abandon), logging each one's pid and what the kernel says it
  // waits in. Returns how many.
  int AbandonRunning();
  // An exit of an abandoned worker, reaped after all: true when `pid` was one.
  bool ReapedAbandoned(pid_t pid);

  const std::vector<Worker>& workers() const { return workers_; }

 private:
  // The console prefix of `worker`'s lines (--log-line-prefix-template). REQUIRES: it was started.
  std::string LinePrefix(const Worker& worker) const;
  // Start's steps: the attempt's filtered logs; one worker started (its
  // directory, logs, process, output and the loop's watch), or why not.
  void OpenDuplicators(const std::string& attempt_dir);
  SpawnOptions SpawnFor(const NodePlacement& placement, const Worker& worker,
                        const Instead* instead) const;
  std::optional<WorkerFailure> StartWorker(const NodePlacement& placement, int local_rank,
                                           const std::string& attempt_dir, const Instead* instead);
  void OnReadable(Worker& worker, bool is_stderr);
  void DrainAndClose(Worker& worker);
  WorkerFailure Describe(const Worker& worker, ExitStatus status, const std::string& message);

  const WorkerGroupOptions options_;
  ProcessRunner& runner_;
  EventLoop& loop_;
  Clock& clock_;
  std::shared_ptr<spdlog::logger> logger_;
  // The attempt's filtered_std{out,err}.log, when filters are given; before
  // workers_, whose outputs point to them, so destroyed after them.
  std::optional<LineDuplicator> duplicate_out_, duplicate_err_;
  std::vector<Worker> workers_;
  std::vector<std::unique_ptr<Process>> abandoned_;
  bool wrote_script_ = false;  // <run_dir>/pystacks.py, for CaptureStacks
  int attempt_ = 0;            // of the workers that run
};

}  // namespace muster

#endif  // MUSTER_AGENT_WORKER_GROUP_H_
