#include "rendezvous/server/local_client.h"

#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace muster::rdzv {
namespace {

// Callbacks may run on the hub's timer thread. The guard lets the client's
// destructor wait for one in progress and stop any later one.
struct Guard {
  absl::Mutex mu;
  bool alive ABSL_GUARDED_BY(mu) = true;
};

template <typename Arg>
std::function<void(Arg)> Guarded(const std::shared_ptr<Guard>& guard,
                                 std::function<void(Arg)> callback) {
  return [guard, callback = std::move(callback)](Arg arg) {
    absl::MutexLock lock(&guard->mu);
    if (guard->alive) callback(std::move(arg));
  };
}

class LocalRendezvousClient final : public RendezvousClient {
 public:
  LocalRendezvousClient(std::shared_ptr<RendezvousHub> hub, std::string peer_addr)
      : hub_(std::move(hub)), guard_(std::make_shared<Guard>()), peer_addr_(std::move(peer_addr)) {}

  ~LocalRendezvousClient() override {
    {
      absl::MutexLock lock(&guard_->mu);
      guard_->alive = false;
    }
    std::set<std::pair<NodeKey, uint64_t>> joins;
    std::optional<std::pair<NodeKey, uint64_t>> watch;
    {
      absl::MutexLock lock(&mu_);
      joins.swap(joins_);
      watch.swap(watch_);
    }
    // Outside mu_: the hub runs the (now inert) callbacks, which take guard_->mu.
    for (const auto& [key, ticket] : joins) hub_->CancelJoin(key, ticket);
    if (watch) hub_->CancelWatch(watch->first, watch->second);
  }

  const std::string& target() const override { return target_; }

  void Join(const JoinRequest& request, absl::Duration timeout,
            std::function<void(absl::StatusOr<Assignment>)> done) override {
    // The hub's own join timeout ends a join; `timeout` is the network's margin.
    const NodeKey key{request.job_id(), request.node().node_id()};
    const uint64_t ticket = hub_->NewTicket();
    {
      absl::MutexLock lock(&mu_);
      joins_.emplace(key, ticket);
    }
    hub_->Join(request, peer_addr_, ticket,
               [this, key, ticket, guard = guard_,
                done = std::move(done)](absl::StatusOr<Assignment> result) {
                 absl::MutexLock lock(&guard->mu);
                 if (!guard->alive) return;
                 {
                   absl::MutexLock joins_lock(&mu_);
                   joins_.erase({key, ticket});
                 }
                 done(std::move(result));
               });
  }

  void Heartbeat(const HeartbeatRequest& request, absl::Duration,
                 std::function<void(absl::StatusOr<int64_t>)> done) override {
    done(hub_->Heartbeat(request));
  }

  void ReportFailure(const ReportFailureRequest& request, absl::Duration,
                     std::function<void(absl::Status)> done) override {
    done(hub_->ReportFailure(request));
  }

  void ReportDone(const ReportDoneRequest& request, absl::Duration,
                  std::function<void(absl::Status)> done) override {
    done(hub_->ReportDone(request));
  }

  void Leave(const LeaveRequest& request, absl::Duration,
             std::function<void(absl::Status)> done) override {
    done(hub_->Leave(request));
  }

  void Status(const StatusRequest& request, absl::Duration,
              std::function<void(absl::StatusOr<StatusResponse>)> done) override {
    done(hub_->Status(request.job_id()));
  }

  void Watch(const WatchRequest& request, std::function<void(const WatchEvent&)> on_event,
             std::function<void(absl::Status)> on_end) override {
    const NodeKey key{request.job_id(), request.node_id()};
    const uint64_t ticket = hub_->NewTicket();
    {
      absl::MutexLock lock(&mu_);
      watch_ = std::make_pair(key, ticket);
    }
    hub_->Watch(request, ticket,
                RendezvousHub::Watcher{Guarded<const WatchEvent&>(guard_, std::move(on_event)),
                                       Guarded<absl::Status>(guard_, std::move(on_end))});
  }

 private:
  const std::shared_ptr<RendezvousHub> hub_;
  const std::shared_ptr<Guard> guard_;
  const std::string peer_addr_;
  const std::string target_ = "this process";
  absl::Mutex mu_;
  std::set<std::pair<NodeKey, uint64_t>> joins_ ABSL_GUARDED_BY(mu_);
  std::optional<std::pair<NodeKey, uint64_t>> watch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<RendezvousClient> NewLocalClient(std::shared_ptr<RendezvousHub> hub,
                                                 std::string peer_addr) {
  return std::make_unique<LocalRendezvousClient>(std::move(hub), std::move(peer_addr));
}

}  // namespace muster::rdzv
