#include "allreduce/ring.h"

#include <cstdint>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::allreduce {
namespace {

using ::testing::ElementsAre;

TEST(RingChunkTest, ChunksCoverTheBufferInOrderAndDifferByAtMostOne) {
  for (int ranks : {1, 2, 3, 4, 7, 8}) {
    for (int64_t count : {0, 1, 2, 3, 5, 8, 1000, 1001, 1007}) {
      int64_t next = 0, smallest = INT64_MAX, largest = 0;
      for (int c = 0; c < ranks; ++c) {
        const Span chunk = RingChunk(count, ranks, c);
        EXPECT_EQ(chunk.begin, next) << count << " over " << ranks << ", chunk " << c;
        next = chunk.end;
        smallest = std::min(smallest, chunk.size());
        largest = std::max(largest, chunk.size());
      }
      EXPECT_EQ(next, count) << count << " over " << ranks;
      EXPECT_LE(largest - smallest, 1) << count << " over " << ranks;
    }
  }
  EXPECT_EQ(RingChunk(1, 4, 0), (Span{0, 1}));
  EXPECT_EQ(RingChunk(1, 4, 3), (Span{1, 1}));  // empty
}

TEST(RingStepTest, EachRankReceivesWhatItsPredecessorSends) {
  for (int ranks : {2, 3, 4, 8}) {
    for (int step = 0; step < ranks - 1; ++step) {
      for (int rank = 0; rank < ranks; ++rank) {
        const int previous = (rank + ranks - 1) % ranks;
        EXPECT_EQ(ReduceScatterStep(rank, ranks, step).recv_chunk,
                  ReduceScatterStep(previous, ranks, step).send_chunk);
        EXPECT_EQ(AllGatherStep(rank, ranks, step).recv_chunk,
                  AllGatherStep(previous, ranks, step).send_chunk);
      }
    }
  }
  // Rank 0 of 4: sends 0, 3, 2; receives 3, 2, 1 and ends holding chunk 1.
  EXPECT_EQ(ReduceScatterStep(0, 4, 0), (RingStep{0, 3}));
  EXPECT_EQ(ReduceScatterStep(0, 4, 2), (RingStep{2, 1}));
  EXPECT_EQ(ReducedChunk(0, 4), 1);
  EXPECT_EQ(AllGatherStep(0, 4, 0), (RingStep{1, 0}));
}

// The whole schedule run on plain arrays: every rank ends with the sum.
std::vector<std::vector<int64_t>> SimulateAllReduce(int ranks, int64_t count, int64_t piece) {
  std::vector<std::vector<int64_t>> buffers(ranks, std::vector<int64_t>(count));
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < count; ++i) buffers[r][i] = (r + 1) * 1000 + i;
  }
  for (int step = 0; step < ranks - 1; ++step) {
    const std::vector<std::vector<int64_t>> sent = buffers;  // every send of a step is concurrent
    for (int r = 0; r < ranks; ++r) {
      const int from = (r + ranks - 1) % ranks;
      const Span chunk = RingChunk(count, ranks, ReduceScatterStep(r, ranks, step).recv_chunk);
      for (const Span& p : Pieces(chunk, piece)) {
        for (int64_t i = p.begin; i < p.end; ++i) buffers[r][i] += sent[from][i];
      }
    }
  }
  for (int r = 0; r < ranks; ++r) {
    const Span mine = RingChunk(count, ranks, ReducedChunk(r, ranks));
    for (int64_t i = mine.begin; i < mine.end; ++i) {
      int64_t want = 0;
      for (int q = 0; q < ranks; ++q) want += (q + 1) * 1000 + i;
      EXPECT_EQ(buffers[r][i], want) << "after reduce-scatter, rank " << r << " element " << i;
    }
  }
  for (int step = 0; step < ranks - 1; ++step) {
    const std::vector<std::vector<int64_t>> sent = buffers;
    for (int r = 0; r < ranks; ++r) {
      const int from = (r + ranks - 1) % ranks;
      const Span chunk = RingChunk(count, ranks, AllGatherStep(r, ranks, step).recv_chunk);
      for (int64_t i = chunk.begin; i < chunk.end; ++i) buffers[r][i] = sent[from][i];
    }
  }
  return buffers;
}

TEST(RingScheduleTest, SumsMatchADirectComputationForAwkwardSizes) {
  for (int ranks : {1, 2, 3, 4, 5, 8}) {
    for (int64_t count : {1, 2, 3, 7, 64, 1001}) {
      for (int64_t piece : {1, 3, 1 << 20}) {
        const auto buffers = SimulateAllReduce(ranks, count, piece);
        for (int r = 0; r < ranks; ++r) {
          for (int64_t i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int q = 0; q < ranks; ++q) want += (q + 1) * 1000 + i;
            ASSERT_EQ(buffers[r][i], want) << ranks << " ranks, count " << count << ", piece "
                                           << piece << ": rank " << r << " element " << i;
          }
        }
      }
    }
  }
}

TEST(PiecesTest, CutAChunkIntoPiecesOfAtMostTheLimit) {
  EXPECT_THAT(Pieces({10, 20}, 4), ElementsAre(Span{10, 14}, Span{14, 18}, Span{18, 20}));
  EXPECT_THAT(Pieces({10, 20}, 10), ElementsAre(Span{10, 20}));
  EXPECT_TRUE(Pieces({5, 5}, 4).empty());
}

}  // namespace
}  // namespace muster::allreduce
