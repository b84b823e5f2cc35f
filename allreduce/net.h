// Blocking TCP with deadlines, for the bootstrap and the TCP backend: every
// wait is a poll() bounded by a deadline, so a peer that died or never came
// ends in an error, not a hang.
#ifndef MUSTER_ALLREDUCE_NET_H_
#define MUSTER_ALLREDUCE_NET_H_

#include <cstddef>
#include <string>

#include <google/protobuf/message_lite.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_handle.h"

namespace muster::allreduce {

struct Listener {
  UniqueFd fd;
  int port = 0;
};

// Listens on every address at `port` (0: any free port).
absl::StatusOr<Listener> Listen(int port);
// One connection from `listener`, or kDeadlineExceeded.
absl::StatusOr<UniqueFd> Accept(int listener, absl::Time deadline);
// Connects to host:port, retrying while nobody listens yet, until `deadline`.
absl::StatusOr<UniqueFd> Connect(const std::string& host, int port, absl::Time deadline);

// Large buffers and no Nagle: for the ring's bulk transfers.
void TuneForBulk(int fd);
// The address the peer of a connected socket has ("10.0.0.2").
std::string PeerAddress(int fd);

absl::Status SendAll(int fd, const void* data, size_t size, absl::Time deadline);
absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline);

// A message with a 4-byte length before it.
absl::Status SendMessage(int fd, const google::protobuf::MessageLite& message, absl::Time deadline);
absl::Status RecvMessage(int fd, google::protobuf::MessageLite* message, absl::Time deadline);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_NET_H_
