// EtcdClient against a real 3-member etcd cluster on free loopback ports
// (tests/etcd/cluster.sh), one per test process: skipped where etcd-server
// or etcd-client is not installed.
#include "rendezvous/etcd/client.h"

#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/support/certificates.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/temp_dir.h"

namespace muster::etcd {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// A watch's events and end, as the callbacks deliver them.
class EventLog {
 public:
  std::function<void(const std::vector<mvccpb::Event>&, int64_t)> OnEvents() {
    return [this](const std::vector<mvccpb::Event>& events, int64_t) {
      absl::MutexLock lock(&mu_);
      events_.insert(events_.end(), events.begin(), events.end());
    };
  }
  std::function<void(absl::Status)> OnEnd() {
    return [this](absl::Status status) {
      absl::MutexLock lock(&mu_);
      end_ = std::move(status);
      ++ends_;
    };
  }
  // Waits until `count` events have come; false after `timeout`.
  bool WaitForEvents(size_t count, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  bool WaitForEnd(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ends_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
  }
  std::vector<mvccpb::Event> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  absl::Status end() {
    absl::MutexLock lock(&mu_);
    return end_;
  }
  int ends() {
    absl::MutexLock lock(&mu_);
    return ends_;
  }

 private:
  absl::Mutex mu_;
  std::vector<mvccpb::Event> events_ ABSL_GUARDED_BY(mu_);
  absl::Status end_ ABSL_GUARDED_BY(mu_);
  int ends_ ABSL_GUARDED_BY(mu_) = 0;
};

// "PUT key" or "DELETE key", for comparing event sequences.
std::vector<std::string> Describe(const std::vector<mvccpb::Event>& events) {
  std::vector<std::string> out;
  for (const mvccpb::Event& event : events) {
    out.push_back(
        absl::StrCat(event.type() == mvccpb::Event::PUT ? "PUT " : "DELETE ", event.kv().key()));
  }
  return out;
}

std::unique_ptr<EtcdClient> NewClient(EtcdOptions options) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Keys of this test only.
std::string Prefix() {
  return absl::StrCat("/test/", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                      "/");
}

class EtcdClientTest : public PlaintextClusterTest {
 protected:
  void SetUp() override {
    PlaintextClusterTest::SetUp();
    if (SetUpStopped()) return;
    client_ = NewClient(Options());
    ASSERT_NE(client_, nullptr);
  }

  static absl::StatusOr<std::string> Script(const std::string& command,
                                            const std::string& args = "") {
    return cluster_.Script(command, args);
  }
  static absl::StatusOr<std::string> Etcdctl(const std::string& args) {
    return cluster_.Etcdctl(args);
  }
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, PutThenGetPrefixAndDelete) {
  const std::string p = Prefix();
  absl::StatusOr<int64_t> first = client_->Put(p + "a/1", "one");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(client_->Put(p + "a/2", "two").ok());
  ASSERT_TRUE(client_->Put(p + "b/1", "other").ok());

  absl::StatusOr<GetResult> got = client_->Get(p + "a/1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->kv.has_value());
  EXPECT_EQ(got->kv->value(), "one");
  EXPECT_EQ(got->kv->create_revision(), *first);
  EXPECT_EQ(got->kv->mod_revision(), *first);
  EXPECT_EQ(got->kv->version(), 1);
  EXPECT_EQ(got->kv->lease(), 0);
  EXPECT_GT(got->revision, *first);  // two puts came after

  absl::StatusOr<GetResult> missing = client_->Get(p + "a/3");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->kv.has_value());

  absl::StatusOr<RangeResult> prefix = client_->GetPrefix(p + "a/");
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  ASSERT_EQ(prefix->kvs.size(), 2u);
  EXPECT_EQ(prefix->kvs[0].key(), p + "a/1");
  EXPECT_EQ(prefix->kvs[1].key(), p + "a/2");

  absl::StatusOr<int64_t> deleted = client_->Delete(p + "a/1");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 1);
  deleted = client_->DeletePrefix(p);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 2);
  prefix = client_->GetPrefix(p);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_TRUE(prefix->kvs.empty());
  EXPECT_EQ(client_->DeletePrefix("").status().code(), absl::StatusCode::kInvalidArgument);
}

// The rendezvous's compare-and-swap: write only if nobody wrote since we read.
TEST_F(EtcdClientTest, TxnOnModRevisionSucceedsOnceAndFailsForAStaleRevision) {
  const std::string key = Prefix() + "state";
  absl::StatusOr<int64_t> revision = client_->Put(key, "v1");
  ASSERT_TRUE(revision.ok()) << revision.status();

  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* compare = txn.add_compare();
  compare->set_key(key);
  compare->set_target(etcdserverpb::Compare::MOD);
  compare->set_result(etcdserverpb::Compare::EQUAL);
  compare->set_mod_revision(*revision);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value("v2");
  txn.add_failure()->mutable_request_range()->set_key(key);

  absl::StatusOr<etcdserverpb::TxnResponse> swapped = client_->Txn(txn);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_TRUE(swapped->succeeded());

  put->set_value("v3");
  absl::StatusOr<etcdserverpb::TxnResponse> stale = client_->Txn(txn);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_FALSE(stale->succeeded());
  ASSERT_EQ(stale->responses_size(), 1);
  ASSERT_EQ(stale->responses(0).response_range().kvs_size(), 1);
  EXPECT_EQ(stale->responses(0).response_range().kvs(0).value(), "v2");
}

// 3,000 keys of 1 KiB do not fit in one response of at most 1 MiB: one
// Range over them fails, GetPrefix pages.
TEST_F(EtcdClientTest, GetPrefixReadsMoreThanOneResponseHolds) {
  EtcdOptions options = Options();
  options.max_response_bytes = 1 << 20;
  std::unique_ptr<EtcdClient> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  const std::string p = Prefix();
  const std::string value(1024, 'v');
  constexpr int kKeys = 3000;
  constexpr int kPerTxn = 100;  // etcd takes at most 128 operations in a transaction
  for (int first = 0; first < kKeys; first += kPerTxn) {
    etcdserverpb::TxnRequest txn;
    for (int i = first; i < first + kPerTxn; ++i) {
      etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
      put->set_key(absl::StrFormat("%skey%05d", p, i));
      put->set_value(value);
    }
    absl::StatusOr<etcdserverpb::TxnResponse> written = client->Txn(txn);
    ASSERT_TRUE(written.ok()) << written.status();
  }

  etcdserverpb::TxnRequest everything;
  etcdserverpb::RangeRequest* range = everything.add_success()->mutable_request_range();
  range->set_key(p);
  range->set_range_end(PrefixEnd(p));
  EXPECT_EQ(client->Txn(everything).status().code(), absl::StatusCode::kResourceExhausted);

  absl::StatusOr<RangeResult> all = client->GetPrefix(p);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->kvs.size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_EQ(all->kvs[i].key(), absl::StrFormat("%skey%05d", p, i));
    ASSERT_EQ(all->kvs[i].value(), value);
    ASSERT_LE(all->kvs[i].mod_revision(), all->revision);
  }
  absl::StatusOr<int64_t> deleted = client->DeletePrefix(p);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, kKeys);
}

TEST_F(EtcdClientTest, KeptLeaseOutlivesItsTtlAndEndsOnceTheKeeperGoes) {
  constexpr absl::Duration kTtl = absl::Seconds(1);
  const std::string key = Prefix() + "node";
  absl::StatusOr<int64_t> lease = client_->GrantLease(kTtl);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put(key, "alive", *lease).ok());
  const absl::Time granted = absl::Now();

  absl::Notification lost;
  std::unique_ptr<LeaseKeeper> keeper =
      client_->KeepAlive(*lease, kTtl, [&lost](absl::Status) { lost.Notify(); });
  absl::SleepFor(granted + 3 * kTtl + absl::Milliseconds(300) - absl::Now());
  absl::StatusOr<GetResult> got = client_->Get(key);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->kv.has_value()) << "the key went with its lease after " << absl::Now() - granted;
  EXPECT_EQ(got->kv->lease(), *lease);
  EXPECT_FALSE(lost.HasBeenNotified());

  keeper.reset();
  const absl::Time dropped = absl::Now();
  bool gone = false;
  while (!gone && absl::Now() < dropped + kTtl + absl::Seconds(2)) {
    got = client_->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    gone = !got->kv.has_value();
    if (!gone) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(gone) << "the key outlived its lease's keeper by " << absl::Now() - dropped;
  EXPECT_FALSE(lost.HasBeenNotified());
}

TEST_F(EtcdClientTest, ARevokedLeaseIsReportedLostOnce) {
  absl::StatusOr<int64_t> lease = client_->GrantLease(absl::Seconds(3));
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::Mutex mu;
  std::vector<absl::Status> reports;
  std::unique_ptr<LeaseKeeper> keeper =
      client_->KeepAlive(*lease, absl::Seconds(3), [&](absl::Status status) {
        absl::MutexLock lock(&mu);
        reports.push_back(std::move(status));
      });
  ASSERT_TRUE(client_->RevokeLease(*lease).ok());
  {
    absl::MutexLock lock(&mu);
    // The next keep-alive (within ttl / 3) is answered TTL 0.
    ASSERT_TRUE(mu.AwaitWithTimeout(
        absl::Condition(
            +[](std::vector<absl::Status>* r) { return !r->empty(); }, &reports),
        absl::Seconds(5)));
    EXPECT_EQ(reports[0].code(), absl::StatusCode::kNotFound) << reports[0];
  }
  keeper.reset();
  EXPECT_EQ(reports.size(), 1u);
  EXPECT_EQ(client_->RevokeLease(*lease).code(), absl::StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, WatchSeesPutsAndDeletesInOrder) {
  const std::string p = Prefix();
  EventLog log;
  std::unique_ptr<EtcdWatch> watch;
  // From a revision of our own, so that nothing before the watch is open can be missed.
  absl::StatusOr<int64_t> start = client_->Put(p + "a", "1");
  ASSERT_TRUE(start.ok()) << start.status();
  watch = client_->Watch(p, PrefixEnd(p), *start, log.OnEvents(), log.OnEnd());
  ASSERT_TRUE(client_->Put(p + "b", "2").ok());
  // Outside the range ("/test/Name-" sorts before "/test/Name/"): had it
  // been delivered, it would be among the four events awaited.
  ASSERT_TRUE(client_->Put(p.substr(0, p.size() - 1) + "-elsewhere", "x").ok());
  ASSERT_TRUE(client_->Put(p + "a", "3").ok());
  ASSERT_TRUE(client_->Delete(p + "b").ok());
  ASSERT_TRUE(log.WaitForEvents(4, absl::Seconds(5)));
  const std::vector<mvccpb::Event> events = log.events();
  EXPECT_THAT(Describe(events), ElementsAreArray({"PUT " + p + "a", "PUT " + p + "b",
                                                  "PUT " + p + "a", "DELETE " + p + "b"}));
  EXPECT_EQ(events[0].kv().mod_revision(), *start);
  EXPECT_EQ(events[2].kv().value(), "3");
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GT(events[i].kv().mod_revision(), events[i - 1].kv().mod_revision());
  }
  watch.reset();
  EXPECT_EQ(log.ends(), 0);
}

TEST_F(EtcdClientTest, WatchFromACompactedRevisionEndsOutOfRange) {
  const std::string key = Prefix() + "k";
  absl::StatusOr<int64_t> old = client_->Put(key, "1");
  ASSERT_TRUE(old.ok()) << old.status();
  absl::StatusOr<int64_t> now = client_->Put(key, "2");
  ASSERT_TRUE(now.ok()) << now.status();
  absl::StatusOr<std::string> compacted = Etcdctl(absl::StrCat("compact ", *now));
  ASSERT_TRUE(compacted.ok()) << compacted.status();

  EventLog log;
  std::unique_ptr<EtcdWatch> watch = client_->Watch(key, "", *old, log.OnEvents(), log.OnEnd());
  ASSERT_TRUE(log.WaitForEnd(absl::Seconds(5)));
  EXPECT_EQ(log.end().code(), absl::StatusCode::kOutOfRange) << log.end();
  EXPECT_THAT(log.end().message(), HasSubstr(absl::StrCat("compact revision ", *now)));
  EXPECT_TRUE(log.events().empty());
  watch.reset();
  EXPECT_EQ(log.ends(), 1);
}

// The leader dies under a watch, a kept lease and calls, all on it: the
// first call waits out the election and the lost write at a follower that
// still believed in the dead leader; once there is a new leader, calls go on
// through another member within 2 s; the watch carries on with no event lost
// or repeated; the lease lives; and the member comes back.
//
// Raft may need a few rounds to elect one of two survivors (split votes, and
// longer on a loaded machine): the first call has the default 5 s, and the
// lease a TTL that outlasts such an election.
TEST_F(EtcdClientTest, AKilledLeaderIsSurvivedByCallsWatchesAndLeases) {
  absl::StatusOr<std::string> leader_text = Script("leader");
  ASSERT_TRUE(leader_text.ok()) << leader_text.status();
  int leader;
  ASSERT_TRUE(absl::SimpleAtoi(*leader_text, &leader)) << *leader_text;
  // The leader first: the clients start there.
  EtcdOptions options = Options();
  std::rotate(options.endpoints.begin(), options.endpoints.begin() + leader,
              options.endpoints.end());
  std::unique_ptr<EtcdClient> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  options.call_timeout = absl::Seconds(2);
  std::unique_ptr<EtcdClient> quick = NewClient(options);
  ASSERT_NE(quick, nullptr);

  const std::string p = Prefix();
  constexpr absl::Duration kTtl = absl::Seconds(5);
  absl::StatusOr<int64_t> lease = client->GrantLease(kTtl);
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<int64_t> base = client->Put(p + "node", "alive", *lease);
  ASSERT_TRUE(base.ok()) << base.status();
  absl::Notification lost;
  std::unique_ptr<LeaseKeeper> keeper =
      client->KeepAlive(*lease, kTtl, [&lost](absl::Status) { lost.Notify(); });
  EventLog log;
  std::unique_ptr<EtcdWatch> watch =
      client->Watch(p + "w/", PrefixEnd(p + "w/"), *base + 1, log.OnEvents(), log.OnEnd());
  std::vector<std::string> expected;
  ASSERT_TRUE(quick->Put(p + "w/0", "before").ok());  // connects `quick` to the leader
  expected.push_back("PUT " + p + "w/0");
  ASSERT_TRUE(log.WaitForEvents(1, absl::Seconds(5)));  // the watch is open

  ASSERT_TRUE(Script("kill", std::to_string(leader)).ok());
  const absl::Time killed = absl::Now();
  absl::StatusOr<int64_t> put = client->Put(p + "w/1", "during the election");
  ASSERT_TRUE(put.ok()) << put.status() << " (" << absl::Now() - killed << " after the kill)";
  expected.push_back("PUT " + p + "w/1");
  ::testing::Test::RecordProperty("first_put_after_kill_ms",
                                  absl::StrCat(absl::ToInt64Milliseconds(absl::Now() - killed)));
  for (int i = 2; i <= 5; ++i) {
    const std::string key = absl::StrCat(p, "w/", i);
    put = quick->Put(key, "after");
    ASSERT_TRUE(put.ok()) << put.status() << " (" << absl::Now() - killed << " after the kill)";
    expected.push_back("PUT " + key);
  }
  absl::StatusOr<GetResult> got = quick->Get(p + "w/3");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->kv.has_value());
  ASSERT_TRUE(quick->Delete(p + "w/0").ok());
  expected.push_back("DELETE " + p + "w/0");

  ASSERT_TRUE(log.WaitForEvents(expected.size(), absl::Seconds(5)))
      << "events: " << ::testing::PrintToString(Describe(log.events()));
  EXPECT_THAT(Describe(log.events()), ElementsAreArray(expected));

  // A whole TTL after the kill, the lease holds: keep-alives went on elsewhere.
  absl::SleepFor(killed + kTtl + absl::Milliseconds(500) - absl::Now());
  got = client->Get(p + "node");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->kv.has_value()) << "the lease was lost with the leader";
  EXPECT_FALSE(lost.HasBeenNotified());

  ASSERT_TRUE(Script("start-member", std::to_string(leader)).ok());
  // The member is back with everything written while it was away.
  EtcdOptions only_it = Options();
  only_it.endpoints = {cluster_.endpoints()[leader]};
  std::unique_ptr<EtcdClient> direct = NewClient(only_it);
  ASSERT_NE(direct, nullptr);
  got = direct->Get(p + "w/5");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->kv.has_value());
  ASSERT_TRUE(client->Put(p + "w/6", "restarted").ok());
  expected.push_back("PUT " + p + "w/6");
  ASSERT_TRUE(log.WaitForEvents(expected.size(), absl::Seconds(5)));
  EXPECT_THAT(Describe(log.events()), ElementsAreArray(expected));
  EXPECT_EQ(log.ends(), 0);
}

// The membership calls, on a learner that never starts (a voter not started
// would cost the cluster its quorum margin; a learner costs nothing).
TEST_F(EtcdClientTest, ListsAddsAndRemovesALearner) {
  absl::StatusOr<std::vector<etcdserverpb::Member>> members = client_->MemberList();
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 3u);
  std::vector<std::string> endpoints;
  for (const etcdserverpb::Member& member : *members) {
    EXPECT_FALSE(member.islearner());
    ASSERT_FALSE(member.clienturls().empty());
    std::optional<std::string> endpoint = EndpointOfUrl(member.clienturls(0));
    ASSERT_TRUE(endpoint.has_value()) << member.clienturls(0);
    endpoints.push_back(*endpoint);
  }
  std::vector<std::string> expected = cluster_.endpoints();
  std::sort(endpoints.begin(), endpoints.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(endpoints, expected);

  // etcd adds a member once its members have been connected for 5 s.
  absl::StatusOr<etcdserverpb::Member> added;
  for (int i = 0; i < 40; ++i) {
    added = client_->MemberAdd("http://127.0.0.1:9", true);
    if (added.ok() || !absl::StrContains(added.status().message(), "unhealthy cluster")) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_TRUE(added->islearner());
  members = client_->MemberList();
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 4u);
  // Not started: no name, no client URL; and never in sync, so not promoted.
  absl::Status promoted = client_->MemberPromote(added->id());
  EXPECT_FALSE(promoted.ok());
  ASSERT_TRUE(client_->MemberRemove(added->id()).ok());
  members = client_->MemberList();
  ASSERT_TRUE(members.ok()) << members.status();
  EXPECT_EQ(members->size(), 3u);
  EXPECT_TRUE(absl::IsNotFound(client_->MemberRemove(added->id())));
}

TEST(EndpointOfUrlTest, TakesTheHostAndPortOfAnHttpUrl) {
  EXPECT_EQ(EndpointOfUrl("http://10.0.0.1:2379"), "10.0.0.1:2379");
  EXPECT_EQ(EndpointOfUrl("https://[::1]:2379/"), "[::1]:2379");
  EXPECT_EQ(EndpointOfUrl("unix://x:1"), std::nullopt);
  EXPECT_EQ(EndpointOfUrl("http://10.0.0.1"), std::nullopt);
  EXPECT_EQ(EndpointOfUrl("http://10.0.0.1:2379/v3"), std::nullopt);
}

// Given one member, a client with auto_sync_interval learns the others, and
// goes on when the one it was given is killed.
TEST_F(EtcdClientTest, FollowsTheMembersEtcdListsWhenTheOneItKnewDies) {
  EtcdOptions options = Options();
  options.endpoints = {cluster_.endpoints()[0]};
  options.auto_sync_interval = absl::Milliseconds(100);
  std::unique_ptr<EtcdClient> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  const std::string p = Prefix();
  ASSERT_TRUE(client->Put(p + "before", "1").ok());
  absl::SleepFor(absl::Milliseconds(500));  // a few syncs
  ASSERT_TRUE(Script("kill", "0").ok());
  absl::StatusOr<int64_t> put = client->Put(p + "after", "2");
  EXPECT_TRUE(put.ok()) << put.status();
  ASSERT_TRUE(Script("start-member", "0").ok());
  // Without the sync, a client of member 0 alone fails while it is away.
  options.auto_sync_interval = absl::ZeroDuration();
  options.call_timeout = absl::Seconds(1);
  std::unique_ptr<EtcdClient> fixed = NewClient(options);
  ASSERT_NE(fixed, nullptr);
  ASSERT_TRUE(Script("kill", "0").ok());
  EXPECT_FALSE(fixed->Put(p + "fixed", "3").ok());
  ASSERT_TRUE(Script("start-member", "0").ok());
}

// With auth enabled, the client authenticates once and again when etcd drops
// its token (auth disabled and enabled again).
TEST_F(EtcdClientTest, AuthenticatesAndAuthenticatesAgainWhenTheTokenIsDropped) {
  ASSERT_TRUE(Etcdctl("user add root:secret").ok());
  ASSERT_TRUE(Etcdctl("auth enable").ok());
  struct Restore {
    ~Restore() {
      (void)Etcdctl("--user root:secret auth disable");
      (void)Etcdctl("user delete root");
    }
  } restore;

  EtcdOptions options = Options();
  options.user = "root";
  options.password = "secret";
  std::unique_ptr<EtcdClient> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  const std::string key = Prefix() + "k";
  absl::StatusOr<int64_t> put = client->Put(key, "1");
  ASSERT_TRUE(put.ok()) << put.status();

  EventLog log;
  std::unique_ptr<EtcdWatch> watch = client->Watch(key, "", *put, log.OnEvents(), log.OnEnd());
  ASSERT_TRUE(log.WaitForEvents(1, absl::Seconds(5)));

  ASSERT_TRUE(Etcdctl("--user root:secret auth disable").ok());
  ASSERT_TRUE(Etcdctl("auth enable").ok());
  put = client->Put(key, "2");
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<GetResult> got = client->Get(key);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->kv.has_value());
  EXPECT_EQ(got->kv->value(), "2");
  ASSERT_TRUE(log.WaitForEvents(2, absl::Seconds(5)));

  // Its answer to a client without credentials still says it is etcd.
  EXPECT_EQ(ProbeEndpoint(Options().endpoints[0], absl::Seconds(5)), EndpointServes::kEtcd);

  options.password = "wrong";
  std::unique_ptr<EtcdClient> wrong = NewClient(options);
  ASSERT_NE(wrong, nullptr);
  absl::Status refused = wrong->Put(key, "3").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("authentication failed"));
}

// Needs no cluster.
TEST(EtcdClientWithoutClusterTest, AnUnreachableClusterIsUnavailableWithinTheCallTimeout) {
  EtcdOptions options;
  options.endpoints = {"127.0.0.1:1"};  // nothing listens on port 1
  options.call_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status status = (*client)->Put("k", "v").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("127.0.0.1:1"));
}

TEST_F(EtcdClientTest, ProbeSaysAnEtcdMemberAnswers) {
  EXPECT_EQ(ProbeEndpoint(Options().endpoints[0], absl::Seconds(5)), EndpointServes::kEtcd);
}

// Needs no cluster: muster's own rendezvous stands for any gRPC server
// without etcd's services.
TEST(EtcdClientWithoutClusterTest, ProbeTellsAServerWithoutEtcdFromNothingYet) {
  EXPECT_EQ(ProbeEndpoint("127.0.0.1:1", absl::Seconds(2)), EndpointServes::kNothingYet);
  int port = 0;
  grpc::CallbackGenericService unimplemented;  // its every method answers UNIMPLEMENTED
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&unimplemented);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(ProbeEndpoint(absl::StrCat("127.0.0.1:", port), absl::Seconds(5)),
            EndpointServes::kOther);
  server->Shutdown();
}

// A cluster that serves its clients over mutual TLS, with certificates
// openssl makes at test time (skipped without openssl).
class EtcdClientTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::access(rdzv::kOpenssl, X_OK) != 0) {
      skip_ = absl::StrCat(rdzv::kOpenssl, " is not installed");
      return;
    }
    certificates_dir_ = std::make_unique<support::TempDir>("muster-etcd-tls");
    certificates_ = certificates_dir_->path();
    if (!rdzv::MakeCertificates(certificates_)) {
      skip_ = "openssl could not make the test certificates";
      return;
    }
    cluster_.Start(certificates_);
  }
  static void TearDownTestSuite() {
    EXPECT_TRUE(cluster_.Stop(SuiteFailed()).ok());
    certificates_dir_.reset();
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    if (!cluster_.skip().empty()) GTEST_SKIP() << cluster_.skip();
    ASSERT_TRUE(cluster_.status().ok()) << cluster_.status();
  }

  static EtcdOptions Options(const std::string& cacert, bool client_certificate) {
    EtcdOptions options;
    options.endpoints = cluster_.endpoints();
    options.tls.cacert = certificates_ + "/" + cacert;
    if (client_certificate) {
      options.tls.cert = certificates_ + "/client.pem";
      options.tls.key = certificates_ + "/client.key";
    }
    return options;
  }

  static inline std::string skip_;
  static inline std::unique_ptr<support::TempDir> certificates_dir_;
  static inline std::string certificates_;
  static inline TestCluster cluster_;
};

TEST_F(EtcdClientTlsTest, CallsAndWatchesGoOverMutualTls) {
  std::unique_ptr<EtcdClient> client = NewClient(Options("ca.pem", true));
  ASSERT_NE(client, nullptr);
  const std::string key = Prefix() + "k";
  absl::StatusOr<int64_t> put = client->Put(key, "1");
  ASSERT_TRUE(put.ok()) << put.status();
  EventLog log;
  std::unique_ptr<EtcdWatch> watch = client->Watch(key, "", *put, log.OnEvents(), log.OnEnd());
  ASSERT_TRUE(client->Put(key, "2").ok());
  ASSERT_TRUE(log.WaitForEvents(2, absl::Seconds(5)));
  EXPECT_EQ(log.events()[1].kv().value(), "2");
}

TEST_F(EtcdClientTlsTest, CallsFailWithoutTheRightCertificates) {
  // No client certificate: the members refuse the handshake.
  EtcdOptions options = Options("ca.pem", false);
  options.call_timeout = absl::Seconds(1);
  std::unique_ptr<EtcdClient> client = NewClient(options);
  ASSERT_NE(client, nullptr);
  absl::Status status = client->Put("k", "v").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("whether the members want a client certificate"));
  // The members' certificate is not from the authority we trust.
  options = Options("other-ca.pem", true);
  options.call_timeout = absl::Seconds(1);
  client = NewClient(options);
  ASSERT_NE(client, nullptr);
  status = client->Put("k", "v").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("other-ca.pem signed the members' certificates"));
}

}  // namespace
}  // namespace muster::etcd
