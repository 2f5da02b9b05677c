// The serving simulation's links (bench/replay/serve/link.h): processor sharing by arithmetic.
#include "bench/replay/serve/link.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvtier::replay {
namespace {

TEST(LinkTest, OneTransferTakesBytesOverBandwidthPlusLatency) {
  Link link("l", 100.0, 0.25);
  const int64_t id = link.Start(0, 100, 7);
  EXPECT_DOUBLE_EQ(link.NextCompletion(), 1.25);
  EXPECT_TRUE(link.AdvanceTo(1.2).empty());
  const std::vector<Link::Done> done = link.AdvanceTo(1.25);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, id);
  EXPECT_EQ(done[0].tag, 7);
  EXPECT_DOUBLE_EQ(link.bytes_moved(), 100);
  EXPECT_DOUBLE_EQ(link.busy_seconds(), 1.0);
  EXPECT_EQ(link.NextCompletion(), std::numeric_limits<double>::infinity());
}

TEST(LinkTest, ConcurrentTransfersShareTheBandwidth) {
  // 100 B/s. A: 100 B at 0; B: 100 B at 0.5. Alone until 0.5, A moves 50 B; then 50 B/s each:
  // A's last 50 B cross at 1.5; B has 50 B by then and its last 50 B alone by 2.0.
  Link link("l", 100.0, 0.0);
  const int64_t a = link.Start(0, 100, 1);
  const int64_t b = link.Start(0.5, 100, 2);
  EXPECT_DOUBLE_EQ(link.NextCompletion(), 1.5);
  std::vector<Link::Done> done = link.AdvanceTo(1.5);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, a);
  EXPECT_DOUBLE_EQ(link.NextCompletion(), 2.0);
  done = link.AdvanceTo(2.0);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, b);
}

TEST(LinkTest, EstimatedCompletionIsProcessorSharingAmongTheFlowsInFlight) {
  // 100 B/s, 1 s latency. A: 100 B, B: 300 B, both at 0. Shared until A's last byte at 2 s (A
  // done at 3 s); B then has 200 B alone: its last byte at 4 s, done at 5 s.
  Link link("l", 100.0, 1.0);
  const int64_t a = link.Start(0, 100, 1);
  const int64_t b = link.Start(0, 300, 2);
  EXPECT_DOUBLE_EQ(link.EstimatedCompletion(a), 3.0);
  EXPECT_DOUBLE_EQ(link.EstimatedCompletion(b), 5.0);
  EXPECT_EQ(link.EstimatedCompletion(99), -1);
  // The estimate is what happens when nothing else starts.
  EXPECT_EQ(link.AdvanceTo(3.0).size(), 1u);
  EXPECT_DOUBLE_EQ(link.EstimatedCompletion(b), 5.0);
  EXPECT_EQ(link.AdvanceTo(5.0).size(), 1u);
}

TEST(LinkTest, CancelReportsTheFractionThatCrossed) {
  Link link("l", 100.0, 0.0);
  const int64_t a = link.Start(0, 200, 1);
  const int64_t b = link.Start(0, 200, 2);
  // 1 s at 50 B/s each: a quarter of each.
  EXPECT_DOUBLE_EQ(link.Cancel(a, 1.0), 0.25);
  // b alone from 1 s: 150 B left at 100 B/s.
  EXPECT_DOUBLE_EQ(link.NextCompletion(), 2.5);
  EXPECT_DOUBLE_EQ(link.Cancel(a, 1.0), -1.0);
  ASSERT_EQ(link.AdvanceTo(2.5).size(), 1u);
  EXPECT_DOUBLE_EQ(link.Cancel(b, 3.0), -1.0);
}

// A transfer whose duration is below the clock's resolution at a late time (1 B at 10 GB/s
// after 1e9 s) used to loop for ever: its finish rounded to now and no byte moved.
TEST(LinkTest, ATransferShorterThanTheClockResolutionStillCompletes) {
  Link link("l", 1e10, 0.0);
  link.Start(1e9, 1.0, 1);
  link.Start(1e9, 1.0, 2);
  const std::vector<Link::Done> done = link.AdvanceTo(1e9 + 1);
  EXPECT_EQ(done.size(), 2u);
  EXPECT_EQ(link.in_flight(), 0);
}

}  // namespace
}  // namespace kvtier::replay
