// InMemorySlotTier through the tiers built on it: the info and allocator it derives, and the
// host- and device-write hooks, which act on the slot record only for the capability that
// tier_backend.h gives them to.
#include "kvtier/in_memory_slot_tier.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/dram_tier.h"
#include "kvtier/emulated_hbm.h"
#include "kvtier/metadata_tier.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

// 2 layers x 2 KV heads x head_dim 8, bf16, 4 tokens per block: 512-byte blocks.
KvGeometry SmallGeometry() {
  return *KvGeometry::Create(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .tokens_per_block = 4});
}

BlockKey Key(uint64_t i) { return BlockKey{0x736c6f74, i}; }

constexpr int64_t kBlockBytes = 512;
constexpr int64_t kSlots = 4;

std::unique_ptr<DramTier> MakeDram() {
  auto t = DramTier::Create(SmallGeometry(),
                            {.capacity_bytes = kSlots * kBlockBytes, .pin_for_cuda = false});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::unique_ptr<EmulatedHbm> MakeHbm() {
  auto t = EmulatedHbm::Create(SmallGeometry(), {.capacity_blocks = kSlots});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<std::byte> Block(uint8_t fill) {
  return std::vector<std::byte>(static_cast<size_t>(kBlockBytes), std::byte{fill});
}

TEST(InMemorySlotTierTest, InfoAndAllocatorFollowTheCapacity) {
  std::unique_ptr<DramTier> dram = MakeDram();
  std::unique_ptr<EmulatedHbm> hbm = MakeHbm();
  auto meta = MetadataTier::Create(SmallGeometry(), {.tier = Tier::kNvme, .capacity_blocks = 7});
  ASSERT_NE(dram, nullptr);
  ASSERT_NE(hbm, nullptr);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(InMemorySlotTier::kMetadataBytesPerSlot, 32);
  for (InMemorySlotTier* t : std::vector<InMemorySlotTier*>{dram.get(), hbm.get(), meta->get()}) {
    const TierInfo& info = t->info();
    SCOPED_TRACE(info.name);
    EXPECT_EQ(info.block_bytes, kBlockBytes);
    EXPECT_EQ(info.capacity_bytes, info.capacity_blocks * kBlockBytes);
    EXPECT_EQ(info.metadata_bytes, info.capacity_blocks * 32);
    EXPECT_EQ(t->allocator().capacity_blocks(), info.capacity_blocks);
    EXPECT_EQ(t->allocator().tier(), info.tier);
  }
  EXPECT_EQ(dram->info().capacity_blocks, kSlots);
  EXPECT_EQ(dram->info().tier, Tier::kDram);
  EXPECT_EQ(hbm->info().tier, Tier::kHbm);
  EXPECT_EQ((*meta)->info().capacity_blocks, 7);
  EXPECT_EQ((*meta)->info().tier, Tier::kNvme);
}

// One tier of each kind, and which hooks act on its slot record.
struct HookCase {
  std::unique_ptr<InMemorySlotTier> tier;
  bool host_hooks;
  bool device_hooks;
};

std::vector<HookCase> HookCases() {
  std::vector<HookCase> cases;
  cases.push_back({MakeDram(), true, false});
  cases.push_back({MakeHbm(), false, true});
  for (Tier tier : {Tier::kHbm, Tier::kDram}) {
    auto t = MetadataTier::Create(SmallGeometry(), {.tier = tier, .capacity_blocks = kSlots});
    EXPECT_TRUE(t.ok()) << t.status();
    cases.push_back({t.ok() ? std::move(*t) : nullptr, false, tier == Tier::kHbm});
  }
  return cases;
}

// Reads `slot` as `key` and waits.
absl::Status Read(InMemorySlotTier& t, SlotId slot, const BlockKey& key) {
  std::vector<std::byte> dst = Block(0);
  return t.ReadBlock(slot, key, absl::MakeSpan(dst)).Wait();
}

// A hook that acts invalidates a written slot (kNotFound) or records a key in a never-written
// one; one that does not leaves the slot as it was.
TEST(InMemorySlotTierTest, EachHookActsOnlyForItsCapability) {
  for (HookCase& c : HookCases()) {
    ASSERT_NE(c.tier, nullptr);
    InMemorySlotTier& t = *c.tier;
    SCOPED_TRACE(t.info().name);
    EXPECT_EQ((t.info().capabilities & kCapHostAddressable) != 0, c.host_hooks);
    EXPECT_EQ((t.info().capabilities & kCapDeviceMemory) != 0, c.device_hooks);
    const std::vector<std::byte> src = Block(0x5a);
    const auto expect_read = [&](SlotId slot, const BlockKey& key, bool holds) {
      if (holds) {
        KVTIER_EXPECT_OK(Read(t, slot, key));
      } else {
        EXPECT_THAT(Read(t, slot, key),
                    IsError(StatusCode::kNotFound,
                            absl::StrCat(t.info().name, ": slot ", slot.value(), " holds no")));
      }
    };

    KVTIER_ASSERT_OK(t.WriteBlock(SlotId(1), Key(1), src).Wait());
    t.BeginHostWrite(SlotId(1));
    expect_read(SlotId(1), Key(1), !c.host_hooks);
    KVTIER_ASSERT_OK(t.WriteBlock(SlotId(1), Key(1), src).Wait());
    t.BeginDeviceWrite(SlotId(1));
    expect_read(SlotId(1), Key(1), !c.device_hooks);

    t.EndHostWrite(SlotId(2), Key(2));
    expect_read(SlotId(2), Key(2), c.host_hooks);
    t.EndDeviceWrite(SlotId(3), Key(3));
    expect_read(SlotId(3), Key(3), c.device_hooks);
    if (c.host_hooks || c.device_hooks) {
      EXPECT_THAT(Read(t, SlotId(c.host_hooks ? 2 : 3), Key(9)),
                  IsError(StatusCode::kDataLoss, "holds block"));
    }

    // Slots outside the tier: every hook ignores them.
    for (SlotId outside : {SlotId(kSlots), SlotId()}) {
      t.BeginHostWrite(outside);
      t.EndHostWrite(outside, Key(4));
      t.BeginDeviceWrite(outside);
      t.EndDeviceWrite(outside, Key(4));
    }

    if (c.host_hooks) {
      KVTIER_EXPECT_OK(t.CheckHolds(SlotId(2), Key(2)));
      EXPECT_THAT(t.CheckHolds(SlotId(0), Key(2)),
                  IsError(StatusCode::kNotFound, "slot 0 holds no complete block"));
      EXPECT_THAT(t.CheckHolds(SlotId(2), Key(1)), IsError(StatusCode::kDataLoss, "holds block"));
      EXPECT_THAT(t.CheckHolds(SlotId(kSlots), Key(2)),
                  IsError(StatusCode::kInvalidArgument, "outside [0, 4)"));
    } else {
      EXPECT_THAT(t.CheckHolds(SlotId(1), Key(1)),
                  IsError(StatusCode::kUnimplemented, "this tier is not host addressable"));
    }
  }
}

// A completion callback that calls the tier while it is being destroyed (the write's callback
// runs on the host-to-device worker, which drains after the device-to-host one is gone): the call
// is answered kUnavailable instead of being queued on a worker that no longer runs (its
// completion never fired; the queue it went to was freed).
TEST(EmulatedHbmTest, ACallFromACallbackDuringDestructionIsAnsweredNotLost) {
  std::unique_ptr<EmulatedHbm> hbm = MakeHbm();
  ASSERT_NE(hbm, nullptr);
  EmulatedHbm* tier = hbm.get();
  const std::vector<std::byte> block = Block(7);
  std::vector<std::byte> out(block.size());
  Completion read;
  Completion read_made;
  KVTIER_ASSERT_OK(tier->WriteBlock(SlotId(0), Key(1), block).Wait());
  // A layer-wise write whose progress callback holds the host-to-device worker for 200 ms, long
  // enough for this thread to start destroying the tier (if it is slower, the read below simply
  // runs: either outcome is an answer), so the next write is still queued then.
  auto slow = std::make_shared<LayerProgress>();
  slow->landed = [](int layers) {
    if (layers == 1) absl::SleepFor(absl::Milliseconds(200));
  };
  (void)tier->WriteBlock(SlotId(2), Key(3), block, {.layers = slow});
  Completion queued = tier->WriteBlock(SlotId(1), Key(2), block);
  queued.OnDone([&](const absl::Status&) {
    read = tier->ReadBlock(SlotId(0), Key(1), absl::MakeSpan(out));
    read_made.Complete(absl::OkStatus());
  });
  hbm.reset();  // waits for both writes and the callback
  ASSERT_TRUE(read_made.done());
  ASSERT_TRUE(read.done()) << "a read queued on a worker that had stopped";
  if (!read.status().ok()) {
    EXPECT_THAT(read.status(), IsError(StatusCode::kUnavailable, "being destroyed"));
  }
}

}  // namespace
}  // namespace kvtier
