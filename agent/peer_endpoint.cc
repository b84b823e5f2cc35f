#include "agent/peer_endpoint.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/constant_time.h"
#include "common/hmac.h"
#include "common/status.h"
#include "rendezvous/auth/node_secret.h"

namespace muster {
namespace {

// The round a message is signed for: its key is that round's.
int64_t RoundOf(const rdzv::PeerMessage& message) {
  return message.has_question() ? message.question().round() : message.reply().round();
}

absl::StatusOr<std::pair<UniqueFd, int>> BindAny(int family) {
  UniqueFd fd(socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return ErrnoToStatus(errno, "socket for the peers' questions");
  sockaddr_storage address{};
  socklen_t length = 0;
  if (family == AF_INET6) {
    const int off = 0;  // IPv4 too, as mapped addresses
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&address);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_any;
    length = sizeof(sockaddr_in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&address);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    length = sizeof(sockaddr_in);
  }
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
    return ErrnoToStatus(errno, "bind of the peers' UDP socket");
  }
  length = sizeof address;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return ErrnoToStatus(errno, "getsockname of the peers' UDP socket");
  }
  const int port = family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  return std::make_pair(std::move(fd), port);
}

}  // namespace

std::string SignPeerMessage(const rdzv::PeerMessage& message, absl::string_view key) {
  rdzv::PeerDatagram datagram;
  datagram.set_body(message.SerializeAsString());
  datagram.set_mac(HmacSha256(key, datagram.body()));
  return datagram.SerializeAsString();
}

std::optional<rdzv::PeerMessage> OpenPeerDatagram(
    absl::string_view datagram, const std::function<const std::string*(int64_t)>& key_of) {
  rdzv::PeerDatagram outer;
  rdzv::PeerMessage message;
  if (datagram.size() > kMaxPeerDatagram ||
      !outer.ParseFromArray(datagram.data(), static_cast<int>(datagram.size())) ||
      !message.ParseFromString(outer.body()) ||
      message.kind_case() == rdzv::PeerMessage::KIND_NOT_SET) {
    return std::nullopt;
  }
  const std::string* key = key_of(RoundOf(message));
  if (key == nullptr || key->empty() ||
      !ConstantTimeEquals(HmacSha256(*key, outer.body()), outer.mac())) {
    return std::nullopt;
  }
  return message;
}

absl::StatusOr<std::unique_ptr<PeerEndpoint>> PeerEndpoint::Create(std::string job_id,
                                                                   std::string node_id) {
  int family = AF_INET6;
  absl::StatusOr<std::pair<UniqueFd, int>> bound = BindAny(family);
  if (!bound.ok()) {
    family = AF_INET;  // a kernel without IPv6
    bound = BindAny(family);
  }
  if (!bound.ok()) return bound.status();
  return std::unique_ptr<PeerEndpoint>(new PeerEndpoint(
      std::move(bound->first), bound->second, family, std::move(job_id), std::move(node_id)));
}

void PeerEndpoint::Remember(const rdzv::Assignment& assignment) {
  if (assignment.peer_key().empty() || Find(assignment.round()) != nullptr) return;
  Round round;
  round.round = assignment.round();
  round.key = assignment.peer_key();
  for (const rdzv::Peer& peer : assignment.peers()) {
    Known known;
    known.peer = peer;
    const std::string& name = peer.addr().empty() ? peer.host() : peer.addr();
    if (peer.port() > 0) {
      addrinfo hints{};
      hints.ai_family = family_;
      hints.ai_socktype = SOCK_DGRAM;
      hints.ai_flags = AI_NUMERICSERV | (family_ == AF_INET6 ? AI_V4MAPPED : 0);
      addrinfo* found = nullptr;
      if (getaddrinfo(name.c_str(), absl::StrCat(peer.port()).c_str(), &hints, &found) == 0) {
        UniqueAddrInfo list(found);
        known.address.emplace();
        std::memcpy(&*known.address, list.get()->ai_addr, list.get()->ai_addrlen);
        known.address_length = list.get()->ai_addrlen;
      }
    }
    round.peers.push_back(std::move(known));
  }
  rounds_.push_back(std::move(round));
  while (rounds_.size() > kKeptRounds) rounds_.pop_front();
}

const PeerEndpoint::Round* PeerEndpoint::Find(int64_t round) const {
  for (const Round& r : rounds_) {
    if (r.round == round) return &r;
  }
  return nullptr;
}

void PeerEndpoint::Ask(int64_t round, absl::Time deadline) {
  Question question;
  question.round = round;
  question.deadline = deadline;
  const Round* known = Find(round);
  if (known == nullptr) {
    question_ = std::move(question);  // nobody to ask: due at the deadline, with no answers
    return;
  }
  for (const Known& peer : known->peers) {
    PeerAnswer unanswered;
    unanswered.node = peer.peer.host();
    question.answers.push_back(unanswered);
    question.nonces.push_back(rdzv::NewNodeSecret().value_or(""));
    if (!peer.address || question.nonces.back().empty()) continue;
    rdzv::PeerMessage message;
    rdzv::PeerQuestion* asked = message.mutable_question();
    asked->set_job_id(job_id_);
    asked->set_round(round);
    asked->set_node_id(node_id_);
    asked->set_nonce(question.nonces.back());
    Send(message, known->key, peer);
  }
  question_ = std::move(question);
}

void PeerEndpoint::Send(const rdzv::PeerMessage& message, const std::string& key, const Known& to) {
  const std::string datagram = SignPeerMessage(message, key);
  // Lost like any datagram when it cannot go: the peer counts as silent.
  sendto(fd_.get(), datagram.data(), datagram.size(), MSG_DONTWAIT,
         reinterpret_cast<const sockaddr*>(&*to.address), to.address_length);
}

void PeerEndpoint::Read(const std::function<PeerAnswer()>& answer) {
  char buffer[kMaxPeerDatagram + 1];
  // Bounded: one call reads what is queued now, not a flood that keeps coming.
  for (int i = 0; i < 256; ++i) {
    sockaddr_storage from{};
    socklen_t from_length = sizeof from;
    const ssize_t n = recvfrom(fd_.get(), buffer, sizeof buffer, MSG_DONTWAIT,
                               reinterpret_cast<sockaddr*>(&from), &from_length);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: all read; an ICMP error of an earlier send: nothing to do
    }
    Take(std::string(buffer, static_cast<size_t>(n)), from, from_length, answer);
  }
}

void PeerEndpoint::Take(const std::string& datagram, const sockaddr_storage& from,
                        socklen_t from_length, const std::function<PeerAnswer()>& answer) {
  const std::string* key = nullptr;  // of the round the datagram is signed for
  std::optional<rdzv::PeerMessage> message =
      OpenPeerDatagram(datagram, [this, &key](int64_t round) -> const std::string* {
        const Round* known = Find(round);
        key = known == nullptr ? nullptr : &known->key;
        return key;
      });
  if (message && message->has_question() && message->question().job_id() == job_id_) {
    const rdzv::PeerQuestion& asked = message->question();
    const PeerAnswer mine = answer();
    rdzv::PeerMessage reply_message;
    rdzv::PeerReply* reply = reply_message.mutable_reply();
    reply->set_job_id(job_id_);
    reply->set_round(asked.round());
    reply->set_node_id(node_id_);
    reply->set_nonce(asked.nonce());
    reply->set_newest_round(mine.round);
    reply->set_reaches_rendezvous(mine.reaches_rendezvous);
    Known to;
    to.address = from;
    to.address_length = from_length;
    Send(reply_message, *key, to);
    return;
  }
  if (message && message->has_reply() && question_ && message->reply().job_id() == job_id_ &&
      message->reply().round() == question_->round) {
    const rdzv::PeerReply& reply = message->reply();
    for (size_t i = 0; i < question_->nonces.size(); ++i) {
      if (question_->nonces[i].empty() || question_->nonces[i] != reply.nonce()) continue;
      PeerAnswer& got = question_->answers[i];
      got.answered = true;
      got.round = reply.newest_round();
      got.reaches_rendezvous = reply.reaches_rendezvous();
      question_->nonces[i].clear();  // one answer per question
      return;
    }
  }
  ++dropped_;
}

std::optional<absl::Time> PeerEndpoint::NextDeadline(absl::Time now) const {
  if (!question_) return std::nullopt;
  for (const PeerAnswer& answer : question_->answers) {
    if (!answer.answered) return question_->deadline;
  }
  return now;
}

std::optional<PeerEndpoint::Answers> PeerEndpoint::TakeAnswers(absl::Time now) {
  std::optional<absl::Time> due = NextDeadline(now);
  if (!due || now < *due) return std::nullopt;
  Answers out{question_->round, std::move(question_->answers)};
  question_.reset();
  return out;
}

}  // namespace muster
