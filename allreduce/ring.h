// The ring all-reduce's schedule, as pure arithmetic: which part of the
// buffer each rank sends and receives at each step. The buffer of `count`
// elements is cut into one chunk per rank; a reduce-scatter of n-1 steps
// leaves each rank with one chunk summed over every rank, and an all-gather
// of n-1 steps passes the summed chunks around. Each step sends to the next
// rank and receives from the previous one.
#ifndef MUSTER_ALLREDUCE_RING_H_
#define MUSTER_ALLREDUCE_RING_H_

#include <cstdint>
#include <vector>

namespace muster::allreduce {

// Elements [begin, end) of the buffer.
struct Span {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  friend bool operator==(const Span&, const Span&) = default;
};

// Chunk `index` of `ranks` near-equal chunks of `count` elements: they
// cover the buffer in order, and sizes differ by at most one (a chunk is
// empty when count < ranks).
Span RingChunk(int64_t count, int ranks, int index);

// The chunks rank `rank` sends and receives at `step` (0 .. ranks-2).
struct RingStep {
  int send_chunk = 0;
  int recv_chunk = 0;
  friend bool operator==(const RingStep&, const RingStep&) = default;
};
// Reduce-scatter: the received chunk is added into the rank's own; after
// the last step, rank r holds chunk (r + 1) mod n summed over every rank.
RingStep ReduceScatterStep(int rank, int ranks, int step);
// All-gather: the received chunk (complete) replaces the rank's own.
RingStep AllGatherStep(int rank, int ranks, int step);
// The chunk that rank `rank` holds complete after the reduce-scatter.
int ReducedChunk(int rank, int ranks);

// A chunk cut into pieces of at most `max_piece` elements, so that sending
// one piece overlaps receiving and reducing the next. An empty chunk has
// no pieces.
std::vector<Span> Pieces(Span chunk, int64_t max_piece);

}  // namespace muster::allreduce

#endif  // MUSTER_ALLREDUCE_RING_H_
