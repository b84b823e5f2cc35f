// PyTorch's file-based watchdog (torch.distributed.elastic.timer's
// FileTimerServer), served by the agent: a worker that runs
//   configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
//   with expires(after=60): ...
// writes one JSON line per acquire and release to a named pipe,
//   {"version": 1, "pid": 1234, "scope_id": "step", "expiration_time": 1.7e9, "signal": 9}
// (expiration_time in Unix seconds; -1 releases the scope), and the server
// kills a pid whose timer expired with the signal its earliest expired timer
// names. The rules are torch's (file_based_local_timer.py, 1.13 and main):
// a later acquire of the same (pid, scope) replaces the earlier one; when a
// pid has expired timers, the earliest with signal > 0 is acted on and every
// timer of that pid is cleared, whether or not one had a signal.
//
// FileTimers is the pure part (lines in, expiries out, on the caller's
// time); TimerPipe is the named pipe.
#ifndef MUSTER_AGENT_FILE_TIMER_H_
#define MUSTER_AGENT_FILE_TIMER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_handle.h"

namespace muster {

// The environment variables torchrun reads and sets.
inline constexpr char kEnableFileTimerEnv[] = "TORCHELASTIC_ENABLE_FILE_TIMER";
inline constexpr char kTimerFileEnv[] = "TORCHELASTIC_TIMER_FILE";

struct FileTimerRequest {
  int64_t pid = 0;
  std::string scope_id;
  // Unix seconds; negative releases the scope.
  double expiration_time = 0;
  int signal = 0;
};

// One line of the protocol, without its '\n'. Errors (kInvalidArgument) say
// what is wrong with it: not JSON, a field missing or of the wrong type, a
// version other than 1.
absl::StatusOr<FileTimerRequest> ParseFileTimerRequest(std::string_view line);

// A timer that ran out.
struct TimerExpiry {
  pid_t pid = 0;
  std::string scope_id;
  int signal = 0;  // > 0: act on it; 0: none of the pid's expired timers asked for a signal
  absl::Time expired_at;
};

class FileTimers {
 public:
  enum class Outcome { kSet, kReleased, kBadLine, kForeignPid };

  // Takes one line. `is_ours(pid)` says whether the pid may be acted on (one
  // of this agent's workers); a line for any other pid changes nothing.
  Outcome Take(std::string_view line, const std::function<bool(pid_t)>& is_ours);

  // The timers expired at `now`: for each pid, the earliest with signal > 0
  // (or, with signal 0, its earliest). Every timer of those pids is cleared.
  std::vector<TimerExpiry> Expire(absl::Time now);

  // The pids with a timer that asks for a signal and runs out by `t`.
  std::vector<pid_t> DueBy(absl::Time t) const;

  // When the earliest timer runs out; nullopt: none is set.
  std::optional<absl::Time> NextExpiry() const;

  // Drops the timers of a pid that exited.
  void Forget(pid_t pid);

  size_t size() const { return timers_.size(); }
  int64_t bad_lines() const { return bad_lines_; }
  int64_t foreign_lines() const { return foreign_lines_; }

 private:
  struct Timer {
    absl::Time expires;
    int signal = 0;
  };
  std::map<std::pair<pid_t, std::string>, Timer> timers_;
  int64_t bad_lines_ = 0;
  int64_t foreign_lines_ = 0;
};

// The named pipe the workers write to. Kept open for reading (and once for
// writing, so that it never reads as ended between two clients: a client
// opens it, writes one line and closes it), non-blocking, close-on-exec.
class TimerPipe {
 public:
  // Makes the pipe, mode 0600: at `path` when given (an existing named pipe
  // there is replaced, as torch does; any other file is an error), else in
  // a fresh directory of mode 0700 under $TMPDIR or /tmp.
  static absl::StatusOr<TimerPipe> Create(const std::string& path);

  TimerPipe(TimerPipe&&) = default;
  TimerPipe& operator=(TimerPipe&&) = default;
  // Removes the pipe (and the directory it made).
  ~TimerPipe();

  const std::string& path() const { return path_; }
  // Readable when a line (or part of one) is waiting.
  int fd() const { return read_.get(); }

  // Reads what is waiting and calls `on_line` for each complete line. A
  // line longer than PIPE_BUF (what a client writes at once) is dropped
  // whole and handed on as "" so that it counts as a bad line.
  void Read(const std::function<void(std::string_view)>& on_line);

 private:
  TimerPipe() = default;
  std::string path_;
  std::string made_dir_;  // removed with the pipe; "" when the path was given
  UniqueFd read_, write_;
  std::string partial_;
  bool skipping_ = false;  // inside an over-long line
};

}  // namespace muster

#endif  // MUSTER_AGENT_FILE_TIMER_H_
