#include "agent/peer_endpoint.h"

#include <poll.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace muster {
namespace {

constexpr char kKey[] = "0123456789abcdef0123456789abcdef";

PeerAnswer Says(int64_t round, bool reaches_rendezvous = false) {
  PeerAnswer answer;
  answer.answered = true;
  answer.round = round;
  answer.reaches_rendezvous = reaches_rendezvous;
  return answer;
}

rdzv::PeerMessage Question(int64_t round) {
  rdzv::PeerMessage message;
  message.mutable_question()->set_job_id("job");
  message.mutable_question()->set_round(round);
  message.mutable_question()->set_node_id("a");
  message.mutable_question()->set_nonce("n");
  return message;
}

std::function<const std::string*(int64_t)> KeyOf(int64_t round, const std::string* key) {
  return [round, key](int64_t asked) { return asked == round ? key : nullptr; };
}

TEST(PeerDatagramTest, OpensOnlyWhatTheRoundsKeySigned) {
  const std::string key = kKey, other = "another key of the same length!!";
  const std::string datagram = SignPeerMessage(Question(3), key);
  std::optional<rdzv::PeerMessage> opened = OpenPeerDatagram(datagram, KeyOf(3, &key));
  ASSERT_TRUE(opened.has_value());
  EXPECT_EQ(opened->question().nonce(), "n");
  EXPECT_FALSE(OpenPeerDatagram(datagram, KeyOf(3, &other)));  // another round's key
  EXPECT_FALSE(OpenPeerDatagram(datagram, KeyOf(4, &key)));    // a round not known
  const std::string empty;
  EXPECT_FALSE(OpenPeerDatagram(datagram, KeyOf(3, &empty)));  // no key: nothing opens

  // The same body under a MAC of another body; the round changed under its MAC.
  rdzv::PeerDatagram forged;
  ASSERT_TRUE(forged.ParseFromString(datagram));
  rdzv::PeerDatagram other_body;
  ASSERT_TRUE(other_body.ParseFromString(SignPeerMessage(Question(4), key)));
  forged.set_mac(other_body.mac());
  EXPECT_FALSE(OpenPeerDatagram(forged.SerializeAsString(), KeyOf(3, &key)));
  EXPECT_FALSE(OpenPeerDatagram("not a datagram at all", KeyOf(3, &key)));
  EXPECT_FALSE(OpenPeerDatagram("", KeyOf(3, &key)));
  rdzv::PeerDatagram unsigned_body;
  unsigned_body.set_body(Question(3).SerializeAsString());
  EXPECT_FALSE(OpenPeerDatagram(unsigned_body.SerializeAsString(), KeyOf(3, &key)));
  EXPECT_FALSE(OpenPeerDatagram(std::string(kMaxPeerDatagram + 1, '\0'), KeyOf(3, &key)));
}

class PeerEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* id : {"a", "b"}) {
      absl::StatusOr<std::unique_ptr<PeerEndpoint>> made = PeerEndpoint::Create("job", id);
      ASSERT_TRUE(made.ok()) << made.status();
      nodes_.push_back(*std::move(made));
    }
  }

  // Node `who`'s assignment in `round`: the other node is its peer.
  rdzv::Assignment AssignmentOf(int who, int64_t round, const std::string& key) {
    rdzv::Assignment assignment;
    assignment.set_round(round);
    assignment.set_peer_key(key);
    rdzv::Peer* peer = assignment.add_peers();
    peer->set_node_id(who == 0 ? "b" : "a");
    peer->set_host(who == 0 ? "host-b" : "host-a");
    peer->set_addr("127.0.0.1");
    peer->set_port(nodes_[1 - who]->port());
    return assignment;
  }

  // Serves both nodes until a's answers are in or its question's deadline passes.
  std::optional<PeerEndpoint::Answers> Exchange(const PeerAnswer& b_says) {
    for (int i = 0; i < 200; ++i) {
      const absl::Time now = absl::Now();
      if (std::optional<PeerEndpoint::Answers> got = nodes_[0]->TakeAnswers(now)) return got;
      pollfd fds[2] = {{nodes_[0]->fd(), POLLIN, 0}, {nodes_[1]->fd(), POLLIN, 0}};
      poll(fds, 2, 20);
      nodes_[1]->Read([&] { return b_says; });
      nodes_[0]->Read([] { return PeerAnswer{}; });
    }
    return std::nullopt;
  }

  std::vector<std::unique_ptr<PeerEndpoint>> nodes_;
};

TEST_F(PeerEndpointTest, APeerOfTheRoundAnswersWhatItKnows) {
  nodes_[0]->Remember(AssignmentOf(0, 3, kKey));
  nodes_[1]->Remember(AssignmentOf(1, 3, kKey));
  nodes_[0]->Ask(3, absl::Now() + absl::Seconds(10));
  std::optional<PeerEndpoint::Answers> got = Exchange(Says(5, true));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->round, 3);
  ASSERT_EQ(got->answers.size(), 1u);
  EXPECT_EQ(got->answers[0].node, "host-b");
  EXPECT_TRUE(got->answers[0].answered);
  EXPECT_EQ(got->answers[0].round, 5);
  EXPECT_TRUE(got->answers[0].reaches_rendezvous);
  EXPECT_EQ(nodes_[0]->dropped(), 0);
  EXPECT_EQ(nodes_[1]->dropped(), 0);
}

TEST_F(PeerEndpointTest, APeerWithAnotherKeyDropsTheQuestionAndCountsAsSilent) {
  nodes_[0]->Remember(AssignmentOf(0, 3, kKey));
  nodes_[1]->Remember(AssignmentOf(1, 3, "a key that is not the round's one"));
  nodes_[0]->Ask(3, absl::Now() + absl::Milliseconds(300));
  std::optional<PeerEndpoint::Answers> got = Exchange(Says(3));
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->answers.size(), 1u);
  EXPECT_FALSE(got->answers[0].answered);
  EXPECT_EQ(nodes_[1]->dropped(), 1);
}

TEST_F(PeerEndpointTest, AQuestionOfARoundThePeerWasNotInIsDropped) {
  nodes_[0]->Remember(AssignmentOf(0, 3, kKey));
  nodes_[1]->Remember(AssignmentOf(1, 2, kKey));
  nodes_[0]->Ask(3, absl::Now() + absl::Milliseconds(300));
  std::optional<PeerEndpoint::Answers> got = Exchange(Says(3));
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(got->answers[0].answered);
  EXPECT_EQ(nodes_[1]->dropped(), 1);
}

TEST_F(PeerEndpointTest, AReplyToNoQuestionOfOursIsDropped) {
  nodes_[0]->Remember(AssignmentOf(0, 3, kKey));
  rdzv::PeerMessage reply;
  reply.mutable_reply()->set_job_id("job");
  reply.mutable_reply()->set_round(3);
  reply.mutable_reply()->set_nonce("guessed");
  reply.mutable_reply()->set_newest_round(9);
  nodes_[0]->Ask(3, absl::Now() + absl::Milliseconds(300));
  // Signed with the round's key even, but its nonce is none a question sent.
  const std::string datagram = SignPeerMessage(reply, kKey);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(nodes_[0]->port()));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(sendto(nodes_[1]->fd(), datagram.data(), datagram.size(), 0,
                   reinterpret_cast<sockaddr*>(&to), sizeof to),
            static_cast<ssize_t>(datagram.size()));
  std::optional<PeerEndpoint::Answers> got = Exchange(PeerAnswer{});
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(got->answers[0].answered);
  EXPECT_EQ(nodes_[0]->dropped(), 1);
}

TEST_F(PeerEndpointTest, ARoundNotRememberedHasNoPeersToAsk) {
  // Nothing to wait for: its (no) answers are due at once.
  nodes_[0]->Ask(7, absl::Now() + absl::Seconds(60));
  std::optional<PeerEndpoint::Answers> got = nodes_[0]->TakeAnswers(absl::Now());
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->round, 7);
  EXPECT_TRUE(got->answers.empty());
  EXPECT_FALSE(nodes_[0]->TakeAnswers(absl::Now() + absl::Seconds(2)));  // taken once
}

TEST_F(PeerEndpointTest, OnlyTheLastRoundsAreKept) {
  for (int64_t round = 1; round <= 1 + static_cast<int64_t>(PeerEndpoint::kKeptRounds); ++round) {
    nodes_[1]->Remember(AssignmentOf(1, round, kKey));
  }
  // Round 1 is forgotten: its question is dropped; the newest is answered.
  nodes_[0]->Remember(AssignmentOf(0, 1, kKey));
  nodes_[0]->Ask(1, absl::Now() + absl::Milliseconds(300));
  EXPECT_FALSE(Exchange(Says(1))->answers[0].answered);
  nodes_[0]->Remember(AssignmentOf(0, 5, kKey));
  nodes_[0]->Ask(5, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(Exchange(Says(1))->answers[0].answered);
}

}  // namespace
}  // namespace muster
