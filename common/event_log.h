// Opening an event log (the agent's --rdzv-conf event_log=, musterd
// --event-log): a file events are appended to, one line per write.
#ifndef MUSTER_COMMON_EVENT_LOG_H_
#define MUSTER_COMMON_EVENT_LOG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_handle.h"

namespace muster {

struct OpenedEventLog {
  UniqueFd fd;
  // Set when others can read the file (its mode allows it): worth a warning.
  std::optional<std::string> warning;
};

// Opens `path` to append to, creating it mode 600 (the events name jobs,
// hosts and failures). Not through a symbolic link, and not a FIFO (whose
// open would block). `flag` names the option in messages ("--event-log").
// Errors (kInvalidArgument, naming the fix): it cannot be opened, or it is
// not a regular file this user owns.
absl::StatusOr<OpenedEventLog> OpenEventLog(const std::string& path, absl::string_view flag);

// Writes an event log's lines from a thread of its own, in the order given,
// so that whoever makes them (musterd's rendezvous, with its lock held)
// never waits on the disk. A line is written as soon as the writer is idle;
// lines that come while it writes go in its next write, kBatchPause after
// (each write holds whole lines). Past kMaxPending lines not yet written,
// new ones are dropped and counted rather than held. `warn` is told, from the
// writer's thread, when lines are dropped and when a write fails (after
// which nothing more is written).
class EventLogWriter {
 public:
  static constexpr size_t kMaxPending = 10000;
  static constexpr absl::Duration kBatchPause = absl::Milliseconds(10);

  EventLogWriter(UniqueFd fd, std::string name, std::function<void(const std::string&)> warn);
  // Writes what is pending, then returns.
  ~EventLogWriter();
  EventLogWriter(const EventLogWriter&) = delete;
  EventLogWriter& operator=(const EventLogWriter&) = delete;

  // Queues one line (with its newline). Never blocks on the disk.
  void Append(std::string_view line);

 private:
  void Run();
  // All of `bytes`, across short writes. Errors: kInternal, saying why.
  absl::Status WriteAll(std::string_view bytes);

  const UniqueFd fd_;
  const std::string name_;  // "--event-log FILE", for messages
  const std::function<void(const std::string&)> warn_;
  absl::Mutex mu_;
  std::string pending_ ABSL_GUARDED_BY(mu_);  // whole lines, in order
  size_t pending_lines_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_idle_ ABSL_GUARDED_BY(mu_) = false;  // waiting on wake_
  absl::CondVar wake_;
  std::thread thread_;  // last: started once the rest is made
};

}  // namespace muster

#endif  // MUSTER_COMMON_EVENT_LOG_H_
