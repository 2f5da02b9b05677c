#include "kvtier/block_index.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

std::vector<BlockKey> Keys(int n) {
  std::vector<BlockKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back(BlockKey{0xabcULL, static_cast<uint64_t>(i + 1)});
  return keys;
}

std::unique_ptr<BlockIndex> Make(int tokens_per_block = 16) {
  return std::move(BlockIndex::Create(tokens_per_block)).value();
}

TEST(BlockIndexTest, CreateRejectsBadBlockSize) {
  EXPECT_THAT(BlockIndex::Create(0), IsError(StatusCode::kInvalidArgument, "tokens_per_block = 0"));
  EXPECT_THAT(BlockIndex::Create(70000),
              IsError(StatusCode::kInvalidArgument, "tokens_per_block = 70000"));
}

TEST(BlockIndexTest, CopiesAcrossTiers) {
  auto index = Make();
  const BlockKey k = Keys(1)[0];
  KVTIER_ASSERT_OK(index->AddCopy(k, Tier::kDram, SlotId(4), CopyState::kReady));
  KVTIER_ASSERT_OK(index->AddCopy(k, Tier::kHbm, SlotId(9), CopyState::kPending));
  std::optional<BlockRecord> r = index->Lookup(k);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->state(Tier::kDram), CopyState::kReady);
  EXPECT_EQ(r->state(Tier::kHbm), CopyState::kPending);
  EXPECT_EQ(r->state(Tier::kNvme), CopyState::kAbsent);
  EXPECT_EQ(r->slots[TierIndex(Tier::kHbm)], SlotId(9));
  EXPECT_EQ(r->fastest_ready_tier(), Tier::kDram);  // the HBM copy is still pending
  EXPECT_EQ(index->size(), 1);

  KVTIER_ASSERT_OK(index->MarkReady(k, Tier::kHbm));
  EXPECT_EQ(index->Lookup(k)->fastest_ready_tier(), Tier::kHbm);

  KVTIER_ASSERT_OK(index->RemoveCopy(k, Tier::kHbm));
  EXPECT_EQ(index->Lookup(k)->fastest_ready_tier(), Tier::kDram);
  KVTIER_ASSERT_OK(index->RemoveCopy(k, Tier::kDram));
  EXPECT_FALSE(index->Lookup(k).has_value());  // no copy left: gone
  EXPECT_EQ(index->size(), 0);
}

TEST(BlockIndexTest, ErrorsNameKeyAndTier) {
  auto index = Make();
  const BlockKey k = Keys(1)[0];
  EXPECT_THAT(index->AddCopy(k, Tier::kHbm, SlotId(), CopyState::kReady),
              IsError(StatusCode::kInvalidArgument, "in hbm is invalid"));
  EXPECT_THAT(index->AddCopy(k, static_cast<Tier>(4), SlotId(1), CopyState::kReady),
              IsError(StatusCode::kInvalidArgument, "tier 4 does not exist"));
  EXPECT_THAT(index->AddCopy(k, Tier::kHbm, SlotId(1), CopyState::kAbsent),
              IsError(StatusCode::kInvalidArgument, "must be pending or ready, not state 0"));
  EXPECT_EQ(index->size(), 0);  // failed adds leave nothing behind
  KVTIER_ASSERT_OK(index->AddCopy(k, Tier::kHbm, SlotId(1), CopyState::kReady));
  EXPECT_THAT(index->AddCopy(k, Tier::kHbm, SlotId(2), CopyState::kReady),
              IsError(StatusCode::kAlreadyExists, "already has a copy in hbm at slot 1"));
  EXPECT_THAT(index->MarkReady(k, Tier::kHbm),
              IsError(StatusCode::kFailedPrecondition, "already ready"));
  EXPECT_THAT(index->MarkReady(k, Tier::kNvme), IsError(StatusCode::kNotFound, "in nvme"));
  // Out-of-range tiers are argument errors everywhere, and never index past the tier arrays.
  for (Tier bad : {static_cast<Tier>(4), static_cast<Tier>(9), static_cast<Tier>(40)}) {
    EXPECT_THAT(index->MarkReady(k, bad), IsError(StatusCode::kInvalidArgument, "does not exist"));
    EXPECT_THAT(index->RemoveCopy(k, bad), IsError(StatusCode::kInvalidArgument, "does not exist"));
    EXPECT_EQ(index->Lookup(k)->state(bad), CopyState::kAbsent);
  }
  EXPECT_THAT(index->RemoveCopy(k, Tier::kRemote), IsError(StatusCode::kNotFound, "in remote"));
  const BlockKey other{7, 7};
  EXPECT_THAT(index->MarkReady(other, Tier::kHbm),
              IsError(StatusCode::kNotFound, other.ToHex()));
  EXPECT_THAT(index->RemoveCopy(other, Tier::kHbm), IsError(StatusCode::kNotFound, "no copy"));
  EXPECT_THAT(index->Match(Keys(2), -1), IsError(StatusCode::kInvalidArgument, "query_tokens = -1"));
}

TEST(BlockIndexTest, MatchStopsAtFirstGap) {
  auto index = Make();
  const std::vector<BlockKey> keys = Keys(6);
  for (int i : {0, 1, 2, 4, 5}) {  // block 3 missing
    KVTIER_ASSERT_OK(index->AddCopy(keys[i], Tier::kHbm, SlotId(i), CopyState::kReady));
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixMatch m, index->Match(keys, 96));
  EXPECT_EQ(m.matched_blocks, 3);
  EXPECT_EQ(m.matched_tokens, 48);
  // A pending copy does not count either.
  KVTIER_ASSERT_OK(index->AddCopy(keys[3], Tier::kDram, SlotId(0), CopyState::kPending));
  EXPECT_EQ(index->Match(keys, 96)->matched_blocks, 3);
  KVTIER_ASSERT_OK(index->MarkReady(keys[3], Tier::kDram));
  std::vector<BlockLocation> where = {BlockLocation{}};  // replaced, not appended to
  KVTIER_ASSERT_OK_AND_ASSIGN(m, index->Match(keys, 96, &where));
  EXPECT_EQ(m.matched_blocks, 6);
  EXPECT_EQ(m.blocks_by_tier[TierIndex(Tier::kHbm)], 5);
  EXPECT_EQ(m.blocks_by_tier[TierIndex(Tier::kDram)], 1);
  ASSERT_EQ(where.size(), 6u);
  EXPECT_EQ(where[3].tier, Tier::kDram);
  EXPECT_EQ(where[4].tier, Tier::kHbm);
  EXPECT_EQ(where[4].slot, SlotId(4));
}

TEST(BlockIndexTest, MatchIsClampedAndSideEffectFree) {
  auto index = Make();
  const std::vector<BlockKey> keys = Keys(4);
  for (int i = 0; i < 4; ++i) {
    KVTIER_ASSERT_OK(index->AddCopy(keys[i], Tier::kNvme, SlotId(i), CopyState::kReady));
  }
  EXPECT_EQ(index->Match(keys, 64)->matched_tokens, 64);
  EXPECT_EQ(index->Match(keys, 63)->matched_tokens, 48);
  EXPECT_EQ(index->Match(keys, 1000)->matched_tokens, 64);  // no more keys than given
  EXPECT_EQ(index->Match(keys, 15)->matched_tokens, 0);
  EXPECT_EQ(index->Match({}, 64)->matched_tokens, 0);
  // Matching changes nothing: every copy is where it was.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(index->Lookup(keys[i])->slots[TierIndex(Tier::kNvme)], SlotId(i));
    EXPECT_EQ(index->Lookup(keys[i])->state(Tier::kNvme), CopyState::kReady);
  }
  EXPECT_EQ(index->size(), 4);
}

TEST(BlockIndexTest, RecordIsCompact) {
  // The metadata budget (DESIGN section 9) is 64 bytes per cached block, key included.
  EXPECT_LE(sizeof(BlockKey) + sizeof(BlockRecord), 64u);
}

}  // namespace
}  // namespace kvtier
