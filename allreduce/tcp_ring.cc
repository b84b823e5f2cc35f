#include "allreduce/tcp_ring.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "allreduce/data.h"
#include "allreduce/ring.h"
#include "common/status.h"

namespace muster::allreduce {
namespace {

// The most one send or recv call moves: small enough that the two
// directions and the additions interleave, large enough to be cheap.
constexpr int64_t kMaxIo = 512 << 10;

}  // namespace

TcpRing::TcpRing(int rank, int ranks, UniqueFd next, UniqueFd prev, absl::Duration timeout,
                 std::string next_name, std::string prev_name)
    : rank_(rank), ranks_(ranks), next_(std::move(next)), prev_(std::move(prev)), timeout_(timeout),
      next_name_(std::move(next_name)), prev_name_(std::move(prev_name)) {}

absl::Status TcpRing::AllReduce(void* data, int64_t count, DataType type) {
  if (ranks_ == 1) return absl::OkStatus();
  const int size = DataTypeSize(type);
  char* base = static_cast<char*>(data);
  staging_.resize(static_cast<size_t>(RingChunk(count, ranks_, 0).size() * size));
  for (int step = 0; step < ranks_ - 1; ++step) {
    const RingStep s = ReduceScatterStep(rank_, ranks_, step);
    const Span out = RingChunk(count, ranks_, s.send_chunk);
    const Span in = RingChunk(count, ranks_, s.recv_chunk);
    MUSTER_RETURN_IF_ERROR(Exchange(base + out.begin * size, out.size() * size, staging_.data(),
                                    in.size() * size, base + in.begin * size, type));
  }
  for (int step = 0; step < ranks_ - 1; ++step) {
    const RingStep s = AllGatherStep(rank_, ranks_, step);
    const Span out = RingChunk(count, ranks_, s.send_chunk);
    const Span in = RingChunk(count, ranks_, s.recv_chunk);
    MUSTER_RETURN_IF_ERROR(Exchange(base + out.begin * size, out.size() * size,
                                    base + in.begin * size, in.size() * size, nullptr, type));
  }
  return absl::OkStatus();
}

absl::Status TcpRing::Exchange(const char* send, int64_t send_bytes, char* recv, int64_t recv_bytes,
                               char* reduce_into, DataType type) {
  const int size = DataTypeSize(type);
  int64_t sent = 0, received = 0, reduced = 0;  // bytes
  absl::Time deadline = absl::Now() + timeout_;
  while (sent < send_bytes || received < recv_bytes) {
    pollfd fds[2] = {{next_.get(), static_cast<short>(sent < send_bytes ? POLLOUT : 0), 0},
                     {prev_.get(), static_cast<short>(received < recv_bytes ? POLLIN : 0), 0}};
    const int64_t wait_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(wait_ms, 1 << 30)));
    if (n < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll");
    if (n == 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no progress for ", absl::FormatDuration(timeout_),
          received < recv_bytes
              ? absl::StrCat(": nothing from ", prev_name_, "; it may have died or hung")
              : absl::StrCat(": ", next_name_, " takes nothing; it may have died or hung")));
    }
    bool moved = false;
    if (sent < send_bytes && (fds[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t k = ::send(next_.get(), send + sent, std::min(kMaxIo, send_bytes - sent),
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0 && errno != EAGAIN && errno != EINTR) {
        return absl::UnavailableError(absl::StrCat("sending to ", next_name_, " failed (",
                                                   std::strerror(errno), "); it may have died"));
      }
      if (k > 0) {
        sent += k;
        moved = true;
      }
    }
    if (received < recv_bytes && (fds[1].revents & (POLLIN | POLLERR | POLLHUP))) {
      const ssize_t k = ::recv(prev_.get(), recv + received,
                               std::min(kMaxIo, recv_bytes - received), MSG_DONTWAIT);
      if (k == 0) {
        return absl::UnavailableError(
            absl::StrCat(prev_name_, " closed its connection mid-transfer; it died or failed"));
      }
      if (k < 0 && errno != EAGAIN && errno != EINTR) {
        return absl::UnavailableError(
            absl::StrCat("receiving from ", prev_name_, " failed (", std::strerror(errno), ")"));
      }
      if (k > 0) {
        received += k;
        moved = true;
        if (reduce_into != nullptr) {
          const int64_t complete = received / size * size;
          AddInto(reduce_into + reduced, recv + reduced, (complete - reduced) / size, type);
          reduced = complete;
        }
      }
    }
    if (moved) deadline = absl::Now() + timeout_;
  }
  return absl::OkStatus();
}

}  // namespace muster::allreduce
