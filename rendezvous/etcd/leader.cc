#include "rendezvous/etcd/leader.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status.h"
#include "proto/etcd_rendezvous.pb.h"
#include "rendezvous/auth/node_secret.h"
#include "rendezvous/etcd/keys.h"
#include "rendezvous/etcd/status.h"
#include "rendezvous/rules/log_limiter.h"
#include "rendezvous/rules/state.h"

namespace muster::etcd {
namespace {

using rdzv::Effects;
using rdzv::EtcdJobState;
using rdzv::EtcdMail;
using rdzv::EtcdReport;
using rdzv::JournalRecord;
using rdzv::NodeKey;

// etcd's defaults: at most 128 operations in a transaction (--max-txn-ops)
// and 1.5 MiB in a request (--max-request-bytes); a batch stays below both.
constexpr int kMaxOpsPerTxn = 120;
constexpr size_t kMaxBytesPerTxn = 1 << 20;
constexpr size_t kMaxStateBytes = 1'400'000;
// How long the leader waits between tries while etcd does not answer.
constexpr absl::Duration kEtcdRetry = absl::Milliseconds(500);
// The timer looks again at least this often.
constexpr absl::Duration kTimerMaxWait = absl::Seconds(1);

// What the watches hand the leader's thread.
struct Input {
  enum class Kind { kNode, kNodeGone, kReport, kWatchEnded };
  Kind kind = Kind::kNode;
  std::string node_id;
  std::string value;
  int64_t revision = 0;
  absl::Status status;
};

rdzv::StateOptions LeaderStateOptions() {
  rdzv::StateOptions options;
  options.ride_out_outages = true;  // etcd is not a node of the job
  options.journal = true;           // the state key is rewritten when these come
  options.external_liveness = true;
  return options;
}

class Leader final : public EtcdLeader {
 public:
  explicit Leader(LeaderOptions options)
      : options_(std::move(options)), keys_(options_.job_id), logger_(Logger("rdzv")) {
    thread_ = std::thread([this] { Run(); });
  }

  ~Leader() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

 private:
  void Run();
  bool Stopping() {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }
  // Waits `d` unless the leader is stopped meanwhile; returns whether it was.
  bool SleepUnlessStopped(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
    return stopping_;
  }

  // Reads the whole job, rebuilds the state from it, answers what waits,
  // and watches the nodes' keys from there on.
  absl::Status TakeOver();
  // TakeOver's steps: forget what the last term held; read the job's keys;
  // restore the state (the members' secrets back); feed the joins in the
  // order they were written; push members the events they may have missed.
  struct Stored {
    bool leads = false;  // the leader key is still this agent's
    EtcdJobState state;
    std::map<std::string, const mvccpb::KeyValue*> nodes, reports;  // by node id
  };
  void Reset();
  Stored ReadStored(const RangeResult& all);
  std::map<std::string, std::string> RestoreState(const EtcdJobState& stored, absl::Time now);
  void ReplayJoins(const std::map<std::string, const mvccpb::KeyValue*>& nodes, absl::Time now,
                   Effects* effects);
  void CatchUpMembers(const std::map<std::string, std::string>& secrets);
  void Watch(const std::string& dir, Input::Kind put_kind, int64_t from_revision,
             std::unique_ptr<EtcdWatch>* watch);
  void Enqueue(Input input);

  void Apply(const Input& input, absl::Time now, Effects* effects);
  void FeedJoin(const std::string& node, const std::string& value, absl::Time now,
                Effects* effects);
  void FeedReport(const std::string& node, const std::string& value, absl::Time now,
                  Effects* effects);
  void NodeGone(const std::string& node, absl::Time now, Effects* effects);
  // Turns the effects into outbox mail and marks the state for writing.
  void Collect(Effects& effects);
  void Push(const std::string& node, const rdzv::WatchEvent& event);
  void SetJoinError(const std::string& node, int64_t seq, const absl::Status& status);
  // The join the node asked last that was answered or is pending (0: none).
  int64_t LastJoin(const std::string& node) const;
  EtcdMail& Mail(const std::string& node) {
    dirty_mail_.insert(node);
    gone_mail_.erase(node);
    return mails_[node];
  }

  // Writes what changed, fenced; then the job's end, once it closed.
  absl::Status Flush(absl::Time now);
  // Runs `ops` in fenced transactions of bounded size, retrying while etcd
  // does not answer. kFailedPrecondition: this agent no longer leads.
  absl::Status Write(std::vector<etcdserverpb::RequestOp> ops);
  absl::Status Commit(const etcdserverpb::TxnRequest& txn);
  absl::Status CleanUp(const rdzv::WatchEvent& closed);

  const LeaderOptions options_;
  const JobKeys keys_;
  const std::shared_ptr<spdlog::logger> logger_;
  std::thread thread_;

  absl::Mutex mu_;
  std::deque<Input> inputs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // The leader's thread only, from here on.
  std::optional<rdzv::RendezvousState> state_;
  std::map<std::string, EtcdMail> mails_;
  std::set<std::string> dirty_mail_;               // to write
  std::set<std::string> gone_mail_;                // to delete
  std::map<std::string, int64_t> pending_joins_;   // node -> its join's seq
  std::map<std::string, int64_t> answered_joins_;  // see EtcdJobState
  bool state_dirty_ = false;
  std::string written_status_;
  std::optional<rdzv::WatchEvent> closing_;  // the job closed: clean up after the flush
  std::optional<rdzv::WatchEvent> closed_;   // read from the closed key
  std::unique_ptr<EtcdWatch> nodes_watch_, inbox_watch_;
};

void Leader::Run() {
  absl::Status status;
  for (;;) {
    if (Stopping()) return;
    status = TakeOver();
    if (status.ok() || absl::IsFailedPrecondition(status)) break;
    logger_->warn("rendezvous leader of job '{}': {}; trying again", options_.job_id,
                  status.message());
    if (SleepUnlessStopped(kEtcdRetry)) return;
  }
  while (status.ok()) {
    std::deque<Input> batch;
    {
      absl::MutexLock lock(&mu_);
      absl::Duration wait = kTimerMaxWait;
      if (std::optional<absl::Time> next = state_->NextDeadline()) {
        wait = std::min(wait, *next - options_.clock->Now());
      }
      if (wait > absl::ZeroDuration()) {
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](Leader* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
                                   return self->stopping_ || !self->inputs_.empty();
                                 },
                                 this),
                             wait);
      }
      if (stopping_) break;
      batch.swap(inputs_);
    }
    const absl::Time now = options_.clock->Now();
    Effects effects;
    bool again = false;
    for (const Input& input : batch) {
      if (input.kind == Input::Kind::kWatchEnded) {
        // etcd ended a watch for good (a compacted revision): read it all again.
        logger_->warn("rendezvous leader of job '{}': {}; reading the job again", options_.job_id,
                      input.status.message());
        again = true;
        break;
      }
      Apply(input, now, &effects);
    }
    if (again) {
      status = TakeOver();
      continue;
    }
    if (std::optional<absl::Time> next = state_->NextDeadline(); next && *next <= now) {
      state_->Advance(now, &effects);
    }
    Collect(effects);
    status = Flush(now);
  }
  nodes_watch_.reset();
  inbox_watch_.reset();
  if (!status.ok() && !Stopping()) {
    logger_->warn("no longer the rendezvous leader of job '{}': {}", options_.job_id,
                  status.message());
    if (options_.on_end) options_.on_end(status);
  }
}

void Leader::Enqueue(Input input) {
  absl::MutexLock lock(&mu_);
  inputs_.push_back(std::move(input));
}

void Leader::Watch(const std::string& dir, Input::Kind put_kind, int64_t from_revision,
                   std::unique_ptr<EtcdWatch>* watch) {
  *watch = options_.client->Watch(
      dir, PrefixEnd(dir), from_revision,
      [this, dir, put_kind](const std::vector<mvccpb::Event>& events, int64_t) {
        for (const mvccpb::Event& event : events) {
          std::optional<std::string> node = JobKeys::NodeOf(event.kv().key(), dir);
          if (!node) continue;
          Input input;
          input.node_id = *std::move(node);
          input.revision = event.kv().mod_revision();
          if (event.type() == mvccpb::Event::DELETE) {
            if (put_kind != Input::Kind::kNode) continue;  // a report key's end says nothing
            input.kind = Input::Kind::kNodeGone;
          } else {
            input.kind = put_kind;
            input.value = event.kv().value();
          }
          Enqueue(std::move(input));
        }
      },
      [this](absl::Status status) {
        Input input;
        input.kind = Input::Kind::kWatchEnded;
        input.status = std::move(status);
        Enqueue(std::move(input));
      });
}

void Leader::Reset() {
  state_.emplace(LeaderStateOptions());
  mails_.clear();
  dirty_mail_.clear();
  gone_mail_.clear();
  pending_joins_.clear();
  answered_joins_.clear();
  state_dirty_ = false;
  written_status_.clear();
  closing_.reset();
  closed_.reset();
  absl::MutexLock lock(&mu_);
  inputs_.clear();  // what the old watches saw is in what is read next
}

Leader::Stored Leader::ReadStored(const RangeResult& all) {
  Stored out;
  for (const mvccpb::KeyValue& kv : all.kvs) {
    const std::string& key = kv.key();
    if (key == keys_.leader()) {
      out.leads = kv.create_revision() == options_.leader_revision;
    } else if (key == keys_.state()) {
      if (!out.state.ParseFromString(kv.value())) {
        logger_->error("job '{}': its state in etcd ({}) does not parse; starting from none",
                       options_.job_id, key);
      }
    } else if (key == keys_.closed()) {
      rdzv::WatchEvent event;
      if (event.ParseFromString(kv.value())) closed_ = event;
    } else if (auto joined = JobKeys::NodeOf(key, keys_.nodes())) {
      out.nodes[*joined] = &kv;
    } else if (auto reporter = JobKeys::NodeOf(key, keys_.inbox())) {
      out.reports[*reporter] = &kv;
    } else if (auto addressee = JobKeys::NodeOf(key, keys_.outbox())) {
      EtcdMail mail;
      if (mail.ParseFromString(kv.value())) mails_[*addressee] = std::move(mail);
    }
  }
  return out;
}

std::map<std::string, std::string> Leader::RestoreState(const EtcdJobState& stored,
                                                        absl::Time now) {
  std::map<std::string, std::string> secrets;
  for (const JournalRecord& record : stored.records()) {
    if (absl::Status restored = state_->Restore(record, now); !restored.ok()) {
      logger_->warn("job '{}': {}; that record is skipped", options_.job_id, restored.message());
    }
    if (record.has_round_formed()) {
      for (const rdzv::DurableNode& member : record.round_formed().members()) {
        secrets[member.info().node_id()] = member.secret();
      }
    }
  }
  answered_joins_.insert(stored.answered_joins().begin(), stored.answered_joins().end());
  return secrets;
}

void Leader::ReplayJoins(const std::map<std::string, const mvccpb::KeyValue*>& nodes,
                         absl::Time now, Effects* effects) {
  // In the order they were written.
  std::vector<std::pair<int64_t, std::string>> joins;
  for (const auto& [node, kv] : nodes) joins.emplace_back(kv->mod_revision(), node);
  std::sort(joins.begin(), joins.end());
  for (const auto& [revision, node] : joins) {
    const std::string& value = nodes.at(node)->value();
    rdzv::EtcdJoin join;
    join.ParseFromString(value);  // FeedJoin says what is wrong with it
    auto decided = answered_joins_.find(node);
    if (join.seq() > 0 && decided != answered_joins_.end() && decided->second == join.seq() &&
        LastJoin(node) < join.seq()) {
      // Decided by the last leader, which may not have written it.
      if (std::optional<rdzv::Assignment> assignment =
              state_->AssignmentOf(NodeKey{options_.job_id, node})) {
        EtcdMail& fresh = Mail(node);
        fresh.set_join_seq(join.seq());
        *fresh.mutable_assignment() = *assignment;
        fresh.clear_join_error();
        fresh.set_round(assignment->round());
        continue;
      }
    }
    FeedJoin(node, value, now, effects);
  }
}

void Leader::CatchUpMembers(const std::map<std::string, std::string>& secrets) {
  for (const auto& [node, secret] : secrets) {
    auto mail = mails_.find(node);
    const int64_t known = mail == mails_.end() ? -1 : mail->second.round();
    absl::StatusOr<std::optional<rdzv::WatchEvent>> missed =
        state_->CatchUp(NodeKey{options_.job_id, node}, secret, known);
    if (missed.ok() && missed->has_value() &&
        (mail == mails_.end() || !mail->second.has_event() ||
         mail->second.event().SerializeAsString() != (*missed)->SerializeAsString())) {
      Push(node, **missed);
    }
  }
}

absl::Status Leader::TakeOver() {
  nodes_watch_.reset();
  inbox_watch_.reset();
  absl::StatusOr<RangeResult> all = options_.client->GetPrefix(keys_.prefix());
  if (!all.ok()) return all.status();
  const absl::Time now = options_.clock->Now();
  Reset();
  const Stored stored = ReadStored(*all);
  if (!stored.leads) {
    return absl::FailedPreconditionError(
        absl::StrCat("this agent no longer holds ", keys_.leader()));
  }
  // The members and their secrets, as the state has them.
  const std::map<std::string, std::string> secrets = RestoreState(stored.state, now);
  logger_->info("leading the rendezvous of job '{}' ({} node(s) in etcd{})", options_.job_id,
                stored.nodes.size(), stored.state.records().empty() ? "" : ", its state restored");

  Effects effects;
  // Members lost while no one led.
  for (const auto& [node, secret] : secrets) {
    if (!stored.nodes.contains(node)) NodeGone(node, now, &effects);
  }
  ReplayJoins(stored.nodes, now, &effects);
  // Events a member may have missed.
  CatchUpMembers(secrets);
  for (const auto& [node, kv] : stored.reports) FeedReport(node, kv->value(), now, &effects);
  Collect(effects);
  if (!closed_ && !closing_) {
    // The last leader closed the job but did not clean up.
    absl::StatusOr<std::optional<rdzv::WatchEvent>> ended =
        state_->CatchUp(NodeKey{options_.job_id, ""}, "", -1);
    if (ended.ok() && ended->has_value() && (*ended)->has_job_closed()) closing_ = **ended;
  }
  MUSTER_RETURN_IF_ERROR(Flush(now));
  Watch(keys_.nodes(), Input::Kind::kNode, all->revision + 1, &nodes_watch_);
  Watch(keys_.inbox(), Input::Kind::kReport, all->revision + 1, &inbox_watch_);
  return absl::OkStatus();
}

void Leader::Apply(const Input& input, absl::Time now, Effects* effects) {
  switch (input.kind) {
    case Input::Kind::kNode: FeedJoin(input.node_id, input.value, now, effects); break;
    case Input::Kind::kNodeGone: NodeGone(input.node_id, now, effects); break;
    case Input::Kind::kReport: FeedReport(input.node_id, input.value, now, effects); break;
    case Input::Kind::kWatchEnded: break;
  }
}

int64_t Leader::LastJoin(const std::string& node) const {
  int64_t last = 0;
  if (auto pending = pending_joins_.find(node); pending != pending_joins_.end()) {
    last = pending->second;
  }
  if (auto mail = mails_.find(node); mail != mails_.end()) {
    last = std::max(last, mail->second.join_seq());
  }
  return last;
}

void Leader::FeedJoin(const std::string& node, const std::string& value, absl::Time now,
                      Effects* effects) {
  rdzv::EtcdJoin join;
  if (!join.ParseFromString(value) || join.seq() <= 0) {
    logger_->warn("job '{}': the join of node {} in etcd is not a muster join; ignored",
                  options_.job_id, rdzv::ForLog(node));
    return;
  }
  // The same join written twice (a write retried on another member), or
  // an older one: answered or pending already.
  if (join.seq() <= LastJoin(node)) return;
  const int64_t seq = join.seq();
  rdzv::JoinRequest& request = *join.mutable_request();
  if (closed_) {
    SetJoinError(node, seq,
                 rdzv::JoinToClosedJob(options_.job_id, closed_->job_closed().reason(),
                                       closed_->job_closed().succeeded()));
    return;
  }
  // The key names the node and the job, whatever the value says.
  request.set_job_id(options_.job_id);
  request.mutable_node()->set_node_id(node);
  absl::StatusOr<std::string> secret = rdzv::NewNodeSecret();
  absl::Status status = secret.status();
  if (status.ok()) status = state_->Join(request, /*peer_addr=*/"", *secret, now, effects);
  if (!status.ok()) {
    SetJoinError(node, seq, status);
    return;
  }
  pending_joins_[node] = seq;
}

void Leader::FeedReport(const std::string& node, const std::string& value, absl::Time now,
                        Effects* effects) {
  EtcdReport report;
  if (!report.ParseFromString(value)) {
    logger_->warn("job '{}': the report of node {} in etcd does not parse; ignored",
                  options_.job_id, rdzv::ForLog(node));
    return;
  }
  auto known = mails_.find(node);
  if (known != mails_.end() && report.seq() <= known->second.request_seq()) return;  // answered
  const NodeKey key{options_.job_id, node};
  absl::Status status;
  switch (report.report_case()) {
    case EtcdReport::kFailure:
      // How far the round got counts before its failure is judged.
      if (report.failure().has_progress()) {
        (void)state_->ReportProgress(key, report.failure().node_secret(),
                                     report.failure().progress(), now, effects);
      }
      status = state_->ReportFailure(key, report.failure().node_secret(), report.failure().round(),
                                     report.failure().failure(), now, effects);
      break;
    case EtcdReport::kDone:
      if (report.done().has_progress()) {
        (void)state_->ReportProgress(key, report.done().node_secret(), report.done().progress(),
                                     now, effects);
      }
      status =
          state_->ReportDone(key, report.done().node_secret(), report.done().round(), now, effects);
      break;
    case EtcdReport::kLeave:
      status = state_->Leave(key, report.leave().node_secret(), report.leave().reason(), now,
                             effects, report.leave().exclude());
      break;
    case EtcdReport::REPORT_NOT_SET: status = absl::InvalidArgumentError("an empty report"); break;
  }
  if (absl::IsNotFound(status) && !mails_.contains(node)) {
    // A node the leader never answered (gone, or never joined): no outbox
    // is made for it; its call times out.
    return;
  }
  EtcdMail& mail = Mail(node);
  mail.set_request_seq(report.seq());
  *mail.mutable_request_status() = ToEtcdStatus(status);
}

void Leader::NodeGone(const std::string& node, absl::Time now, Effects* effects) {
  state_->DropNode(NodeKey{options_.job_id, node},
                   "lost: its etcd lease ended (the agent died, or could not reach etcd for "
                   "heartbeat_timeout)",
                   now, effects);
  pending_joins_.erase(node);
  answered_joins_.erase(node);
  mails_.erase(node);
  dirty_mail_.erase(node);
  gone_mail_.insert(node);
}

void Leader::SetJoinError(const std::string& node, int64_t seq, const absl::Status& status) {
  EtcdMail& mail = Mail(node);
  mail.set_join_seq(seq);
  mail.clear_assignment();
  *mail.mutable_join_error() = ToEtcdStatus(status);
}

void Leader::Push(const std::string& node, const rdzv::WatchEvent& event) {
  EtcdMail& mail = Mail(node);
  mail.set_event_seq(mail.event_seq() + 1);
  *mail.mutable_event() = event;
  if (event.has_round_changed()) mail.set_round(event.round_changed().new_round());
}

void Leader::Collect(Effects& effects) {
  for (const std::string& line : effects.log) logger_->info("{}", line);
  for (auto& [key, assignment] : effects.assigned) {
    auto pending = pending_joins_.find(key.node_id);
    if (pending == pending_joins_.end()) continue;  // its node is gone
    EtcdMail& mail = Mail(key.node_id);
    mail.set_join_seq(pending->second);
    mail.clear_join_error();
    mail.set_round(assignment.round());
    *mail.mutable_assignment() = std::move(assignment);
    answered_joins_[key.node_id] = pending->second;
    pending_joins_.erase(pending);
    state_dirty_ = true;
  }
  for (const auto& [key, status] : effects.join_failed) {
    auto pending = pending_joins_.find(key.node_id);
    if (pending == pending_joins_.end()) continue;
    SetJoinError(key.node_id, pending->second, status);
    pending_joins_.erase(pending);
  }
  for (const auto& [key, event] : effects.pushed) {
    if (gone_mail_.contains(key.node_id)) continue;
    Push(key.node_id, event);
    if (event.has_job_closed()) closing_ = event;
  }
  if (!effects.journal.empty()) state_dirty_ = true;
}

absl::Status Leader::Flush(absl::Time now) {
  std::vector<etcdserverpb::RequestOp> ops;
  if (state_dirty_) {
    EtcdJobState stored;
    for (JournalRecord& record : state_->Snapshot()) *stored.add_records() = std::move(record);
    for (const auto& [node, seq] : answered_joins_) {
      if (state_->AssignmentOf(NodeKey{options_.job_id, node})) {
        (*stored.mutable_answered_joins())[node] = seq;
      }
    }
    std::string value = stored.SerializeAsString();
    if (value.size() > kMaxStateBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the state of job '", options_.job_id, "' is ", value.size(),
          " bytes, over what one etcd request may carry (--max-request-bytes, 1.5 MiB by "
          "default): run etcd with a larger --max-request-bytes, or use musterd"));
    }
    etcdserverpb::RequestOp op;
    op.mutable_request_put()->set_key(keys_.state());
    op.mutable_request_put()->set_value(std::move(value));
    ops.push_back(std::move(op));
  }
  if (absl::StatusOr<rdzv::StatusResponse> status = state_->Status(options_.job_id, now);
      status.ok()) {
    std::string value = status->SerializeAsString();
    if (value != written_status_) {
      etcdserverpb::RequestOp op;
      op.mutable_request_put()->set_key(keys_.status());
      op.mutable_request_put()->set_value(value);
      ops.push_back(std::move(op));
      written_status_ = std::move(value);
    }
  }
  for (const std::string& node : dirty_mail_) {
    etcdserverpb::RequestOp op;
    op.mutable_request_put()->set_key(keys_.outbox(node));
    op.mutable_request_put()->set_value(mails_[node].SerializeAsString());
    ops.push_back(std::move(op));
  }
  for (const std::string& node : gone_mail_) {
    etcdserverpb::RequestOp op;
    op.mutable_request_delete_range()->set_key(keys_.outbox(node));
    ops.push_back(std::move(op));
  }
  if (!ops.empty()) MUSTER_RETURN_IF_ERROR(Write(std::move(ops)));
  state_dirty_ = false;
  dirty_mail_.clear();
  gone_mail_.clear();
  if (closing_ && !closed_) {
    MUSTER_RETURN_IF_ERROR(CleanUp(*closing_));
    closed_ = closing_;
  }
  return absl::OkStatus();
}

absl::Status Leader::Write(std::vector<etcdserverpb::RequestOp> ops) {
  auto fenced = [this] { return FencedTxn(keys_.leader(), options_.leader_revision); };
  etcdserverpb::TxnRequest txn = fenced();
  size_t bytes = 0;
  for (etcdserverpb::RequestOp& op : ops) {
    const size_t size = op.ByteSizeLong();
    if (txn.success_size() > 0 &&
        (txn.success_size() >= kMaxOpsPerTxn || bytes + size > kMaxBytesPerTxn)) {
      MUSTER_RETURN_IF_ERROR(Commit(txn));
      txn = fenced();
      bytes = 0;
    }
    *txn.add_success() = std::move(op);
    bytes += size;
  }
  return Commit(txn);
}

absl::Status Leader::Commit(const etcdserverpb::TxnRequest& txn) {
  for (;;) {
    absl::StatusOr<etcdserverpb::TxnResponse> response = options_.client->Txn(txn);
    if (response.ok()) {
      if (!response->succeeded()) {
        return absl::FailedPreconditionError(
            absl::StrCat("this agent no longer holds ", keys_.leader(),
                         " (its lease ended); another agent leads now"));
      }
      return absl::OkStatus();
    }
    // Every write is a whole value: a transaction that may have been
    // applied can be sent again.
    if (!absl::IsUnavailable(response.status()) && !absl::IsDeadlineExceeded(response.status())) {
      return response.status();
    }
    if (SleepUnlessStopped(kEtcdRetry)) return absl::CancelledError("stopping");
  }
}

absl::Status Leader::CleanUp(const rdzv::WatchEvent& closed) {
  // The closed key outlives the leader: a lease of its own, never renewed.
  absl::StatusOr<int64_t> lease = options_.client->GrantLease(rdzv::kClosedJobRetention);
  if (!lease.ok()) return lease.status();
  std::vector<etcdserverpb::RequestOp> ops(6);
  ops[0].mutable_request_put()->set_key(keys_.closed());
  ops[0].mutable_request_put()->set_value(closed.SerializeAsString());
  ops[0].mutable_request_put()->set_lease(*lease);
  ops[1].mutable_request_delete_range()->set_key(keys_.state());
  ops[2].mutable_request_delete_range()->set_key(keys_.status());
  for (int i = 0; i < 3; ++i) {
    const std::string dir = i == 0 ? keys_.nodes() : i == 1 ? keys_.inbox() : keys_.outbox();
    ops[3 + i].mutable_request_delete_range()->set_key(dir);
    ops[3 + i].mutable_request_delete_range()->set_range_end(PrefixEnd(dir));
  }
  MUSTER_RETURN_IF_ERROR(Write(std::move(ops)));
  logger_->info("job '{}': its keys in etcd are deleted; {} says how it ended for {}",
                options_.job_id, keys_.closed(), absl::FormatDuration(rdzv::kClosedJobRetention));
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<EtcdLeader> EtcdLeader::Start(LeaderOptions options) {
  return std::make_unique<Leader>(std::move(options));
}

}  // namespace muster::etcd
