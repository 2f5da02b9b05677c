// TR-2: fork B from A at token 33 (A has 40 tokens, B=16): appending to B must not change A's
// third block (copy-on-write of the partial block); both read back their own tokens.
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/block_allocator.h"
#include "kvtier/page_table.h"
#include "tests/testing/accounting.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/slot_token_store.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::testing::ElementsAreArray;

TEST(Regress_TR_2, AppendToForkNeverChangesParentsPartialBlock) {
  constexpr int kB = 16;
  auto allocator = std::move(BlockAllocator::Create(Tier::kHbm, 16)).value();
  testing::SlotTokenStore kv(16, kB);
  auto a = std::move(PageTable::Create(SequenceId(1), allocator.get(), kB)).value();
  const std::vector<int32_t> a_tokens = testing::Iota(40);
  KVTIER_ASSERT_OK(a->Append(a_tokens).status());
  kv.WriteTokens(*a, 0);

  KVTIER_ASSERT_OK_AND_ASSIGN(ForkResult fork, a->Fork(SequenceId(2), 33));
  PageTable& b = *fork.child;
  ASSERT_TRUE(fork.copy.has_value()) << "a fork inside a block must copy that block";
  EXPECT_EQ(fork.copy->src, a->block_table()[2]);
  EXPECT_EQ(fork.copy->num_tokens, 1);
  EXPECT_NE(b.block_table()[2], a->block_table()[2]);
  EXPECT_EQ(b.block_table()[0], a->block_table()[0]);  // full blocks are shared
  EXPECT_EQ(b.block_table()[1], a->block_table()[1]);
  kv.Copy(*fork.copy);

  const std::vector<int32_t> b_new = testing::Iota(20, 9000);
  KVTIER_ASSERT_OK(b.Append(b_new).status());
  kv.WriteTokens(b, 33);
  // A appends too, into its own partial block.
  KVTIER_ASSERT_OK(a->Append(testing::Iota(4, 7000)).status());
  kv.WriteTokens(*a, 40);

  std::vector<int32_t> a_want = a_tokens;
  for (int32_t t : testing::Iota(4, 7000)) a_want.push_back(t);
  std::vector<int32_t> b_want(a_tokens.begin(), a_tokens.begin() + 33);
  b_want.insert(b_want.end(), b_new.begin(), b_new.end());
  EXPECT_THAT(kv.ReadBack(*a), ElementsAreArray(a_want));
  EXPECT_THAT(kv.ReadBack(b), ElementsAreArray(b_want));
  EXPECT_THAT(a->tokens(), ElementsAreArray(a_want));
  EXPECT_THAT(b.tokens(), ElementsAreArray(b_want));
  testing::ExpectAccounting(*allocator);

  KVTIER_ASSERT_OK(a->Release());
  KVTIER_ASSERT_OK(b.Release());
  EXPECT_EQ(allocator->counts().held(), 0);
  testing::ExpectAccounting(*allocator);
}

TEST(Regress_TR_2, ForkOfSealedBlockAlsoCopies) {
  // The whole kind: forking inside a block that is already full (sealed, immutable) must copy
  // it too, or the child's appends would write into a block other sequences may share.
  constexpr int kB = 16;
  auto allocator = std::move(BlockAllocator::Create(Tier::kHbm, 16)).value();
  testing::SlotTokenStore kv(16, kB);
  auto a = std::move(PageTable::Create(SequenceId(1), allocator.get(), kB)).value();
  KVTIER_ASSERT_OK(a->Append(testing::Iota(48)).status());
  kv.WriteTokens(*a, 0);
  KVTIER_ASSERT_OK_AND_ASSIGN(ForkResult fork, a->Fork(SequenceId(2), 40));
  ASSERT_TRUE(fork.copy.has_value());
  EXPECT_EQ(fork.copy->num_tokens, 8);
  kv.Copy(*fork.copy);
  KVTIER_ASSERT_OK(fork.child->Append(testing::Iota(8, 500)).status());
  kv.WriteTokens(*fork.child, 40);
  EXPECT_THAT(kv.ReadBack(*a), ElementsAreArray(testing::Iota(48)));
}

}  // namespace
}  // namespace kvtier
