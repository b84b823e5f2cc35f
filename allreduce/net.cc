#include "allreduce/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/endpoint.h"
#include "common/status.h"
#include "common/unique_handle.h"

namespace muster::allreduce {
namespace {

constexpr uint32_t kMaxMessage = 64 << 20;

// Milliseconds until `deadline`, for poll(); 0 once it passed.
int MillisLeft(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

// Waits for `events` on fd; kDeadlineExceeded when the deadline passes.
absl::Status Wait(int fd, short events, absl::Time deadline, const char* what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, MillisLeft(deadline));
    if (n > 0) return absl::OkStatus();
    if (n == 0) return absl::DeadlineExceededError(absl::StrCat("timed out waiting to ", what));
    if (errno != EINTR) return ErrnoToStatus(errno, "poll");
  }
}

}  // namespace

absl::StatusOr<Listener> Listen(int port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  const int on = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bind to port ", port));
  }
  if (listen(fd.get(), 1024) != 0) return ErrnoToStatus(errno, "listen");
  socklen_t length = sizeof addr;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &length);
  return Listener{std::move(fd), ntohs(addr.sin_port)};
}

absl::StatusOr<UniqueFd> Accept(int listener, absl::Time deadline) {
  MUSTER_RETURN_IF_ERROR(Wait(listener, POLLIN, deadline, "accept a connection"));
  UniqueFd fd(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "accept");
  return fd;
}

absl::StatusOr<UniqueFd> Connect(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  const UniqueAddrInfo found(list);
  std::string last_error = "nothing tried";
  absl::Duration pause = absl::Milliseconds(20);
  while (true) {
    for (const addrinfo* a = found.get(); a != nullptr; a = a->ai_next) {
      // Non-blocking, so that a host that drops the SYN costs the deadline, not minutes.
      UniqueFd fd(
          socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd.valid()) continue;
      int error = connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (error == EINPROGRESS) {
        pollfd p{fd.get(), POLLOUT, 0};
        const int n = poll(&p, 1, std::min(MillisLeft(deadline), 5'000));
        socklen_t length = sizeof error;
        if (n <= 0) {
          error = ETIMEDOUT;
        } else if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
          error = errno;
        }
      }
      if (error == 0) {
        fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
        return fd;
      }
      last_error = std::strerror(error);
    }
    if (absl::Now() + pause > deadline) break;
    absl::SleepFor(pause);  // the listener may not be up yet
    pause = std::min(pause * 2, absl::Milliseconds(500));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cannot connect to ", FormatEndpoint(host, port), " (", last_error, ")"));
}

void TuneForBulk(int fd) {
  const int on = 1;
  const int buffer = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
}

std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return "";
  char text[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
  } else if (addr.ss_family == AF_INET6) {
    const in6_addr& a6 = reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      inet_ntop(AF_INET, &a6.s6_addr[12], text, sizeof text);
    } else {
      inet_ntop(AF_INET6, &a6, text, sizeof text);
    }
  }
  return text;
}

absl::Status SendAll(int fd, const void* data, size_t size, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    MUSTER_RETURN_IF_ERROR(Wait(fd, POLLOUT, deadline, "send"));
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoToStatus(errno, "send");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t size, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    MUSTER_RETURN_IF_ERROR(Wait(fd, POLLIN, deadline, "receive"));
    const ssize_t n = recv(fd, p, size, MSG_DONTWAIT);
    if (n == 0) return absl::UnavailableError("the peer closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoToStatus(errno, "recv");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SendMessage(int fd, const google::protobuf::MessageLite& message,
                         absl::Time deadline) {
  const std::string body = message.SerializeAsString();
  const uint32_t length = htonl(static_cast<uint32_t>(body.size()));
  std::string frame(reinterpret_cast<const char*>(&length), sizeof length);
  frame += body;
  return SendAll(fd, frame.data(), frame.size(), deadline);
}

absl::Status RecvMessage(int fd, google::protobuf::MessageLite* message, absl::Time deadline) {
  uint32_t length = 0;
  MUSTER_RETURN_IF_ERROR(RecvAll(fd, &length, sizeof length, deadline));
  length = ntohl(length);
  if (length > kMaxMessage) {
    return absl::DataLossError(
        absl::StrCat("a message of ", length, " bytes: not muster-allreduce"));
  }
  std::string body(length, '\0');
  MUSTER_RETURN_IF_ERROR(RecvAll(fd, body.data(), body.size(), deadline));
  if (!message->ParseFromString(body)) return absl::DataLossError("a message that does not parse");
  return absl::OkStatus();
}

}  // namespace muster::allreduce
