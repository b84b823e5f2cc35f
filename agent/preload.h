// --preload MODULES: one Python interpreter per node imports the modules
// once (agent/preload_server.py), and every worker of every round is forked
// from it instead of started cold, so a restart pays neither the
// interpreter's start nor `import torch`. The fork is made what a cold
// start makes: the worker's own environment, argv, __main__, sys.path[0],
// streams, process group, PDEATHSIG, NUMA binding, and the agent as its
// parent (a double fork: the agent is a child subreaper), so that
// everything the agent does to a worker works the same on it.
//
// Its failures never fail the job: a module that does not import, an
// interpreter that died or cannot be forked safely (threads, a CUDA
// context), and the workers start cold, said once with the reason.
#ifndef MUSTER_AGENT_PRELOAD_H_
#define MUSTER_AGENT_PRELOAD_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/child_process.h"
#include "agent/event_loop.h"
#include "agent/process_runner.h"
#include "common/log.h"
#include "common/unique_handle.h"

namespace muster {

struct PreloadOptions {
  // The worker's interpreter and its flags (python -u), and what it runs:
  // the script, or the module of -m.
  std::vector<std::string> interpreter;
  std::string target;
  bool module = false;
  std::vector<std::string> modules;  // what it imports
  std::vector<std::string> env;      // the job's environment (KEY=VALUE)
  std::string dir;                   // where preload_server.py is written
  // A fork that has not set its worker up in this long is given up on.
  absl::Duration fork_limit = absl::Seconds(10);
};

// A ProcessRunner that forks the user's Python workers (SpawnOptions::
// python_script) from the preloaded interpreter once it is ready, and
// starts anything else, or everything once it is broken, with `cold`.
class Preloader final : public ProcessRunner {
 public:
  enum class State { kImporting, kReady, kBroken };
  // Called as it turns ready or broken, with what happened.
  using OnChange = std::function<void(State, const std::string&)>;

  // Starts the interpreter through `cold`; it imports in the background,
  // watched on `loop` (both outlive this).
  static absl::StatusOr<std::unique_ptr<Preloader>> Start(PreloadOptions options,
                                                          ProcessRunner& cold, EventLoop& loop,
                                                          OnChange on_change);
  // The interpreter still running is killed.
  ~Preloader() override;
  Preloader(const Preloader&) = delete;
  Preloader& operator=(const Preloader&) = delete;

  State state() const { return state_; }
  // `pid` exited: true when it was the interpreter (it is then broken).
  bool OnExit(pid_t pid, ExitStatus status);
  // Gives up on it, killing it: the workers start cold from now on. The
  // first reason is logged, and told to `on_change`, once.
  void Break(const std::string& why);
  // When the import began, for the agent's wait.
  absl::Time started() const { return started_; }
  // Workers forked from it so far, and started cold while it was asked for.
  int forked() const { return forked_; }
  int cold_started() const { return cold_started_; }

  absl::StatusOr<std::unique_ptr<Process>> Spawn(const SpawnOptions& options) override;
  std::optional<ChildExit> NextExit() override { return cold_.NextExit(); }
  void Reap(pid_t pid) override { cold_.Reap(pid); }

 private:
  Preloader(PreloadOptions options, ProcessRunner& cold, EventLoop& loop, OnChange on_change);
  // Reads what the interpreter said on its socket.
  void OnReadable();
  // One worker forked from the interpreter, or why not.
  absl::StatusOr<std::unique_ptr<Process>> Fork(const SpawnOptions& options);
  // Kills the interpreter, if it runs, without waiting for it.
  void Kill();
  // Sends a fork request with the worker's output and report pipes.
  absl::Status SendRequest(const SpawnOptions& options, int out, int err, int report);

  const PreloadOptions options_;
  ProcessRunner& cold_;
  EventLoop& loop_;
  const OnChange on_change_;
  std::shared_ptr<spdlog::logger> logger_;
  State state_ = State::kImporting;
  std::unique_ptr<Process> interpreter_;
  UniqueFd socket_;
  std::string said_;  // what it wrote so far, up to a newline
  absl::Time started_;
  int forked_ = 0;
  int cold_started_ = 0;
};

// The source of agent/preload_server.py, built in.
extern const char* const kPreloadServerSource;

}  // namespace muster

#endif  // MUSTER_AGENT_PRELOAD_H_
