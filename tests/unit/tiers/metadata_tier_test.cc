#include "kvtier/metadata_tier.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/emulated_hbm.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_cache_stats.h"
#include "kvtier/metadata_store.h"
#include "tests/testing/fault_injecting_tier.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::testing::Each;
using ::testing::Ge;
using ::testing::IsEmpty;

constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr int kDram = TierIndex(Tier::kDram);

// 2 layers x 2 KV heads x head_dim 8, bf16, 4 tokens per block: 512-byte blocks.
KvGeometry SmallGeometry() {
  return *KvGeometry::Create(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .tokens_per_block = 4});
}

// Llama-3.1-70B's KV (80 layers, 8 KV heads of 128, bf16) at 512 tokens per block:
// 2 x 80 x 8 x 128 x 2 bytes x 512 = 160 MiB a block.
KvGeometry Llama70BGeometry() {
  return *KvGeometry::Create({.num_layers = 80,
                              .num_kv_heads = 8,
                              .head_dim = 128,
                              .dtype = KvDtype::kBf16,
                              .tokens_per_block = 512});
}

BlockKey Key(uint64_t i) { return BlockKey{0x6d657461, i}; }

std::unique_ptr<MetadataTier> Make(Tier tier, int64_t capacity_blocks,
                                   const KvGeometry& g = SmallGeometry()) {
  auto t = MetadataTier::Create(g, {.tier = tier, .capacity_blocks = capacity_blocks});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// Resident set size of this process, from /proc/self/statm (its second field, in pages).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// ---------------------------------------------------------------- Create and info

TEST(MetadataTierTest, CreateRejectsBadOptions) {
  const KvGeometry g = SmallGeometry();
  EXPECT_THAT(MetadataTier::Create(g, {.tier = Tier::kHbm, .capacity_blocks = 0}),
              IsError(StatusCode::kInvalidArgument, "capacity_blocks = 0"));
  EXPECT_THAT(MetadataTier::Create(g, {.tier = Tier::kDram, .capacity_blocks = -5}),
              IsError(StatusCode::kInvalidArgument, "capacity_blocks = -5"));
  EXPECT_THAT(MetadataTier::Create(g, {.tier = Tier::kDram,
                                       .capacity_blocks = BlockAllocator::kMaxCapacityBlocks + 1}),
              IsError(StatusCode::kInvalidArgument, "capacity_blocks"));
  EXPECT_THAT(MetadataTier::Create(g, {.tier = static_cast<Tier>(kNumTiers), .capacity_blocks = 4}),
              IsError(StatusCode::kInvalidArgument, "unknown tier 4"));
  EXPECT_THAT(MetadataTier::Create(g, {.tier = static_cast<Tier>(255), .capacity_blocks = 4}),
              IsError(StatusCode::kInvalidArgument, "unknown tier"));
}

TEST(MetadataTierTest, InfoIsARealTiersExceptForCapabilities) {
  const KvGeometry g = SmallGeometry();
  for (Tier tier : {Tier::kHbm, Tier::kDram, Tier::kNvme, Tier::kRemote}) {
    SCOPED_TRACE(TierName(tier));
    std::unique_ptr<MetadataTier> t = Make(tier, 10);
    ASSERT_NE(t, nullptr);
    const TierInfo& info = t->info();
    EXPECT_EQ(info.tier, tier);
    EXPECT_EQ(info.name, "metadata(" + std::string(TierName(tier)) + ")");
    EXPECT_EQ(info.capacity_blocks, 10);
    EXPECT_EQ(info.block_bytes, g.bytes_per_block());
    EXPECT_EQ(info.capacity_bytes, 10 * g.bytes_per_block());
    EXPECT_EQ(info.metadata_bytes, 10 * MetadataTier::kMetadataBytesPerSlot);
    EXPECT_EQ(info.capabilities,
              kCapInlineIo | (tier == Tier::kHbm ? uint32_t{kCapDeviceMemory} : uint32_t{0}));
    EXPECT_EQ(t->allocator().capacity_blocks(), 10);
    EXPECT_EQ(t->allocator().tier(), tier);
    EXPECT_EQ(t->HostAddress(SlotId(0)), nullptr);
    EXPECT_THAT(t->CheckHolds(SlotId(0), Key(0)), IsError(StatusCode::kUnimplemented, ""));
    EXPECT_TRUE(t->recovered_blocks().empty());
  }
}

TEST(MetadataTierTest, CapacityOfTerabytesCostsOnlyItsSlots) {
  // 200000 blocks of 160 MiB: 31.25 TiB of capacity, 6.4 MB of bookkeeping.
  std::unique_ptr<MetadataTier> t = Make(Tier::kDram, 200000, Llama70BGeometry());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->info().block_bytes, int64_t{160} << 20);
  EXPECT_EQ(t->info().capacity_bytes, int64_t{200000} * (int64_t{160} << 20));
  EXPECT_EQ(t->info().metadata_bytes, 200000 * 32);
}

// ---------------------------------------------------------------- Reads and writes

TEST(MetadataTierTest, WriteThenReadChecksTheKeyAndMovesNoBytes) {
  std::unique_ptr<MetadataTier> t = Make(Tier::kDram, 8);
  ASSERT_NE(t, nullptr);
  const size_t bytes = static_cast<size_t>(t->info().block_bytes);
  const std::vector<std::byte> src(bytes, std::byte{0x5a});
  std::vector<std::byte> dst(bytes, std::byte{0xab});

  Completion write = t->WriteBlock(SlotId(3), Key(7), src);
  EXPECT_TRUE(write.done()) << "a metadata write completes before returning";
  KVTIER_ASSERT_OK(write.Wait());
  Completion read = t->ReadBlock(SlotId(3), Key(7), absl::MakeSpan(dst));
  EXPECT_TRUE(read.done());
  KVTIER_EXPECT_OK(read.Wait());
  EXPECT_THAT(dst, Each(std::byte{0xab})) << "a metadata read must not write its destination";

  EXPECT_THAT(t->ReadBlock(SlotId(3), Key(8), absl::MakeSpan(dst)).Wait(),
              IsError(StatusCode::kDataLoss, Key(7).ToHex()));
  EXPECT_THAT(t->ReadBlock(SlotId(4), Key(7), absl::MakeSpan(dst)).Wait(),
              IsError(StatusCode::kNotFound, "slot 4 holds no complete block"));

  KVTIER_ASSERT_OK(t->WriteBlock(SlotId(3), Key(8), src).Wait());  // an overwrite replaces it
  KVTIER_EXPECT_OK(t->ReadBlock(SlotId(3), Key(8), absl::MakeSpan(dst)).Wait());
  EXPECT_THAT(t->ReadBlock(SlotId(3), Key(7), absl::MakeSpan(dst)).Wait(),
              IsError(StatusCode::kDataLoss, "slot 3"));
}

TEST(MetadataTierTest, BadArgumentsAreRejectedAndLeaveTheSlot) {
  std::unique_ptr<MetadataTier> t = Make(Tier::kNvme, 8);
  ASSERT_NE(t, nullptr);
  const size_t bytes = static_cast<size_t>(t->info().block_bytes);
  std::vector<std::byte> ok(bytes), small(bytes - 1), big(bytes + 1);
  KVTIER_ASSERT_OK(t->WriteBlock(SlotId(0), Key(1), ok).Wait());

  EXPECT_THAT(t->WriteBlock(SlotId(8), Key(0), ok).Wait(),
              IsError(StatusCode::kInvalidArgument, "slot 8 is outside [0, 8)"));
  EXPECT_THAT(t->WriteBlock(SlotId(), Key(0), ok).Wait(),
              IsError(StatusCode::kInvalidArgument, "outside"));
  EXPECT_THAT(t->WriteBlock(SlotId(0), Key(2), small).Wait(),
              IsError(StatusCode::kInvalidArgument, "a buffer of 511 bytes for a block of 512"));
  EXPECT_THAT(t->WriteBlock(SlotId(0), Key(2), big).Wait(),
              IsError(StatusCode::kInvalidArgument, "513"));
  EXPECT_THAT(t->ReadBlock(SlotId(8), Key(1), absl::MakeSpan(ok)).Wait(),
              IsError(StatusCode::kInvalidArgument, "outside"));
  EXPECT_THAT(t->ReadBlock(SlotId(0), Key(1), absl::MakeSpan(small)).Wait(),
              IsError(StatusCode::kInvalidArgument, "511"));
  // The refused writes did not record their key.
  KVTIER_EXPECT_OK(t->ReadBlock(SlotId(0), Key(1), absl::MakeSpan(ok)).Wait());
}

TEST(MetadataTierTest, OperationPastItsDeadlineDoesNotTouchTheSlot) {
  std::unique_ptr<MetadataTier> t = Make(Tier::kRemote, 4);
  ASSERT_NE(t, nullptr);
  std::vector<std::byte> buf(static_cast<size_t>(t->info().block_bytes));
  KVTIER_ASSERT_OK(t->WriteBlock(SlotId(1), Key(1), buf).Wait());
  const BlockIoOptions past{.deadline = absl::Now() - absl::Seconds(1)};
  EXPECT_THAT(t->WriteBlock(SlotId(1), Key(2), buf, past).Wait(),
              IsError(StatusCode::kDeadlineExceeded, "slot 1"));
  EXPECT_THAT(t->ReadBlock(SlotId(1), Key(1), absl::MakeSpan(buf), past).Wait(),
              IsError(StatusCode::kDeadlineExceeded, "deadline"));
  KVTIER_EXPECT_OK(t->ReadBlock(SlotId(1), Key(1), absl::MakeSpan(buf)).Wait())
      << "a write that never started changed the slot";
  const BlockIoOptions future{.deadline = absl::Now() + absl::Hours(1)};
  KVTIER_EXPECT_OK(t->WriteBlock(SlotId(2), Key(2), buf, future).Wait());
}

TEST(MetadataTierTest, ConcurrentWritersAndReadersSeeWholeKeys) {
  std::unique_ptr<MetadataTier> t = Make(Tier::kDram, 64);
  ASSERT_NE(t, nullptr);
  const size_t bytes = static_cast<size_t>(t->info().block_bytes);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::vector<std::byte> buf(bytes);
      for (int i = 0; i < 2000; ++i) {
        const auto slot = SlotId(static_cast<uint32_t>((w * 16) + (i % 16)));
        const BlockKey key = Key(static_cast<uint64_t>(w * 100000 + i));
        EXPECT_TRUE(t->WriteBlock(slot, key, buf).Wait().ok());
        EXPECT_TRUE(t->ReadBlock(slot, key, absl::MakeSpan(buf)).Wait().ok());
        // Another thread's slot: any answer but a crash, and never OK for a key it never had.
        const auto other = SlotId(static_cast<uint32_t>(((w + 1) % 4) * 16 + (i % 16)));
        EXPECT_FALSE(t->ReadBlock(other, key, absl::MakeSpan(buf)).Wait().ok());
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

// ---------------------------------------------------------------- Device-facing

TEST(MetadataTierTest, DevicePoolForHbmOnlyWithLayerFirstStridesAndNoAddresses) {
  const KvGeometry g = SmallGeometry();
  std::unique_ptr<MetadataTier> hbm = Make(Tier::kHbm, 8);
  ASSERT_NE(hbm, nullptr);
  std::optional<DevicePoolView> pool = hbm->device_pool();
  ASSERT_TRUE(pool.has_value());
  EXPECT_THAT(pool->k_base, IsEmpty());
  EXPECT_THAT(pool->v_base, IsEmpty());
  EXPECT_FALSE(pool->host_accessible);
  // The strides are those of a real layer-first pool of the same geometry.
  KVTIER_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<EmulatedHbm> real,
      EmulatedHbm::Create(g, {.layout = HbmLayout::kLayerFirst, .capacity_blocks = 8}));
  const DevicePoolView expected = *real->device_pool();
  EXPECT_EQ(pool->block_stride_bytes, expected.block_stride_bytes);
  EXPECT_EQ(pool->token_stride_bytes, expected.token_stride_bytes);
  EXPECT_EQ(pool->head_stride_bytes, expected.head_stride_bytes);
  EXPECT_EQ(pool->block_stride_bytes, g.bytes_per_block_per_layer());

  for (Tier tier : {Tier::kDram, Tier::kNvme, Tier::kRemote}) {
    std::unique_ptr<MetadataTier> t = Make(tier, 8);
    ASSERT_NE(t, nullptr);
    EXPECT_FALSE(t->device_pool().has_value()) << TierName(tier);
  }
}

TEST(MetadataTierTest, DeviceWritesInvalidateAndRecordOnHbmOnly) {
  std::unique_ptr<MetadataTier> hbm = Make(Tier::kHbm, 4);
  ASSERT_NE(hbm, nullptr);
  std::vector<std::byte> buf(static_cast<size_t>(hbm->info().block_bytes));
  KVTIER_ASSERT_OK(hbm->WriteBlock(SlotId(2), Key(1), buf).Wait());
  hbm->BeginDeviceWrite(SlotId(2));
  EXPECT_THAT(hbm->ReadBlock(SlotId(2), Key(1), absl::MakeSpan(buf)).Wait(),
              IsError(StatusCode::kNotFound, "slot 2"));
  hbm->EndDeviceWrite(SlotId(2), Key(9));
  KVTIER_EXPECT_OK(hbm->ReadBlock(SlotId(2), Key(9), absl::MakeSpan(buf)).Wait());
  hbm->BeginDeviceWrite(SlotId(4));  // outside the tier: ignored
  hbm->EndDeviceWrite(SlotId(), Key(1));

  std::unique_ptr<MetadataTier> dram = Make(Tier::kDram, 4);
  ASSERT_NE(dram, nullptr);
  KVTIER_ASSERT_OK(dram->WriteBlock(SlotId(2), Key(1), buf).Wait());
  dram->BeginDeviceWrite(SlotId(2));  // no device memory: a no-op
  KVTIER_EXPECT_OK(dram->ReadBlock(SlotId(2), Key(1), absl::MakeSpan(buf)).Wait());
  dram->EndDeviceWrite(SlotId(3), Key(5));
  EXPECT_THAT(dram->ReadBlock(SlotId(3), Key(5), absl::MakeSpan(buf)).Wait(),
              IsError(StatusCode::kNotFound, "slot 3"));
}

// ---------------------------------------------------------------- Under a KvCache

KvCacheOptions MetadataCacheOptions(const KvGeometry& g, int64_t hbm_blocks, int64_t dram_blocks) {
  KvCacheOptions o;
  o.tiers[kHbm] = Make(Tier::kHbm, hbm_blocks, g);
  o.tiers[kDram] = Make(Tier::kDram, dram_blocks, g);
  o.room_wait = absl::Seconds(10);
  return o;
}

// A prompt is cached, demoted to DRAM by another sequence's need for HBM, and attached again:
// every decision and every count is what byte-holding tiers give (kv_cache_test.cc), with no
// bytes anywhere.
TEST(MetadataTierTest, KvCacheDemotesAndOnboardsThroughMetadataTiers) {
  constexpr int kB = 4;
  constexpr int64_t kHbmBlocks = 8;
  // 7 blocks: with the one token appended after the attach they fill HBM's 8 slots exactly.
  constexpr int kPromptBlocks = 7;
  const KvGeometry g = SmallGeometry();
  KVTIER_ASSERT_OK_AND_ASSIGN(
      CacheNamespace ns,
      CacheNamespace::Create(g, {.model_id = "kvtier-test/metadata", .weights_fingerprint = "w"}));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache,
                              KvCache::Create(ns, MetadataCacheOptions(g, kHbmBlocks, 16)));
  const int64_t bb = g.bytes_per_block();

  const std::vector<int32_t> prompt = Iota(kPromptBlocks * kB, 1000);
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(1)));
  KVTIER_ASSERT_OK_AND_ASSIGN(KvAppendResult appended, cache->Append(SequenceId(1), prompt));
  EXPECT_EQ(appended.num_sealed_blocks, kPromptBlocks);
  KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(1), static_cast<int64_t>(prompt.size())));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(1)));

  // Another sequence takes every HBM slot: the prompt's blocks are demoted to DRAM.
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(2)));
  KVTIER_ASSERT_OK(cache->Append(SequenceId(2), Iota(kHbmBlocks * kB, 500000)).status());
  KVTIER_ASSERT_OK(cache->Release(SequenceId(2)));
  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
  KvCacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[kHbm].demotions, kPromptBlocks);
  EXPECT_EQ(s.tiers[kDram].stored, kPromptBlocks);
  EXPECT_EQ(s.tiers[kDram].bytes_in, kPromptBlocks * bb);
  EXPECT_EQ(s.tiers[kHbm].bytes_out, kPromptBlocks * bb);

  // The same prompt plus one token: every block is found in DRAM and onboarded.
  std::vector<int32_t> again = prompt;
  again.push_back(7);
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(3)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult attached, cache->AttachPrefix(SequenceId(3), again));
  EXPECT_EQ(attached.attached_tokens, kPromptBlocks * kB);
  EXPECT_EQ(attached.attached_blocks_by_tier[kDram], kPromptBlocks);
  KVTIER_ASSERT_OK(cache->Append(SequenceId(3), {7}).status());
  KVTIER_ASSERT_OK_AND_ASSIGN(
      ResidencyTicket ticket,
      cache->EnsureResident(SequenceId(3), 0, static_cast<int64_t>(again.size()),
                            {.mode = ResidencyMode::kWait}));
  EXPECT_THAT(ticket.block_status(), Each(BlockResidency::kResident));
  EXPECT_EQ(ticket.block_table().slots.size(), static_cast<size_t>(kPromptBlocks + 1));
  EXPECT_THAT(ticket.block_table().slots, Each(Ge(0)));
  EXPECT_THAT(ticket.block_table().pool.k_base, IsEmpty()) << "no addresses to hand a kernel";
  KVTIER_EXPECT_OK(ticket.completion().Wait());

  s = cache->stats();
  EXPECT_EQ(s.tiers[kDram].hits, kPromptBlocks);
  EXPECT_EQ(s.tiers[kDram].bytes_out, kPromptBlocks * bb);
  EXPECT_EQ(s.tiers[kHbm].bytes_in, kPromptBlocks * bb);
  EXPECT_EQ(s.tiers[kDram].failed_loads, 0);
  EXPECT_EQ(s.tiers[kHbm].failed_stores, 0);
  testing::ExpectTierAccounting(s);
  KVTIER_EXPECT_OK(cache->CheckInvariants());

  KVTIER_ASSERT_OK(cache->ReleaseTicket(ticket));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(3)));
  KVTIER_EXPECT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
  KVTIER_EXPECT_OK(cache->CheckInvariants());
}

// Regression (found by the replay harness: the Mooncake trace hit 5.8% with 69k blocks of
// tiers, 36.7% after the fix, unlimited 37.3%): a burst of HBM evictions into a full DRAM tier
// started one DRAM -> NVMe demotion and then dropped every other HBM victim, because DRAM had no
// slot *now*. The victims must wait for DRAM's demotions to land instead: nothing is lost.
TEST(MetadataTierTest, BurstOfDemotionsIntoAFullTierCascadesInsteadOfDropping) {
  constexpr int kB = 4;
  constexpr int64_t kHbmBlocks = 8;
  const KvGeometry g = SmallGeometry();
  KVTIER_ASSERT_OK_AND_ASSIGN(
      CacheNamespace ns,
      CacheNamespace::Create(g, {.model_id = "kvtier-test/metadata", .weights_fingerprint = "w"}));
  KvCacheOptions options = MetadataCacheOptions(g, kHbmBlocks, kHbmBlocks);
  options.tiers[TierIndex(Tier::kNvme)] = Make(Tier::kNvme, 64, g);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache,
                              KvCache::Create(ns, std::move(options)));
  std::vector<std::vector<int32_t>> prompts;
  for (uint64_t i = 1; i <= 3; ++i) {
    prompts.push_back(Iota(kHbmBlocks * kB, static_cast<int32_t>(i * 100000)));
    KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(i)));
    // Sequence 2 demotes sequence 1's blocks into the empty DRAM; sequence 3 demotes sequence
    // 2's into a full DRAM, whose own blocks (sequence 1's) must first go down to NVMe.
    KVTIER_ASSERT_OK(cache->Append(SequenceId(i), prompts.back()).status()) << "sequence " << i;
    KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(i), kHbmBlocks * kB));
    KVTIER_ASSERT_OK(cache->Release(SequenceId(i)));
    KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
  }
  const KvCacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[kHbm].evictions, 2 * kHbmBlocks) << testing::StatsString(s);
  EXPECT_EQ(s.tiers[kHbm].demotions, 2 * kHbmBlocks) << testing::StatsString(s);
  EXPECT_EQ(s.tiers[kDram].demotions, kHbmBlocks) << testing::StatsString(s);
  EXPECT_EQ(s.tiers[TierIndex(Tier::kNvme)].stored, kHbmBlocks);
  // Every block of every prompt is still cached somewhere.
  for (size_t i = 0; i < prompts.size(); ++i) {
    KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache->Lookup(prompts[i]));
    EXPECT_EQ(where.matched_tokens, kHbmBlocks * kB) << "prompt " << i + 1;
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup first, cache->Lookup(prompts[0]));
  EXPECT_EQ(first.blocks_by_tier[TierIndex(Tier::kNvme)], kHbmBlocks);
  KVTIER_EXPECT_OK(cache->CheckInvariants());
}

// When the room wait ends while the tier below is still demoting, the victims waiting for it
// are dropped (counted) rather than failing the call with HBM full of droppable blocks. Review
// finding on the cascade above: Append failed with kResourceExhausted. Each NVMe write is held
// 250 ms, so DRAM's demotions are still in flight when the 50 ms room wait ends.
TEST(MetadataTierTest, RoomWaitEndingDuringACascadeDropsInsteadOfFailing) {
  constexpr int kB = 4;
  constexpr int64_t kHbmBlocks = 8;
  const KvGeometry g = SmallGeometry();
  KVTIER_ASSERT_OK_AND_ASSIGN(
      CacheNamespace ns,
      CacheNamespace::Create(g, {.model_id = "kvtier-test/metadata", .weights_fingerprint = "w"}));
  KvCacheOptions options = MetadataCacheOptions(g, kHbmBlocks, kHbmBlocks);
  auto nvme = std::make_unique<testing::FaultInjectingTier>(Make(Tier::kNvme, 64, g));
  testing::FaultInjectingTier* slow_nvme = nvme.get();
  options.tiers[TierIndex(Tier::kNvme)] = std::move(nvme);
  options.room_wait = absl::Milliseconds(50);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache,
                              KvCache::Create(ns, std::move(options)));
  for (uint64_t i = 1; i <= 3; ++i) {
    // Sequence 2 demotes sequence 1 into DRAM; sequence 3 finds DRAM full and its demotion to
    // the (now slow) NVMe tier still running when the room wait ends.
    if (i == 3) slow_nvme->SetDelay(absl::Milliseconds(250));
    const std::vector<int32_t> prompt = Iota(kHbmBlocks * kB, static_cast<int32_t>(i * 100000));
    KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(i)));
    KVTIER_ASSERT_OK(cache->Append(SequenceId(i), prompt).status()) << "sequence " << i;
    KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(i), kHbmBlocks * kB));
    KVTIER_ASSERT_OK(cache->Release(SequenceId(i)));
    if (i < 3) {
      KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
    }
  }
  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
  const KvCacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[kHbm].evictions, 2 * kHbmBlocks) << testing::StatsString(s);
  // Sequence 1's blocks were demoted; sequence 2's were dropped at the end of the wait.
  EXPECT_EQ(s.tiers[kHbm].demotions, kHbmBlocks) << testing::StatsString(s);
  testing::ExpectTierAccounting(s);
  KVTIER_EXPECT_OK(cache->CheckInvariants());
}

// A 70B model's real block size and terabytes of capacity: creating the tiers and a cache, and
// copying blocks between the tiers (through the engine's bounce buffer, which neither tier
// touches), allocates no block bytes. One 160 MiB block touched would show in the resident set.
TEST(MetadataTierTest, LargeGeometryAllocatesNoBlockBytes) {
  const KvGeometry g = Llama70BGeometry();
  const int64_t bb = g.bytes_per_block();
  ASSERT_EQ(bb, int64_t{160} << 20);
  const int64_t rss_before = ResidentBytes();
  {
    KVTIER_ASSERT_OK_AND_ASSIGN(
        CacheNamespace ns, CacheNamespace::Create(g, {.model_id = "kvtier-test/llama-70b-shape",
                                                      .weights_fingerprint = "w"}));
    KvCacheOptions options = MetadataCacheOptions(g, 100000, 200000);
    options.bounce_buffers = 1;
    ASSERT_NE(options.tiers[kHbm], nullptr);
    ASSERT_NE(options.tiers[kDram], nullptr);
    EXPECT_EQ(options.tiers[kHbm]->info().capacity_bytes, 100000 * bb);   // 15.3 TiB
    EXPECT_EQ(options.tiers[kDram]->info().capacity_bytes, 200000 * bb);  // 30.5 TiB
    KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache,
                                KvCache::Create(ns, std::move(options)));
    const int64_t rss_created = ResidentBytes();

    // Four blocks written, then a Pause copies them HBM -> DRAM (staged through the bounce
    // buffer: neither tier is host addressable).
    constexpr int kBlocks = 4;
    KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(1)));
    KVTIER_ASSERT_OK(cache->Append(SequenceId(1), Iota(kBlocks * 512, 1)).status());
    KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(1), kBlocks * 512));
    KVTIER_ASSERT_OK(cache->Pause(SequenceId(1), absl::Seconds(1)));
    KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
    const KvCacheStats s = cache->stats();
    EXPECT_EQ(s.tiers[kDram].stored, kBlocks);
    EXPECT_EQ(s.tiers[kDram].bytes_in, kBlocks * bb);
    KVTIER_EXPECT_OK(cache->Release(SequenceId(1)));
    KVTIER_EXPECT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
    KVTIER_EXPECT_OK(cache->CheckInvariants());
    const int64_t rss_after = ResidentBytes();

    std::cout << "[ rss      ] before " << (rss_before >> 20) << " MiB, tiers and cache created "
              << (rss_created >> 20) << " MiB, after " << kBlocks << " staged copies of "
              << (bb >> 20) << " MiB blocks " << (rss_after >> 20) << " MiB\n";
    // Bookkeeping for 300000 slots is a few tens of MiB; one block is 160.
    EXPECT_LT(rss_created - rss_before, int64_t{128} << 20);
    EXPECT_LT(rss_after - rss_before, int64_t{128} << 20);
    EXPECT_LT(rss_after, int64_t{300} << 20);
  }
}

// ---------------------------------------------------------------- A shared store

std::unique_ptr<MetadataTier> MakeShared(std::shared_ptr<MetadataStore> store, int64_t capacity) {
  auto t = MetadataTier::Create(
      SmallGeometry(),
      {.tier = Tier::kRemote, .capacity_blocks = capacity, .store = std::move(store)});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(MetadataStoreTest, StoreContainsEraseAndCounts) {
  MetadataStore store;
  EXPECT_TRUE(store.Store(Key(1)));
  EXPECT_FALSE(store.Store(Key(1)));
  EXPECT_TRUE(store.Store(Key(2)));
  EXPECT_TRUE(store.Contains(Key(1)));
  EXPECT_FALSE(store.Contains(Key(3)));
  EXPECT_TRUE(store.Erase(Key(1)));
  EXPECT_FALSE(store.Erase(Key(1)));
  EXPECT_FALSE(store.Contains(Key(1)));
  const MetadataStoreStats s = store.stats();
  EXPECT_EQ(s.keys, 1);
  EXPECT_EQ(s.stored, 2);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.erased, 1);
  EXPECT_EQ(s.probes, 3);
  EXPECT_EQ(s.probe_hits, 1);
}

TEST(MetadataTierTest, StoreOnlyForTheRemoteTierAndItAddsProbing) {
  auto store = std::make_shared<MetadataStore>();
  for (Tier tier : {Tier::kHbm, Tier::kDram, Tier::kNvme}) {
    EXPECT_THAT(
        MetadataTier::Create(SmallGeometry(), {.tier = tier, .capacity_blocks = 4, .store = store}),
        IsError(StatusCode::kInvalidArgument, "a store is for the remote tier"));
  }
  std::unique_ptr<MetadataTier> t = MakeShared(store, 4);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->info().capabilities, kCapInlineIo | kCapProbe);
  EXPECT_EQ(t->info().name, "metadata(remote, shared store)");
  // Without a store the remote tier cannot probe or adopt.
  std::unique_ptr<MetadataTier> alone = Make(Tier::kRemote, 4);
  EXPECT_THAT(alone->ProbeBlocks({Key(1)}, absl::InfiniteFuture()),
              IsError(StatusCode::kUnimplemented, ""));
  EXPECT_THAT(alone->AdoptStoredBlock(SlotId(0), Key(1)), IsError(StatusCode::kUnimplemented, ""));
}

// Two workers' remote tiers over one store: what one writes the other finds, adopts and reads;
// the writer's eviction deletes it (the reader then misses); a reader's eviction deletes nothing;
// a second write of a block already there is skipped and not the second writer's to delete.
TEST(MetadataTierTest, TiersSharingAStoreFindAdoptAndLoseEachOthersBlocks) {
  auto store = std::make_shared<MetadataStore>();
  std::unique_ptr<MetadataTier> a = MakeShared(store, 4);
  std::unique_ptr<MetadataTier> b = MakeShared(store, 4);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::byte> buf(static_cast<size_t>(a->info().block_bytes));
  KVTIER_ASSERT_OK(a->WriteBlock(SlotId(0), Key(10), buf).Wait());
  KVTIER_ASSERT_OK(a->WriteBlock(SlotId(1), Key(11), buf).Wait());

  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<bool> found,
                              b->ProbeBlocks({Key(10), Key(11), Key(12)}, absl::InfiniteFuture()));
  EXPECT_EQ(found, (std::vector<bool>{true, true, false}));
  EXPECT_THAT(b->ProbeBlocks({Key(10)}, absl::InfinitePast()),
              IsError(StatusCode::kDeadlineExceeded, "deadline"));
  KVTIER_ASSERT_OK(b->AdoptStoredBlock(SlotId(3), Key(10)));
  KVTIER_ASSERT_OK(b->AdoptStoredBlock(SlotId(2), Key(11)));
  EXPECT_THAT(b->AdoptStoredBlock(SlotId(4), Key(10)), IsError(StatusCode::kInvalidArgument, ""));
  KVTIER_EXPECT_OK(b->ReadBlock(SlotId(3), Key(10), absl::MakeSpan(buf)).Wait());

  // B lets go of block 11: it was A's, so the store keeps it and A still reads it.
  b->DiscardBlock(SlotId(2), Key(11));
  EXPECT_TRUE(store->Contains(Key(11)));
  KVTIER_EXPECT_OK(a->ReadBlock(SlotId(1), Key(11), absl::MakeSpan(buf)).Wait());

  // A evicts block 10, which it stored: the store drops it, and B's adopted copy is a miss.
  a->DiscardBlock(SlotId(0), Key(10));
  EXPECT_FALSE(store->Contains(Key(10)));
  EXPECT_THAT(b->ReadBlock(SlotId(3), Key(10), absl::MakeSpan(buf)).Wait(),
              IsError(StatusCode::kNotFound, "no longer holds"));
  // A discard naming a key the slot does not hold changes nothing.
  a->DiscardBlock(SlotId(1), Key(99));
  EXPECT_TRUE(store->Contains(Key(11)));

  // B writes block 11 too: skipped (the store has it), so B's eviction of it leaves it.
  KVTIER_ASSERT_OK(b->WriteBlock(SlotId(0), Key(11), buf).Wait());
  b->DiscardBlock(SlotId(0), Key(11));
  EXPECT_TRUE(store->Contains(Key(11)));
  const MetadataStoreStats s = store->stats();
  EXPECT_EQ(s.keys, 1);
  EXPECT_EQ(s.stored, 2);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.erased, 1);
}

// Two metadata-only caches over one store, as the serving simulation's fleet runs them: what the
// first computes and writes through is found by the second's discovery and onboarded from the
// remote tier; a cache of other weights over the same store finds nothing.
TEST(MetadataTierTest, KvCachesSharingAStoreDiscoverEachOthersBlocks) {
  constexpr int kB = 4;
  const KvGeometry g = SmallGeometry();
  auto store = std::make_shared<MetadataStore>();
  auto make_cache = [&](const std::string& weights) -> std::unique_ptr<KvCache> {
    auto ns = CacheNamespace::Create(
        g, {.model_id = "kvtier-test/metadata", .weights_fingerprint = weights});
    EXPECT_TRUE(ns.ok()) << ns.status();
    KvCacheOptions o;
    o.tiers[kHbm] = Make(Tier::kHbm, 8, g);
    o.tiers[TierIndex(Tier::kRemote)] = MakeShared(store, 16);
    o.room_wait = absl::Seconds(10);
    o.write_policy = WritePolicy::kWriteThrough;
    auto cache = KvCache::Create(*ns, std::move(o));
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? std::move(*cache) : nullptr;
  };
  constexpr int kRemoteIndex = TierIndex(Tier::kRemote);
  const std::vector<int32_t> prompt = Iota(4 * kB, 100);
  std::vector<int32_t> query = prompt;
  query.push_back(7);

  std::unique_ptr<KvCache> a = make_cache("w0");
  ASSERT_NE(a, nullptr);
  KVTIER_ASSERT_OK(a->CreateSequence(SequenceId(1)));
  KVTIER_ASSERT_OK(a->Append(SequenceId(1), prompt).status());
  KVTIER_ASSERT_OK(a->ReportWritten(SequenceId(1), static_cast<int64_t>(prompt.size())));
  KVTIER_ASSERT_OK(a->WaitIdle(absl::Now() + absl::Seconds(30)));
  KVTIER_ASSERT_OK(a->Release(SequenceId(1)));
  EXPECT_EQ(a->stats().tiers[kRemoteIndex].stored, 4);
  EXPECT_EQ(store->stats().keys, 4);

  std::unique_ptr<KvCache> b = make_cache("w0");
  ASSERT_NE(b, nullptr);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, b->Lookup(query));
  EXPECT_EQ(where.matched_tokens, 4 * kB);
  EXPECT_EQ(where.discovered_blocks, 4);
  KVTIER_ASSERT_OK(b->CreateSequence(SequenceId(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(SequenceId(2), query));
  EXPECT_EQ(r.attached_blocks_by_tier[kRemoteIndex], 4);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(SequenceId(2), 0, 4 * kB,
                                                                   {.mode = ResidencyMode::kWait}));
  EXPECT_THAT(t.block_status(), Each(BlockResidency::kResident));
  KVTIER_ASSERT_OK(b->ReleaseTicket(t));
  KVTIER_ASSERT_OK(b->Release(SequenceId(2)));
  KVTIER_ASSERT_OK(b->WaitIdle(absl::Now() + absl::Seconds(30)));
  KvCacheStats s = b->stats();
  EXPECT_EQ(s.tiers[kRemoteIndex].hits, 4);
  EXPECT_EQ(s.blocks_moved[kRemoteIndex][kHbm], 4);
  KVTIER_EXPECT_OK(b->CheckInvariants());
  testing::ExpectTierAccounting(s);

  std::unique_ptr<KvCache> c = make_cache("w1");
  ASSERT_NE(c, nullptr);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup other, c->Lookup(query));
  EXPECT_EQ(other.matched_tokens, 0);
  EXPECT_EQ(other.discovered_blocks, 0);
}

// publish_to_remote: with write-back, a written block goes straight from HBM to the fleet's store
// (not through DRAM, which stays empty until an eviction), so another cache finds it at once;
// without it nothing reaches the store while HBM has room.
TEST(MetadataTierTest, PublishToRemoteCopiesWrittenBlocksToTheStoreAtOnce) {
  constexpr int kB = 4;
  const KvGeometry g = SmallGeometry();
  constexpr int kRemoteIndex = TierIndex(Tier::kRemote);
  KVTIER_ASSERT_OK_AND_ASSIGN(
      CacheNamespace ns,
      CacheNamespace::Create(g, {.model_id = "kvtier-test/metadata", .weights_fingerprint = "w"}));
  const std::vector<int32_t> prompt = Iota(4 * kB, 100);
  for (bool publish : {true, false}) {
    SCOPED_TRACE(publish ? "publish" : "write-back only");
    auto store = std::make_shared<MetadataStore>();
    KvCacheOptions o = MetadataCacheOptions(g, 8, 8);
    o.tiers[kRemoteIndex] = MakeShared(store, 16);
    o.publish_to_remote = publish;
    KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> a, KvCache::Create(ns, std::move(o)));
    KVTIER_ASSERT_OK(a->CreateSequence(SequenceId(1)));
    KVTIER_ASSERT_OK(a->Append(SequenceId(1), prompt).status());
    KVTIER_ASSERT_OK(a->ReportWritten(SequenceId(1), static_cast<int64_t>(prompt.size())));
    KVTIER_ASSERT_OK(a->WaitIdle(absl::Now() + absl::Seconds(30)));
    KVTIER_ASSERT_OK(a->Release(SequenceId(1)));
    const KvCacheStats s = a->stats();
    EXPECT_EQ(s.tiers[kRemoteIndex].stored, publish ? 4 : 0) << testing::StatsString(s);
    EXPECT_EQ(s.tiers[kDram].stored, 0);
    EXPECT_EQ(s.blocks_moved[kHbm][kRemoteIndex], publish ? 4 : 0);
    EXPECT_EQ(store->stats().keys, publish ? 4 : 0);
    KVTIER_EXPECT_OK(a->CheckInvariants());
    testing::ExpectTierAccounting(s);

    // Another sequence takes all of HBM: the prompt's blocks are demoted to DRAM either way (the
    // published copy is the fleet's, not a reason to drop this worker's faster copy), and the
    // remote tier, which has them, gets no second copy.
    KVTIER_ASSERT_OK(a->CreateSequence(SequenceId(2)));
    KVTIER_ASSERT_OK(a->Append(SequenceId(2), Iota(8 * kB, 900000)).status());
    KVTIER_ASSERT_OK(a->WaitIdle(absl::Now() + absl::Seconds(30)));
    KVTIER_ASSERT_OK(a->Release(SequenceId(2)));
    const KvCacheStats after = a->stats();
    EXPECT_EQ(after.blocks_moved[kHbm][kDram], 4) << testing::StatsString(after);
    EXPECT_EQ(after.blocks_moved[kHbm][kRemoteIndex], publish ? 4 : 0);
    KVTIER_EXPECT_OK(a->CheckInvariants());
  }
}

// Regression (found in review of a change that restored from the cheapest link): a block with a
// local copy must restore from it, not from the fleet's store, which another worker may have
// emptied. Worker `a` publishes a prompt to the shared store first; worker `c` publishes the
// same blocks (its writes are skipped: the store has them) and demotes its HBM copies to NVMe.
// `a` then evicts its remote copies, deleting the store's keys (delete_freed). `c` still indexes
// ready remote copies, and the network is the cheaper link there: restoring from the store
// failed every load, although each block had a ready NVMe copy.
TEST(MetadataTierTest, RestoreFromTheCheaperLinkFallsBackToALocalCopyTheStoreLost) {
  constexpr int kB = 4;
  const KvGeometry g = SmallGeometry();
  constexpr int kNvmeIndex = TierIndex(Tier::kNvme);
  constexpr int kRemoteIndex = TierIndex(Tier::kRemote);
  KVTIER_ASSERT_OK_AND_ASSIGN(
      CacheNamespace ns,
      CacheNamespace::Create(g, {.model_id = "kvtier-test/metadata", .weights_fingerprint = "w"}));
  auto store = std::make_shared<MetadataStore>();
  const std::vector<int32_t> prompt = Iota(4 * kB, 100);
  std::vector<int32_t> query = prompt;
  query.push_back(7);
  auto write = [&](KvCache& cache, SequenceId id, const std::vector<int32_t>& tokens) {
    KVTIER_ASSERT_OK(cache.CreateSequence(id));
    KVTIER_ASSERT_OK(cache.Append(id, tokens).status());
    KVTIER_ASSERT_OK(cache.ReportWritten(id, static_cast<int64_t>(tokens.size())));
    KVTIER_ASSERT_OK(cache.WaitIdle(absl::Now() + absl::Seconds(30)));
    KVTIER_ASSERT_OK(cache.Release(id));
    KVTIER_ASSERT_OK(cache.WaitIdle(absl::Now() + absl::Seconds(30)));
  };

  KvCacheOptions ao;
  ao.tiers[kHbm] = Make(Tier::kHbm, 8, g);
  ao.tiers[kRemoteIndex] = MakeShared(store, 4);  // room for one prompt
  ao.room_wait = absl::Seconds(10);
  ao.publish_to_remote = true;
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> a, KvCache::Create(ns, std::move(ao)));
  write(*a, SequenceId(1), prompt);
  ASSERT_EQ(store->stats().stored, 4);

  KvCacheOptions co;
  co.tiers[kHbm] = Make(Tier::kHbm, 8, g);
  co.tiers[kNvmeIndex] = Make(Tier::kNvme, 16, g);
  co.tiers[kRemoteIndex] = MakeShared(store, 16);
  co.room_wait = absl::Seconds(10);
  co.publish_to_remote = true;
  co.measure_bandwidth = false;
  co.links[kNvmeIndex] = {absl::ZeroDuration(), 1e6};
  co.links[kRemoteIndex] = {absl::ZeroDuration(), 1e9};  // the network is the cheaper link
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> c, KvCache::Create(ns, std::move(co)));
  write(*c, SequenceId(1), prompt);
  ASSERT_EQ(store->stats().skipped, 4);
  write(*c, SequenceId(2), Iota(8 * kB, 900000));  // pushes the prompt out of c's HBM
  ASSERT_EQ(c->stats().blocks_moved[kHbm][kNvmeIndex], 4) << testing::StatsString(c->stats());

  write(*a, SequenceId(2), Iota(4 * kB, 500000));  // a's remote budget: its old blocks go
  ASSERT_EQ(store->stats().erased, 4);

  KVTIER_ASSERT_OK(c->CreateSequence(SequenceId(3)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, c->AttachPrefix(SequenceId(3), query));
  EXPECT_EQ(r.attached_tokens, 4 * kB);
  KVTIER_ASSERT_OK_AND_ASSIGN(
      ResidencyTicket t,
      c->EnsureResident(SequenceId(3), 0, 4 * kB, {.mode = ResidencyMode::kWait}));
  EXPECT_THAT(t.block_status(), Each(BlockResidency::kResident))
      << "each block had a ready NVMe copy; " << testing::StatsString(c->stats());
  KVTIER_ASSERT_OK(c->ReleaseTicket(t));
  KVTIER_ASSERT_OK(c->Release(SequenceId(3)));
  KVTIER_ASSERT_OK(c->WaitIdle(absl::Now() + absl::Seconds(30)));
  KVTIER_EXPECT_OK(c->CheckInvariants());
}

// A block with copies in NVMe and in the fleet's store is restored over the cheaper link, not
// from the first tier in order: the store when the network is faster, NVMe when the drive is.
TEST(MetadataTierTest, RestoreComesFromTheReadyCopyBehindTheCheapestLink) {
  constexpr int kB = 4;
  const KvGeometry g = SmallGeometry();
  constexpr int kNvmeIndex = TierIndex(Tier::kNvme);
  constexpr int kRemoteIndex = TierIndex(Tier::kRemote);
  KVTIER_ASSERT_OK_AND_ASSIGN(
      CacheNamespace ns,
      CacheNamespace::Create(g, {.model_id = "kvtier-test/metadata", .weights_fingerprint = "w"}));
  const std::vector<int32_t> prompt = Iota(4 * kB, 100);
  std::vector<int32_t> query = prompt;
  query.push_back(7);
  for (bool network_faster : {true, false}) {
    SCOPED_TRACE(network_faster ? "network faster" : "NVMe faster");
    KvCacheOptions o;
    o.tiers[kHbm] = Make(Tier::kHbm, 8, g);
    o.tiers[kNvmeIndex] = Make(Tier::kNvme, 16, g);
    o.tiers[kRemoteIndex] = MakeShared(std::make_shared<MetadataStore>(), 16);
    o.room_wait = absl::Seconds(10);
    o.publish_to_remote = true;
    o.measure_bandwidth = false;
    o.links[kNvmeIndex] = {absl::ZeroDuration(), network_faster ? 1e6 : 1e9};
    o.links[kRemoteIndex] = {absl::ZeroDuration(), network_faster ? 1e9 : 1e6};
    KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> c, KvCache::Create(ns, std::move(o)));
    KVTIER_ASSERT_OK(c->CreateSequence(SequenceId(1)));
    KVTIER_ASSERT_OK(c->Append(SequenceId(1), prompt).status());
    KVTIER_ASSERT_OK(c->ReportWritten(SequenceId(1), static_cast<int64_t>(prompt.size())));
    KVTIER_ASSERT_OK(c->WaitIdle(absl::Now() + absl::Seconds(30)));
    KVTIER_ASSERT_OK(c->Release(SequenceId(1)));
    // Push the prompt out of HBM: its blocks go to NVMe and stay in the store.
    KVTIER_ASSERT_OK(c->CreateSequence(SequenceId(2)));
    KVTIER_ASSERT_OK(c->Append(SequenceId(2), Iota(8 * kB, 900000)).status());
    KVTIER_ASSERT_OK(c->WaitIdle(absl::Now() + absl::Seconds(30)));
    KVTIER_ASSERT_OK(c->Release(SequenceId(2)));
    ASSERT_EQ(c->stats().blocks_moved[kHbm][kNvmeIndex], 4) << testing::StatsString(c->stats());

    KVTIER_ASSERT_OK(c->CreateSequence(SequenceId(3)));
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, c->AttachPrefix(SequenceId(3), query));
    EXPECT_EQ(r.attached_tokens, 4 * kB);
    EXPECT_EQ(r.attached_blocks_by_tier[kRemoteIndex], network_faster ? 4 : 0);
    EXPECT_EQ(r.attached_blocks_by_tier[kNvmeIndex], network_faster ? 0 : 4);
    KVTIER_ASSERT_OK_AND_ASSIGN(
        ResidencyTicket t,
        c->EnsureResident(SequenceId(3), 0, 4 * kB, {.mode = ResidencyMode::kWait}));
    EXPECT_THAT(t.block_status(), Each(BlockResidency::kResident));
    KVTIER_ASSERT_OK(c->ReleaseTicket(t));
    KVTIER_ASSERT_OK(c->Release(SequenceId(3)));
    KVTIER_ASSERT_OK(c->WaitIdle(absl::Now() + absl::Seconds(30)));
    const KvCacheStats s = c->stats();
    EXPECT_EQ(s.blocks_moved[kRemoteIndex][kHbm], network_faster ? 4 : 0);
    EXPECT_EQ(s.blocks_moved[kNvmeIndex][kHbm], network_faster ? 0 : 4);
    KVTIER_EXPECT_OK(c->CheckInvariants());
  }
}

// A failed onboard retries from another ready copy: NVMe (the cheaper link here) fails every
// read, the fleet's store still has the blocks, so they are restored from there and resident,
// not recomputed.
TEST(MetadataTierTest, AFailedOnboardRetriesFromTheNextReadyCopy) {
  constexpr int kB = 4;
  const KvGeometry g = SmallGeometry();
  constexpr int kNvmeIndex = TierIndex(Tier::kNvme);
  constexpr int kRemoteIndex = TierIndex(Tier::kRemote);
  KVTIER_ASSERT_OK_AND_ASSIGN(
      CacheNamespace ns,
      CacheNamespace::Create(g, {.model_id = "kvtier-test/metadata", .weights_fingerprint = "w"}));
  const std::vector<int32_t> prompt = Iota(4 * kB, 100);
  std::vector<int32_t> query = prompt;
  query.push_back(7);
  KvCacheOptions o;
  o.tiers[kHbm] = Make(Tier::kHbm, 8, g);
  auto nvme = std::make_unique<testing::FaultInjectingTier>(Make(Tier::kNvme, 16, g));
  testing::FaultInjectingTier* faulty = nvme.get();
  o.tiers[kNvmeIndex] = std::move(nvme);
  o.tiers[kRemoteIndex] = MakeShared(std::make_shared<MetadataStore>(), 16);
  o.room_wait = absl::Seconds(10);
  o.publish_to_remote = true;
  o.measure_bandwidth = false;
  o.links[kNvmeIndex] = {absl::ZeroDuration(), 1e9};
  o.links[kRemoteIndex] = {absl::ZeroDuration(), 1e6};
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> c, KvCache::Create(ns, std::move(o)));
  KVTIER_ASSERT_OK(c->CreateSequence(SequenceId(1)));
  KVTIER_ASSERT_OK(c->Append(SequenceId(1), prompt).status());
  KVTIER_ASSERT_OK(c->ReportWritten(SequenceId(1), static_cast<int64_t>(prompt.size())));
  KVTIER_ASSERT_OK(c->WaitIdle(absl::Now() + absl::Seconds(30)));
  KVTIER_ASSERT_OK(c->Release(SequenceId(1)));
  KVTIER_ASSERT_OK(c->CreateSequence(SequenceId(2)));
  KVTIER_ASSERT_OK(c->Append(SequenceId(2), Iota(8 * kB, 900000)).status());
  KVTIER_ASSERT_OK(c->WaitIdle(absl::Now() + absl::Seconds(30)));
  KVTIER_ASSERT_OK(c->Release(SequenceId(2)));
  ASSERT_EQ(c->stats().blocks_moved[kHbm][kNvmeIndex], 4) << testing::StatsString(c->stats());

  faulty->FailNextReads(1 << 20, absl::UnavailableError("injected: the drive is failing"));
  KVTIER_ASSERT_OK(c->CreateSequence(SequenceId(3)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, c->AttachPrefix(SequenceId(3), query));
  EXPECT_EQ(r.attached_blocks_by_tier[kNvmeIndex], 4) << "NVMe is the cheaper link";
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, c->EnsureResident(SequenceId(3), 0, 4 * kB,
                                                                   {.mode = ResidencyMode::kWait}));
  EXPECT_THAT(t.block_status(), Each(BlockResidency::kResident));
  KVTIER_ASSERT_OK(c->ReleaseTicket(t));
  KVTIER_ASSERT_OK(c->Release(SequenceId(3)));
  KVTIER_ASSERT_OK(c->WaitIdle(absl::Now() + absl::Seconds(30)));
  const KvCacheStats s = c->stats();
  EXPECT_EQ(s.tiers[kNvmeIndex].failed_loads, 4) << testing::StatsString(s);
  EXPECT_EQ(s.blocks_moved[kRemoteIndex][kHbm], 4);
  KVTIER_EXPECT_OK(c->CheckInvariants());
}

}  // namespace
}  // namespace kvtier
