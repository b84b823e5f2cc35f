#include "agent/events.h"

#include "gtest/gtest.h"

namespace muster {
namespace {

TEST(EventJsonLineTest, OneObjectOnOneLine) {
  AgentEvent event{.time = absl::FromUnixMillis(1764921600125),
                   .job = "job7",
                   .round = 3,
                   .node = "host-a:42:x1y2",
                   .kind = "worker_failed",
                   .detail = "rank 1 \"oops\"\nsecond line"};
  EXPECT_EQ(EventJsonLine(event),
            "{\"time\": 1764921600.125, \"job\": \"job7\", \"round\": 3, \"node\": "
            "\"host-a:42:x1y2\", \"kind\": \"worker_failed\", \"detail\": \"rank 1 \\\"oops\\\"\\n"
            "second line\"}\n");
}

TEST(RoundChangedKindTest, TheReasonNamesTheKind) {
  rdzv::RoundChanged changed;
  EXPECT_EQ(RoundChangedKind(changed), "round_changed");
  changed.set_reason(rdzv::RoundChanged::WORKER_FAILED);
  EXPECT_EQ(RoundChangedKind(changed), "job_restarting");
  changed.set_reason(rdzv::RoundChanged::NODE_JOINED);
  EXPECT_EQ(RoundChangedKind(changed), "node_joined");
  changed.set_reason(rdzv::RoundChanged::NODE_LOST);
  EXPECT_EQ(RoundChangedKind(changed), "node_lost");
}

}  // namespace
}  // namespace muster
