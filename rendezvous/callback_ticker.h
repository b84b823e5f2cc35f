// Keeps gRPC's callback threads awake in a process that uses the callback
// API (the agent's client, the rendezvous server).
//
// Debian's gRPC (1.51) has no background poller, so the C++ callback API
// runs on "nexting" threads (CompletionQueue::CallbackAlternativeCQ, in
// src/cpp/common/completion_queue_cc.cc): max(2, cores / 2) threads, each
// waiting at most 1 s for a completion and, when none came, sleeping 100 ms
// without polling. Those threads are the only ones that read gRPC's sockets
// and run reactions, so once a process has had no completion for a second
// they all sleep at the same time, and a message that arrives then waits up
// to 100 ms: a restart whose failure lands 1.0-1.1 s after the agents start
// (or 1.1 s after any quiet spell) took 100 ms in place of 5 (issue 10,
// bench/restart_sweep.py).
//
// While held, a CallbackTicker completes a call on a lame channel (no
// socket, no server) every kCallbackTickInterval, so the thread that took
// the latest tick is always waiting for the next completion.
#ifndef MUSTER_RENDEZVOUS_CALLBACK_TICKER_H_
#define MUSTER_RENDEZVOUS_CALLBACK_TICKER_H_

#include <memory>

#include "absl/time/time.h"

namespace muster::rdzv {

// How long a nexting thread waits for a completion before it naps.
inline constexpr absl::Duration kNextingThreadIdleTimeout = absl::Seconds(1);
// A tick may come this much late (a loaded machine) before every thread can
// be napping at once: kNextingThreadIdleTimeout - kCallbackTickInterval.
inline constexpr absl::Duration kCallbackTickInterval = absl::Milliseconds(250);
static_assert(kCallbackTickInterval < kNextingThreadIdleTimeout);

class CallbackTicker {
 public:
  // The process's ticker, started by the first holder; it stops (and its
  // thread is joined) when the last holder lets go. Thread-safe.
  static std::shared_ptr<CallbackTicker> Acquire();

  virtual ~CallbackTicker() = default;

  // Ticks completed so far (for tests).
  virtual int64_t ticks() const = 0;
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_CALLBACK_TICKER_H_
