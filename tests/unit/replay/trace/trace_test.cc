#include "bench/replay/trace/trace.h"

#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::replay {
namespace {

TEST(DeriveTokenIdTest, IsAFixedFunction) {
  // Pinned values: token ids must not change across runs, machines, compilers and releases, or
  // recorded results stop being comparable.
  EXPECT_EQ(DeriveTokenId(0, 0), 455555280);
  EXPECT_EQ(DeriveTokenId(0, 1), 74044291);
  EXPECT_EQ(DeriveTokenId(1, 0), 817674032);
  EXPECT_EQ(DeriveTokenId(12345, 511), 581247383);
  EXPECT_EQ(DeriveTokenId(~uint64_t{0}, 63), 1375660345);
  EXPECT_EQ(DeriveTokenId(777, 5), DeriveTokenId(777, 5));
}

TEST(DeriveTokenIdTest, StaysInRange) {
  for (uint64_t id :
       {uint64_t{0}, uint64_t{1}, uint64_t{1} << 40, uint64_t{1} << 63, ~uint64_t{0}}) {
    for (int position = 0; position < 512; ++position) {
      const int32_t token = DeriveTokenId(id, position);
      EXPECT_GE(token, 0);
      EXPECT_LT(token, INT32_MAX);  // [0, 2^31 - 1)
    }
  }
}

TEST(DeriveTokenIdTest, DifferentIdsAndPositionsGiveDifferentTokens) {
  // 64k (id, position) pairs into a 2^31 range: a good hash has ~1 collision; adjacent ids and
  // positions (id + 1, position - 1) must not line up.
  std::set<int32_t> tokens;
  int pairs = 0;
  for (uint64_t id = 0; id < 1024; ++id) {
    for (int position = 0; position < 64; ++position, ++pairs) {
      tokens.insert(DeriveTokenId(id, position));
    }
  }
  EXPECT_GE(tokens.size(), static_cast<size_t>(pairs) - 8);
  for (uint64_t id = 0; id < 1000; ++id) {
    EXPECT_NE(DeriveTokenId(id, 1), DeriveTokenId(id + 1, 0)) << id;
  }
}

TEST(PromptTokensTest, BlocksOfEqualIdsGiveEqualTokens) {
  TraceRequest a{.input_tokens = 10, .block_ids = {7, 8, 9}};
  TraceRequest b{.input_tokens = 12, .block_ids = {7, 8, 5}};
  const std::vector<int32_t> ta = PromptTokens(a, 4);
  const std::vector<int32_t> tb = PromptTokens(b, 4);
  ASSERT_EQ(ta.size(), 10u);  // the last block is partial: 4 + 4 + 2
  ASSERT_EQ(tb.size(), 12u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ta[i], tb[i]) << i;
  for (int i = 8; i < 10; ++i) EXPECT_NE(ta[i], tb[i]) << i;
  for (int i = 0; i < 10; ++i) EXPECT_EQ(ta[i], DeriveTokenId(a.block_ids[i / 4], i % 4)) << i;
}

TEST(PromptTokensTest, FinerCacheBlocksSeeTheSameTokens) {
  // A cache at 16 tokens per block reads the same ids as one at 64: tokens depend on the trace
  // block only, so keys computed at any tokens_per_block dividing 64 agree between requests.
  TraceRequest r{.input_tokens = 128, .block_ids = {3, 4}};
  const std::vector<int32_t> t = PromptTokens(r, 64);
  ASSERT_EQ(t.size(), 128u);
  EXPECT_EQ(t[64], DeriveTokenId(4, 0));
  EXPECT_EQ(t[127], DeriveTokenId(4, 63));
}

TEST(PromptTokensTest, NeverReadsPastItsIds) {
  TraceRequest short_ids{.input_tokens = 100, .block_ids = {1}};
  EXPECT_EQ(PromptTokens(short_ids, 64).size(), 64u);
  EXPECT_TRUE(PromptTokens(short_ids, 0).empty());
}

}  // namespace
}  // namespace kvtier::replay
