// InMemorySlotTier through the tiers built on it: the info and allocator it derives, and the
// host- and device-write hooks, which act on the slot record only for the capability that
// tier_backend.h gives them to.
#include "kvtier/in_memory_slot_tier.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

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

TEST(InMemorySlotTierTest, HostHooksActOnAHostAddressableTier) {
  std::unique_ptr<DramTier> dram = MakeDram();
  ASSERT_NE(dram, nullptr);
  ASSERT_NE(dram->info().capabilities & kCapHostAddressable, 0u);
  std::vector<std::byte> src = Block(0x5a);
  std::vector<std::byte> dst = Block(0);
  KVTIER_ASSERT_OK(dram->WriteBlock(SlotId(1), Key(1), src).Wait());
  KVTIER_EXPECT_OK(dram->CheckHolds(SlotId(1), Key(1)));

  dram->BeginHostWrite(SlotId(1));
  EXPECT_THAT(dram->CheckHolds(SlotId(1), Key(1)),
              IsError(StatusCode::kNotFound, "dram: slot 1 holds no complete block"));
  EXPECT_THAT(dram->ReadBlock(SlotId(1), Key(1), absl::MakeSpan(dst)).Wait(),
              IsError(StatusCode::kNotFound, "slot 1"));
  dram->EndHostWrite(SlotId(1), Key(2));
  KVTIER_EXPECT_OK(dram->CheckHolds(SlotId(1), Key(2)));
  EXPECT_THAT(dram->CheckHolds(SlotId(1), Key(1)), IsError(StatusCode::kDataLoss, "holds block"));
  KVTIER_EXPECT_OK(dram->ReadBlock(SlotId(1), Key(2), absl::MakeSpan(dst)).Wait());
  EXPECT_EQ(dst, src);

  // A slot outside the tier: CheckHolds refuses it, the hooks ignore it.
  EXPECT_THAT(dram->CheckHolds(SlotId(kSlots), Key(1)),
              IsError(StatusCode::kInvalidArgument, "outside [0, 4)"));
  dram->BeginHostWrite(SlotId(kSlots));
  dram->EndHostWrite(SlotId(), Key(1));

  // Device hooks are not for a host tier: slot 1 keeps its block.
  dram->BeginDeviceWrite(SlotId(1));
  KVTIER_EXPECT_OK(dram->CheckHolds(SlotId(1), Key(2)));
  dram->EndDeviceWrite(SlotId(2), Key(7));
  EXPECT_THAT(dram->CheckHolds(SlotId(2), Key(7)), IsError(StatusCode::kNotFound, "slot 2"));
}

TEST(InMemorySlotTierTest, DeviceHooksActOnADeviceTier) {
  std::unique_ptr<EmulatedHbm> hbm = MakeHbm();
  ASSERT_NE(hbm, nullptr);
  std::vector<std::byte> src = Block(0x33);
  std::vector<std::byte> dst = Block(0);
  KVTIER_ASSERT_OK(hbm->WriteBlock(SlotId(3), Key(1), src).Wait());

  hbm->BeginDeviceWrite(SlotId(3));
  EXPECT_THAT(hbm->ReadBlock(SlotId(3), Key(1), absl::MakeSpan(dst)).Wait(),
              IsError(StatusCode::kNotFound, "emulated_hbm(layer_first): slot 3"));
  hbm->EndDeviceWrite(SlotId(3), Key(4));
  KVTIER_EXPECT_OK(hbm->ReadBlock(SlotId(3), Key(4), absl::MakeSpan(dst)).Wait());
  EXPECT_EQ(dst, src);
  EXPECT_THAT(hbm->ReadBlock(SlotId(3), Key(1), absl::MakeSpan(dst)).Wait(),
              IsError(StatusCode::kDataLoss, "not "));
  hbm->BeginDeviceWrite(SlotId(kSlots));  // outside the tier: ignored
  hbm->EndDeviceWrite(SlotId(), Key(1));

  // Host hooks are not for a device tier: no-ops, and CheckHolds is unimplemented.
  hbm->BeginHostWrite(SlotId(3));
  KVTIER_EXPECT_OK(hbm->ReadBlock(SlotId(3), Key(4), absl::MakeSpan(dst)).Wait());
  hbm->EndHostWrite(SlotId(0), Key(5));
  EXPECT_THAT(hbm->ReadBlock(SlotId(0), Key(5), absl::MakeSpan(dst)).Wait(),
              IsError(StatusCode::kNotFound, "slot 0"));
  EXPECT_THAT(hbm->CheckHolds(SlotId(3), Key(4)),
              IsError(StatusCode::kUnimplemented, "not host addressable"));
}

TEST(InMemorySlotTierTest, ATierWithNeitherCapabilityIgnoresEveryHook) {
  auto made = MetadataTier::Create(SmallGeometry(), {.tier = Tier::kDram, .capacity_blocks = 2});
  ASSERT_TRUE(made.ok()) << made.status();
  MetadataTier& t = **made;
  ASSERT_EQ(t.info().capabilities, 0u);
  std::vector<std::byte> buf = Block(0);
  KVTIER_ASSERT_OK(t.WriteBlock(SlotId(0), Key(1), buf).Wait());
  t.BeginHostWrite(SlotId(0));
  t.BeginDeviceWrite(SlotId(0));
  KVTIER_EXPECT_OK(t.ReadBlock(SlotId(0), Key(1), absl::MakeSpan(buf)).Wait());
  t.EndHostWrite(SlotId(1), Key(2));
  t.EndDeviceWrite(SlotId(1), Key(2));
  EXPECT_THAT(t.ReadBlock(SlotId(1), Key(2), absl::MakeSpan(buf)).Wait(),
              IsError(StatusCode::kNotFound, "metadata(dram): slot 1"));
  EXPECT_THAT(t.CheckHolds(SlotId(0), Key(1)), IsError(StatusCode::kUnimplemented, ""));
}

}  // namespace
}  // namespace kvtier
