// The accounting invariant of DESIGN section 5, checked against an independent recount.
#ifndef KVTIER_TESTS_TESTING_ACCOUNTING_H_
#define KVTIER_TESTS_TESTING_ACCOUNTING_H_

#include <array>
#include <cstdint>

#include "gtest/gtest.h"
#include "kvtier/block_allocator.h"

namespace kvtier::testing {

// free + used + quarantined == capacity, and every counter equals a recount of slot states.
inline void ExpectAccounting(const BlockAllocator& allocator) {
  const SlotCounts c = allocator.counts();
  EXPECT_EQ(c.free + c.used() + c.quarantined, allocator.capacity_blocks());
  std::array<int64_t, kNumSlotStates> recount{};
  for (int64_t i = 0; i < allocator.capacity_blocks(); ++i) {
    auto state = allocator.state(SlotId(static_cast<uint32_t>(i)));
    ASSERT_TRUE(state.ok()) << state.status();
    ++recount[static_cast<size_t>(*state)];
  }
  EXPECT_EQ(c.free, recount[static_cast<size_t>(SlotState::kFree)]);
  EXPECT_EQ(c.writable, recount[static_cast<size_t>(SlotState::kWritable)]);
  EXPECT_EQ(c.sealed, recount[static_cast<size_t>(SlotState::kSealed)]);
  EXPECT_EQ(c.cached, recount[static_cast<size_t>(SlotState::kCached)]);
  EXPECT_EQ(c.in_flight, recount[static_cast<size_t>(SlotState::kInFlight)]);
  EXPECT_EQ(c.quarantined, recount[static_cast<size_t>(SlotState::kQuarantined)]);
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_ACCOUNTING_H_
