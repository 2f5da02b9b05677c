// What broke: TransferEngine's threads (the deadline timer and the dispatcher) belonged to its
// shared state, and a callback running on one of them could hold the last reference to that
// state when the engine was destroyed; the state was then destroyed on that thread, which joined
// itself: std::terminate ("Resource deadlock avoided"), seen under ASan.
#include <memory>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_stack.h"

namespace kvtier {
namespace {

using Stack = ::kvtier::testing::TierStack;

TEST(Regress_EngineDestroyedUnderCallback, DestroyWhileTimerThreadRunsACallback) {
  auto s = std::make_unique<Stack>();
  const SlotId h = s->Put(Tier::kHbm, Stack::Key(1), Stack::Block(1));
  Completion never;
  TransferOptions options;
  options.deadline = absl::Now() + absl::Milliseconds(20);
  options.source_ready = never;
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t, s->engine->Copy(Stack::Key(1), Tier::kHbm, h, Tier::kDram,
                                                          options));
  // Fired on the timer thread when the deadline passes; keeps that thread busy meanwhile.
  t.completion.OnDone([](const absl::Status&) { absl::SleepFor(absl::Milliseconds(300)); });
  absl::SleepFor(absl::Milliseconds(100));  // the deadline has fired; the callback sleeps
  s.reset();  // destroys the engine while its timer thread is inside the callback
  absl::SleepFor(absl::Milliseconds(400));  // the callback returns; nothing may join itself
  EXPECT_TRUE(absl::IsDeadlineExceeded(t.completion.status()));
  never.Complete(absl::OkStatus());
}

}  // namespace
}  // namespace kvtier
