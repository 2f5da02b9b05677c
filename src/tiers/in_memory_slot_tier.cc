// InMemorySlotTier: the TierInfo, allocator and slot record its tiers share, and the TierBackend
// members that need only those.
#include "kvtier/in_memory_slot_tier.h"

#include <utility>

#include "internal/status_macros.h"
#include "tiers/slot_contents.h"

namespace kvtier {

static_assert(InMemorySlotTier::kMetadataBytesPerSlot == 8 + internal::SlotContents::kBytesPerSlot,
              "the header's per-slot cost must match what the tier keeps");

InMemorySlotTier::InMemorySlotTier(TierInfo info, std::unique_ptr<BlockAllocator> allocator)
    : info_(std::move(info)),
      allocator_(std::move(allocator)),
      contents_(std::make_unique<internal::SlotContents>(info_.capacity_blocks)) {}

InMemorySlotTier::~InMemorySlotTier() = default;

TierInfo InMemorySlotTier::MakeInfo(Tier tier, std::string name, int64_t capacity_blocks,
                                    int64_t block_bytes, uint32_t capabilities) {
  TierInfo info;
  info.tier = tier;
  info.name = std::move(name);
  info.capacity_blocks = capacity_blocks;
  info.block_bytes = block_bytes;
  info.capacity_bytes = capacity_blocks * block_bytes;
  info.metadata_bytes = capacity_blocks * kMetadataBytesPerSlot;
  info.capabilities = capabilities;
  return info;
}

const TierInfo& InMemorySlotTier::info() const { return info_; }
BlockAllocator& InMemorySlotTier::allocator() { return *allocator_; }

bool InMemorySlotTier::InRange(SlotId slot) const {
  return slot.value() < static_cast<uint64_t>(info_.capacity_blocks);
}

void InMemorySlotTier::BeginSlotWrite(SlotId slot) { contents_->Invalidate(slot); }
void InMemorySlotTier::EndSlotWrite(SlotId slot, const BlockKey& key) { contents_->Set(slot, key); }

absl::Status InMemorySlotTier::CheckSlotHolds(SlotId slot, const BlockKey& key) const {
  return contents_->Check(slot, key, info_);
}

absl::Status InMemorySlotTier::CheckReadNow(SlotId slot, const BlockKey& key, size_t bytes,
                                            absl::Time deadline) const {
  KVTIER_RETURN_IF_ERROR(internal::CheckBlockIoNow(info_, slot, bytes, deadline));
  return CheckSlotHolds(slot, key);
}

// The hooks: tier_backend.h gives each pair to the tiers of one capability, no-ops elsewhere.
namespace {
bool HookApplies(const TierInfo& info, uint32_t capability, SlotId slot) {
  return (info.capabilities & capability) != 0 &&
         slot.value() < static_cast<uint64_t>(info.capacity_blocks);
}
}  // namespace

void InMemorySlotTier::BeginHostWrite(SlotId slot) {
  if (HookApplies(info_, kCapHostAddressable, slot)) BeginSlotWrite(slot);
}
void InMemorySlotTier::EndHostWrite(SlotId slot, const BlockKey& key) {
  if (HookApplies(info_, kCapHostAddressable, slot)) EndSlotWrite(slot, key);
}
void InMemorySlotTier::BeginDeviceWrite(SlotId slot) {
  if (HookApplies(info_, kCapDeviceMemory, slot)) BeginSlotWrite(slot);
}
void InMemorySlotTier::EndDeviceWrite(SlotId slot, const BlockKey& key) {
  if (HookApplies(info_, kCapDeviceMemory, slot)) EndSlotWrite(slot, key);
}

absl::Status InMemorySlotTier::CheckHolds(SlotId slot, const BlockKey& key) {
  if ((info_.capabilities & kCapHostAddressable) == 0) return TierBackend::CheckHolds(slot, key);
  KVTIER_RETURN_IF_ERROR(
      internal::CheckBlockIo(info_, slot, static_cast<size_t>(info_.block_bytes)));
  return CheckSlotHolds(slot, key);
}

}  // namespace kvtier
