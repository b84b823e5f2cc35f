// What one connection may hold open, and that an ended call gives its place back.
#include "rendezvous/server/peer_limits.h"

#include <optional>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace muster::rdzv {
namespace {

using ::testing::HasSubstr;
using Kind = PeerLimits::Kind;

TEST(PeerLimitsTest, APeerHoldsAtMostItsBoundOfEachKindAndGetsPlacesBack) {
  PeerLimits limits(/*max_joins=*/2, /*max_watches=*/1);
  std::vector<PeerLimits::Slot> joins;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<PeerLimits::Slot> slot = limits.Acquire("peer-a", Kind::kJoin);
    ASSERT_TRUE(slot.ok()) << slot.status();
    joins.push_back(*std::move(slot));
  }
  absl::StatusOr<PeerLimits::Slot> third = limits.Acquire("peer-a", Kind::kJoin);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("holds 2 pending joins"));
  EXPECT_TRUE(limits.Acquire("peer-b", Kind::kJoin).ok()) << "another peer has its own bound";
  EXPECT_EQ(limits.Held("peer-b", Kind::kJoin), 0) << "the slot above was dropped at once";
  {
    absl::StatusOr<PeerLimits::Slot> watch = limits.Acquire("peer-a", Kind::kWatch);
    ASSERT_TRUE(watch.ok()) << "joins and watches are counted apart";
    EXPECT_EQ(limits.Acquire("peer-a", Kind::kWatch).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(limits.Held("peer-a", Kind::kWatch), 0);
  joins.pop_back();
  EXPECT_EQ(limits.Held("peer-a", Kind::kJoin), 1);
  EXPECT_TRUE(limits.Acquire("peer-a", Kind::kJoin).ok());
}

TEST(PeerLimitsTest, AMovedSlotGivesItsPlaceBackOnce) {
  PeerLimits limits(1, 1);
  std::optional<PeerLimits::Slot> held;
  {
    absl::StatusOr<PeerLimits::Slot> slot = limits.Acquire("p", Kind::kJoin);
    ASSERT_TRUE(slot.ok());
    held.emplace(*std::move(slot));
  }
  EXPECT_EQ(limits.Held("p", Kind::kJoin), 1);
  PeerLimits::Slot moved = *std::move(held);
  held.reset();
  EXPECT_EQ(limits.Held("p", Kind::kJoin), 1);
  moved = *limits.Acquire("q", Kind::kJoin);  // assigning gives the old place back
  EXPECT_EQ(limits.Held("p", Kind::kJoin), 0);
  EXPECT_EQ(limits.Held("q", Kind::kJoin), 1);
}

}  // namespace
}  // namespace muster::rdzv
