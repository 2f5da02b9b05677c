// IO-3: an onboard from NVMe fails (injected EIO): those blocks are reported not resident, the
// stats count a failed load and no delivered block, and the HBM slots never hold stale bytes
// that the caller could read as valid.
//
// At the transfer-engine level: the KvCache ticket that reports per-block residency is the next
// issue's; here the failed Completion is that report.
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_stack.h"

namespace kvtier {
namespace {

using Stack = ::kvtier::testing::TierStack;

TEST(Regress_IO_3, FailedNvmeOnboardIsNotResidentAndLeavesNoValidBytes) {
  Stack s(4);
  // An HBM slot that once held another block (stale bytes), now free again.
  const SlotId old = s.Put(Tier::kHbm, Stack::Key(99), Stack::Block(99));
  KVTIER_ASSERT_OK(s.engine->WithAllocator(Tier::kHbm, [&](BlockAllocator& a) { return a.Evict(old); }));
  const SlotId n = s.Put(Tier::kNvme, Stack::Key(1), Stack::Block(1));

  s.nvme->FailNextReads(1, absl::UnavailableError("injected EIO"));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t, s.engine->Copy(Stack::Key(1), Tier::kNvme, n, Tier::kHbm));
  // The free list is LIFO: the onboard was given exactly the slot with the stale bytes.
  ASSERT_EQ(t.destination, old);
  EXPECT_THAT(t.completion.Wait(), testing::IsError(absl::StatusCode::kUnavailable, "injected EIO"));
  const TransferStats st = s.engine->stats(Tier::kNvme, Tier::kHbm);
  EXPECT_EQ(st.failures, 1);
  EXPECT_EQ(st.blocks, 0);
  EXPECT_EQ(st.bytes, 0);
  // Not resident: the destination slot is free again, and reading it as the block fails.
  EXPECT_EQ(s.StateOf(Tier::kHbm, t.destination), SlotState::kFree);
  EXPECT_FALSE(s.Get(Tier::kHbm, t.destination, Stack::Key(1)).ok());
  EXPECT_FALSE(s.Get(Tier::kHbm, old, Stack::Key(1)).ok());
  // The NVMe copy is intact and a retry succeeds.
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer retry, s.engine->Copy(Stack::Key(1), Tier::kNvme, n, Tier::kHbm));
  KVTIER_ASSERT_OK(retry.completion.Wait());
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, s.Get(Tier::kHbm, retry.destination, Stack::Key(1)));
  EXPECT_TRUE(back == Stack::Block(1));
}

}  // namespace
}  // namespace kvtier
