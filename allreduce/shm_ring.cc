#include "allreduce/shm_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "allreduce/data.h"
#include "allreduce/ring.h"
#include "common/status.h"

namespace muster::allreduce {
namespace {

constexpr int kMaxRanks = 256;
constexpr size_t kHeaderBytes = 4096 + kMaxRanks * 64;

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const int64_t ns = std::max<int64_t>(absl::ToInt64Nanoseconds(timeout), 0);
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

// At the start of the segment; the buffers follow it.
struct SharedMemoryAllReduce::Header {
  std::atomic<uint32_t> arrived;     // at the current barrier
  std::atomic<uint32_t> generation;  // barriers completed; futex word
  // Barriers each rank has reached, to name the missing ones on a timeout.
  struct alignas(64) Seen {
    std::atomic<uint64_t> count;
  } seen[kMaxRanks];
};
static_assert(sizeof(SharedMemoryAllReduce::Header) <= kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
              std::atomic<uint64_t>::is_always_lock_free);

namespace {

absl::StatusOr<std::pair<void*, size_t>> Map(int fd, size_t length) {
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return ErrnoToStatus(errno, "mmap of the shared segment");
  return std::make_pair(base, length);
}

size_t SegmentBytes(int ranks, int64_t max_bytes) {
  return kHeaderBytes + static_cast<size_t>(ranks + 1) * static_cast<size_t>(max_bytes);
}

}  // namespace

SharedMemoryAllReduce::SharedMemoryAllReduce(std::string name, int rank, int ranks,
                                             int64_t max_bytes, void* base, size_t length)
    : name_(std::move(name)), rank_(rank), ranks_(ranks), max_bytes_(max_bytes), base_(base),
      length_(length) {}

SharedMemoryAllReduce::SharedMemoryAllReduce(SharedMemoryAllReduce&& other) noexcept
    : rank_name(std::move(other.rank_name)), name_(std::move(other.name_)), rank_(other.rank_),
      ranks_(other.ranks_), max_bytes_(other.max_bytes_),
      base_(std::exchange(other.base_, nullptr)), length_(other.length_),
      barriers_(other.barriers_), linked_(std::exchange(other.linked_, false)) {}

SharedMemoryAllReduce::~SharedMemoryAllReduce() {
  if (linked_) shm_unlink(name_.c_str());
  if (base_ != nullptr) munmap(base_, length_);
}

absl::StatusOr<SharedMemoryAllReduce> SharedMemoryAllReduce::Create(const std::string& name,
                                                                    int ranks, int64_t max_bytes) {
  if (ranks > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory takes at most ", kMaxRanks, " ranks; use --backend tcp"));
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("shm_open ", name));
  const size_t length = SegmentBytes(ranks, max_bytes);
  // ftruncate leaves the pages unallocated; a segment larger than /dev/shm
  // can hold fails here rather than with SIGBUS later.
  const int error = ftruncate(fd, static_cast<off_t>(length)) != 0
                        ? errno
                        : posix_fallocate(fd, 0, static_cast<off_t>(length));
  if (error != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoToStatus(error,
                         absl::StrCat("sizing the shared segment to ", length,
                                      " bytes (is /dev/shm large enough? else use --backend tcp)"));
  }
  absl::StatusOr<std::pair<void*, size_t>> mapped = Map(fd, length);
  close(fd);
  if (!mapped.ok()) {
    shm_unlink(name.c_str());
    return mapped.status();
  }
  new (mapped->first) Header();
  SharedMemoryAllReduce shm(name, 0, ranks, max_bytes, mapped->first, length);
  shm.linked_ = true;
  return shm;
}

absl::StatusOr<SharedMemoryAllReduce> SharedMemoryAllReduce::Open(const std::string& name, int rank,
                                                                  int ranks, int64_t max_bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return ErrnoToStatus(
        errno, absl::StrCat("shm_open ", name, " (rank 0's segment; is rank 0 on this machine?)"));
  }
  // Rank 0 sized it from its own options (the bootstrap checked they match).
  struct stat info {};
  if (fstat(fd, &info) != 0 ||
      static_cast<size_t>(info.st_size) != SegmentBytes(ranks, max_bytes)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("rank 0's segment ", name, " is not sized for this rank's options"));
  }
  absl::StatusOr<std::pair<void*, size_t>> mapped = Map(fd, SegmentBytes(ranks, max_bytes));
  close(fd);
  if (!mapped.ok()) return mapped.status();
  return SharedMemoryAllReduce(name, rank, ranks, max_bytes, mapped->first, mapped->second);
}

absl::Status SharedMemoryAllReduce::Attached(absl::Duration timeout) {
  MUSTER_RETURN_IF_ERROR(Barrier(timeout));
  if (linked_) shm_unlink(name_.c_str());  // every rank has it mapped
  linked_ = false;
  return absl::OkStatus();
}

char* SharedMemoryAllReduce::Slot(int rank) const {
  return static_cast<char*>(base_) + kHeaderBytes + static_cast<size_t>(rank) * max_bytes_;
}

char* SharedMemoryAllReduce::Output() const { return Slot(ranks_); }

absl::Status SharedMemoryAllReduce::Barrier(absl::Duration timeout) {
  Header* header = static_cast<Header*>(base_);
  const uint32_t generation = header->generation.load(std::memory_order_acquire);
  header->seen[rank_].count.store(++barriers_, std::memory_order_relaxed);
  if (header->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(ranks_)) {
    header->arrived.store(0, std::memory_order_relaxed);
    header->generation.fetch_add(1, std::memory_order_acq_rel);
    FutexWakeAll(&header->generation);
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (header->generation.load(std::memory_order_acquire) == generation) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      std::vector<std::string> missing;
      for (int r = 0; r < ranks_; ++r) {
        if (header->seen[r].count.load() < barriers_) missing.push_back(rank_name(r));
      }
      return absl::DeadlineExceededError(
          absl::StrCat(absl::StrJoin(missing, ", "), " did not reach the all-reduce within ",
                       absl::FormatDuration(timeout), "; it died or hung"));
    }
    FutexWait(&header->generation, generation, std::min(left, absl::Milliseconds(100)));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryAllReduce::AllReduce(void* data, int64_t count, DataType type,
                                              absl::Duration timeout) {
  const int64_t size = DataTypeSize(type);
  const size_t bytes = static_cast<size_t>(count * size);
  if (ranks_ == 1) return absl::OkStatus();
  std::memcpy(Slot(rank_), data, bytes);
  MUSTER_RETURN_IF_ERROR(Barrier(timeout));
  // This rank's chunk of the sum, from every rank's slot.
  const Span mine = RingChunk(count, ranks_, rank_);
  const size_t offset = static_cast<size_t>(mine.begin * size);
  std::memcpy(Output() + offset, Slot(0) + offset, static_cast<size_t>(mine.size() * size));
  for (int r = 1; r < ranks_; ++r) AddInto(Output() + offset, Slot(r) + offset, mine.size(), type);
  MUSTER_RETURN_IF_ERROR(Barrier(timeout));
  // No barrier after this copy: the next call writes the output only after
  // its first barrier, which every rank reaches once done copying, and the
  // slots were last read before the barrier above.
  std::memcpy(data, Output(), bytes);
  return absl::OkStatus();
}

}  // namespace muster::allreduce
