#include "rendezvous/grpc/callback_ticker.h"

#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/const_init.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "proto/rendezvous.grpc.pb.h"

namespace muster::rdzv {
namespace {

// Shared with the calls' callbacks, which may outlive the ticker.
struct Counters {
  absl::Mutex mu;
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  int64_t ticks ABSL_GUARDED_BY(mu) = 0;
};

struct TickCall {
  grpc::ClientContext context;
  StatusRequest request;
  StatusResponse response;
};

class CallbackTickerImpl final : public CallbackTicker {
 public:
  explicit CallbackTickerImpl(absl::Duration interval)
      // No credentials: gRPC makes a lame channel, whose calls fail at once
      // (a completion on the callback queue) without a socket or a server.
      : channel_(grpc::CreateCustomChannel("", nullptr, grpc::ChannelArguments())),
        stub_(Rendezvous::NewStub(channel_)), interval_(interval),
        counters_(std::make_shared<Counters>()), thread_([this] { Loop(); }) {}

  ~CallbackTickerImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
    // A lame call completes at once; the bound only keeps a stuck gRPC from
    // hanging the exit.
    bool ended;
    {
      absl::MutexLock lock(&counters_->mu);
      ended = counters_->mu.AwaitWithTimeout(
          absl::Condition(
              +[](Counters* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) { return c->in_flight == 0; },
              counters_.get()),
          absl::Seconds(5));
    }
    // The channel goes here, on this thread, once no call holds it: the
    // last channel of a process must never go on a callback thread, where
    // gRPC would shut its callback queue down and free it under the thread
    // that runs it (callback_ticker.h, "The end"). A tick that never
    // completed holds it still: it is kept for good then, and the callback
    // threads with it, rather than freed under one of them later.
    if (!ended) {
      Logger("rdzv")->warn(
          "gRPC did not complete a call on a channel with no server within 5 s; its callback "
          "threads are left running, and the process will end without gRPC's clean-up");
      new std::shared_ptr<grpc::Channel>(channel_);  // leaked on purpose
      static_cast<void>(stub_.release());
    }
  }

  int64_t ticks() const override {
    absl::MutexLock lock(&counters_->mu);
    return counters_->ticks;
  }

 private:
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_)) {
      {
        absl::MutexLock counted(&counters_->mu);
        // The last tick is still queued: the callback threads are busy anyway.
        if (counters_->in_flight > 0) continue;
        ++counters_->in_flight;
      }
      auto call = std::make_shared<TickCall>();
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + kNextingThreadIdleTimeout));
      stub_->async()->Status(&call->context, &call->request, &call->response,
                             [call, counters = counters_](grpc::Status) mutable {
                               // The call's ClientContext holds the channel: it goes
                               // before the count that lets the destructor go on.
                               call.reset();
                               absl::MutexLock counted(&counters->mu);
                               --counters->in_flight;
                               ++counters->ticks;
                             });
    }
  }

  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Rendezvous::Stub> stub_;
  const absl::Duration interval_;
  const std::shared_ptr<Counters> counters_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts in the constructor
};

}  // namespace

std::shared_ptr<CallbackTicker> CallbackTicker::Acquire() {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  // Leaked on purpose: no destructor runs at exit while a holder may remain.
  static auto* current = new std::weak_ptr<CallbackTicker>();
  absl::MutexLock lock(&mu);
  std::shared_ptr<CallbackTicker> ticker = current->lock();
  if (!ticker) {
    ticker = std::make_shared<CallbackTickerImpl>(kCallbackTickInterval);
    *current = ticker;
  }
  return ticker;
}

std::unique_ptr<CallbackTicker> CallbackTicker::StartForTest(absl::Duration interval) {
  return std::make_unique<CallbackTickerImpl>(interval);
}

}  // namespace muster::rdzv
