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
//
// The end. Those threads and their queue belong to every channel and server
// that made a callback call: each holds a reference, and the one that lets
// go of the last reference shuts the queue down, joins the threads and frees
// the queue, on whatever thread it runs. On one of those threads (a callback
// that drops the last owner of a channel) it cannot join itself, frees the
// queue it is about to read again, and the process dies of a double free on
// its way out (issue 30: 5 in 8,000 agent exits). So a process that speaks
// gRPC ends in this order, on its own threads only:
//   1. each client or server cancels its calls and waits until every
//      callback has returned and has dropped what it held of the call (the
//      ClientContext, which owns a reference to the channel): client.h,
//      service.h, etcd/client.h;
//   2. each drops its stubs and channels (or its server);
//   3. the ticker goes last, since every holder declares it first: no tick
//      is in flight when it drops its channel, so the queue is shut down and
//      its threads joined on the thread that drops the last holder (a tick
//      that gRPC never completes within 5 s keeps the channel for good,
//      and the process ends as in 4's fallback);
//   4. main waits for gRPC's own clean-up before it returns, and ends with
//      _exit where it did not come (FinishGrpc, grpc/exit.h).
// None of those objects may be dropped inside a gRPC callback.
#ifndef MUSTER_RENDEZVOUS_GRPC_CALLBACK_TICKER_H_
#define MUSTER_RENDEZVOUS_GRPC_CALLBACK_TICKER_H_

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
  // thread is joined) when the last holder lets go, which waits for the tick
  // in flight and then drops the ticker's channel on that holder's thread.
  // Thread-safe. REQUIRES: the last holder lets go outside gRPC's callbacks.
  static std::shared_ptr<CallbackTicker> Acquire();

  // A ticker of its own that ticks every `interval`, shared with nobody
  // (for tests that end tickers while their ticks are in flight).
  static std::unique_ptr<CallbackTicker> StartForTest(absl::Duration interval);

  virtual ~CallbackTicker() = default;

  // Ticks completed so far (for tests).
  virtual int64_t ticks() const = 0;
};

}  // namespace muster::rdzv

#endif  // MUSTER_RENDEZVOUS_GRPC_CALLBACK_TICKER_H_
