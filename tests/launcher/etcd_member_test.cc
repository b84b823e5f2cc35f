// A member of host mode's own etcd cluster (ha=1), for real: Debian's etcd
// on loopback, started, serving, unseen by a reaper of every child, and
// gone with its data when dropped. Skipped where etcd is not installed.
#include "launcher/etcd_member.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rendezvous/etcd/client.h"
#include "tests/support/temp_dir.h"

namespace muster {
namespace {

constexpr char kEtcd[] = "/usr/bin/etcd";

class EtcdMemberTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kEtcd, X_OK) != 0) GTEST_SKIP() << "needs etcd (scripts/setup installs etcd-server)";
  }

  EtcdMemberOptions Options(const std::string& name) {
    EtcdMemberOptions options;
    options.etcd = kEtcd;
    options.name = name;
    options.directory = dir_.path() + "/" + name;
    options.host = "127.0.0.1";
    options.cluster_token = "etcd-member-test";
    return options;
  }

  support::TempDir dir_;
};

TEST_F(EtcdMemberTest, AFirstMemberServesAndIsGoneWithItsDataWhenDropped) {
  absl::StatusOr<std::unique_ptr<EtcdMember>> member = EtcdMember::Create(Options("m0"));
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE((*member)->Start("", absl::Seconds(20)).ok()) << (*member)->LogTail();
  EXPECT_TRUE((*member)->running());
  struct stat info = {};
  ASSERT_EQ(stat((dir_.path() + "/m0").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);

  etcd::EtcdOptions options;
  options.endpoints = {(*member)->endpoint()};
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Put("/k", "v").ok());
  absl::StatusOr<std::vector<etcdserverpb::Member>> members = (*client)->MemberList();
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].name(), "m0");
  EXPECT_EQ((*members)[0].peerurls(0), (*member)->peer_url());

  member->reset();
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/m0"));
  EXPECT_FALSE((*client)->Put("/k", "again").ok());
}

// The agent reaps every child that exits; a member it reaped is still seen
// to have exited, and stopping it then signals nobody.
TEST_F(EtcdMemberTest, AMemberTheAgentsReaperTookIsSeenGone) {
  absl::StatusOr<std::unique_ptr<EtcdMember>> member = EtcdMember::Create(Options("m0"));
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE((*member)->Start("", absl::Seconds(20)).ok()) << (*member)->LogTail();
  (*member)->Signal(SIGKILL);
  // As the agent's loop does: any child, reaped.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*member)->running() && absl::Now() < deadline) {
    siginfo_t info = {};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG) != 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Time start = absl::Now();
  while ((*member)->running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE((*member)->running());
  member->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));  // not the 5 s stop grace
}

TEST_F(EtcdMemberTest, ALearnerAddedJoinsTheClusterAndIsPromoted) {
  absl::StatusOr<std::unique_ptr<EtcdMember>> first = EtcdMember::Create(Options("m0"));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->Start("", absl::Seconds(20)).ok()) << (*first)->LogTail();
  absl::StatusOr<std::unique_ptr<EtcdMember>> second = EtcdMember::Create(Options("m1"));
  ASSERT_TRUE(second.ok()) << second.status();

  etcd::EtcdOptions options;
  options.endpoints = {(*first)->endpoint()};
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<etcdserverpb::Member> added = (*client)->MemberAdd((*second)->peer_url(), true);
  ASSERT_TRUE(added.ok()) << added.status();
  const std::string cluster =
      absl::StrCat("m0=", (*first)->peer_url(), ",m1=", (*second)->peer_url());
  ASSERT_TRUE((*second)->Start(cluster, absl::Seconds(30)).ok()) << (*second)->LogTail();
  bool promoted = false;
  for (int i = 0; i < 100 && !promoted; ++i) {
    promoted = (*client)->MemberPromote(added->id()).ok();
    if (!promoted) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(promoted) << (*second)->LogTail();
}

TEST_F(EtcdMemberTest, AMemberThatCannotStartSaysWhy) {
  EtcdMemberOptions options = Options("m0");
  options.etcd = "/bin/false";
  absl::StatusOr<std::unique_ptr<EtcdMember>> member = EtcdMember::Create(options);
  ASSERT_TRUE(member.ok()) << member.status();
  absl::Status started = (*member)->Start("", absl::Seconds(5));
  EXPECT_FALSE(started.ok());
  EXPECT_THAT(std::string(started.message()), ::testing::HasSubstr("exited as it started"));
}

}  // namespace
}  // namespace muster
