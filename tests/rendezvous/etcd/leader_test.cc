// EtcdLeader against a real etcd cluster (etcd_test_cluster.h): the test
// writes the nodes' keys as agents do and reads the outboxes the leader
// writes. What agents never see go wrong but a leader must get right: a
// join written twice, a successor resending what its predecessor decided,
// a leader whose key is gone, a node whose lease ends, a job's end.
#include "rendezvous/etcd/leader.h"

#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/etcd_rendezvous.pb.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/keys.h"
#include "rendezvous/etcd/status.h"
#include "rendezvous/rules/protocol.h"
#include "tests/rendezvous/etcd/requests.h"
#include "tests/support/etcd_cluster.h"

namespace muster::etcd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kWait = absl::Seconds(10);

class EtcdLeaderTest : public PlaintextClusterTest {
 protected:
  void SetUp() override {
    PlaintextClusterTest::SetUp();
    if (SetUpStopped()) return;
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(Options());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  void TearDown() override { leader_.reset(); }

  // Takes the leader key (with a lease of its own) and starts a leader on it.
  void StartLeader() {
    absl::StatusOr<int64_t> lease = client_->GrantLease(absl::Seconds(30));
    ASSERT_TRUE(lease.ok()) << lease.status();
    absl::StatusOr<int64_t> written = client_->Put(keys_.leader(), "test", *lease);
    ASSERT_TRUE(written.ok()) << written.status();
    LeaderOptions options;
    options.client = client_.get();
    options.job_id = job_;
    options.leader_revision = *written;
    options.on_end = [this](absl::Status status) {
      absl::MutexLock lock(&mu_);
      ended_.push_back(std::move(status));
    };
    leader_ = EtcdLeader::Start(std::move(options));
  }

  // The node's join number `seq`, under `lease` (0: none), as an agent writes it.
  void Join(const std::string& node, int64_t seq, int nodes, int64_t lease = 0) {
    rdzv::EtcdJoin join;
    join.set_seq(seq);
    *join.mutable_request() = JoinOf(node, nodes);
    ASSERT_TRUE(client_->Put(keys_.node(node), join.SerializeAsString(), lease).ok());
  }

  void Report(const std::string& node, rdzv::EtcdReport report) {
    ASSERT_TRUE(client_->Put(keys_.inbox(node), report.SerializeAsString()).ok());
  }

  // The node's outbox once `ready` holds for it; fails the test after kWait.
  rdzv::EtcdMail MailWhen(const std::string& node,
                          const std::function<bool(const rdzv::EtcdMail&)>& ready) {
    const absl::Time deadline = absl::Now() + kWait;
    rdzv::EtcdMail mail;
    while (absl::Now() < deadline) {
      absl::StatusOr<GetResult> got = client_->Get(keys_.outbox(node));
      if (got.ok() && got->kv && mail.ParseFromString(got->kv->value()) && ready(mail)) {
        return mail;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "the outbox of " << node << " never got there: " << mail.DebugString();
    return mail;
  }
  rdzv::EtcdMail Assigned(const std::string& node) {
    return MailWhen(node, [](const rdzv::EtcdMail& mail) { return mail.has_assignment(); });
  }

  std::vector<std::string> Keys() {
    absl::StatusOr<RangeResult> all = client_->GetPrefix(keys_.prefix());
    EXPECT_TRUE(all.ok()) << all.status();
    std::vector<std::string> out;
    if (all.ok()) {
      for (const auto& kv : all->kvs) out.push_back(kv.key().substr(keys_.prefix().size()));
    }
    return out;
  }

  std::vector<absl::Status> Ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

  const std::string job_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const JobKeys keys_{job_};
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdLeader> leader_;
  absl::Mutex mu_;
  std::vector<absl::Status> ended_ ABSL_GUARDED_BY(mu_);
};

TEST_F(EtcdLeaderTest, EachNodeFindsItsAnswerInItsOwnOutbox) {
  StartLeader();
  Join("a", 1, 2);
  Join("b", 1, 2);
  const rdzv::EtcdMail a = Assigned("a");
  const rdzv::EtcdMail b = Assigned("b");
  EXPECT_EQ(a.join_seq(), 1);
  EXPECT_EQ(a.assignment().world_size(), 2);
  EXPECT_EQ(a.assignment().master_addr(), "addr-a") << "group rank 0's address";
  EXPECT_TRUE(a.assignment().ride_out_outages());
  EXPECT_NE(a.assignment().group_rank(), b.assignment().group_rank());
  EXPECT_NE(a.assignment().node_secret(), b.assignment().node_secret());
  EXPECT_THAT(Keys(), UnorderedElementsAre("leader", "nodes/a", "nodes/b", "outbox/a", "outbox/b",
                                           "state", "status"));
}

TEST_F(EtcdLeaderTest, AJoinWrittenTwiceIsAnsweredOnce) {
  StartLeader();
  // Every value a's outbox takes, as its agent's watch would see them.
  absl::StatusOr<GetResult> now = client_->Get(keys_.outbox("a"));
  ASSERT_TRUE(now.ok());
  absl::Mutex seen_mu;
  std::vector<rdzv::EtcdMail> seen;
  std::unique_ptr<EtcdWatch> watch = client_->Watch(
      keys_.outbox("a"), "", now->revision + 1,
      [&](const std::vector<mvccpb::Event>& events, int64_t) {
        absl::MutexLock lock(&seen_mu);
        for (const mvccpb::Event& event : events) {
          rdzv::EtcdMail mail;
          if (mail.ParseFromString(event.kv().value())) seen.push_back(mail);
        }
      },
      [](absl::Status) {});
  // A write retried on another member can land twice: the same join. The
  // leader has taken the first (the status counts it) when the second comes.
  Join("a", 1, 2);
  const absl::Time deadline = absl::Now() + kWait;
  for (rdzv::StatusResponse status; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(20))) {
    absl::StatusOr<GetResult> got = client_->Get(keys_.status());
    if (got.ok() && got->kv && status.ParseFromString(got->kv->value()) &&
        status.participants() == 1) {
      break;
    }
  }
  Join("a", 1, 2);
  Join("b", 1, 2);
  const rdzv::EtcdMail a = Assigned("a");
  EXPECT_EQ(a.join_seq(), 1);
  // The leader takes the writes in their order, so a wrong answer to the
  // second would be in a's outbox before the assignment; the watch delivers
  // in that order too. Once it has delivered the assignment, it has
  // delivered any wrong answer.
  const auto assignment_seen = [&] {
    absl::MutexLock lock(&seen_mu);
    for (const rdzv::EtcdMail& mail : seen) {
      if (mail.has_assignment()) return true;
    }
    return false;
  };
  for (const absl::Time seen_by = absl::Now() + kWait;
       !assignment_seen() && absl::Now() < seen_by;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(assignment_seen()) << "a's watch never saw its assignment";
  watch.reset();
  {
    absl::MutexLock lock(&seen_mu);
    for (const rdzv::EtcdMail& mail : seen) {
      EXPECT_EQ(FromEtcdStatus(mail.join_error()), absl::OkStatus())
          << "the second write was taken for another agent's join";
    }
  }
  // A later join is a new one, answered as such (a rejoin with its secret
  // in a running round opens the next).
  rdzv::EtcdJoin again;
  again.set_seq(2);
  *again.mutable_request() = JoinOf("a", 2);
  again.mutable_request()->set_node_secret(a.assignment().node_secret());
  ASSERT_TRUE(client_->Put(keys_.node("a"), again.SerializeAsString()).ok());
  const rdzv::EtcdMail b = MailWhen("b", [](const rdzv::EtcdMail& m) { return m.has_event(); });
  EXPECT_EQ(b.event().round_changed().new_round(), 1);
  EXPECT_EQ(b.event().round_changed().reason(), rdzv::RoundChanged::NODE_JOINED);
}

TEST_F(EtcdLeaderTest, ASuccessorResendsWhatItsPredecessorDecided) {
  StartLeader();
  Join("a", 1, 2);
  Join("b", 1, 2);
  const rdzv::EtcdMail before = Assigned("a");
  Assigned("b");
  leader_.reset();
  // As if the answer to a had been decided but not yet written when the
  // leader died.
  ASSERT_TRUE(client_->Delete(keys_.outbox("a")).ok());
  ASSERT_TRUE(client_->Delete(keys_.leader()).ok());
  StartLeader();
  const rdzv::EtcdMail after = Assigned("a");
  EXPECT_EQ(after.join_seq(), 1);
  EXPECT_EQ(after.assignment().SerializeAsString(), before.assignment().SerializeAsString())
      << "the same round, ranks and secret, not a new round";
  EXPECT_FALSE(MailWhen("b", [](const rdzv::EtcdMail&) { return true; }).has_event())
      << "nobody was told the job moved on";
}

TEST_F(EtcdLeaderTest, ALeaderWhoseKeyIsGoneWritesNothingAndStops) {
  StartLeader();
  // Its lease ended, and another agent may lead by now.
  ASSERT_TRUE(client_->Delete(keys_.leader()).ok());
  Join("a", 1, 2);
  Join("b", 1, 2);
  const absl::Time deadline = absl::Now() + kWait;
  while (Ended().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_THAT(Ended(), ElementsAre(::testing::_));
  EXPECT_EQ(Ended()[0].code(), absl::StatusCode::kFailedPrecondition) << Ended()[0];
  EXPECT_THAT(Keys(), UnorderedElementsAre("nodes/a", "nodes/b")) << "no answer, no state";
}

TEST_F(EtcdLeaderTest, ANodeWhoseLeaseEndsIsLostAndTheOthersAreTold) {
  StartLeader();
  absl::StatusOr<int64_t> lease = client_->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok());
  Join("a", 1, 2);
  Join("b", 1, 2, *lease);
  Assigned("a");
  ASSERT_TRUE(client_->RevokeLease(*lease).ok());  // b's key goes with it
  const rdzv::EtcdMail a = MailWhen("a", [](const rdzv::EtcdMail& m) { return m.has_event(); });
  EXPECT_EQ(a.event().round_changed().reason(), rdzv::RoundChanged::NODE_LOST);
  EXPECT_THAT(a.event().round_changed().detail(), HasSubstr("its etcd lease ended"));
  EXPECT_EQ(a.round(), 1);
}

TEST_F(EtcdLeaderTest, ForgedAndMalformedKeysDoNotDisturbTheJob) {
  StartLeader();
  Join("a", 1, 2);
  Join("b", 1, 2);
  const rdzv::EtcdMail a = Assigned("a");
  // Whoever can write to etcd: a join that is not one, one with a field
  // over its bound, and a failure report for a without a's secret.
  ASSERT_TRUE(client_->Put(keys_.node("junk"), std::string(64, '\xff')).ok());
  rdzv::EtcdJoin huge;
  huge.set_seq(1);
  *huge.mutable_request() = JoinOf("huge", 2);
  huge.mutable_request()->mutable_node()->set_host(std::string(1 << 20, 'h'));
  ASSERT_TRUE(client_->Put(keys_.node("huge"), huge.SerializeAsString()).ok());
  rdzv::EtcdReport forged;
  forged.set_seq(1);
  forged.mutable_failure()->set_node_secret("a guess");
  forged.mutable_failure()->set_round(0);
  forged.mutable_failure()->mutable_failure()->set_exit_code(1);
  Report("a", forged);
  const rdzv::EtcdMail refused =
      MailWhen("a", [](const rdzv::EtcdMail& m) { return m.request_seq() == 1; });
  EXPECT_EQ(refused.request_status().code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_FALSE(refused.has_event()) << "the job did not move on";
  EXPECT_EQ(refused.assignment().SerializeAsString(), a.assignment().SerializeAsString());
  const rdzv::EtcdMail too_big =
      MailWhen("huge", [](const rdzv::EtcdMail& m) { return m.join_seq() == 1; });
  EXPECT_EQ(too_big.join_error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(too_big.join_error().message(), HasSubstr("host"));
  absl::StatusOr<GetResult> status = client_->Get(keys_.status());
  ASSERT_TRUE(status.ok() && status->kv);
  rdzv::StatusResponse job;
  ASSERT_TRUE(job.ParseFromString(status->kv->value()));
  EXPECT_EQ(job.state(), "running");
  EXPECT_EQ(job.round(), 0);
  EXPECT_EQ(job.restart_count(), 0);
  EXPECT_THAT(Ended(), ::testing::IsEmpty()) << "the leader goes on";
}

TEST_F(EtcdLeaderTest, AClosedJobLeavesOnlyItsClosedKey) {
  StartLeader();
  Join("a", 1, 1);
  const rdzv::EtcdMail a = Assigned("a");
  rdzv::EtcdReport done;
  done.set_seq(1);
  done.mutable_done()->set_node_secret(a.assignment().node_secret());
  done.mutable_done()->set_round(0);
  Report("a", done);
  const absl::Time deadline = absl::Now() + kWait;
  while (absl::Now() < deadline && Keys() != std::vector<std::string>{"closed", "leader"}) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(Keys(), ElementsAre("closed", "leader"));
  absl::StatusOr<GetResult> closed = client_->Get(keys_.closed());
  ASSERT_TRUE(closed.ok() && closed->kv);
  rdzv::WatchEvent event;
  ASSERT_TRUE(event.ParseFromString(closed->kv->value()));
  EXPECT_TRUE(event.job_closed().succeeded());
  EXPECT_NE(closed->kv->lease(), 0) << "it expires by itself";
}

}  // namespace
}  // namespace muster::etcd
