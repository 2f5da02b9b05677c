// LT-3: a sequence whose compute has not reported its tokens as written is offloaded: the
// offload waits for the compute completion and the stored bytes are the final ones.
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_stack.h"

namespace kvtier {
namespace {

using Stack = ::kvtier::testing::TierStack;

TEST(Regress_LT_3, OffloadStoresTheBytesComputeFinallyWrote) {
  for (Tier to : {Tier::kDram, Tier::kNvme}) {
    Stack s(4);
    // The block's slot exists with stale bytes; the kernel is still writing it.
    const SlotId h = s.Put(Tier::kHbm, Stack::Key(1), Stack::Block(666));
    Completion compute;
    TransferOptions options;
    options.source_ready = compute;
    KVTIER_ASSERT_OK_AND_ASSIGN(Transfer offload,
                                s.engine->Copy(Stack::Key(1), Tier::kHbm, h, to, options));
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_FALSE(offload.completion.done()) << "the offload ran before compute reported";
    std::thread kernel([&] {
      EXPECT_TRUE(s.hbm->WriteBlock(h, Stack::Key(1), Stack::Block(1)).Wait().ok());
      compute.Complete(absl::OkStatus());  // "tokens up to n are written"
    });
    KVTIER_ASSERT_OK(offload.completion.Wait());
    kernel.join();
    KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> stored,
                                s.Get(to, offload.destination, Stack::Key(1)));
    EXPECT_TRUE(stored == Stack::Block(1)) << "stale bytes stored in " << TierName(to);
  }
}

}  // namespace
}  // namespace kvtier
