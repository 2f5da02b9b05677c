// DramTier (dram_tier.h): one exact-size host region, page-locked when a GPU answers.
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
  Impl(internal::HostRegion pool, bool is_pinned, int64_t bytes_per_block)
      : region(std::move(pool)), pinned(is_pinned), block_bytes(bytes_per_block) {}
  ~Impl() {
    if (pinned) internal::UnpinHostMemory(region.data(), region.size());
  }
  std::byte* Slot(SlotId slot) const { return region.data() + slot.value() * block_bytes; }

  internal::HostRegion region;
  const bool pinned;
  const int64_t block_bytes;
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
  TierInfo info = MakeInfo(Tier::kDram, "dram", blocks, block_bytes, kCapHostAddressable);
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
  return std::unique_ptr<DramTier>(
      new DramTier(std::move(info), std::move(allocator),
                   std::make_unique<Impl>(std::move(region), pinned, block_bytes)));
}

DramTier::DramTier(TierInfo info, std::unique_ptr<BlockAllocator> allocator,
                   std::unique_ptr<Impl> impl)
    : InMemorySlotTier(std::move(info), std::move(allocator)), impl_(std::move(impl)) {}
DramTier::~DramTier() = default;

int64_t DramTier::mapped_bytes() const { return static_cast<int64_t>(impl_->region.mapped_bytes()); }
bool DramTier::huge_pages() const { return impl_->region.huge_pages(); }

std::byte* DramTier::HostAddress(SlotId slot) {
  if (!InRange(slot)) return nullptr;
  return impl_->Slot(slot);
}

Completion DramTier::WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                                const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIoNow(info(), slot, src.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  BeginSlotWrite(slot);
  std::memcpy(impl_->Slot(slot), src.data(), src.size());
  EndSlotWrite(slot, key);
  return Completion::Done(absl::OkStatus());
}

Completion DramTier::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                               const BlockIoOptions& options) {
  if (absl::Status s = CheckReadNow(slot, key, dst.size(), options.deadline); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  std::memcpy(dst.data(), impl_->Slot(slot), dst.size());
  return Completion::Done(absl::OkStatus());
}

}  // namespace kvtier
