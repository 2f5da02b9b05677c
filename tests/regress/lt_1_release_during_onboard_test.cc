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
  s.hbm->SetDelay(absl::Milliseconds(200));  // the onboard is still running when A is released
  const SlotId d0 = s.Put(Tier::kDram, Stack::Key(0), Stack::Block(0));
  const SlotId d1 = s.Put(Tier::kDram, Stack::Key(1), Stack::Block(1));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer a0, s.engine->Copy(Stack::Key(0), Tier::kDram, d0, Tier::kHbm));
  // A's second block has a deadline that passes mid-copy: its slot must stay out of reach until
  // the late write is known done.
  TransferOptions soon;
  soon.deadline = absl::Now() + absl::Milliseconds(20);
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer a1,
                              s.engine->Copy(Stack::Key(1), Tier::kDram, d1, Tier::kHbm, soon));
  // "Release A": nobody waits for or holds A's blocks any more.
  // Sequence B takes every HBM slot it can get while A's copies are in flight.
  absl::flat_hash_set<SlotId> b_slots;
  std::vector<std::unique_ptr<PageTable>> b;
  KVTIER_ASSERT_OK(s.engine->WithAllocator(Tier::kHbm, [&](BlockAllocator& alloc) -> absl::Status {
    auto table = PageTable::Create(SequenceId(2), &alloc, 8);
    if (!table.ok()) return table.status();
    auto appended = (*table)->Append(std::vector<int32_t>(16, 7));  // two blocks
    if (!appended.ok()) return appended.status();
    for (SlotId slot : (*table)->block_table()) b_slots.insert(slot);
    EXPECT_TRUE(absl::IsResourceExhausted((*table)->Append(std::vector<int32_t>(8, 7)).status()))
        << "B got a third slot: one of A's in-flight slots";
    b.push_back(std::move(*table));
    return absl::OkStatus();
  }));
  EXPECT_FALSE(b_slots.contains(a0.destination));
  EXPECT_FALSE(b_slots.contains(a1.destination));
  // B's kernel writes B's bytes into B's slots.
  for (SlotId slot : b_slots) {
    KVTIER_ASSERT_OK(s.hbm->WriteBlock(slot, Stack::Key(100 + slot.value()), Stack::Block(100)).Wait());
  }
  KVTIER_ASSERT_OK(a0.completion.Wait());
  EXPECT_TRUE(absl::IsDeadlineExceeded(a1.completion.Wait()));
  // A's late copies landed in A's slots only: B still reads its own bytes.
  for (SlotId slot : b_slots) {
    KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back,
                                s.Get(Tier::kHbm, slot, Stack::Key(100 + slot.value())));
    EXPECT_TRUE(back == Stack::Block(100)) << "slot " << slot.value() << " holds A's bytes";
  }
  // Once A's timed-out copy is known done, its slot is free again, and only then.
  for (int i = 0; i < 400 && s.StateOf(Tier::kHbm, a1.destination) != SlotState::kFree; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(s.StateOf(Tier::kHbm, a1.destination), SlotState::kFree);
  KVTIER_ASSERT_OK(s.engine->WithAllocator(Tier::kHbm, [&](BlockAllocator&) {
    return b[0]->Release();
  }));
}

}  // namespace
}  // namespace kvtier
