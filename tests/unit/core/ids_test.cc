#include "kvtier/ids.h"

#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

// The point of typed ids: none converts into another or from/to its integer implicitly.
static_assert(!std::is_convertible_v<SlotId, SequenceId>);
static_assert(!std::is_convertible_v<SequenceId, SlotId>);
static_assert(!std::is_constructible_v<SlotId, SequenceId>);
static_assert(!std::is_convertible_v<uint32_t, SlotId>);
static_assert(!std::is_convertible_v<SlotId, uint32_t>);
static_assert(!std::is_convertible_v<Tier, int>);
static_assert(!std::is_convertible_v<int, Tier>);
static_assert(!std::is_assignable_v<SlotId&, SequenceId>);
static_assert(sizeof(SlotId) == 4 && sizeof(SequenceId) == 8 && sizeof(Tier) == 1);

TEST(IdsTest, DefaultIsInvalid) {
  EXPECT_FALSE(SlotId().valid());
  EXPECT_FALSE(SequenceId().valid());
  EXPECT_TRUE(SlotId(0).valid());
  EXPECT_EQ(SlotId().value(), UINT32_MAX);
}

TEST(IdsTest, CompareAndHash) {
  EXPECT_LT(SlotId(3), SlotId(4));
  EXPECT_EQ(SequenceId(9), SequenceId(9));
  absl::flat_hash_set<SlotId> set = {SlotId(1), SlotId(2), SlotId(1)};
  EXPECT_EQ(set.size(), 2u);
}

TEST(IdsTest, TierNamesAndOrder) {
  EXPECT_EQ(TierName(Tier::kHbm), "hbm");
  EXPECT_EQ(TierName(Tier::kDram), "dram");
  EXPECT_EQ(TierName(Tier::kNvme), "nvme");
  EXPECT_EQ(TierName(Tier::kRemote), "remote");
  EXPECT_EQ(TierName(static_cast<Tier>(17)), "unknown");
  EXPECT_LT(TierIndex(Tier::kHbm), TierIndex(Tier::kRemote));  // fastest first
  EXPECT_EQ(TierIndex(Tier::kRemote), kNumTiers - 1);
}

}  // namespace
}  // namespace kvtier
