// Where the nodes of a round ask each other, while the rendezvous does not
// answer them, whether they are still in the round and whether they reach
// it (ElasticOptions::ask_peers, action::AskPeers): one UDP socket per
// agent, one datagram each way (proto/peer.proto), each signed with the
// round's key (Assignment.peer_key), which only the round's nodes hold.
// Anything else that arrives is dropped unanswered, and counted.
#ifndef MUSTER_AGENT_PEER_ENDPOINT_H_
#define MUSTER_AGENT_PEER_ENDPOINT_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/elastic_state.h"
#include "common/unique_handle.h"
#include "proto/peer.pb.h"
#include "proto/rendezvous.pb.h"

namespace muster {

// The largest datagram read; a longer one is dropped.
inline constexpr size_t kMaxPeerDatagram = 2048;

// `message` as a datagram signed with `key`.
std::string SignPeerMessage(const rdzv::PeerMessage& message, absl::string_view key);

// The message in `datagram`, if it parses and its MAC is right under the key
// `key_of` gives for the round it names (nullptr: no key for that round).
std::optional<rdzv::PeerMessage> OpenPeerDatagram(
    absl::string_view datagram, const std::function<const std::string*(int64_t)>& key_of);

class PeerEndpoint {
 public:
  // A UDP socket on every address of this node (IPv6 and IPv4 where it
  // can, else IPv4), on a port the kernel picks.
  static absl::StatusOr<std::unique_ptr<PeerEndpoint>> Create(std::string job_id,
                                                              std::string node_id);
  PeerEndpoint(const PeerEndpoint&) = delete;
  PeerEndpoint& operator=(const PeerEndpoint&) = delete;

  int fd() const { return fd_.get(); }
  int port() const { return port_; }

  // A round this node runs in: its key and the peers to ask, their addresses
  // looked up now, while the network works. The last kKeptRounds are kept,
  // since a peer asks about the round it is in, which may be an older one.
  void Remember(const rdzv::Assignment& assignment);

  // Asks each peer of `round` once; their answers are gathered until
  // `deadline` (a question still open is dropped). A round not remembered
  // (a rendezvous that gave no key): no peers, as for a node alone in it.
  void Ask(int64_t round, absl::Time deadline);

  // Reads every datagram waiting: a question of a remembered round gets
  // `answer`'s reply; a reply to the open question is kept.
  void Read(const std::function<PeerAnswer()>& answer);

  // When the open question's answers are due: now once every peer answered.
  std::optional<absl::Time> NextDeadline(absl::Time now) const;

  // The open question's answers, one per peer asked, once every peer
  // answered or `now` is past its deadline; the question is then closed.
  struct Answers {
    int64_t round = -1;
    std::vector<PeerAnswer> answers;
  };
  std::optional<Answers> TakeAnswers(absl::Time now);

  // Datagrams dropped: unreadable, unsigned, or for no question of ours.
  int64_t dropped() const { return dropped_; }

  static constexpr size_t kKeptRounds = 4;

 private:
  struct Known {
    rdzv::Peer peer;
    std::optional<sockaddr_storage> address;  // nullopt: no port, or its name did not resolve
    socklen_t address_length = 0;
  };
  struct Round {
    int64_t round = -1;
    std::string key;
    std::vector<Known> peers;
  };
  struct Question {
    int64_t round = -1;
    absl::Time deadline;
    std::vector<std::string> nonces;  // one per peer asked
    std::vector<PeerAnswer> answers;  // in the round's peer order
  };

  PeerEndpoint(UniqueFd fd, int port, int family, std::string job_id, std::string node_id)
      : fd_(std::move(fd)), port_(port), family_(family), job_id_(std::move(job_id)),
        node_id_(std::move(node_id)) {}
  const Round* Find(int64_t round) const;
  void Send(const rdzv::PeerMessage& message, const std::string& key, const Known& to);
  void Take(const std::string& datagram, const sockaddr_storage& from, socklen_t from_length,
            const std::function<PeerAnswer()>& answer);

  UniqueFd fd_;
  int port_ = 0;
  int family_ = AF_INET6;
  std::string job_id_;
  std::string node_id_;
  std::deque<Round> rounds_;  // newest last
  std::optional<Question> question_;
  int64_t dropped_ = 0;
};

}  // namespace muster

#endif  // MUSTER_AGENT_PEER_ENDPOINT_H_
