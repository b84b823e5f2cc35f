#include "rendezvous/etcd/backend.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "proto/etcd_rendezvous.pb.h"
#include "rendezvous/etcd/keys.h"
#include "rendezvous/etcd/leader.h"
#include "rendezvous/etcd/status.h"
#include "rendezvous/etcd/steward.h"
#include "rendezvous/rules/protocol.h"
#include "rendezvous/rules/state.h"

namespace muster::etcd {
namespace {

using rdzv::Assignment;
using rdzv::EtcdMail;
using rdzv::EtcdReport;
using rdzv::WatchEvent;

// How soon a campaign that etcd did not answer, or a leader that stopped
// while this agent still holds the leader key, is tried again.
constexpr absl::Duration kCampaignRetry = absl::Seconds(1);
// The worker looks at its deadlines at least this often.
constexpr absl::Duration kWorkerMaxWait = absl::Seconds(1);
constexpr absl::Duration kLingerPoll = absl::Milliseconds(100);

class EtcdRendezvous final : public rdzv::RendezvousClient {
 public:
  explicit EtcdRendezvous(EtcdRendezvousOptions options)
      : options_(std::move(options)), keys_(options_.job_id), logger_(Logger("agent")) {
    worker_ = std::thread([this] { Work(); });
  }

  ~EtcdRendezvous() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    worker_.join();
  }

  const std::string& target() const override { return options_.target; }
  // The etcd client reopens the outbox's watch for as long as etcd is away.
  bool WatchOutlivesOutages() const override { return true; }

  void Join(const rdzv::JoinRequest& request, absl::Duration timeout,
            std::function<void(absl::StatusOr<Assignment>)> done) override {
    const absl::Time deadline = absl::Now() + timeout;
    auto shared = std::make_shared<decltype(done)>(std::move(done));
    if (!Post([=, this] { DoJoin(request, deadline, std::move(*shared)); })) {
      (*shared)(Cancelled());
    }
  }

  void Heartbeat(const rdzv::HeartbeatRequest& request, absl::Duration,
                 std::function<void(absl::StatusOr<int64_t>)> done) override {
    auto shared = std::make_shared<decltype(done)>(std::move(done));
    if (!Post([=, this] { DoHeartbeat(request.node_id(), std::move(*shared)); })) {
      (*shared)(Cancelled());
    }
  }

  void ReportFailure(const rdzv::ReportFailureRequest& request, absl::Duration timeout,
                     std::function<void(absl::Status)> done) override {
    EtcdReport report;
    *report.mutable_failure() = request;
    Report(request.node_id(), std::move(report), timeout, std::move(done));
  }
  void ReportDone(const rdzv::ReportDoneRequest& request, absl::Duration timeout,
                  std::function<void(absl::Status)> done) override {
    EtcdReport report;
    *report.mutable_done() = request;
    Report(request.node_id(), std::move(report), timeout, std::move(done));
  }
  void Leave(const rdzv::LeaveRequest& request, absl::Duration timeout,
             std::function<void(absl::Status)> done) override {
    EtcdReport report;
    *report.mutable_leave() = request;
    Report(request.node_id(), std::move(report), timeout, std::move(done));
  }

  void Status(const rdzv::StatusRequest&, absl::Duration,
              std::function<void(absl::StatusOr<rdzv::StatusResponse>)> done) override {
    auto shared = std::make_shared<decltype(done)>(std::move(done));
    if (!Post([=, this] { DoStatus(std::move(*shared)); })) (*shared)(Cancelled());
  }

  void Watch(const rdzv::WatchRequest& request, std::function<void(const WatchEvent&)> on_event,
             std::function<void(absl::Status)> on_end) override {
    auto watcher = std::make_shared<Watcher>();
    watcher->known_round = request.known_round();
    watcher->on_event = std::move(on_event);
    watcher->on_end = std::move(on_end);
    if (!Post([=, this] { DoWatch(request.node_id(), watcher); })) watcher->on_end(Cancelled());
  }

 private:
  struct PendingJoin {
    int64_t seq = 0;  // EtcdJoin.seq
    std::function<void(absl::StatusOr<Assignment>)> done;
    absl::Time deadline;
  };
  struct PendingReport {
    std::function<void(absl::Status)> done;
    absl::Time deadline;
  };
  struct Watcher {
    int64_t known_round = -1;
    int64_t delivered_seq = 0;
    std::function<void(const WatchEvent&)> on_event;
    std::function<void(absl::Status)> on_end;
  };
  using Completions = std::vector<std::function<void()>>;

  static absl::Status Cancelled() {
    return absl::CancelledError("the rendezvous client is shutting down");
  }
  absl::Status NotInJob(const std::string& node) const {
    return absl::NotFoundError(
        absl::StrCat("node ", node, " is not part of job '", options_.job_id, "'"));
  }
  // A node whose lease ended: the job has dropped it (as musterd says it).
  absl::Status LeaseEnded(const std::string& node) const {
    return absl::NotFoundError(absl::StrCat("node ", node, " ", rdzv::kDroppedFromJob, " '",
                                            options_.job_id, "': its etcd lease ended"));
  }
  // An etcd error, as the agent reads it: who did not answer.
  absl::Status FromEtcd(const absl::Status& status) const {
    return absl::Status(status.code(), absl::StrCat(options_.target, ": ", status.message()));
  }

  // Runs `task` on the worker thread; false once the client is stopping.
  bool Post(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(task));
    return true;
  }
  void PostAfter(absl::Duration delay, std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    if (!stopping_) timers_.emplace(absl::Now() + delay, std::move(task));
  }

  void Work();
  void ShutDown();
  // With this node's member of the job's own cluster running: the job
  // closed, waits (bounded by the lease TTL) until every other agent has
  // left, so that none is left without a quorum to learn the close from;
  // else the member leaves the cluster (LeaveCluster).
  void AwaitTheLastAgent();
  void LeaveCluster();

  void DoJoin(const rdzv::JoinRequest& request, absl::Time deadline,
              std::function<void(absl::StatusOr<Assignment>)> done);
  void DoHeartbeat(const std::string& node, std::function<void(absl::StatusOr<int64_t>)> done);
  void Report(const std::string& node, EtcdReport report, absl::Duration timeout,
              std::function<void(absl::Status)> done);
  void DoReport(EtcdReport report, absl::Time deadline, std::function<void(absl::Status)> done);
  void DoStatus(std::function<void(absl::StatusOr<rdzv::StatusResponse>)> done);
  void DoWatch(const std::string& node, std::shared_ptr<Watcher> watcher);

  // The job's closed key, if it has one: how it ended.
  absl::StatusOr<std::optional<WatchEvent>> ReadClosed();
  absl::Status EnsureLease();
  // Keeps lease_ alive, a new keeper in keeper_; OnLeaseLost if it cannot.
  void KeepLeaseAlive();
  absl::Status EnsureOutboxWatch();
  void OnOutbox(const mvccpb::Event& event);
  // Completes what `mail` answers. REQUIRES: mu_ held.
  void Answer(const EtcdMail& mail, Completions* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnLeaseLost(uint64_t generation, const absl::Status& status);
  // The lease is gone: this node is no longer in the job, nor its leader.
  void ForgetLease();
  void Campaign();
  // Campaigns again when the leader key, as of `from_revision`, goes.
  void WatchLeader(int64_t from_revision);
  void StartLeader();
  void OnLeaderEnded(uint64_t generation, const absl::Status& status);
  // Host mode's own cluster: offers this node's member (once per lease)
  // and watches for its seat.
  void OfferMember();
  // Deletes the offer once this node's member has stopped: the leader then
  // removes the member and seats another node.
  void WithdrawOffer();
  void OnSeat(const std::string& value);

  const EtcdRendezvousOptions options_;
  const JobKeys keys_;
  const std::shared_ptr<spdlog::logger> logger_;
  std::thread worker_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<PendingJoin> join_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, PendingReport> reports_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Watcher> watcher_ ABSL_GUARDED_BY(mu_);
  // The outbox as last read or watched; nullopt: it does not exist.
  std::optional<EtcdMail> mail_ ABSL_GUARDED_BY(mu_);

  // The worker thread only.
  std::string node_id_;
  int64_t lease_ = 0;  // 0: none
  uint64_t lease_generation_ = 0;
  std::unique_ptr<LeaseKeeper> keeper_;
  std::unique_ptr<EtcdWatch> outbox_watch_;
  std::unique_ptr<EtcdWatch> leader_watch_;
  std::unique_ptr<EtcdClient> leader_etcd_;  // declared before leader_: it outlives it
  std::unique_ptr<EtcdLeader> leader_;
  std::unique_ptr<EtcdSteward> steward_;  // with keep_members, while leading
  std::unique_ptr<EtcdWatch> seat_watch_;
  uint64_t offered_generation_ = 0;  // the lease the offer was written under
  bool seat_taken_ = false;
  bool offer_withdrawn_ = false;
  int64_t leader_revision_ = 0;
  bool campaigning_ = false;
  int64_t join_seq_ = 0;
  int64_t report_seq_ = 0;
};

void EtcdRendezvous::Work() {
  for (;;) {
    std::vector<std::function<void()>> run;
    Completions completions;
    {
      absl::MutexLock lock(&mu_);
      absl::Time wake = absl::Now() + kWorkerMaxWait;
      if (!timers_.empty()) wake = std::min(wake, timers_.begin()->first);
      if (join_) wake = std::min(wake, join_->deadline);
      for (const auto& [seq, report] : reports_) wake = std::min(wake, report.deadline);
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](EtcdRendezvous* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
                                  return self->stopping_ || !self->tasks_.empty();
                                },
                                this),
                            wake);
      if (stopping_) break;
      const absl::Time now = absl::Now();
      for (auto& task : tasks_) run.push_back(std::move(task));
      tasks_.clear();
      while (!timers_.empty() && timers_.begin()->first <= now) {
        run.push_back(std::move(timers_.begin()->second));
        timers_.erase(timers_.begin());
      }
      if (join_ && join_->deadline <= now) {
        completions.push_back([done = std::move(join_->done), target = options_.target] {
          done(absl::DeadlineExceededError(absl::StrCat(
              "no answer to the join from the rendezvous leader (", target, ") in time")));
        });
        join_.reset();
        // Nobody waits for it: the node leaves, as a cancelled join does.
        run.push_back([this] {
          if (!node_id_.empty()) options_.etcd->Delete(keys_.node(node_id_)).IgnoreError();
        });
      }
      for (auto it = reports_.begin(); it != reports_.end();) {
        if (it->second.deadline > now) {
          ++it;
          continue;
        }
        completions.push_back([done = std::move(it->second.done), target = options_.target] {
          done(absl::DeadlineExceededError(absl::StrCat(
              "no answer to the report from the rendezvous leader (", target, ") in time")));
        });
        it = reports_.erase(it);
      }
    }
    for (auto& completion : completions) completion();
    for (auto& task : run) task();
  }
  ShutDown();
}

void EtcdRendezvous::LeaveCluster() {
  absl::StatusOr<std::vector<etcdserverpb::Member>> members = options_.etcd->MemberList();
  if (!members.ok()) return;
  const std::string peer_url = options_.member_host->Offer().peer_url;
  for (const etcdserverpb::Member& member : *members) {
    if (member.peerurls().empty() || member.peerurls(0) != peer_url) continue;
    // Refused for the last member (which the job's state is on): then it
    // stops with the node.
    absl::Status removed = options_.etcd->MemberRemove(member.id());
    if (removed.ok()) {
      logger_->info("this node's etcd member left the job's cluster, which goes on without it");
    }
    return;
  }
}

void EtcdRendezvous::AwaitTheLastAgent() {
  absl::StatusOr<GetResult> closed = options_.etcd->Get(keys_.closed());
  if (!closed.ok()) return;
  // The job goes on without this node: its member leaves first, so that the
  // members left keep their majority.
  if (!closed->kv) return LeaveCluster();
  // Every agent holds a lease until it leaves (revoked), or until its TTL
  // after it died; the closed key holds one of its own.
  const absl::Time deadline = absl::Now() + options_.lease_ttl + kWorkerMaxWait;
  bool said = false;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<int64_t>> leases = options_.etcd->Leases();
    if (!leases.ok()) return;  // no quorum left to keep
    const bool others = std::any_of(leases->begin(), leases->end(),
                                    [&](int64_t lease) { return lease != closed->kv->lease(); });
    if (!others) return;
    if (!said) {
      logger_->info(
          "the job closed; this node's etcd member stays until the other agents have "
          "learned it and left (at most {})",
          absl::FormatDuration(deadline - absl::Now()));
      said = true;
    }
    absl::SleepFor(kLingerPoll);
  }
}

void EtcdRendezvous::ShutDown() {
  steward_.reset();
  seat_watch_.reset();
  leader_.reset();
  leader_watch_.reset();
  outbox_watch_.reset();
  keeper_.reset();
  if (lease_ != 0) {
    // Deletes this node's keys (and the leader key, if it held it) now,
    // rather than at the lease's end: the job and a new leader move on at once.
    options_.etcd->RevokeLease(lease_).IgnoreError();
    lease_ = 0;
  }
  if (options_.member_host && options_.member_host->Seated()) AwaitTheLastAgent();
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    if (join_) completions.push_back([done = std::move(join_->done)] { done(Cancelled()); });
    join_.reset();
    for (auto& [seq, report] : reports_) {
      completions.push_back([done = std::move(report.done)] { done(Cancelled()); });
    }
    reports_.clear();
    if (watcher_) completions.push_back([w = watcher_] { w->on_end(Cancelled()); });
    watcher_.reset();
    tasks_.clear();
    timers_.clear();
  }
  for (auto& completion : completions) completion();
}

absl::StatusOr<std::optional<WatchEvent>> EtcdRendezvous::ReadClosed() {
  absl::StatusOr<GetResult> closed = options_.etcd->Get(keys_.closed());
  if (!closed.ok()) return FromEtcd(closed.status());
  if (!closed->kv) return std::optional<WatchEvent>();
  WatchEvent event;
  if (!event.ParseFromString(closed->kv->value()) || !event.has_job_closed()) {
    return std::optional<WatchEvent>();
  }
  return std::optional<WatchEvent>(std::move(event));
}

absl::Status EtcdRendezvous::EnsureLease() {
  if (lease_ != 0) return absl::OkStatus();
  absl::StatusOr<int64_t> lease = options_.etcd->GrantLease(options_.lease_ttl);
  if (!lease.ok()) return FromEtcd(lease.status());
  lease_ = *lease;
  ++lease_generation_;
  KeepLeaseAlive();
  return absl::OkStatus();
}

void EtcdRendezvous::KeepLeaseAlive() {
  const uint64_t generation = lease_generation_;
  keeper_ =
      options_.etcd->KeepAlive(lease_, options_.lease_ttl, [this, generation](absl::Status status) {
        Post([this, generation, status] { OnLeaseLost(generation, status); });
      });
}

void EtcdRendezvous::OnLeaseLost(uint64_t generation, const absl::Status& status) {
  if (generation != lease_generation_ || lease_ == 0) return;
  if (!absl::IsNotFound(status)) {
    // No keep-alive got through for a whole TTL: etcd is away, not
    // necessarily the lease (etcd renews every lease when it elects a
    // leader). Keep it alive again; only etcd saying it is gone ends it.
    logger_->debug("keeping this node's etcd lease alive again ({})", status.message());
    KeepLeaseAlive();
    return;
  }
  logger_->warn(
      "this node's etcd lease ended ({}): the job counts this node as lost; it joins again "
      "with a new one",
      status.message());
  ForgetLease();
  // Tell the agent now, as its heartbeats would: its workers are no longer
  // the job's (found by the simulator: nothing told it, and with no other
  // agent to lead, the job waited for it for ever).
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    if (watcher_) {
      completions.push_back(
          [w = std::move(watcher_), ended = LeaseEnded(node_id_)] { w->on_end(ended); });
    }
    watcher_.reset();
  }
  for (auto& completion : completions) completion();
}

void EtcdRendezvous::ForgetLease() {
  steward_.reset();
  seat_watch_.reset();
  leader_.reset();
  leader_watch_.reset();
  keeper_.reset();
  lease_ = 0;
  ++lease_generation_;  // what the old keeper still says is about the old lease
  campaigning_ = false;
}

absl::Status EtcdRendezvous::EnsureOutboxWatch() {
  if (outbox_watch_) return absl::OkStatus();
  const std::string key = keys_.outbox(node_id_);
  absl::StatusOr<GetResult> got = options_.etcd->Get(key);
  if (!got.ok()) return FromEtcd(got.status());
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    mail_.reset();
    if (got->kv) {
      EtcdMail mail;
      if (mail.ParseFromString(got->kv->value())) {
        mail_ = mail;
        Answer(mail, &completions);
      }
    }
  }
  for (auto& completion : completions) completion();
  outbox_watch_ = options_.etcd->Watch(
      key, "", got->revision + 1,
      [this](const std::vector<mvccpb::Event>& events, int64_t) {
        for (const mvccpb::Event& event : events) OnOutbox(event);
      },
      [this](absl::Status status) {
        // Compacted past what it saw: read the outbox again.
        logger_->debug("the watch of this node's outbox ended ({}); watching it again",
                       status.message());
        Post([this] {
          outbox_watch_.reset();
          EnsureOutboxWatch().IgnoreError();
        });
      });
  return absl::OkStatus();
}

void EtcdRendezvous::OnOutbox(const mvccpb::Event& event) {
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    if (event.type() == mvccpb::Event::DELETE) {
      // The leader dropped this node, or the job closed and its keys went.
      mail_.reset();
      if (watcher_) {
        completions.push_back([w = watcher_, status = NotInJob(node_id_)] { w->on_end(status); });
        watcher_.reset();
      }
    } else {
      EtcdMail mail;
      if (mail.ParseFromString(event.kv().value())) {
        mail_ = mail;
        Answer(mail, &completions);
      }
    }
  }
  for (auto& completion : completions) completion();
}

void EtcdRendezvous::Answer(const EtcdMail& mail, Completions* out) {
  if (join_ && mail.join_seq() == join_->seq) {
    absl::StatusOr<Assignment> result = mail.assignment();
    if (!mail.has_assignment()) {
      absl::Status refused = FromEtcdStatus(mail.join_error());
      result = refused.ok() ? absl::InternalError(
                                  "the rendezvous leader answered the join with "
                                  "neither an assignment nor an error")
                            : refused;
    }
    out->push_back([done = std::move(join_->done), result = std::move(result)]() mutable {
      done(std::move(result));
    });
    join_.reset();
  }
  if (auto report = reports_.find(mail.request_seq()); report != reports_.end()) {
    out->push_back([done = std::move(report->second.done),
                    status = FromEtcdStatus(mail.request_status())] { done(status); });
    reports_.erase(report);
  }
  if (watcher_ && mail.has_event() && mail.event_seq() > watcher_->delivered_seq) {
    watcher_->delivered_seq = mail.event_seq();
    out->push_back([w = watcher_, event = mail.event()] { w->on_event(event); });
    if (mail.event().has_job_closed()) watcher_.reset();  // the last event of a watch
  }
}

void EtcdRendezvous::DoJoin(const rdzv::JoinRequest& request, absl::Time deadline,
                            std::function<void(absl::StatusOr<Assignment>)> done) {
  node_id_ = request.node().node_id();
  absl::StatusOr<std::optional<WatchEvent>> closed = ReadClosed();
  if (!closed.ok()) return done(closed.status());
  if (*closed)
    return done(rdzv::JoinToClosedJob(options_.job_id, (*closed)->job_closed().reason(),
                                      (*closed)->job_closed().succeeded()));
  if (absl::Status status = EnsureLease(); !status.ok()) return done(status);
  if (absl::Status status = EnsureOutboxWatch(); !status.ok()) return done(status);
  OfferMember();
  rdzv::EtcdJoin join;
  join.set_seq(++join_seq_);
  *join.mutable_request() = request;
  absl::StatusOr<int64_t> written =
      options_.etcd->Put(keys_.node(node_id_), join.SerializeAsString(), lease_);
  if (absl::IsNotFound(written.status())) {
    // The lease ended while this node was cut off from etcd, and the node
    // learned it was dropped before its keeper said so: a new lease.
    logger_->info("this node's etcd lease ended while it was away; it joins with a new one");
    ForgetLease();
    if (absl::Status status = EnsureLease(); !status.ok()) return done(status);
    written = options_.etcd->Put(keys_.node(node_id_), join.SerializeAsString(), lease_);
  }
  if (!written.ok()) return done(FromEtcd(written.status()));
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    if (join_) {
      completions.push_back([old = std::move(join_->done)] {
        old(absl::AbortedError("superseded by a newer join of the same node"));
      });
    }
    join_ = PendingJoin{join.seq(), std::move(done), deadline};
    // The answer may have come before the join was recorded.
    if (mail_) Answer(*mail_, &completions);
  }
  for (auto& completion : completions) completion();
  if (!campaigning_ && !leader_) {
    campaigning_ = true;
    Campaign();
  }
}

void EtcdRendezvous::Campaign() {
  if (lease_ == 0 || leader_) {
    campaigning_ = false;
    return;
  }
  // A read first: where a leader is (the usual case, for all but the first
  // agent), a read costs etcd no raft proposal, as the transaction would.
  absl::StatusOr<GetResult> current = options_.etcd->Get(keys_.leader());
  if (current.ok() && current->kv &&
      !(current->kv->lease() == lease_ && current->kv->value() == node_id_)) {
    WatchLeader(current->revision + 1);
    return;
  }
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(keys_.leader());
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(keys_.leader());
  put->set_value(node_id_);
  put->set_lease(lease_);
  txn.add_failure()->mutable_request_range()->set_key(keys_.leader());
  absl::StatusOr<etcdserverpb::TxnResponse> response = options_.etcd->Txn(txn);
  if (!response.ok()) {
    PostAfter(kCampaignRetry, [this] { Campaign(); });
    return;
  }
  if (response->succeeded()) {
    leader_revision_ = response->header().revision();
    leader_watch_.reset();
    StartLeader();
    return;
  }
  if (response->responses_size() == 1 && response->responses(0).response_range().kvs_size() == 1) {
    // An earlier campaign whose answer was lost may have won already.
    const mvccpb::KeyValue& holder = response->responses(0).response_range().kvs(0);
    if (holder.lease() == lease_ && holder.value() == node_id_) {
      leader_revision_ = holder.create_revision();
      leader_watch_.reset();
      StartLeader();
      return;
    }
  }
  WatchLeader(response->header().revision() + 1);
}

void EtcdRendezvous::WatchLeader(int64_t from_revision) {
  // Another agent leads: take over when its key goes.
  leader_watch_ = options_.etcd->Watch(
      keys_.leader(), "", from_revision,
      [this](const std::vector<mvccpb::Event>& events, int64_t) {
        for (const mvccpb::Event& event : events) {
          if (event.type() == mvccpb::Event::DELETE) {
            Post([this] { Campaign(); });
            return;
          }
        }
      },
      [this](absl::Status) { Post([this] { Campaign(); }); });
}

void EtcdRendezvous::StartLeader() {
  logger_->info("this agent leads the rendezvous of job '{}' (elected through {})", options_.job_id,
                options_.target);
  const uint64_t generation = lease_generation_;
  if (!leader_etcd_ && options_.leader_etcd) {
    EtcdOptions leader_options = *options_.leader_etcd;
    // The members as the agent's client knows them now: a cluster whose
    // members change (auto_sync_interval) may have lost those it began with.
    if (leader_options.auto_sync_interval > absl::ZeroDuration()) {
      leader_options.endpoints = options_.etcd->Endpoints();
    }
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(leader_options);
    if (client.ok()) {
      leader_etcd_ = *std::move(client);
    } else {
      logger_->warn("the leader's own etcd client: {}; it shares the agent's",
                    client.status().message());
    }
  }
  LeaderOptions leader;
  leader.client = leader_etcd_ ? leader_etcd_.get() : options_.etcd.get();
  leader.job_id = options_.job_id;
  leader.leader_revision = leader_revision_;
  leader.on_end = [this, generation](absl::Status status) {
    Post([this, generation, status] { OnLeaderEnded(generation, status); });
  };
  leader_ = EtcdLeader::Start(std::move(leader));
  if (options_.keep_members) {
    StewardOptions steward;
    steward.client = leader_etcd_ ? leader_etcd_.get() : options_.etcd.get();
    steward.job_id = options_.job_id;
    steward.leader_revision = leader_revision_;
    steward_ = EtcdSteward::Start(std::move(steward));
  }
}

void EtcdRendezvous::OfferMember() {
  if (!options_.member_host || offered_generation_ == lease_generation_) return;
  if (options_.member_host->Exited()) return;  // WithdrawOffer said why
  MemberOffer offer = options_.member_host->Offer();
  rdzv::EtcdMemberOffer value;
  value.set_name(offer.name);
  value.set_host(offer.host);
  value.set_peer_url(offer.peer_url);
  value.set_client_url(offer.client_url);
  absl::StatusOr<int64_t> written =
      options_.etcd->Put(keys_.member(node_id_), value.SerializeAsString(), lease_);
  if (!written.ok()) {
    logger_->warn("offering this node's etcd member to the job: {}", written.status().message());
    return;  // the next join offers again
  }
  offered_generation_ = lease_generation_;
  if (options_.member_host->Seated() || seat_taken_) return;
  seat_watch_ = options_.etcd->Watch(
      keys_.seat(node_id_), "", *written + 1,
      [this](const std::vector<mvccpb::Event>& events, int64_t) {
        for (const mvccpb::Event& event : events) {
          if (event.type() == mvccpb::Event::PUT) {
            Post([this, value = event.kv().value()] { OnSeat(value); });
          }
        }
      },
      [](absl::Status) {});
}

void EtcdRendezvous::WithdrawOffer() {
  if (!options_.member_host || offered_generation_ == 0 || offer_withdrawn_ ||
      !options_.member_host->Exited()) {
    return;
  }
  if (!options_.etcd->Delete(keys_.member(node_id_)).ok()) return;  // the next heartbeat
  offer_withdrawn_ = true;
  logger_->warn(
      "this node's etcd member has stopped (its log is etcd.log beside its data); its offer is "
      "withdrawn, and the job's leader removes it and seats another node");
}

void EtcdRendezvous::OnSeat(const std::string& value) {
  rdzv::EtcdMemberSeat seat;
  if (seat_taken_ || !seat.ParseFromString(value)) return;
  seat_taken_ = true;
  logger_->info("this node is seated in the job's etcd cluster ({}): starting its member",
                seat.initial_cluster());
  const std::string node = node_id_;
  options_.member_host->Join(seat.initial_cluster(), [this, node](absl::Status status) {
    if (status.ok()) return;
    // Withdrawn: the leader removes the learner and seats another node.
    logger_->warn("this node's etcd member could not start: {}", status.message());
    Post([this, node] { options_.etcd->Delete(keys_.member(node)).IgnoreError(); });
  });
}

void EtcdRendezvous::OnLeaderEnded(uint64_t generation, const absl::Status& status) {
  if (generation != lease_generation_ || lease_ == 0) return;
  steward_.reset();
  leader_.reset();
  if (absl::IsFailedPrecondition(status)) {
    // The leader key is gone: someone else may lead; stand again.
    PostAfter(kCampaignRetry, [this] { Campaign(); });
  } else {
    // Still this agent's key: nobody else can lead, so lead again.
    PostAfter(kCampaignRetry, [this, generation] {
      if (generation == lease_generation_ && lease_ != 0 && !leader_) StartLeader();
    });
  }
}

void EtcdRendezvous::DoHeartbeat(const std::string& node,
                                 std::function<void(absl::StatusOr<int64_t>)> done) {
  node_id_ = node;
  // Only a node that joined heartbeats, and it joined under a lease: with
  // that lease gone, its key is, and the job counts it lost whatever its
  // outbox still says.
  if (lease_ == 0) return done(LeaseEnded(node));
  WithdrawOffer();
  absl::StatusOr<GetResult> got = options_.etcd->Get(keys_.outbox(node));
  if (!got.ok()) return done(FromEtcd(got.status()));
  if (got->kv) {
    EtcdMail mail;
    if (mail.ParseFromString(got->kv->value())) return done(mail.round());
  }
  absl::StatusOr<std::optional<WatchEvent>> closed = ReadClosed();
  if (!closed.ok()) return done(closed.status());
  if (*closed) {
    return done(rdzv::ClosedJob(options_.job_id, (*closed)->job_closed().reason(),
                                (*closed)->job_closed().succeeded()));
  }
  done(NotInJob(node));
}

void EtcdRendezvous::Report(const std::string& node, EtcdReport report, absl::Duration timeout,
                            std::function<void(absl::Status)> done) {
  const absl::Time deadline = absl::Now() + timeout;
  auto shared = std::make_shared<decltype(done)>(std::move(done));
  if (!Post([=, this] {
        node_id_ = node;
        DoReport(report, deadline, std::move(*shared));
      })) {
    (*shared)(Cancelled());
  }
}

void EtcdRendezvous::DoReport(EtcdReport report, absl::Time deadline,
                              std::function<void(absl::Status)> done) {
  if (lease_ == 0) {
    // Its lease ended: the job has already dropped this node.
    return done(report.has_leave() ? absl::OkStatus() : LeaseEnded(node_id_));
  }
  if (absl::Status status = EnsureOutboxWatch(); !status.ok()) return done(status);
  report.set_seq(++report_seq_);
  absl::StatusOr<int64_t> written =
      options_.etcd->Put(keys_.inbox(node_id_), report.SerializeAsString(), lease_);
  if (absl::IsNotFound(written.status())) {
    // Its lease ended (before its keeper said so): the job dropped this node.
    ForgetLease();
    return done(report.has_leave() ? absl::OkStatus() : LeaseEnded(node_id_));
  }
  if (!written.ok()) return done(FromEtcd(written.status()));
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    reports_[report.seq()] = PendingReport{std::move(done), deadline};
    if (mail_) Answer(*mail_, &completions);
  }
  for (auto& completion : completions) completion();
}

void EtcdRendezvous::DoStatus(std::function<void(absl::StatusOr<rdzv::StatusResponse>)> done) {
  absl::StatusOr<GetResult> got = options_.etcd->Get(keys_.status());
  if (!got.ok()) return done(FromEtcd(got.status()));
  rdzv::StatusResponse status;
  if (got->kv && status.ParseFromString(got->kv->value())) {
    status.set_job_id(options_.job_id);
    return done(std::move(status));
  }
  absl::StatusOr<std::optional<WatchEvent>> closed = ReadClosed();
  if (!closed.ok()) return done(closed.status());
  if (*closed) {
    status.set_job_id(options_.job_id);
    status.set_state("closed");
    return done(std::move(status));
  }
  done(absl::NotFoundError(
      absl::StrCat("no job '", options_.job_id, "' in ", options_.target, " yet")));
}

void EtcdRendezvous::DoWatch(const std::string& node, std::shared_ptr<Watcher> watcher) {
  node_id_ = node;
  if (absl::Status status = EnsureOutboxWatch(); !status.ok()) return watcher->on_end(status);
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    if (watcher_) {
      completions.push_back(
          [old = watcher_] { old->on_end(absl::AbortedError("replaced by a newer watch")); });
    }
    watcher_.reset();
    if (!mail_) {
      completions.push_back([watcher, status = NotInJob(node)] { watcher->on_end(status); });
    } else {
      WatchEvent started;
      started.mutable_watch_started()->set_round(mail_->round());
      completions.push_back([watcher, started] { watcher->on_event(started); });
      watcher->delivered_seq = mail_->event_seq();
      const WatchEvent& last = mail_->event();
      const bool missed =
          last.has_job_closed() ||
          (last.has_round_changed() && last.round_changed().new_round() > watcher->known_round);
      if (mail_->has_event() && missed) {
        completions.push_back([watcher, last] { watcher->on_event(last); });
      }
      if (!last.has_job_closed()) watcher_ = watcher;
    }
  }
  for (auto& completion : completions) completion();
}

}  // namespace

std::unique_ptr<rdzv::RendezvousClient> NewEtcdRendezvousClient(EtcdRendezvousOptions options) {
  return std::make_unique<EtcdRendezvous>(std::move(options));
}

}  // namespace muster::etcd
