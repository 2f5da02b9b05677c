#include "kvtier/block_allocator.h"

#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/accounting.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::ExpectAccounting;
using ::kvtier::testing::IsError;

std::unique_ptr<BlockAllocator> Make(int64_t capacity) {
  auto a = BlockAllocator::Create(Tier::kHbm, capacity);
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(a).value();
}

SlotState StateOf(const BlockAllocator& a, SlotId s) { return *a.state(s); }

TEST(BlockAllocatorTest, CreateRejectsBadCapacity) {
  EXPECT_THAT(BlockAllocator::Create(Tier::kDram, 0),
              IsError(StatusCode::kInvalidArgument, "capacity_blocks = 0"));
  EXPECT_THAT(BlockAllocator::Create(Tier::kDram, -1),
              IsError(StatusCode::kInvalidArgument, "BlockAllocator(dram): capacity_blocks = -1"));
  EXPECT_THAT(BlockAllocator::Create(static_cast<Tier>(200), 8),
              IsError(StatusCode::kInvalidArgument, "tier 200 does not exist"));
  EXPECT_THAT(BlockAllocator::Create(Tier::kDram, BlockAllocator::kMaxCapacityBlocks + 1),
              IsError(StatusCode::kInvalidArgument, "capacity_blocks = 2147483649"));
}

TEST(BlockAllocatorTest, FullLifecycle) {
  auto a = Make(4);
  EXPECT_EQ(a->tier(), Tier::kHbm);
  EXPECT_EQ(a->capacity_blocks(), 4);
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId s, a->Allocate());
  EXPECT_EQ(StateOf(*a, s), SlotState::kWritable);
  EXPECT_EQ(*a->ref_count(s), 1u);
  ExpectAccounting(*a);
  KVTIER_ASSERT_OK(a->Seal(s));
  EXPECT_EQ(StateOf(*a, s), SlotState::kSealed);
  KVTIER_ASSERT_OK(a->Acquire(s));
  EXPECT_EQ(*a->ref_count(s), 2u);
  KVTIER_ASSERT_OK(a->Release(s));
  EXPECT_EQ(StateOf(*a, s), SlotState::kSealed);
  KVTIER_ASSERT_OK(a->Release(s));
  EXPECT_EQ(StateOf(*a, s), SlotState::kCached);
  EXPECT_EQ(*a->ref_count(s), 0u);
  EXPECT_EQ(a->counts().cached, 1);
  ExpectAccounting(*a);
  KVTIER_ASSERT_OK(a->Acquire(s));  // a hit revives a cached block
  EXPECT_EQ(StateOf(*a, s), SlotState::kSealed);
  KVTIER_ASSERT_OK(a->Release(s));
  KVTIER_ASSERT_OK(a->Evict(s));
  EXPECT_EQ(StateOf(*a, s), SlotState::kFree);
  EXPECT_EQ(a->free_blocks(), 4);
  ExpectAccounting(*a);
}

TEST(BlockAllocatorTest, WritableReleaseFreesAtOnce) {
  auto a = Make(2);
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId s, a->Allocate());
  KVTIER_ASSERT_OK(a->Release(s));
  EXPECT_EQ(StateOf(*a, s), SlotState::kFree);
  EXPECT_EQ(a->free_blocks(), 2);
}

TEST(BlockAllocatorTest, TransferStates) {
  auto a = Make(3);
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId ok, a->AllocateForTransfer());
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId cancelled, a->AllocateForTransfer());
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId failed, a->AllocateForTransfer());
  EXPECT_EQ(a->counts().in_flight, 3);
  EXPECT_EQ(*a->ref_count(ok), 0u);
  // An in-flight slot is neither freeable nor evictable nor reusable.
  EXPECT_THAT(a->Release(ok), IsError(StatusCode::kFailedPrecondition, "state in_flight"));
  EXPECT_THAT(a->Evict(ok), IsError(StatusCode::kFailedPrecondition, "cannot evict slot"));
  EXPECT_THAT(a->Allocate(), IsError(StatusCode::kResourceExhausted, "all 3 slots"));
  KVTIER_ASSERT_OK(a->CompleteTransfer(ok));
  EXPECT_EQ(StateOf(*a, ok), SlotState::kCached);
  KVTIER_ASSERT_OK(a->CancelTransfer(cancelled));
  EXPECT_EQ(StateOf(*a, cancelled), SlotState::kFree);
  KVTIER_ASSERT_OK(a->FailTransfer(failed));
  EXPECT_EQ(StateOf(*a, failed), SlotState::kQuarantined);
  EXPECT_EQ(a->counts().quarantined, 1);
  ExpectAccounting(*a);
  // A quarantined slot is not handed out again until it is reclaimed.
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId next, a->Allocate());
  EXPECT_NE(next, failed);
  EXPECT_THAT(a->Allocate(), IsError(StatusCode::kResourceExhausted, "in use"));
  KVTIER_ASSERT_OK(a->ReclaimQuarantined(failed));
  EXPECT_EQ(StateOf(*a, failed), SlotState::kFree);
  ExpectAccounting(*a);
}

TEST(BlockAllocatorTest, IllegalTransitionsFailAndChangeNothing) {
  auto a = Make(2);
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId w, a->Allocate());
  const SlotId free_slot(1);
  const SlotCounts before = a->counts();
  EXPECT_THAT(a->Acquire(w), IsError(StatusCode::kFailedPrecondition,
                                     "cannot acquire slot 0 in state writable"));
  EXPECT_THAT(a->Evict(w), IsError(StatusCode::kFailedPrecondition, "state writable"));
  EXPECT_THAT(a->CompleteTransfer(w), IsError(StatusCode::kFailedPrecondition, "state writable"));
  EXPECT_THAT(a->CancelTransfer(w), IsError(StatusCode::kFailedPrecondition, "state writable"));
  EXPECT_THAT(a->FailTransfer(w), IsError(StatusCode::kFailedPrecondition, "state writable"));
  EXPECT_THAT(a->ReclaimQuarantined(w), IsError(StatusCode::kFailedPrecondition, "reclaim"));
  EXPECT_THAT(a->Seal(free_slot), IsError(StatusCode::kFailedPrecondition, "seal slot 1 in state free"));
  EXPECT_THAT(a->Release(free_slot), IsError(StatusCode::kFailedPrecondition, "state free"));
  EXPECT_THAT(a->Acquire(free_slot), IsError(StatusCode::kFailedPrecondition, "state free"));
  KVTIER_ASSERT_OK(a->Seal(w));
  EXPECT_THAT(a->Seal(w), IsError(StatusCode::kFailedPrecondition, "state sealed"));
  EXPECT_THAT(a->Evict(w), IsError(StatusCode::kFailedPrecondition, "state sealed"));
  const SlotCounts after = a->counts();
  EXPECT_EQ(after.free, before.free);
  EXPECT_EQ(after.sealed, 1);
  ExpectAccounting(*a);
}

TEST(BlockAllocatorTest, OutOfRangeSlotIds) {
  auto a = Make(2);
  for (SlotId bad : {SlotId(2), SlotId(1000), SlotId()}) {
    EXPECT_THAT(a->Seal(bad), IsError(StatusCode::kInvalidArgument, "is outside [0, 2)"));
    EXPECT_THAT(a->Acquire(bad), IsError(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(a->Release(bad), IsError(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(a->Evict(bad), IsError(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(a->CompleteTransfer(bad), IsError(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(a->CancelTransfer(bad), IsError(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(a->FailTransfer(bad), IsError(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(a->ReclaimQuarantined(bad), IsError(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(a->state(bad), IsError(StatusCode::kInvalidArgument, "outside"));
    EXPECT_THAT(a->ref_count(bad), IsError(StatusCode::kInvalidArgument, "outside"));
  }
}

TEST(BlockAllocatorTest, ExhaustionThenReuse) {
  auto a = Make(3);
  absl::flat_hash_set<SlotId> seen;
  for (int i = 0; i < 3; ++i) {
    KVTIER_ASSERT_OK_AND_ASSIGN(SlotId s, a->Allocate());
    EXPECT_TRUE(seen.insert(s).second) << "slot handed out twice";
  }
  EXPECT_THAT(a->Allocate(), IsError(StatusCode::kResourceExhausted, "BlockAllocator(hbm)"));
  EXPECT_THAT(a->AllocateForTransfer(), IsError(StatusCode::kResourceExhausted, "all 3"));
  KVTIER_ASSERT_OK(a->Release(SlotId(1)));
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId again, a->Allocate());
  EXPECT_EQ(again, SlotId(1));
  ExpectAccounting(*a);
}

TEST(BlockAllocatorTest, RefCountCeiling) {
  auto a = Make(1);
  KVTIER_ASSERT_OK_AND_ASSIGN(SlotId s, a->Allocate());
  KVTIER_ASSERT_OK(a->Seal(s));
  for (uint32_t i = 1; i < BlockAllocator::kMaxRefCount; ++i) ASSERT_TRUE(a->Acquire(s).ok());
  EXPECT_EQ(*a->ref_count(s), BlockAllocator::kMaxRefCount);
  EXPECT_THAT(a->Acquire(s), IsError(StatusCode::kResourceExhausted, "references"));
  EXPECT_EQ(*a->ref_count(s), BlockAllocator::kMaxRefCount);
}

TEST(BlockAllocatorTest, StateNames) {
  EXPECT_EQ(SlotStateName(SlotState::kFree), "free");
  EXPECT_EQ(SlotStateName(SlotState::kWritable), "writable");
  EXPECT_EQ(SlotStateName(SlotState::kSealed), "sealed");
  EXPECT_EQ(SlotStateName(SlotState::kCached), "cached");
  EXPECT_EQ(SlotStateName(SlotState::kInFlight), "in_flight");
  EXPECT_EQ(SlotStateName(SlotState::kQuarantined), "quarantined");
  EXPECT_EQ(SlotStateName(static_cast<SlotState>(99)), "unknown");
}

// Random legal and illegal operations; the invariant and the recount hold after every one.
TEST(BlockAllocatorTest, InvariantAfterEveryRandomOperation) {
  auto a = Make(32);
  std::mt19937 rng(20261130);
  for (int step = 0; step < 5000; ++step) {
    const SlotId s(static_cast<uint32_t>(rng() % 33));  // sometimes out of range
    switch (rng() % 9) {
      case 0: (void)a->Allocate(); break;
      case 1: (void)a->AllocateForTransfer(); break;
      case 2: (void)a->Seal(s); break;
      case 3: (void)a->Acquire(s); break;
      case 4: (void)a->Release(s); break;
      case 5: (void)a->Evict(s); break;
      case 6: (void)a->CompleteTransfer(s); break;
      case 7: (void)(rng() % 2 ? a->FailTransfer(s) : a->CancelTransfer(s)); break;
      case 8: (void)a->ReclaimQuarantined(s); break;
    }
    ASSERT_EQ(a->counts().total(), 32) << "step " << step;
    ExpectAccounting(*a);
    if (::testing::Test::HasFailure()) FAIL() << "after step " << step;
  }
}

}  // namespace
}  // namespace kvtier
