// LT-1: start an onboard into HBM slots for sequence A, release A while the copy is in flight,
// allocate sequence B: B never receives A's slots until the copy has completed or been
// confirmed dead, and B's blocks never hold A's bytes.
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "kvtier/page_table.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_stack.h"

namespace kvtier {
namespace {

using Stack = ::kvtier::testing::TierStack;

TEST(Regress_LT_1, InFlightOnboardSlotsAreNeverHandedToAnotherSequence) {
  Stack s(4);
  // A's copies into HBM take 300 ms each (one after the other): they are still running when A
  // is released and when A's second copy passes its deadline.
  s.hbm->SetDelay(absl::Milliseconds(300));
  const SlotId d0 = s.Put(Tier::kDram, Stack::Key(0), Stack::Block(0));
  const SlotId d1 = s.Put(Tier::kDram, Stack::Key(1), Stack::Block(1));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer a0, s.engine->Copy(Stack::Key(0), Tier::kDram, d0, Tier::kHbm));
  TransferOptions soon;
  soon.deadline = absl::Now() + absl::Milliseconds(100);
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer a1,
                              s.engine->Copy(Stack::Key(1), Tier::kDram, d1, Tier::kHbm, soon));
  // Both copies have started (their sources are pinned) before anything else happens.
  for (int i = 0; i < 1000 && (s.StateOf(Tier::kDram, d0) != SlotState::kSealed ||
                               s.StateOf(Tier::kDram, d1) != SlotState::kSealed);
       ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  // A's second copy passes its deadline mid-flight: A gives up on it ("release A"), but its write
  // may still land, so its slot must stay out of reach.
  EXPECT_TRUE(absl::IsDeadlineExceeded(a1.completion.Wait()));
  EXPECT_EQ(s.StateOf(Tier::kHbm, a1.destination), SlotState::kQuarantined);
  EXPECT_FALSE(a0.completion.done());

  // Sequence B takes every HBM slot it can get, and its kernel writes B's bytes at once (not
  // delayed), so a late write of A into one of B's slots would overwrite them.
  s.hbm->SetDelay(absl::ZeroDuration());
  absl::flat_hash_set<SlotId> b_slots;
  std::unique_ptr<PageTable> b;
  KVTIER_ASSERT_OK(s.engine->WithAllocator(Tier::kHbm, [&](BlockAllocator& alloc) -> absl::Status {
    auto table = PageTable::Create(SequenceId(2), &alloc, 8);
    if (!table.ok()) return table.status();
    auto appended = (*table)->Append(std::vector<int32_t>(16, 7));  // two blocks
    if (!appended.ok()) return appended.status();
    EXPECT_TRUE(absl::IsResourceExhausted((*table)->Append(std::vector<int32_t>(8, 7)).status()))
        << "B got a third slot: one of A's in-flight or quarantined slots";
    b = std::move(*table);
    return absl::OkStatus();
  }));
  for (SlotId slot : b->block_table()) b_slots.insert(slot);
  EXPECT_FALSE(b_slots.contains(a0.destination));
  EXPECT_FALSE(b_slots.contains(a1.destination));
  for (SlotId slot : b_slots) {
    KVTIER_ASSERT_OK(s.hbm->WriteBlock(slot, Stack::Key(100 + slot.value()), Stack::Block(100)).Wait());
  }

  // A's copies land (a0 completes, a1's late write is known done): only then is a1's slot free.
  KVTIER_ASSERT_OK(a0.completion.Wait());
  for (int i = 0; i < 1000 && s.StateOf(Tier::kHbm, a1.destination) != SlotState::kFree; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(s.StateOf(Tier::kHbm, a1.destination), SlotState::kFree);
  // B's blocks still hold B's bytes.
  for (SlotId slot : b_slots) {
    KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back,
                                s.Get(Tier::kHbm, slot, Stack::Key(100 + slot.value())));
    EXPECT_TRUE(back == Stack::Block(100)) << "slot " << slot.value() << " holds A's bytes";
  }
  KVTIER_ASSERT_OK(s.engine->WithAllocator(Tier::kHbm, [&](BlockAllocator&) { return b->Release(); }));
}

}  // namespace
}  // namespace kvtier
