// The TCP backend: an all-reduce over a ring of TCP connections, each rank
// sending to the next and receiving from the previous. Reduce-scatter, then
// all-gather (ring.h); within a step, sending, receiving and adding run
// interleaved on non-blocking sockets, so the three overlap.
#ifndef MUSTER_ALLREDUCE_TCP_RING_H_
#define MUSTER_ALLREDUCE_TCP_RING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "allreduce/sweep.h"
#include "common/unique_handle.h"

namespace muster::allreduce {

class TcpRing {
 public:
  // `next` is connected to rank (rank + 1) mod ranks, `prev` to
  // (rank - 1) mod ranks; both unused with one rank. A step that moves no
  // byte for `timeout` fails, naming the silent neighbour.
  TcpRing(int rank, int ranks, UniqueFd next, UniqueFd prev, absl::Duration timeout,
          std::string next_name, std::string prev_name);

  // Sums `count` elements of `type` at `data` over every rank, in place.
  absl::Status AllReduce(void* data, int64_t count, DataType type);

 private:
  // Sends send_bytes from `send` to next while receiving recv_bytes from
  // prev into `recv` (added into `reduce_into` as elements complete, when
  // that is set).
  absl::Status Exchange(const char* send, int64_t send_bytes, char* recv, int64_t recv_bytes,
                        char* reduce_into, DataType type);

  const int rank_;
  const int ranks_;
  UniqueFd next_, prev_;
  const absl::Duration timeout_;
  const std::string next_name_, prev_name_;
  std::vector<char> staging_;
};

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_TCP_RING_H_
