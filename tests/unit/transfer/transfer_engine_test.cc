#include "kvtier/transfer_engine.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/status_macros.h"
#include "kvtier/dram_tier.h"
#include "kvtier/emulated_hbm.h"
#include "kvtier/metadata_tier.h"
#include "kvtier/nvme_tier.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_stack.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;
using Stack = ::kvtier::testing::TierStack;

// Polls until the slot reaches `want` or five seconds pass.
bool Eventually(Stack& s, Tier t, SlotId slot, SlotState want) {
  for (int i = 0; i < 1000; ++i) {
    if (s.StateOf(t, slot) == want) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

TEST(TransferEngineTest, CreateRejectsBadOptions) {
  EXPECT_THAT(TransferEngine::Create({}), IsError(StatusCode::kInvalidArgument, "no tier given"));
  Stack s;
  TransferEngineOptions wrong_index;
  wrong_index.tiers[TierIndex(Tier::kNvme)] = s.dram;
  EXPECT_THAT(TransferEngine::Create(wrong_index),
              IsError(StatusCode::kInvalidArgument, "dram backend is at the index of nvme"));
  auto other = EmulatedHbm::Create(*KvGeometry::Create({.num_layers = 1, .num_kv_heads = 1,
                                                        .head_dim = 8}),
                                   {.capacity_blocks = 2});
  TransferEngineOptions mixed;
  mixed.tiers[TierIndex(Tier::kHbm)] = other->get();
  mixed.tiers[TierIndex(Tier::kDram)] = s.dram;
  EXPECT_THAT(TransferEngine::Create(mixed), IsError(StatusCode::kInvalidArgument, "-byte blocks"));
  TransferEngineOptions no_bounce;
  no_bounce.tiers[TierIndex(Tier::kDram)] = s.dram;
  no_bounce.bounce_buffers = 0;
  EXPECT_THAT(TransferEngine::Create(no_bounce),
              IsError(StatusCode::kInvalidArgument, "bounce_buffers = 0"));
}

// Two MetadataTiers (kCapInlineIo): a copy that can start at once runs inside Copy, so its
// Completion has fired and the destination is cached when Copy returns; one whose source_ready
// is still pending queues and runs when it fires, as between any other tiers.
TEST(TransferEngineTest, CopyBetweenInlineTiersFinishesInsideCopy) {
  const KvGeometry g = *KvGeometry::Create({.num_layers = 1, .num_kv_heads = 1, .head_dim = 8});
  auto hbm = MetadataTier::Create(g, {.tier = Tier::kHbm, .capacity_blocks = 4});
  auto dram = MetadataTier::Create(g, {.tier = Tier::kDram, .capacity_blocks = 4});
  ASSERT_TRUE(hbm.ok() && dram.ok());
  ASSERT_NE((*hbm)->info().capabilities & kCapInlineIo, 0u);
  TransferEngineOptions options;
  options.tiers[TierIndex(Tier::kHbm)] = hbm->get();
  options.tiers[TierIndex(Tier::kDram)] = dram->get();
  options.bounce_buffers = 1;
  auto engine = TransferEngine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  SlotId src;
  ASSERT_TRUE((*engine)
                  ->WithAllocator(Tier::kHbm,
                                  [&](BlockAllocator& a) -> absl::Status {
                                    KVTIER_ASSIGN_OR_RETURN(src, a.Allocate());
                                    return a.Seal(src);
                                  })
                  .ok());
  std::vector<std::byte> bytes(static_cast<size_t>(g.bytes_per_block()));
  ASSERT_TRUE((*hbm)->WriteBlock(src, Stack::Key(1), bytes).Wait().ok());

  absl::StatusOr<Transfer> now = (*engine)->Copy(Stack::Key(1), Tier::kHbm, src, Tier::kDram);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_TRUE(now->completion.done());
  EXPECT_TRUE(now->completion.status().ok()) << now->completion.status();
  EXPECT_EQ((*engine)->in_flight(), 0);
  SlotState state = SlotState::kFree;
  ASSERT_TRUE((*engine)
                  ->WithAllocator(Tier::kDram,
                                  [&](BlockAllocator& a) -> absl::Status {
                                    KVTIER_ASSIGN_OR_RETURN(state, a.state(now->destination));
                                    return absl::OkStatus();
                                  })
                  .ok());
  EXPECT_EQ(state, SlotState::kCached);
  EXPECT_TRUE(
      (*dram)->ReadBlock(now->destination, Stack::Key(1), absl::MakeSpan(bytes)).Wait().ok());

  Completion compute;
  TransferOptions later;
  later.source_ready = compute;
  absl::StatusOr<Transfer> queued =
      (*engine)->Copy(Stack::Key(1), Tier::kDram, now->destination, Tier::kHbm, later);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_FALSE(queued->completion.done());
  compute.Complete(absl::OkStatus());
  EXPECT_TRUE(queued->completion.WaitUntil(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ((*engine)->in_flight(), 0);
}

TEST(TransferEngineTest, CopyRejectsBadRequestsWithoutAllocating) {
  Stack s;
  const SlotId src = s.Put(Tier::kDram, Stack::Key(1), Stack::Block(1));
  EXPECT_THAT(s.engine->Copy(Stack::Key(1), Tier::kDram, src, Tier::kRemote),
              IsError(StatusCode::kInvalidArgument, "no destination tier 3"));
  EXPECT_THAT(s.engine->Copy(Stack::Key(1), Tier::kDram, src, Tier::kDram),
              IsError(StatusCode::kInvalidArgument, "both dram"));
  EXPECT_THAT(s.engine->Copy(Stack::Key(1), Tier::kDram, SlotId(99), Tier::kHbm),
              IsError(StatusCode::kInvalidArgument, "slot 99 is outside"));
  EXPECT_THAT(s.engine->Copy(Stack::Key(1), Tier::kDram, SlotId(3), Tier::kHbm),
              IsError(StatusCode::kFailedPrecondition, "dram slot 3, is free"));
  for (uint32_t i = 0; i < 4; ++i) s.Put(Tier::kHbm, Stack::Key(10 + i), Stack::Block(10 + i));
  EXPECT_THAT(s.engine->Copy(Stack::Key(1), Tier::kDram, src, Tier::kHbm),
              IsError(StatusCode::kResourceExhausted, "all 4 slots"));
  EXPECT_EQ(s.engine->in_flight(), 0);
  EXPECT_EQ(s.engine->stats(Tier::kDram, Tier::kHbm).operations, 0);
}

TEST(TransferEngineTest, EveryPathDeliversTheSameBytes) {
  Stack s;
  const std::vector<std::byte> data = Stack::Block(42);
  const BlockKey key = Stack::Key(42);
  const SlotId h0 = s.Put(Tier::kHbm, key, data);
  // HBM -> DRAM (read into a host slot), DRAM -> NVMe (write from a host slot),
  // NVMe -> HBM (staged through a bounce buffer), HBM -> NVMe (staged), NVMe -> DRAM.
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t1, s.engine->Copy(key, Tier::kHbm, h0, Tier::kDram));
  KVTIER_ASSERT_OK(t1.completion.Wait());
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t2,
                              s.engine->Copy(key, Tier::kDram, t1.destination, Tier::kNvme));
  KVTIER_ASSERT_OK(t2.completion.Wait());
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t3,
                              s.engine->Copy(key, Tier::kNvme, t2.destination, Tier::kHbm));
  KVTIER_ASSERT_OK(t3.completion.Wait());
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t4, s.engine->Copy(key, Tier::kHbm, h0, Tier::kNvme));
  KVTIER_ASSERT_OK(t4.completion.Wait());
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t5,
                              s.engine->Copy(key, Tier::kNvme, t4.destination, Tier::kDram));
  KVTIER_ASSERT_OK(t5.completion.Wait());
  for (auto [tier, slot] : {std::pair{Tier::kDram, t1.destination}, {Tier::kNvme, t2.destination},
                            {Tier::kHbm, t3.destination}, {Tier::kNvme, t4.destination},
                            {Tier::kDram, t5.destination}}) {
    KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, s.Get(tier, slot, key));
    EXPECT_TRUE(back == data) << TierName(tier) << " slot " << slot.value();
    EXPECT_EQ(s.StateOf(tier, slot), SlotState::kCached);
  }
  EXPECT_EQ(s.StateOf(Tier::kHbm, h0), SlotState::kCached);  // the source pin was dropped
  const TransferStats st = s.engine->stats(Tier::kNvme, Tier::kHbm);
  EXPECT_EQ(st.operations, 1);
  EXPECT_EQ(st.blocks, 1);
  EXPECT_EQ(st.bytes, Stack::Geometry().bytes_per_block());
  EXPECT_EQ(st.failures, 0);
  EXPECT_GT(st.bandwidth_bytes_per_second, 0);
  EXPECT_EQ(s.engine->in_flight(), 0);
}

// Found in review: the destructor returned once no transfer was in flight, while the thread
// that ended the last one could still be running its Completion's callbacks (which the owner
// may then outlive). It now waits for them too.
TEST(TransferEngineTest, DestructionWaitsForTheLastCompletionsCallbacks) {
  Stack s;
  const SlotId src = s.Put(Tier::kNvme, Stack::Key(1), Stack::Block(1));
  s.tier(Tier::kNvme)->SetDelay(absl::Milliseconds(100));  // completes on the delay thread
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t,
                              s.engine->Copy(Stack::Key(1), Tier::kNvme, src, Tier::kDram));
  std::atomic<bool> entered{false};
  std::atomic<bool> finished{false};
  t.completion.OnDone([&](const absl::Status&) {
    entered = true;
    absl::SleepFor(absl::Milliseconds(300));
    finished = true;
  });
  for (int i = 0; i < 500 && !entered; ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(entered);
  s.engine.reset();
  EXPECT_TRUE(finished) << "the engine was gone while its completion's callback still ran";
}

// Found in review: the engine's one dispatcher thread starts copies, and NvmeTier::WriteBlock
// waited there for a staging buffer while a slow device held them all (up to the copy's
// deadline). Every other copy, a DRAM -> HBM onboard too, waited behind it and missed its own
// deadline. The tier now queues such a write and returns at once.
TEST(TransferEngineTest, ASlowNvmeDoesNotHoldUpOtherTiersCopies) {
  const KvGeometry g = Stack::Geometry();
  testing::TempDir dir;
  auto nvme = NvmeTier::Create(g, {.path = dir.File("nvme.bin"),
                                   .capacity_bytes = 4 * NvmeTier::SlotBytes(g),
                                   .queue_depth = 1,
                                   .engine = NvmeEngine::kIoUring});
  if (!nvme.ok() && absl::IsUnavailable(nvme.status())) {
    GTEST_SKIP() << "the io_uring NVMe tier cannot run here: " << nvme.status().message();
  }
  ASSERT_TRUE(nvme.ok()) << nvme.status();
  auto hbm = EmulatedHbm::Create(g, {.capacity_blocks = 4});
  auto dram = DramTier::Create(
      g,
      {.capacity_bytes = 4 * g.bytes_per_block(), .try_huge_pages = false, .pin_for_cuda = false});
  ASSERT_TRUE(hbm.ok() && dram.ok());
  TransferEngineOptions options;
  options.tiers[TierIndex(Tier::kHbm)] = hbm->get();
  options.tiers[TierIndex(Tier::kDram)] = dram->get();
  options.tiers[TierIndex(Tier::kNvme)] = nvme->get();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<TransferEngine> engine,
                              TransferEngine::Create(options));
  std::vector<SlotId> in_dram;
  for (uint64_t i = 0; i < 3; ++i) {
    SlotId slot;
    KVTIER_ASSERT_OK(engine->WithAllocator(Tier::kDram, [&](BlockAllocator& a) -> absl::Status {
      KVTIER_ASSIGN_OR_RETURN(slot, a.Allocate());
      return absl::OkStatus();
    }));
    KVTIER_ASSERT_OK((*dram)->WriteBlock(slot, Stack::Key(i), Stack::Block(i)).Wait());
    KVTIER_ASSERT_OK(engine->WithAllocator(Tier::kDram, [&](BlockAllocator& a) {
      absl::Status s = a.Seal(slot);
      return s.ok() ? a.Release(slot) : s;
    }));
    in_dram.push_back(slot);
  }

  // The device answers nothing: the first offload holds the one staging buffer.
  (*nvme)->HoldCompletionsForTest(true);
  const absl::Time far = absl::Now() + absl::Seconds(30);
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer first, engine->Copy(Stack::Key(0), Tier::kDram, in_dram[0],
                                                           Tier::kNvme, {.deadline = far}));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer second, engine->Copy(Stack::Key(1), Tier::kDram, in_dram[1],
                                                            Tier::kNvme, {.deadline = far}));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer onboard,
                              engine->Copy(Stack::Key(2), Tier::kDram, in_dram[2], Tier::kHbm,
                                           {.deadline = absl::Now() + absl::Seconds(3)}));
  KVTIER_EXPECT_OK(onboard.completion.Wait());
  EXPECT_FALSE(first.completion.done());
  EXPECT_FALSE(second.completion.done());

  (*nvme)->HoldCompletionsForTest(false);
  KVTIER_EXPECT_OK(first.completion.Wait());
  KVTIER_EXPECT_OK(second.completion.Wait());
  std::vector<std::byte> back(static_cast<size_t>(g.bytes_per_block()));
  KVTIER_EXPECT_OK(
      (*nvme)->ReadBlock(second.destination, Stack::Key(1), absl::MakeSpan(back)).Wait());
  EXPECT_TRUE(back == Stack::Block(1));
  engine.reset();
}

// Copies queued with defer_start wait for StartDeferred, then start together: the reads of one
// source tier reach it as one ReadBlocks, both into a host-addressable destination (NVMe ->
// DRAM) and staged through bounce buffers (NVMe -> HBM, as many as there are buffers).
TEST(TransferEngineTest, DeferredCopiesReadEachSourceTierInOneBatch) {
  Stack s(8);
  std::vector<SlotId> src;
  for (uint32_t i = 0; i < 8; ++i)
    src.push_back(s.Put(Tier::kNvme, Stack::Key(i), Stack::Block(i)));
  std::vector<Transfer> to_dram;
  std::vector<Transfer> to_hbm;
  TransferOptions deferred;
  deferred.defer_start = true;
  for (uint32_t i = 0; i < 4; ++i) {
    KVTIER_ASSERT_OK_AND_ASSIGN(
        Transfer t, s.engine->Copy(Stack::Key(i), Tier::kNvme, src[i], Tier::kDram, deferred));
    to_dram.push_back(t);
    KVTIER_ASSERT_OK_AND_ASSIGN(Transfer u, s.engine->Copy(Stack::Key(4 + i), Tier::kNvme,
                                                           src[4 + i], Tier::kHbm, deferred));
    to_hbm.push_back(u);
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(s.nvme->read_batches().empty()) << "started before StartDeferred";
  EXPECT_EQ(s.engine->in_flight(), 8);
  EXPECT_FALSE(to_dram[0].completion.done());
  s.engine->StartDeferred();
  for (uint32_t i = 0; i < 4; ++i) {
    KVTIER_ASSERT_OK(to_dram[i].completion.Wait());
    KVTIER_ASSERT_OK(to_hbm[i].completion.Wait());
    KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> d,
                                s.Get(Tier::kDram, to_dram[i].destination, Stack::Key(i)));
    EXPECT_TRUE(d == Stack::Block(i)) << "DRAM block " << i;
    KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> h,
                                s.Get(Tier::kHbm, to_hbm[i].destination, Stack::Key(4 + i)));
    EXPECT_TRUE(h == Stack::Block(4 + i)) << "HBM block " << i;
  }
  // One pass started all 8 (4 bounce buffers for the 4 staged ones): one batch of 8 reads.
  EXPECT_THAT(s.nvme->read_batches(), ::testing::ElementsAre(8u));
  EXPECT_EQ(s.engine->stats(Tier::kNvme, Tier::kDram).blocks, 4);
  EXPECT_EQ(s.engine->stats(Tier::kNvme, Tier::kHbm).blocks, 4);
  EXPECT_EQ(s.engine->in_flight(), 0);
}

// Deferred copies of two batches (two requests) that start in one pass share no backend call:
// NVMe reads go as one ReadBlocks per batch, and layer-wise writes from DRAM into HBM as one
// layer-major WriteBlocks per batch, each under its own batch's deadline (the calls still queue
// on the tier's one copy stream). Copies that name no batch (0) share one call, as before.
TEST(TransferEngineTest, DeferredCopiesOfTwoBatchesShareNoBackendCall) {
  for (const bool batched : {true, false}) {
    SCOPED_TRACE(batched ? "batches 1 and 2" : "no batch");
    Stack s(16);
    std::vector<Transfer> copies;
    auto progress = std::make_shared<LayerProgress>();
    progress->landed = [](int) {};
    for (uint32_t i = 0; i < 6; ++i) {
      TransferOptions o;
      o.defer_start = true;
      o.batch = batched ? 1 + i % 2 : 0;
      const SlotId n = s.Put(Tier::kNvme, Stack::Key(i), Stack::Block(i));
      KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t,
                                  s.engine->Copy(Stack::Key(i), Tier::kNvme, n, Tier::kDram, o));
      copies.push_back(t);
      if (i < 4) {
        const SlotId d = s.Put(Tier::kDram, Stack::Key(10 + i), Stack::Block(10 + i));
        o.layers = progress;
        KVTIER_ASSERT_OK_AND_ASSIGN(
            Transfer u, s.engine->Copy(Stack::Key(10 + i), Tier::kDram, d, Tier::kHbm, o));
        copies.push_back(u);
      }
    }
    s.engine->StartDeferred();
    for (const Transfer& t : copies) KVTIER_ASSERT_OK(t.completion.Wait());
    if (batched) {
      EXPECT_THAT(s.nvme->read_batches(), ::testing::ElementsAre(3u, 3u));
      EXPECT_THAT(s.hbm->write_batches(), ::testing::ElementsAre(2u, 2u));
    } else {
      EXPECT_THAT(s.nvme->read_batches(), ::testing::ElementsAre(6u));
      EXPECT_THAT(s.hbm->write_batches(), ::testing::ElementsAre(4u));
    }
    for (uint32_t i = 0; i < 4; ++i) {
      KVTIER_ASSERT_OK_AND_ASSIGN(
          std::vector<std::byte> h,
          s.Get(Tier::kHbm, copies[2 * i + 1].destination, Stack::Key(10 + i)));
      EXPECT_TRUE(h == Stack::Block(10 + i)) << "HBM block " << i;
    }
    EXPECT_EQ(s.engine->in_flight(), 0);
  }
}

// A deferred copy nobody starts only ages toward its deadline, and fails by it with its slots
// untouched.
TEST(TransferEngineTest, DeferredCopyNeverStartedEndsByItsDeadline) {
  Stack s;
  const SlotId n = s.Put(Tier::kNvme, Stack::Key(1), Stack::Block(1));
  KVTIER_ASSERT_OK_AND_ASSIGN(
      Transfer t,
      s.engine->Copy(Stack::Key(1), Tier::kNvme, n, Tier::kDram,
                     {.deadline = absl::Now() + absl::Milliseconds(50), .defer_start = true}));
  EXPECT_THAT(t.completion.Wait(), IsError(StatusCode::kDeadlineExceeded, "deadline"));
  EXPECT_EQ(s.StateOf(Tier::kDram, t.destination), SlotState::kFree);
  EXPECT_EQ(s.StateOf(Tier::kNvme, n), SlotState::kCached);
  EXPECT_TRUE(s.nvme->read_batches().empty());
}

TEST(TransferEngineTest, ChainedCopyWaitsForItsArrivingSource) {
  Stack s;
  s.nvme->SetDelay(absl::Milliseconds(100));
  const SlotId n = s.Put(Tier::kNvme, Stack::Key(5), Stack::Block(5));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer up, s.engine->Copy(Stack::Key(5), Tier::kNvme, n, Tier::kDram));
  // Submitted before the first arrives: its source is still in flight, so it waits.
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer on,
                              s.engine->Copy(Stack::Key(5), Tier::kDram, up.destination, Tier::kHbm));
  KVTIER_ASSERT_OK(on.completion.Wait());
  EXPECT_TRUE(up.completion.done());
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, s.Get(Tier::kHbm, on.destination, Stack::Key(5)));
  EXPECT_TRUE(back == Stack::Block(5));
}

TEST(TransferEngineTest, SourceIsPinnedWhileCopied) {
  Stack s;
  s.hbm->SetDelay(absl::Milliseconds(400));
  const SlotId d = s.Put(Tier::kDram, Stack::Key(6), Stack::Block(6));
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t, s.engine->Copy(Stack::Key(6), Tier::kDram, d, Tier::kHbm));
  ASSERT_TRUE(Eventually(s, Tier::kDram, d, SlotState::kSealed));
  EXPECT_THAT(s.engine->WithAllocator(Tier::kDram, [&](BlockAllocator& a) { return a.Evict(d); }),
              IsError(StatusCode::kFailedPrecondition, "state sealed"));
  KVTIER_ASSERT_OK(t.completion.Wait());
  EXPECT_EQ(s.StateOf(Tier::kDram, d), SlotState::kCached);
  KVTIER_EXPECT_OK(s.engine->WithAllocator(Tier::kDram, [&](BlockAllocator& a) { return a.Evict(d); }));
}

TEST(TransferEngineTest, DeadlineWhileRunningQuarantinesUntilKnownDone) {
  Stack s;
  s.hbm->SetDelay(absl::Milliseconds(500));
  const SlotId d = s.Put(Tier::kDram, Stack::Key(7), Stack::Block(7));
  TransferOptions soon;
  soon.deadline = absl::Now() + absl::Milliseconds(100);
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t,
                              s.engine->Copy(Stack::Key(7), Tier::kDram, d, Tier::kHbm, soon));
  EXPECT_THAT(t.completion.WaitFor(absl::Milliseconds(350)),
              IsError(StatusCode::kDeadlineExceeded, "passed its deadline"));
  EXPECT_EQ(s.StateOf(Tier::kHbm, t.destination), SlotState::kQuarantined);
  EXPECT_EQ(s.engine->stats(Tier::kDram, Tier::kHbm).failures, 1);
  // The write lands later; only then is the slot known done and free again.
  EXPECT_TRUE(Eventually(s, Tier::kHbm, t.destination, SlotState::kFree));
  EXPECT_EQ(s.StateOf(Tier::kDram, d), SlotState::kCached);
  EXPECT_EQ(s.engine->in_flight(), 0);
}

TEST(TransferEngineTest, SourceReadyGatesAndFails) {
  Stack s;
  const SlotId h = s.Put(Tier::kHbm, Stack::Key(8), Stack::Block(8));
  Completion compute;
  KVTIER_ASSERT_OK_AND_ASSIGN(
      Transfer waits, s.engine->Copy(Stack::Key(8), Tier::kHbm, h, Tier::kDram,
                                     {.deadline = absl::Now() + absl::Milliseconds(30),
                                      .source_ready = compute}));
  EXPECT_THAT(waits.completion.Wait(), IsError(StatusCode::kDeadlineExceeded, "deadline"));
  EXPECT_EQ(s.StateOf(Tier::kDram, waits.destination), SlotState::kFree);  // never started
  Completion failed_compute;
  KVTIER_ASSERT_OK_AND_ASSIGN(
      Transfer t, s.engine->Copy(Stack::Key(8), Tier::kHbm, h, Tier::kDram,
                                 {.source_ready = failed_compute}));
  failed_compute.Complete(absl::AbortedError("kernel failed"));
  EXPECT_THAT(t.completion.Wait(), IsError(StatusCode::kAborted, "source not ready: kernel failed"));
  EXPECT_TRUE(Eventually(s, Tier::kDram, t.destination, SlotState::kFree));
}

TEST(TransferEngineTest, PinnedDestinationIsHandedOver) {
  Stack s;
  const SlotId d = s.Put(Tier::kDram, Stack::Key(9), Stack::Block(9));
  TransferOptions pin;
  pin.pin_destination = true;
  KVTIER_ASSERT_OK_AND_ASSIGN(Transfer t,
                              s.engine->Copy(Stack::Key(9), Tier::kDram, d, Tier::kHbm, pin));
  KVTIER_ASSERT_OK(t.completion.Wait());
  EXPECT_EQ(s.StateOf(Tier::kHbm, t.destination), SlotState::kSealed);
  KVTIER_EXPECT_OK(s.engine->WithAllocator(Tier::kHbm, [&](BlockAllocator& a) {
    return a.Release(t.destination);
  }));
}

TEST(TransferEngineTest, ShutdownCancelsWaitingTransfers) {
  Completion never;
  Completion result;
  {
    Stack s;
    const SlotId h = s.Put(Tier::kHbm, Stack::Key(3), Stack::Block(3));
    auto t = s.engine->Copy(Stack::Key(3), Tier::kHbm, h, Tier::kDram, {.source_ready = never});
    ASSERT_TRUE(t.ok());
    result = t->completion;
  }
  EXPECT_THAT(result.Wait(), IsError(StatusCode::kCancelled, "shutting down"));
  never.Complete(absl::OkStatus());  // after the engine is gone: must be harmless
}

}  // namespace
}  // namespace kvtier
