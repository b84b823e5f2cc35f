// The layout of a job's keys in etcd: one path segment per id, so no job's
// or node's keys are a prefix of another's, and every key maps back.
#include "rendezvous/etcd/keys.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::etcd {
namespace {

using ::testing::StartsWith;

TEST(EtcdKeysTest, AJobsKeysLiveUnderItsOwnPrefix) {
  const JobKeys keys("train-7b");
  EXPECT_EQ(keys.prefix(), "/muster/v1/jobs/train-7b/");
  EXPECT_EQ(keys.leader(), "/muster/v1/jobs/train-7b/leader");
  EXPECT_EQ(keys.state(), "/muster/v1/jobs/train-7b/state");
  EXPECT_EQ(keys.status(), "/muster/v1/jobs/train-7b/status");
  EXPECT_EQ(keys.closed(), "/muster/v1/jobs/train-7b/closed");
  EXPECT_EQ(keys.node("host-a:123:x"), "/muster/v1/jobs/train-7b/nodes/host-a%3A123%3Ax");
  EXPECT_EQ(keys.inbox("n"), "/muster/v1/jobs/train-7b/inbox/n");
  EXPECT_EQ(keys.outbox("n"), "/muster/v1/jobs/train-7b/outbox/n");
  for (const std::string& key : {keys.leader(), keys.node("n"), keys.outbox("n")}) {
    EXPECT_THAT(key, StartsWith(keys.prefix()));
  }
}

TEST(EtcdKeysTest, NoJobsPrefixIsAnothersPrefix) {
  // Without escaping, job "a" would see the keys of job "a/nodes/x".
  const JobKeys a("a"), nested("a/nodes/x"), longer("ab");
  EXPECT_EQ(nested.prefix(), "/muster/v1/jobs/a%2Fnodes%2Fx/");
  EXPECT_THAT(nested.leader(), ::testing::Not(StartsWith(a.prefix())));
  EXPECT_THAT(longer.leader(), ::testing::Not(StartsWith(a.prefix())));
}

TEST(EtcdKeysTest, EveryByteGoesThereAndBack) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  const std::string escaped = EscapeKeySegment(all);
  EXPECT_EQ(escaped.find('/'), std::string::npos);
  EXPECT_EQ(UnescapeKeySegment(escaped), all);
  EXPECT_EQ(EscapeKeySegment("Az09._~-"), "Az09._~-");
  EXPECT_EQ(EscapeKeySegment("a b%"), "a%20b%25");
}

TEST(EtcdKeysTest, TextEscapingCouldNotHaveMadeIsRefused) {
  for (const char* bad : {"%", "%4", "%zz", "%2f", "a/b", "%41" /* 'A' is never escaped */}) {
    EXPECT_EQ(UnescapeKeySegment(bad), std::nullopt) << bad;
  }
}

TEST(EtcdKeysTest, TheNodeOfAKeyIsReadBack) {
  const JobKeys keys("j");
  EXPECT_EQ(JobKeys::NodeOf(keys.node("h:1:x y"), keys.nodes()), "h:1:x y");
  EXPECT_EQ(JobKeys::NodeOf(keys.outbox("n"), keys.nodes()), std::nullopt);
  EXPECT_EQ(JobKeys::NodeOf(keys.nodes(), keys.nodes()), std::nullopt) << "no node id";
  EXPECT_EQ(JobKeys::NodeOf(keys.leader(), keys.nodes()), std::nullopt);
}

}  // namespace
}  // namespace muster::etcd
