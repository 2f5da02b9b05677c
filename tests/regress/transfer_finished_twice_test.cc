// What broke: a waiting transfer whose source_ready failed right at its deadline could be ended
// twice, once by the dispatcher (the failure) and once by the deadline timer. The second end
// counted the failure again and "cancelled" its destination slot a second time, although by
// then the slot could belong to another transfer, which would then complete into a free slot.
// Found in review; the race needs many tries, so this test makes thousands, bounded in time.
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_stack.h"

namespace kvtier {
namespace {

using Stack = ::kvtier::testing::TierStack;

TEST(Regress_TransferFinishedTwice, FailureAtTheDeadlineEndsTheTransferOnce) {
  Stack s(4);
  const SlotId h = s.Put(Tier::kHbm, Stack::Key(1), Stack::Block(1));
  std::mt19937 rng(7);
  int64_t ended = 0;
  const absl::Time stop = absl::Now() + absl::Seconds(3);
  for (int i = 0; i < 5000 && absl::Now() < stop; ++i) {
    Completion compute;
    TransferOptions options;
    options.deadline = absl::Now() + absl::Microseconds(500);
    options.source_ready = compute;
    KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t,
                                s.engine->Copy(Stack::Key(1), Tier::kHbm, h, Tier::kDram, options));
    const absl::Time fail_at =
        options.deadline + absl::Microseconds(static_cast<int>(rng() % 200) - 100);
    while (absl::Now() < fail_at) {
    }
    compute.Complete(absl::AbortedError("kernel failed"));
    EXPECT_FALSE(t.completion.Wait().ok());
    while (s.engine->in_flight() != 0) absl::SleepFor(absl::Microseconds(50));
    ++ended;
    ASSERT_EQ(s.engine->stats(Tier::kHbm, Tier::kDram).failures, ended)
        << "transfer " << i << " was ended twice";
    ASSERT_EQ(s.StateOf(Tier::kDram, t.destination), SlotState::kFree);
  }
  // Every DRAM slot is free again: none was left in flight or freed twice.
  KVTIER_ASSERT_OK(s.engine->WithAllocator(Tier::kDram, [](BlockAllocator& a) {
    return a.counts().free == a.capacity_blocks()
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat(a.counts().free, " free slots"));
  }));
}

}  // namespace
}  // namespace kvtier
