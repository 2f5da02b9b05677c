// LT-2: an offload of block g1 into DRAM slot h is in flight; h cannot be chosen for g2 until the
// first copy completes.
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_stack.h"

namespace kvtier {
namespace {

using Stack = ::kvtier::testing::TierStack;

TEST(Regress_LT_2, InFlightOffloadDestinationIsNotChosenAgain) {
  Stack s(4);
  s.hbm->SetDelay(absl::Milliseconds(150));  // reading g1 out of HBM is slow
  const SlotId g1_hbm = s.Put(Tier::kHbm, Stack::Key(1), Stack::Block(1));
  const SlotId g2_hbm = s.Put(Tier::kHbm, Stack::Key(2), Stack::Block(2));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer g1, s.engine->Copy(Stack::Key(1), Tier::kHbm, g1_hbm, Tier::kDram));
  const SlotId h = g1.destination;
  EXPECT_EQ(s.StateOf(Tier::kDram, h), SlotState::kInFlight);
  // Every other DRAM slot can be chosen for g2 and later blocks, never h.
  std::vector<Transfer> others;
  for (int i = 0; i < 3; ++i) {
    KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t, s.engine->Copy(Stack::Key(2), Tier::kHbm, g2_hbm, Tier::kDram));
    EXPECT_NE(t.destination, h);
    others.push_back(t);
  }
  EXPECT_TRUE(absl::IsResourceExhausted(
      s.engine->Copy(Stack::Key(2), Tier::kHbm, g2_hbm, Tier::kDram).status()));
  KVTIER_ASSERT_OK(g1.completion.Wait());
  for (Transfer& t : others) KVTIER_ASSERT_OK(t.completion.Wait());
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, s.Get(Tier::kDram, h, Stack::Key(1)));
  EXPECT_TRUE(back == Stack::Block(1));
  // Completed: h is an ordinary cached block now, evictable and then reusable.
  EXPECT_EQ(s.StateOf(Tier::kDram, h), SlotState::kCached);
  KVTIER_ASSERT_OK(s.engine->WithAllocator(Tier::kDram, [&](BlockAllocator& a) { return a.Evict(h); }));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer reuse, s.engine->Copy(Stack::Key(2), Tier::kHbm, g2_hbm, Tier::kDram));
  EXPECT_EQ(reuse.destination, h);
  KVTIER_ASSERT_OK(reuse.completion.Wait());
}

}  // namespace
}  // namespace kvtier
