// TR-1: B=16, a 40-token prompt cached; querying the same 40 tokens matches 32 tokens (two full
// blocks), never 48; querying 20 of those tokens matches 16.
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kvtier/block_allocator.h"
#include "kvtier/block_index.h"
#include "kvtier/page_table.h"
#include "kvtier/prefix_hasher.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

TEST(Regress_TR_1, MatchCountsFullBlocksOfTheQueryOnly) {
  constexpr int kB = 16;
  const PrefixHasher hasher = testing::MakeHasher(kB);
  auto allocator = std::move(BlockAllocator::Create(Tier::kHbm, 16)).value();
  auto index = std::move(BlockIndex::Create(kB)).value();
  const std::vector<int32_t> prompt = testing::Iota(40);

  // Cache the prompt the way the engine does: page table, seal, key, publish.
  auto table = std::move(PageTable::Create(SequenceId(1), allocator.get(), kB)).value();
  KVTIER_ASSERT_OK_AND_ASSIGN(AppendResult appended, table->Append(prompt));
  ASSERT_EQ(appended.num_sealed_blocks, 2);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> keys, hasher.BlockKeys(table->tokens()));
  ASSERT_EQ(keys.size(), 2u) << "the partial third block must not get a key";
  for (int64_t i = 0; i < appended.num_sealed_blocks; ++i) {
    KVTIER_ASSERT_OK(index->AddCopy(keys[i], Tier::kHbm, table->block_table()[i],
                                    CopyState::kReady, 0));
  }
  KVTIER_ASSERT_OK(table->Release());

  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> q40, hasher.BlockKeys(prompt));
  EXPECT_EQ(index->Match(q40, 40)->matched_tokens, 32);
  const absl::Span<const int32_t> first20 = absl::MakeConstSpan(prompt).subspan(0, 20);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> q20, hasher.BlockKeys(first20));
  EXPECT_EQ(index->Match(q20, 20)->matched_tokens, 16);

  // The whole kind: a caller passing more keys than its query covers is clamped too. Cache a
  // 48-token version (three full blocks) and query only 40 of its tokens with all three keys.
  std::vector<int32_t> longer = prompt;
  for (int32_t t : testing::Iota(8, 1040)) longer.push_back(t);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> k48, hasher.BlockKeys(longer));
  ASSERT_EQ(k48.size(), 3u);
  KVTIER_ASSERT_OK(index->AddCopy(k48[2], Tier::kHbm, SlotId(9), CopyState::kReady, 0));
  EXPECT_EQ(index->Match(k48, 48)->matched_tokens, 48);
  EXPECT_EQ(index->Match(k48, 40)->matched_tokens, 32);
  EXPECT_EQ(index->Match(k48, 20)->matched_tokens, 16);
  EXPECT_EQ(index->Match(k48, 0)->matched_tokens, 0);
}

}  // namespace
}  // namespace kvtier
