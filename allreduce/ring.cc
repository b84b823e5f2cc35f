#include "allreduce/ring.h"

#include <algorithm>

namespace muster::allreduce {
namespace {

int Mod(int value, int n) { return ((value % n) + n) % n; }

}  // namespace

Span RingChunk(int64_t count, int ranks, int index) {
  // The first count % ranks chunks get one element more.
  const int64_t base = count / ranks;
  const int64_t extra = count % ranks;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

RingStep ReduceScatterStep(int rank, int ranks, int step) {
  return {Mod(rank - step, ranks), Mod(rank - step - 1, ranks)};
}

int ReducedChunk(int rank, int ranks) { return Mod(rank + 1, ranks); }

RingStep AllGatherStep(int rank, int ranks, int step) {
  return {Mod(rank + 1 - step, ranks), Mod(rank - step, ranks)};
}

std::vector<Span> Pieces(Span chunk, int64_t max_piece) {
  std::vector<Span> pieces;
  for (int64_t begin = chunk.begin; begin < chunk.end; begin += max_piece) {
    pieces.push_back({begin, std::min(chunk.end, begin + max_piece)});
  }
  return pieces;
}

}  // namespace muster::allreduce
