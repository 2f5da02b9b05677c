// ID-1: same tokens, adapter "X" loaded twice with different weights (a new load generation):
// the second load gets 0 hits on blocks written under the first.
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/block_index.h"
#include "kvtier/prefix_hasher.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

TEST(Regress_ID_1, ReloadedAdapterGetsNoHitsOnOldBlocks) {
  const PrefixHasher hasher = testing::MakeHasher(16);
  const std::vector<int32_t> prompt = testing::Iota(160);
  BlockExtras first_load;
  first_load.adapter = AdapterIdentity{.id = "X", .load_generation = 1};
  BlockExtras second_load;
  second_load.adapter = AdapterIdentity{.id = "X", .load_generation = 2};

  auto index = std::move(BlockIndex::Create(16)).value();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> written, hasher.BlockKeys(prompt, first_load));
  ASSERT_EQ(written.size(), 10u);
  for (size_t i = 0; i < written.size(); ++i) {
    KVTIER_ASSERT_OK(index->AddCopy(written[i], Tier::kHbm, SlotId(static_cast<uint32_t>(i)),
                                    CopyState::kReady));
  }

  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> reloaded, hasher.BlockKeys(prompt, second_load));
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixMatch miss, index->Match(reloaded, 160));
  EXPECT_EQ(miss.matched_tokens, 0);
  for (const BlockKey& k : reloaded) EXPECT_FALSE(index->Lookup(k).has_value());

  // Control: the same load generation hits every block.
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> same, hasher.BlockKeys(prompt, first_load));
  EXPECT_EQ(index->Match(same, 160)->matched_tokens, 160);
  // And no adapter at all is a different model too.
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> base, hasher.BlockKeys(prompt));
  EXPECT_EQ(index->Match(base, 160)->matched_tokens, 0);
}

}  // namespace
}  // namespace kvtier
