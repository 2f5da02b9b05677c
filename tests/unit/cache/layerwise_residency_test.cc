// Layer-wise readiness of residency tickets (kv_cache.h: ResidencyTicket::layer_ready,
// EnqueueStreamWait) and the CUDA-event Completion on a tier without CUDA. The HBM tier sits
// behind a LayerGateTier, so each test decides how many layers of an onboard have landed.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/ticket_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/layer_gate_tier.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::BlockPatternMismatches;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::kvtier::testing::KvCacheFixture;
using ::kvtier::testing::KvCacheTestConfig;
using ::kvtier::testing::LayerGateTier;
using ::kvtier::testing::WriteBlockPattern;

constexpr int kB = testing::KvCacheEnv::kTokensPerBlock;
constexpr int kLayers = 2;  // KvCacheEnv::Geometry
constexpr uint32_t kSeed = 7;

// Bytes of layer `layer` of block `i` of `table` that differ from the pattern of kSeed.
int64_t LayerMismatches(const KvGeometry& g, const DeviceBlockTable& table, size_t i, int layer) {
  int64_t bad = 0;
  const int64_t head_bytes = int64_t{g.head_dim()} * KvDtypeBytes(g.dtype());
  for (int plane = 0; plane < 2; ++plane) {
    for (int t = 0; t < g.tokens_per_block(); ++t) {
      for (int h = 0; h < g.num_kv_heads(); ++h) {
        const std::byte* p =
            KvAddress(table.pool, table.slots[i], layer, static_cast<KvPlane>(plane), t, h);
        for (int64_t b = 0; b < head_bytes; ++b) {
          bad += p[b] != testing::PatternByte(kSeed, layer, plane, t, h, b);
        }
      }
    }
  }
  return bad;
}

class KvCacheLayerwiseTest : public KvCacheFixture {
 protected:
  // A cache whose HBM is behind a LayerGateTier (`fences`: it hands out recording fences),
  // write-through to DRAM, with `prompt` (two full blocks) written by sequence 1 and released,
  // then dropped from HBM: its blocks are in DRAM only. The gate is open while that happens.
  void BuildWithPromptInDram(bool fences, KvCacheTestConfig config = {}) {
    Build(config, [&](KvCacheOptions& o) {
      o.write_policy = WritePolicy::kWriteThrough;
      auto gate = std::make_unique<LayerGateTier>(std::move(o.tiers[0]), fences);
      gate_ = gate.get();
      o.tiers[0] = std::move(gate);
    });
    ASSERT_NE(cache_, nullptr);
    gate_->OpenLayers(kLayers);
    prompt_ = Iota(2 * kB + 1, 100);
    const std::vector<int32_t> first(prompt_.begin(), prompt_.begin() + 2 * kB);
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(1)));
    KVTIER_ASSERT_OK(cache_->Append(SequenceId(1), first).status());
    auto t = cache_->EnsureResident(SequenceId(1), 0, 2 * kB);
    KVTIER_ASSERT_OK(t.status());
    for (size_t i = 0; i < 2; ++i) WriteBlockPattern(env_->geometry(), t->block_table(), i, kSeed);
    KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(1), 2 * kB));
    KVTIER_ASSERT_OK(cache_->ReleaseTicket(*t));
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
    KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
    ASSERT_EQ(cache_->stats().tiers[TierIndex(Tier::kDram)].stored, 2);
    KVTIER_ASSERT_OK(cache_->ResetPrefixCache(Tier::kHbm).status());
    gate_->OpenLayers(0);
    // Sequence 2 attaches both blocks (in DRAM) and computes the last token itself.
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(2)));
    auto hit = cache_->AttachPrefix(SequenceId(2), prompt_);
    KVTIER_ASSERT_OK(hit.status());
    ASSERT_EQ(hit->attached_tokens, 2 * kB);
  }

  absl::StatusOr<ResidencyTicket> Onboard(absl::Time deadline = absl::InfiniteFuture()) {
    return cache_->EnsureResident(SequenceId(2), 0, 2 * kB,
                                  {.deadline = deadline, .mode = ResidencyMode::kAsync});
  }

  void TearDown() override {
    if (gate_ != nullptr) gate_->OpenLayers(kLayers);
    KvCacheFixture::TearDown();
  }

  LayerGateTier* gate_ = nullptr;  // owned by cache_
  std::vector<int32_t> prompt_;
};

TEST_F(KvCacheLayerwiseTest, EachLayerIsReadyWhileLaterLayersAreStillInTransfer) {
  BuildWithPromptInDram(/*fences=*/false);
  auto ticket = Onboard();
  KVTIER_ASSERT_OK(ticket.status());
  ASSERT_EQ(ticket->num_layers(), kLayers);
  // Nothing has landed: no layer is ready, yet the table names each block's destination slot
  // (a layer-wise HBM tier: a stream may be queued on it before its layers land).
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(ticket->layer_ready(0).done());
  const std::vector<int32_t> planned = ticket->block_table().slots;
  EXPECT_THAT(planned, ::testing::Each(::testing::Ge(0)));

  gate_->OpenLayers(1);
  KVTIER_ASSERT_OK(ticket->layer_ready(0).WaitFor(absl::Seconds(10)));
  // Layer 0 of both blocks is in HBM, with its final slot in the table and its bytes in place;
  // layer 1 is held at the gate, so neither it nor the whole ticket is done.
  EXPECT_FALSE(ticket->layer_ready(1).done());
  EXPECT_FALSE(ticket->completion().done());
  EXPECT_THAT(ticket->block_status(), ::testing::Each(BlockResidency::kPending));
  const DeviceBlockTable& table = ticket->block_table();
  ASSERT_EQ(table.slots.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_GE(table.slots[i], 0);
    EXPECT_EQ(LayerMismatches(env_->geometry(), table, i, 0), 0) << "block " << i;
  }
  const std::vector<int32_t> slots_at_layer0 = table.slots;
  EXPECT_EQ(slots_at_layer0, planned);

  gate_->OpenLayers(2);
  KVTIER_ASSERT_OK(ticket->layer_ready(1).WaitFor(absl::Seconds(10)));
  KVTIER_ASSERT_OK(ticket->completion().WaitFor(absl::Seconds(10)));
  EXPECT_THAT(ticket->block_status(), ::testing::Each(BlockResidency::kResident));
  EXPECT_EQ(ticket->block_table().slots, slots_at_layer0);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(BlockPatternMismatches(env_->geometry(), ticket->block_table(), i, kSeed), 0);
  }
  EXPECT_EQ(gate_->layered_writes(), 2);
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*ticket));
  KVTIER_EXPECT_OK(cache_->Release(SequenceId(2)));
}

TEST_F(KvCacheLayerwiseTest, ATicketOfResidentBlocksHasEveryLayerReadyAtOnce) {
  BuildWithPromptInDram(/*fences=*/true);
  gate_->OpenLayers(kLayers);
  auto first = Onboard();
  KVTIER_ASSERT_OK(first.status());
  KVTIER_ASSERT_OK(first->completion().WaitFor(absl::Seconds(10)));
  // Everything is in HBM now: a new ticket needs no layer to land and no stream to wait.
  auto ticket = Onboard();
  KVTIER_ASSERT_OK(ticket.status());
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(ticket->layer_ready(l).done());
    KVTIER_EXPECT_OK(ticket->layer_ready(l).status());
  }
  const int waits_before = static_cast<int>(gate_->stream_waits().size());
  KVTIER_EXPECT_OK(ticket->EnqueueStreamWait(nullptr));
  EXPECT_EQ(static_cast<int>(gate_->stream_waits().size()), waits_before);
  EXPECT_THAT(ticket->layer_ready(kLayers).status(), IsError(StatusCode::kOutOfRange, "layer 2"));
  EXPECT_THAT(ticket->layer_ready(-1).status(), IsError(StatusCode::kOutOfRange, "layer -1"));
  EXPECT_THAT(ticket->EnqueueStreamWait(nullptr, kLayers),
              IsError(StatusCode::kOutOfRange, "layer 2"));
  EXPECT_THAT(ResidencyTicket().layer_ready(0).status(),
              IsError(StatusCode::kInvalidArgument, "invalid"));
  EXPECT_THAT(ResidencyTicket().EnqueueStreamWait(nullptr),
              IsError(StatusCode::kInvalidArgument, "invalid"));
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*first));
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*ticket));
  KVTIER_EXPECT_OK(cache_->Release(SequenceId(2)));
}

TEST_F(KvCacheLayerwiseTest, StreamWaitUsesTheFenceOfEachQueuedLayerWithoutHostWait) {
  BuildWithPromptInDram(/*fences=*/true);
  auto ticket = Onboard();
  KVTIER_ASSERT_OK(ticket.status());
  // The copies are queued (the tier announced a fence per layer) but none has landed: the
  // stream is made to wait on the device, and the call returns without anything landing.
  void* const stream = reinterpret_cast<void*>(0x5eed);
  const absl::Time start = absl::Now();
  KVTIER_ASSERT_OK(ticket->EnqueueStreamWait(stream, 0, absl::Now() + absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(ticket->layer_ready(0).done());
  std::vector<LayerGateTier::StreamWait> waits = gate_->stream_waits();
  ASSERT_EQ(waits.size(), 2u);  // one fence per block
  for (const auto& w : waits) {
    EXPECT_EQ(w.stream, stream);
    EXPECT_EQ(w.layer, 0);
  }
  // Every layer: the last layer's fence of each block (copies of a block are in layer order).
  KVTIER_ASSERT_OK(ticket->EnqueueStreamWait(stream, ResidencyTicket::kAllLayers,
                                             absl::Now() + absl::Seconds(10)));
  waits = gate_->stream_waits();
  ASSERT_EQ(waits.size(), 4u);
  EXPECT_EQ(waits[2].layer, kLayers - 1);
  EXPECT_EQ(waits[3].layer, kLayers - 1);

  gate_->OpenLayers(1);
  KVTIER_ASSERT_OK(ticket->layer_ready(0).WaitFor(absl::Seconds(10)));
  // Layer 0 has landed: nothing for the device to wait on.
  KVTIER_ASSERT_OK(ticket->EnqueueStreamWait(stream, 0));
  EXPECT_EQ(gate_->stream_waits().size(), 4u);
  gate_->OpenLayers(kLayers);
  KVTIER_ASSERT_OK(ticket->completion().WaitFor(absl::Seconds(10)));
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*ticket));
  KVTIER_EXPECT_OK(cache_->Release(SequenceId(2)));
}

TEST_F(KvCacheLayerwiseTest, WithoutFencesStreamWaitWaitsOnTheHostUpToItsDeadline) {
  BuildWithPromptInDram(/*fences=*/false);
  auto ticket = Onboard();
  KVTIER_ASSERT_OK(ticket.status());
  EXPECT_THAT(ticket->EnqueueStreamWait(nullptr, 0, absl::Now() + absl::Milliseconds(50)),
              IsError(StatusCode::kDeadlineExceeded, "deadline"));
  gate_->OpenLayers(1);
  KVTIER_EXPECT_OK(ticket->EnqueueStreamWait(nullptr, 0, absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(ticket->layer_ready(0).done());
  EXPECT_TRUE(gate_->stream_waits().empty());
  gate_->OpenLayers(kLayers);
  KVTIER_ASSERT_OK(ticket->completion().WaitFor(absl::Seconds(10)));
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*ticket));
  KVTIER_EXPECT_OK(cache_->Release(SequenceId(2)));
}

TEST_F(KvCacheLayerwiseTest, AFailedOnboardFailsEveryLayerAndTheStreamWait) {
  KvCacheTestConfig config;
  config.fault_injectors = true;  // the gate wraps HBM's injector, which fails the writes
  BuildWithPromptInDram(/*fences=*/true, config);
  env_->fault(Tier::kHbm)->FailNextWrites(2, absl::UnavailableError("injected: HBM copy failed"));
  auto ticket = Onboard();
  KVTIER_ASSERT_OK(ticket.status());
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_THAT(ticket->layer_ready(l).WaitFor(absl::Seconds(10)),
                IsError(StatusCode::kUnavailable, "injected: HBM copy failed"));
  }
  EXPECT_THAT(ticket->completion().WaitFor(absl::Seconds(10)),
              IsError(StatusCode::kUnavailable, "injected"));
  EXPECT_THAT(ticket->EnqueueStreamWait(nullptr, 0),
              IsError(StatusCode::kUnavailable, "block 0 is not resident"));
  EXPECT_THAT(ticket->block_table().slots, ::testing::Each(-1));
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*ticket));
  KVTIER_EXPECT_OK(cache_->Release(SequenceId(2)));
}

TEST_F(KvCacheLayerwiseTest, APartlyLandedBlockIsNotGivenUpAtTheDeadline) {
  BuildWithPromptInDram(/*fences=*/false);
  auto ticket = Onboard(absl::Now() + absl::Milliseconds(300));
  KVTIER_ASSERT_OK(ticket.status());
  gate_->OpenLayers(1);
  KVTIER_ASSERT_OK(ticket->layer_ready(0).WaitFor(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(500));  // past the deadline, layer 1 still held
  // A kernel may be reading layer 0 from these slots: the blocks stay pending, not expired.
  EXPECT_THAT(ticket->block_status(), ::testing::Each(BlockResidency::kPending));
  EXPECT_FALSE(ticket->completion().done());
  gate_->OpenLayers(kLayers);
  KVTIER_ASSERT_OK(ticket->completion().WaitFor(absl::Seconds(10)));
  EXPECT_THAT(ticket->block_status(), ::testing::Each(BlockResidency::kResident));
  // Pinned by the ticket: locked in HBM until it is released.
  EXPECT_EQ(cache_->stats().tiers[TierIndex(Tier::kHbm)].locked_blocks, 2);
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*ticket));
  EXPECT_EQ(cache_->stats().tiers[TierIndex(Tier::kHbm)].locked_blocks, 0);
  KVTIER_EXPECT_OK(cache_->Release(SequenceId(2)));
}

TEST_F(KvCacheLayerwiseTest, ABlockNotStartedByTheDeadlineIsStillGivenUp) {
  BuildWithPromptInDram(/*fences=*/false);
  auto ticket = Onboard(absl::Now() + absl::Milliseconds(200));
  KVTIER_ASSERT_OK(ticket.status());
  // No layer lands before the deadline: both blocks are reported not resident, every layer
  // fails, and the ticket completes.
  EXPECT_THAT(ticket->completion().WaitFor(absl::Seconds(10)),
              IsError(StatusCode::kUnavailable, "deadline"));
  EXPECT_THAT(ticket->block_status(), ::testing::Each(BlockResidency::kNotResident));
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_THAT(ticket->layer_ready(l).status(),
                IsError(StatusCode::kUnavailable, absl::StrCat("layer ", l)));
  }
  gate_->OpenLayers(kLayers);
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*ticket));
  KVTIER_EXPECT_OK(cache_->Release(SequenceId(2)));
}

TEST_F(KvCacheLayerwiseTest, ACudaEventCompletionNeedsACudaTier) {
  Build({});
  int not_an_event = 0;
  EXPECT_THAT(cache_->CompletionOfCudaEvent(&not_an_event).status(),
              IsError(StatusCode::kUnimplemented, "GPU stream"));
  EXPECT_THAT(cache_->CompletionOfCudaEvent(nullptr).status(),
              IsError(StatusCode::kInvalidArgument, "null"));
}

// The per-ticket bookkeeping itself: a block that fails must keep each layer it had not landed
// from ever firing OK, even when the other blocks land before the failure's completions are
// fired (they are fired after the locks are released, so the first fire would win).
TEST(TicketLayersTest, AFailedBlockKeepsItsLayersFromFiringOkWhenOthersLand) {
  internal::TicketState t;
  t.num_layers = kLayers;
  t.layer_ready.resize(kLayers);
  {
    internal::MutexLock lock(&t.mu);
    t.status.assign(2, BlockResidency::kPending);
    t.table.slots.assign(2, -1);
    t.landed_layers.assign(2, 0);
    t.layer_pending.assign(kLayers, 2);
    t.committed.assign(2, 0);
    t.fanouts.assign(2, nullptr);
  }
  std::vector<std::pair<Completion, absl::Status>> fire;
  std::vector<Completion> ready;
  {
    internal::MutexLock lock(&t.mu);
    internal::AdvanceLayersLocked(t, 0, 1, /*slot=*/5, ready);  // block 0: layer 0 landed
    internal::FailLayersLocked(t, 0, absl::DataLossError("bad copy"), fire);
    t.status[0] = BlockResidency::kNotResident;
    internal::AdvanceLayersLocked(t, 1, kLayers, /*slot=*/6, ready);  // block 1: all landed
  }
  // Layer 0 fires OK (both blocks have it); layer 1 only fails (block 0 never got it).
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_FALSE(ready[0].done());
  ready[0].Complete(absl::OkStatus());
  EXPECT_TRUE(t.layer_ready[0].done());
  ASSERT_EQ(fire.size(), 1u);
  EXPECT_THAT(fire[0].second, IsError(StatusCode::kUnavailable, "layer 1 of block 0"));
  EXPECT_FALSE(t.layer_ready[1].done());
  fire[0].first.Complete(fire[0].second);
  EXPECT_THAT(t.layer_ready[1].status(), IsError(StatusCode::kUnavailable, "bad copy"));
}

}  // namespace
}  // namespace kvtier
