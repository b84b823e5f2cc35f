// The result of one asynchronous rendezvous call, for tests: the callback
// fills it, and the test waits for it before it asserts anything.
#ifndef MUSTER_TESTS_RENDEZVOUS_SERVER_PENDING_H_
#define MUSTER_TESTS_RENDEZVOUS_SERVER_PENDING_H_

#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace muster::rdzv {

// The longest a test waits for one answer before it fails.
inline constexpr absl::Duration kPendingWait = absl::Seconds(10);

// T is constructible from an absl::Status (absl::Status, absl::StatusOr<...>).
// The callback owns the state too, so a test that gave up waiting leaves
// nothing dangling. Thread-safe.
template <typename T>
class Pending {
 public:
  // REQUIRES: the callback runs at most once.
  std::function<void(T)> Callback() {
    return [state = state_](T value) {
      state->value.emplace(std::move(value));
      state->done.Notify();
    };
  }

  // Whether the callback has run.
  bool Done() const { return state_->done.HasBeenNotified(); }

  // The result, or kInternal (and a test failure) when none came within `timeout`.
  T Wait(absl::Duration timeout = kPendingWait) {
    if (!state_->done.WaitForNotificationWithTimeout(timeout)) {
      ADD_FAILURE() << "no answer within " << timeout;
      return T(absl::InternalError("test: no answer in time"));
    }
    return *state_->value;
  }

 private:
  struct State {
    absl::Notification done;
    std::optional<T> value;  // written once, before `done`
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace muster::rdzv

#endif  // MUSTER_TESTS_RENDEZVOUS_SERVER_PENDING_H_
