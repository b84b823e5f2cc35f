// The shared-memory backend, for ranks that all run on one machine: every
// rank writes its buffer into a shared segment, sums its own chunk of every
// rank's buffer (a reduce-scatter), and copies the whole result back (an
// all-gather). About three passes over the buffer per rank, where the TCP
// ring copies every byte through the kernel twice per step. Ranks meet at
// barriers in the segment that time out, naming the ranks that never came.
#ifndef MUSTER_ALLREDUCE_SHM_RING_H_
#define MUSTER_ALLREDUCE_SHM_RING_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allreduce/sweep.h"

namespace muster::allreduce {

class SharedMemoryAllReduce {
 public:
  // Rank 0 creates the segment `name` (for `ranks` buffers of `max_bytes`);
  // the others open it after it exists. Every rank calls Attached() once all
  // have opened it, and rank 0 then unlinks the name (or at its end, when
  // the others never attached). Only rank 0 killed in between leaves the
  // segment in /dev/shm.
  static absl::StatusOr<SharedMemoryAllReduce> Create(const std::string& name, int ranks,
                                                      int64_t max_bytes);
  static absl::StatusOr<SharedMemoryAllReduce> Open(const std::string& name, int rank, int ranks,
                                                    int64_t max_bytes);
  absl::Status Attached(absl::Duration timeout);

  SharedMemoryAllReduce(SharedMemoryAllReduce&& other) noexcept;
  SharedMemoryAllReduce& operator=(SharedMemoryAllReduce&&) = delete;
  ~SharedMemoryAllReduce();

  // Sums `count` elements of `type` at `data` over every rank, in place.
  absl::Status AllReduce(void* data, int64_t count, DataType type, absl::Duration timeout);

  // For messages: what each rank is called ("rank 2 (host-a)").
  std::function<std::string(int)> rank_name = [](int r) { return "rank " + std::to_string(r); };

 private:
 public:
  struct Header;  // in the segment; public for the size checks in shm_ring.cc

 private:
  SharedMemoryAllReduce(std::string name, int rank, int ranks, int64_t max_bytes, void* base,
                        size_t length);
  absl::Status Barrier(absl::Duration timeout);
  char* Slot(int rank) const;
  char* Output() const;

  std::string name_;
  int rank_ = 0;
  int ranks_ = 1;
  int64_t max_bytes_ = 0;
  void* base_ = nullptr;
  size_t length_ = 0;
  uint64_t barriers_ = 0;  // how many this rank has passed
  bool linked_ = false;    // rank 0: the name still exists
};

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_SHM_RING_H_
