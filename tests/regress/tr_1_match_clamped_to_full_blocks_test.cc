// TR-1: B=16, a 40-token prompt cached; querying the same 40 tokens matches 32 tokens (two full
// blocks), never 48; querying 20 of those tokens matches 16.
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kvtier/block_index.h"
#include "kvtier/kv_cache.h"
#include "kvtier/prefix_hasher.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

constexpr int kB = 16;

TEST(Regress_TR_1, MatchCountsFullBlocksOfTheQueryOnly) {
  testing::KvCacheEnv env({.hbm_blocks = 16, .dram_blocks = 0, .tokens_per_block = kB});
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache, env.NewCache());
  const std::vector<int32_t> prompt = testing::Iota(40);
  const absl::Span<const int32_t> first20 = absl::MakeConstSpan(prompt).subspan(0, 20);

  // Cache the prompt as a request does: append, the kernel writes it, release.
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(1)));
  KVTIER_ASSERT_OK_AND_ASSIGN(KvAppendResult appended, cache->Append(SequenceId(1), prompt));
  ASSERT_EQ(appended.num_sealed_blocks, 2);
  KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(1), 40));
  EXPECT_EQ(cache->stats().indexed_blocks, 2) << "the partial third block must not get a key";
  KVTIER_ASSERT_OK(cache->Release(SequenceId(1)));

  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup l40, cache->Lookup(prompt));
  EXPECT_EQ(l40.matched_tokens, 32);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup l20, cache->Lookup(first20));
  EXPECT_EQ(l20.matched_tokens, 16);
  // A request attaching the prompt is told the same.
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult attached, cache->AttachPrefix(SequenceId(2), prompt));
  EXPECT_EQ(attached.matched_tokens, 32);
  EXPECT_EQ(attached.attached_tokens, 32);
  KVTIER_ASSERT_OK(cache->Release(SequenceId(2)));
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(3)));
  KVTIER_ASSERT_OK_AND_ASSIGN(attached, cache->AttachPrefix(SequenceId(3), first20));
  EXPECT_EQ(attached.matched_tokens, 16);
  KVTIER_ASSERT_OK(cache->Release(SequenceId(3)));

  // The whole kind: a longer cached prefix is clamped to the query too. Cache a 48-token
  // version (three full blocks) and query fewer of its tokens.
  std::vector<int32_t> longer = prompt;
  for (int32_t t : testing::Iota(8, 1040)) longer.push_back(t);
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(4)));
  KVTIER_ASSERT_OK(cache->AttachPrefix(SequenceId(4), longer).status());
  KVTIER_ASSERT_OK(cache->Append(SequenceId(4), absl::MakeConstSpan(longer).subspan(32)).status());
  KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(4), 48));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(4)));
  for (const auto& [query_tokens, want] :
       std::vector<std::pair<size_t, int64_t>>{{48, 48}, {47, 32}, {40, 32}, {20, 16}, {15, 0}}) {
    KVTIER_ASSERT_OK_AND_ASSIGN(
        PrefixLookup l, cache->Lookup(absl::MakeConstSpan(longer).subspan(0, query_tokens)));
    EXPECT_EQ(l.matched_tokens, want) << "a query of " << query_tokens << " tokens";
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup none, cache->Lookup({}));
  EXPECT_EQ(none.matched_tokens, 0);
  KVTIER_EXPECT_OK(cache->CheckInvariants());
}

// The index below the cache: a caller passing more keys than its query covers is clamped.
TEST(Regress_TR_1, IndexMatchClampsKeysToTheQuery) {
  const PrefixHasher hasher = testing::MakeHasher(kB);
  auto index = std::move(BlockIndex::Create(kB)).value();
  const std::vector<int32_t> tokens = testing::Iota(48);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> keys, hasher.BlockKeys(tokens));
  ASSERT_EQ(keys.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    KVTIER_ASSERT_OK(index->AddCopy(keys[i], Tier::kHbm, SlotId(i), CopyState::kReady));
  }
  EXPECT_EQ(index->Match(keys, 48)->matched_tokens, 48);
  EXPECT_EQ(index->Match(keys, 40)->matched_tokens, 32);
  EXPECT_EQ(index->Match(keys, 20)->matched_tokens, 16);
  EXPECT_EQ(index->Match(keys, 0)->matched_tokens, 0);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> k40,
                              hasher.BlockKeys(absl::MakeConstSpan(tokens).subspan(0, 40)));
  EXPECT_EQ(index->Match(k40, 40)->matched_tokens, 32);
}

}  // namespace
}  // namespace kvtier
