#include "kvtier/page_table.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/accounting.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/slot_token_store.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::ExpectAccounting;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::testing::ElementsAreArray;

class PageTableTest : public ::testing::Test {
 protected:
  static constexpr int kB = 16;
  void SetUp() override { allocator_ = std::move(BlockAllocator::Create(Tier::kHbm, 8)).value(); }

  std::unique_ptr<PageTable> NewTable(uint64_t id) {
    auto t = PageTable::Create(SequenceId(id), allocator_.get(), kB);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(t).value();
  }
  SlotState StateOf(SlotId s) { return *allocator_->state(s); }

  std::unique_ptr<BlockAllocator> allocator_;
};

TEST_F(PageTableTest, CreateRejectsBadArguments) {
  EXPECT_THAT(PageTable::Create(SequenceId(1), nullptr, 16),
              IsError(StatusCode::kInvalidArgument, "allocator is null"));
  EXPECT_THAT(PageTable::Create(SequenceId(1), allocator_.get(), 0),
              IsError(StatusCode::kInvalidArgument, "tokens_per_block = 0"));
  EXPECT_THAT(PageTable::Create(SequenceId(), allocator_.get(), 16),
              IsError(StatusCode::kInvalidArgument, "sequence id is invalid"));
}

TEST_F(PageTableTest, AppendFillsPartialBlockAndSealsFullOnes) {
  auto t = NewTable(1);
  EXPECT_EQ(t->tokens_in_last_block(), 0);
  KVTIER_ASSERT_OK_AND_ASSIGN(AppendResult r, t->Append(Iota(10)));
  EXPECT_EQ(r.num_new_slots, 1);
  EXPECT_EQ(r.num_sealed_blocks, 0);
  EXPECT_EQ(t->num_blocks(), 1);
  EXPECT_EQ(t->tokens_in_last_block(), 10);
  EXPECT_EQ(StateOf(t->block_table()[0]), SlotState::kWritable);

  KVTIER_ASSERT_OK_AND_ASSIGN(r, t->Append(Iota(30, 2000)));  // 40 tokens
  EXPECT_EQ(r.num_new_slots, 2);
  EXPECT_EQ(r.first_sealed_block, 0);
  EXPECT_EQ(r.num_sealed_blocks, 2);
  EXPECT_EQ(t->num_tokens(), 40);
  EXPECT_EQ(t->num_full_blocks(), 2);
  EXPECT_EQ(t->tokens_in_last_block(), 8);
  EXPECT_EQ(StateOf(t->block_table()[0]), SlotState::kSealed);
  EXPECT_EQ(StateOf(t->block_table()[1]), SlotState::kSealed);
  EXPECT_EQ(StateOf(t->block_table()[2]), SlotState::kWritable);
  EXPECT_EQ(t->tokens()[10], 2000);

  KVTIER_ASSERT_OK_AND_ASSIGN(r, t->Append(Iota(8)));  // exactly fills block 2
  EXPECT_EQ(r.num_new_slots, 0);
  EXPECT_EQ(r.first_sealed_block, 2);
  EXPECT_EQ(r.num_sealed_blocks, 1);
  EXPECT_EQ(t->tokens_in_last_block(), 16);
  KVTIER_ASSERT_OK_AND_ASSIGN(r, t->Append({}));
  EXPECT_EQ(r.num_new_slots, 0);
  EXPECT_EQ(r.num_sealed_blocks, 0);
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, AppendIsAllOrNothingWhenTierIsFull) {
  auto t = NewTable(1);
  KVTIER_ASSERT_OK(t->Append(Iota(100)).status());  // 7 blocks of 8
  const SlotCounts before = allocator_->counts();
  EXPECT_THAT(t->Append(Iota(40)), IsError(StatusCode::kResourceExhausted, "in use"));
  EXPECT_EQ(t->num_tokens(), 100);
  EXPECT_EQ(t->num_blocks(), 7);
  EXPECT_EQ(allocator_->counts().free, before.free);
  EXPECT_EQ(allocator_->counts().writable, before.writable);
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, SlotForBlockAndErrors) {
  auto t = NewTable(3);
  KVTIER_ASSERT_OK(t->Append(Iota(20)).status());
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId s, t->SlotForBlock(1));
  EXPECT_EQ(s, t->block_table()[1]);
  EXPECT_THAT(t->SlotForBlock(2), IsError(StatusCode::kOutOfRange, "block 2 is outside [0, 2)"));
  EXPECT_THAT(t->SlotForBlock(-1), IsError(StatusCode::kOutOfRange, "block -1"));
}

TEST_F(PageTableTest, ReleaseTwiceAndUseAfterRelease) {
  auto t = NewTable(5);
  KVTIER_ASSERT_OK(t->Append(Iota(20)).status());
  KVTIER_ASSERT_OK(t->Release());
  EXPECT_TRUE(t->released());
  EXPECT_EQ(allocator_->counts().held(), 0);
  EXPECT_EQ(allocator_->counts().cached, 1);  // the full block stays as KV
  EXPECT_EQ(allocator_->counts().free, 7);    // the private partial block is gone
  EXPECT_THAT(t->Release(), IsError(StatusCode::kFailedPrecondition, "sequence 5 was already released"));
  EXPECT_THAT(t->Append(Iota(1)), IsError(StatusCode::kFailedPrecondition, "released"));
  EXPECT_THAT(t->Fork(SequenceId(6), 0), IsError(StatusCode::kFailedPrecondition, "released"));
  EXPECT_THAT(t->Truncate(0), IsError(StatusCode::kFailedPrecondition, "released"));
  EXPECT_THAT(t->SlotForBlock(0), IsError(StatusCode::kFailedPrecondition, "released"));
  EXPECT_THAT(t->AppendCachedBlock(Tier::kHbm, SlotId(0), Iota(16)),
              IsError(StatusCode::kFailedPrecondition, "released"));
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, DestructorReleases) {
  {
    auto t = NewTable(1);
    KVTIER_ASSERT_OK(t->Append(Iota(40)).status());
  }
  EXPECT_EQ(allocator_->counts().held(), 0);
  EXPECT_EQ(allocator_->counts().cached, 2);
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, AppendCachedBlockSharesSlot) {
  auto a = NewTable(1);
  KVTIER_ASSERT_OK(a->Append(Iota(32)).status());
  const SlotId first = a->block_table()[0];
  KVTIER_ASSERT_OK(a->Release());
  ASSERT_EQ(StateOf(first), SlotState::kCached);

  auto b = NewTable(2);
  KVTIER_ASSERT_OK(b->AppendCachedBlock(Tier::kHbm, first, Iota(16)));
  EXPECT_EQ(StateOf(first), SlotState::kSealed);
  EXPECT_EQ(*allocator_->ref_count(first), 1u);
  auto c = NewTable(3);
  KVTIER_ASSERT_OK(c->AppendCachedBlock(Tier::kHbm, first, Iota(16)));
  EXPECT_EQ(*allocator_->ref_count(first), 2u);
  EXPECT_THAT(c->AppendCachedBlock(Tier::kHbm, first, Iota(15)),
              IsError(StatusCode::kInvalidArgument, "has 16 tokens, not 15"));
  KVTIER_ASSERT_OK(c->Append(Iota(3)).status());
  EXPECT_THAT(c->AppendCachedBlock(Tier::kHbm, first, Iota(16)),
              IsError(StatusCode::kFailedPrecondition, "partial block (19 tokens)"));
  // Only sealed or cached slots can be adopted.
  auto d = NewTable(4);
  EXPECT_THAT(d->AppendCachedBlock(Tier::kHbm, c->block_table()[1], Iota(16)),
              IsError(StatusCode::kFailedPrecondition, "state writable"));
  EXPECT_THAT(d->AppendCachedBlock(Tier::kHbm, SlotId(99), Iota(16)),
              IsError(StatusCode::kInvalidArgument, "outside"));
  // Slot ids are tier-local: a DRAM hit is not HBM slot `first` (a wrong block if accepted).
  EXPECT_THAT(d->AppendCachedBlock(Tier::kDram, first, Iota(16)),
              IsError(StatusCode::kInvalidArgument, "a block cached in dram must be onboarded"));
  EXPECT_EQ(d->num_tokens(), 0);
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, ForkAtBlockBoundarySharesWithoutCopy) {
  auto a = NewTable(1);
  KVTIER_ASSERT_OK(a->Append(Iota(40)).status());
  KVTIER_ASSERT_OK_AND_ASSIGN(ForkResult f, a->Fork(SequenceId(2), 32));
  EXPECT_FALSE(f.copy.has_value());
  EXPECT_EQ(f.child->sequence(), SequenceId(2));
  EXPECT_EQ(f.child->num_tokens(), 32);
  EXPECT_EQ(f.child->block_table()[0], a->block_table()[0]);
  EXPECT_EQ(*allocator_->ref_count(a->block_table()[0]), 2u);
  KVTIER_ASSERT_OK_AND_ASSIGN(ForkResult empty, a->Fork(SequenceId(3), 0));
  EXPECT_EQ(empty.child->num_blocks(), 0);
  EXPECT_THAT(a->Fork(SequenceId(4), 41), IsError(StatusCode::kOutOfRange, "at token 41"));
  EXPECT_THAT(a->Fork(SequenceId(4), -1), IsError(StatusCode::kOutOfRange, "at token -1"));
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, ForkFailsCleanlyWhenNoSlotForCopy) {
  auto a = NewTable(1);
  KVTIER_ASSERT_OK(a->Append(Iota(8 * kB)).status());  // every slot used
  const SlotCounts before = allocator_->counts();
  EXPECT_THAT(a->Fork(SequenceId(2), 20), IsError(StatusCode::kResourceExhausted, "in use"));
  EXPECT_EQ(*allocator_->ref_count(a->block_table()[0]), 1u);  // shares undone
  EXPECT_EQ(allocator_->counts().sealed, before.sealed);
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, TruncateInsidePartialBlockKeepsSlot) {
  testing::SlotTokenStore store(8, kB);
  auto t = NewTable(1);
  KVTIER_ASSERT_OK(t->Append(Iota(40)).status());
  store.WriteTokens(*t, 0);
  const SlotId last = t->block_table()[2];
  KVTIER_ASSERT_OK_AND_ASSIGN(std::optional<BlockCopy> copy, t->Truncate(36));
  EXPECT_FALSE(copy.has_value());
  EXPECT_EQ(t->block_table()[2], last);
  EXPECT_EQ(t->num_tokens(), 36);
  EXPECT_THAT(store.ReadBack(*t), ElementsAreArray(Iota(36)));
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, TruncateIntoSealedBlockCopiesIt) {
  testing::SlotTokenStore store(8, kB);
  auto t = NewTable(1);
  KVTIER_ASSERT_OK(t->Append(Iota(40)).status());
  store.WriteTokens(*t, 0);
  const SlotId sealed = t->block_table()[1];
  KVTIER_ASSERT_OK_AND_ASSIGN(std::optional<BlockCopy> copy, t->Truncate(20));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->src, sealed);
  EXPECT_EQ(copy->num_tokens, 4);
  EXPECT_EQ(t->block_table()[1], copy->dst);
  EXPECT_EQ(StateOf(sealed), SlotState::kCached);  // immutable, kept as KV for others
  EXPECT_EQ(StateOf(copy->dst), SlotState::kWritable);
  store.Copy(*copy);
  KVTIER_ASSERT_OK(t->Append(Iota(3, 7)).status());
  store.WriteTokens(*t, 20);
  std::vector<int32_t> want = Iota(20);
  for (int32_t x : Iota(3, 7)) want.push_back(x);
  EXPECT_THAT(store.ReadBack(*t), ElementsAreArray(want));
  EXPECT_EQ(store.at(sealed, 4), 1020);  // the sealed block still holds the old token 20
  KVTIER_ASSERT_OK_AND_ASSIGN(copy, t->Truncate(0));
  EXPECT_FALSE(copy.has_value());
  EXPECT_EQ(t->num_blocks(), 0);
  EXPECT_THAT(t->Truncate(1), IsError(StatusCode::kOutOfRange, "to 1 tokens; it has 0"));
  EXPECT_THAT(t->Truncate(-1), IsError(StatusCode::kOutOfRange, "to -1"));
  ExpectAccounting(*allocator_);
}

TEST_F(PageTableTest, TruncateIntoSealedBlockReusesDroppedPartialBlock) {
  // Found in review: with every slot in use, truncating into a sealed block failed although the
  // dropped partial block could hold the copy; with nothing cached the caller could never evict
  // its way out.
  auto small = std::move(BlockAllocator::Create(Tier::kHbm, 3)).value();
  testing::SlotTokenStore store(3, kB);
  auto t = std::move(PageTable::Create(SequenceId(1), small.get(), kB)).value();
  KVTIER_ASSERT_OK(t->Append(Iota(40)).status());  // 2 sealed + 1 writable: all 3 slots
  store.WriteTokens(*t, 0);
  const SlotId tail = t->block_table()[2];
  KVTIER_ASSERT_OK_AND_ASSIGN(std::optional<BlockCopy> copy, t->Truncate(20));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->dst, tail);
  EXPECT_EQ(copy->num_tokens, 4);
  store.Copy(*copy);
  EXPECT_THAT(store.ReadBack(*t), ElementsAreArray(Iota(20)));
  EXPECT_EQ(*small->state(tail), SlotState::kWritable);
  ExpectAccounting(*small);
}

TEST_F(PageTableTest, AppendOfItsOwnTokensIsSafe) {
  auto t = NewTable(1);
  KVTIER_ASSERT_OK(t->Append(Iota(20)).status());
  KVTIER_ASSERT_OK(t->Append(t->tokens()).status());  // the span points into the table
  std::vector<int32_t> want = Iota(20);
  for (int32_t x : Iota(20)) want.push_back(x);
  EXPECT_THAT(t->tokens(), ElementsAreArray(want));
}

TEST_F(PageTableTest, TruncateFailsCleanlyWhenNoSlotForCopy) {
  auto t = NewTable(1);
  KVTIER_ASSERT_OK(t->Append(Iota(8 * kB)).status());
  EXPECT_THAT(t->Truncate(20), IsError(StatusCode::kResourceExhausted, "in use"));
  EXPECT_EQ(t->num_tokens(), 8 * kB);
  EXPECT_EQ(t->num_blocks(), 8);
  ExpectAccounting(*allocator_);
}

}  // namespace
}  // namespace kvtier
