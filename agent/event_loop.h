// The agent's one thread of control: an epoll loop over file descriptors
// (worker output pipes), a signalfd for the signals the agent handles, an
// eventfd through which other threads (gRPC's) post work to it, and one
// timer whose deadline is read from the caller before every wait.
#ifndef MUSTER_AGENT_EVENT_LOOP_H_
#define MUSTER_AGENT_EVENT_LOOP_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/unique_handle.h"

namespace muster {

class EventLoop {
 public:
  struct Handlers {
    // A signal of the set given to Create arrived.
    std::function<void(int sig)> on_signal;
    // The clock reached the deadline `next_deadline` returned.
    std::function<void()> on_timer;
    // Read before every wait; nullopt: no timer.
    std::function<std::optional<absl::Time>()> next_deadline;
    // Read after every event: true ends Run.
    std::function<bool()> done;
  };

  // `signals` are read from a signalfd. REQUIRES: they are blocked in every
  // thread (see BlockAgentSignals). `clock` outlives the loop.
  static absl::StatusOr<std::unique_ptr<EventLoop>> Create(Clock& clock,
                                                           const std::vector<int>& signals);
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Calls `on_readable` on the loop thread whenever `fd` is readable (or
  // at its end or error). REQUIRES: fd stays open until Remove(fd).
  absl::Status Add(int fd, std::function<void()> on_readable);
  void Remove(int fd);

  // Runs `task` on the loop thread, in the order posted. Thread-safe.
  // Tasks still queued when Run returns are dropped.
  void Post(std::function<void()> task);

  // Dispatches events until handlers.done() is true. An error: epoll failed.
  absl::Status Run(const Handlers& handlers);

 private:
  EventLoop(Clock& clock) : clock_(clock) {}
  void ArmTimer(std::optional<absl::Time> deadline);
  void RunPosted(const Handlers& handlers);

  Clock& clock_;
  UniqueFd epoll_, signal_fd_, event_fd_, timer_fd_;
  std::map<int, std::function<void()>> readers_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> posted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_AGENT_EVENT_LOOP_H_
