// MetadataTier (metadata_tier.h): a tier's slots and block identities, no bytes.
#include "kvtier/metadata_tier.h"

#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/host_region.h"
#include "internal/status_macros.h"
#include "internal/strings.h"
#include "tiers/device_pool_view.h"
#include "tiers/slot_contents.h"

namespace kvtier {

struct MetadataTier::Impl {
  const KvGeometry geometry;
};

absl::StatusOr<std::unique_ptr<MetadataTier>> MetadataTier::Create(
    const KvGeometry& geometry, const MetadataTierOptions& options) {
  if (TierIndex(options.tier) < 0 || TierIndex(options.tier) >= kNumTiers) {
    return absl::InvalidArgumentError(
        absl::StrCat("MetadataTier: unknown tier ", TierIndex(options.tier)));
  }
  const int64_t block_bytes = geometry.bytes_per_block();
  if (options.capacity_blocks < 1 || options.capacity_blocks > BlockAllocator::kMaxCapacityBlocks ||
      options.capacity_blocks > std::numeric_limits<int64_t>::max() / block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("MetadataTier: capacity_blocks = ", options.capacity_blocks, " is not in [1, ",
                     BlockAllocator::kMaxCapacityBlocks, "] or its bytes overflow"));
  }
  // kCapDeviceMemory so KvCache takes it as HBM; never kCapHostAddressable: no bytes to address.
  TierInfo info = MakeInfo(options.tier,
                           absl::StrCat("metadata(", internal::ToAbsl(TierName(options.tier)), ")"),
                           options.capacity_blocks, block_bytes,
                           kCapInlineIo | (options.tier == Tier::kHbm ? uint32_t{kCapDeviceMemory}
                                                                      : uint32_t{0}));
  // The bookkeeping is the only memory this tier takes, and at 2^31 slots it is 64 GiB: refuse
  // it up front rather than fail inside a vector allocation.
  if (absl::StatusOr<int64_t> available = internal::AvailableMemoryBytes();
      available.ok() && info.metadata_bytes > *available) {
    return absl::ResourceExhaustedError(
        absl::StrCat(info.name, ": ", info.metadata_bytes, " bytes of slot bookkeeping but only ",
                     *available, " bytes of memory are available (MemAvailable)"));
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockAllocator> allocator,
                          BlockAllocator::Create(options.tier, options.capacity_blocks));
  return std::unique_ptr<MetadataTier>(new MetadataTier(std::move(info), std::move(allocator),
                                                        std::make_unique<Impl>(Impl{geometry})));
}

MetadataTier::MetadataTier(TierInfo info, std::unique_ptr<BlockAllocator> allocator,
                           std::unique_ptr<Impl> impl)
    : InMemorySlotTier(std::move(info), std::move(allocator)), impl_(std::move(impl)) {}
MetadataTier::~MetadataTier() = default;

Completion MetadataTier::WriteBlock(SlotId slot, const BlockKey& key,
                                    absl::Span<const std::byte> src,
                                    const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIoNow(info(), slot, src.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  // No bytes to copy, so the write is one step: the slot goes from its old key to `key` under
  // the record's lock, and no reader can see anything in between.
  EndSlotWrite(slot, key);
  return Completion::Done(absl::OkStatus());
}

Completion MetadataTier::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                                   const BlockIoOptions& options) {
  return Completion::Done(CheckReadNow(slot, key, dst.size(), options.deadline));
}

std::optional<DevicePoolView> MetadataTier::device_pool() const {
  if (info().tier != Tier::kHbm) return std::nullopt;
  DevicePoolView view = internal::MakeDevicePoolView(
      impl_->geometry, HbmLayout::kLayerFirst, [](int) -> void* { return nullptr; },
      /*host_accessible=*/false);
  // No memory, so no addresses: an empty list cannot be mistaken for a pool at address 0.
  view.k_base.clear();
  view.v_base.clear();
  return view;
}

}  // namespace kvtier
