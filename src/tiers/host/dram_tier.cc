#include "kvtier/dram_tier.h"

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/host_region.h"
#include "internal/status_macros.h"
#include "platform/cuda_host.h"
#include "tiers/slot_contents.h"

namespace kvtier {

struct DramTier::Impl {
  Impl(internal::HostRegion pool, bool is_pinned, std::unique_ptr<BlockAllocator> slots,
       TierInfo tier_info)
      : region(std::move(pool)),
        pinned(is_pinned),
        allocator(std::move(slots)),
        info(std::move(tier_info)),
        contents(info.capacity_blocks) {}
  ~Impl() {
    if (pinned) internal::UnpinHostMemory(region.data(), region.size());
  }
  std::byte* Slot(SlotId slot) const { return region.data() + slot.value() * info.block_bytes; }

  internal::HostRegion region;
  const bool pinned;
  std::unique_ptr<BlockAllocator> allocator;
  const TierInfo info;
  internal::SlotContents contents;
};

absl::StatusOr<std::unique_ptr<DramTier>> DramTier::Create(const KvGeometry& geometry,
                                                           const DramTierOptions& options) {
  const int64_t block_bytes = geometry.bytes_per_block();
  const int64_t blocks = options.capacity_bytes > 0 ? options.capacity_bytes / block_bytes : 0;
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("DramTier: capacity_bytes = ",
                                                   options.capacity_bytes,
                                                   " holds no whole block of ", block_bytes,
                                                   " bytes"));
  }
  TierInfo info;
  info.tier = Tier::kDram;
  info.name = "dram";
  info.capacity_blocks = blocks;
  info.block_bytes = block_bytes;
  info.capacity_bytes = blocks * block_bytes;
  info.metadata_bytes = blocks * (8 + internal::SlotContents::kBytesPerSlot);
  info.capabilities = kCapHostAddressable;
  KVTIER_ASSIGN_OR_RETURN(
      internal::HostRegion region,
      internal::HostRegion::Create(static_cast<size_t>(info.capacity_bytes), "DramTier",
                                   options.try_huge_pages, options.check_available_memory,
                                   options.prefault));
  // After the region: its budget check must refuse an impossible size before anything else is
  // allocated for it (the allocator alone takes 8 bytes per slot).
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockAllocator> allocator,
                          BlockAllocator::Create(Tier::kDram, blocks));
  bool pinned = false;
  if (options.pin_for_cuda && internal::CudaDeviceAnswers()) {
    KVTIER_RETURN_IF_ERROR(internal::PinHostMemory(region.data(), region.size()));
    pinned = true;
    info.capabilities |= kCapPinnedHost;
  }
  return std::unique_ptr<DramTier>(new DramTier(
      std::make_unique<Impl>(std::move(region), pinned, std::move(allocator), std::move(info))));
}

DramTier::DramTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DramTier::~DramTier() = default;

const TierInfo& DramTier::info() const { return impl_->info; }
BlockAllocator& DramTier::allocator() { return *impl_->allocator; }
int64_t DramTier::mapped_bytes() const { return static_cast<int64_t>(impl_->region.mapped_bytes()); }
bool DramTier::huge_pages() const { return impl_->region.huge_pages(); }

std::byte* DramTier::HostAddress(SlotId slot) {
  if (slot.value() >= static_cast<uint64_t>(impl_->info.capacity_blocks)) return nullptr;
  return impl_->Slot(slot);
}

void DramTier::BeginHostWrite(SlotId slot) {
  if (slot.value() < static_cast<uint64_t>(impl_->info.capacity_blocks)) {
    impl_->contents.Invalidate(slot);
  }
}

void DramTier::EndHostWrite(SlotId slot, const BlockKey& key) {
  if (slot.value() < static_cast<uint64_t>(impl_->info.capacity_blocks)) {
    impl_->contents.Set(slot, key);
  }
}

absl::Status DramTier::CheckHolds(SlotId slot, const BlockKey& key) {
  KVTIER_RETURN_IF_ERROR(internal::CheckBlockIo(impl_->info, slot, impl_->info.block_bytes));
  return impl_->contents.Check(slot, key, impl_->info);
}

Completion DramTier::WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                                const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIoNow(impl_->info, slot, src.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  impl_->contents.Invalidate(slot);
  std::memcpy(impl_->Slot(slot), src.data(), src.size());
  impl_->contents.Set(slot, key);
  return Completion::Done(absl::OkStatus());
}

Completion DramTier::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                               const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIoNow(impl_->info, slot, dst.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  if (absl::Status s = impl_->contents.Check(slot, key, impl_->info); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  std::memcpy(dst.data(), impl_->Slot(slot), dst.size());
  return Completion::Done(absl::OkStatus());
}

}  // namespace kvtier
