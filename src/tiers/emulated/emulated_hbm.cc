#include "kvtier/emulated_hbm.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/host_region.h"
#include "internal/status_macros.h"
#include "internal/stream_worker.h"
#include "tiers/device_pool_view.h"
#include "tiers/slot_contents.h"

namespace kvtier {

struct EmulatedHbm::Impl {
  Impl(const KvGeometry& g, HbmLayout pool_layout, internal::HostRegion pool,
       std::unique_ptr<BlockAllocator> slots, TierInfo tier_info)
      : geometry(g),
        layout(pool_layout),
        region(std::move(pool)),
        allocator(std::move(slots)),
        info(std::move(tier_info)),
        contents(info.capacity_blocks) {}

  // Copies between the block-contiguous host buffer and the slot, in the pool's layout.
  void ToPool(SlotId slot, const std::byte* src) const {
    if (layout == HbmLayout::kBlockFirst) {
      std::memcpy(region.data() + slot.value() * info.block_bytes, src, info.block_bytes);
      return;
    }
    const int64_t per_layer = geometry.bytes_per_block_per_layer();
    for (int l = 0; l < geometry.num_layers(); ++l) {
      std::memcpy(LayerBase(l) + slot.value() * per_layer, src + l * per_layer, per_layer);
    }
  }
  void FromPool(SlotId slot, std::byte* dst) const {
    if (layout == HbmLayout::kBlockFirst) {
      std::memcpy(dst, region.data() + slot.value() * info.block_bytes, info.block_bytes);
      return;
    }
    const int64_t per_layer = geometry.bytes_per_block_per_layer();
    for (int l = 0; l < geometry.num_layers(); ++l) {
      std::memcpy(dst + l * per_layer, LayerBase(l) + slot.value() * per_layer, per_layer);
    }
  }
  std::byte* LayerBase(int layer) const {
    const int64_t per_layer = geometry.bytes_per_block_per_layer();
    if (layout == HbmLayout::kBlockFirst) return region.data() + layer * per_layer;
    return region.data() + layer * per_layer * info.capacity_blocks;
  }

  const KvGeometry geometry;
  const HbmLayout layout;
  internal::HostRegion region;
  std::unique_ptr<BlockAllocator> allocator;
  const TierInfo info;
  internal::SlotContents contents;
  // Last members: destroyed first, so queued work finishes while everything above still exists.
  internal::StreamWorker host_to_device;
  internal::StreamWorker device_to_host;
};

absl::StatusOr<std::unique_ptr<EmulatedHbm>> EmulatedHbm::Create(
    const KvGeometry& geometry, const EmulatedHbmOptions& options) {
  if (options.layout != HbmLayout::kLayerFirst && options.layout != HbmLayout::kBlockFirst) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmulatedHbm: unknown layout ", static_cast<int>(options.layout)));
  }
  if (options.capacity_blocks < 1 ||
      options.capacity_blocks > std::numeric_limits<int64_t>::max() / geometry.bytes_per_block()) {
    return absl::InvalidArgumentError(absl::StrCat("EmulatedHbm: capacity_blocks = ",
                                                   options.capacity_blocks, " is not usable"));
  }
  TierInfo info;
  info.tier = Tier::kHbm;
  info.name = absl::StrCat("emulated_hbm(", HbmLayoutName(options.layout), ")");
  info.capacity_blocks = options.capacity_blocks;
  info.block_bytes = geometry.bytes_per_block();
  info.capacity_bytes = info.capacity_blocks * info.block_bytes;
  info.metadata_bytes = info.capacity_blocks * (8 + internal::SlotContents::kBytesPerSlot);
  info.capabilities = kCapDeviceMemory;
  KVTIER_ASSIGN_OR_RETURN(
      internal::HostRegion region,
      internal::HostRegion::Create(static_cast<size_t>(info.capacity_bytes), info.name,
                                   /*try_huge_pages=*/true, options.check_available_memory,
                                   /*prefault=*/true));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockAllocator> allocator,
                          BlockAllocator::Create(Tier::kHbm, options.capacity_blocks));
  return std::unique_ptr<EmulatedHbm>(new EmulatedHbm(std::make_unique<Impl>(
      geometry, options.layout, std::move(region), std::move(allocator), std::move(info))));
}

EmulatedHbm::EmulatedHbm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EmulatedHbm::~EmulatedHbm() = default;

const TierInfo& EmulatedHbm::info() const { return impl_->info; }
BlockAllocator& EmulatedHbm::allocator() { return *impl_->allocator; }
HbmLayout EmulatedHbm::layout() const { return impl_->layout; }

std::byte* EmulatedHbm::LayerBase(int layer) const {
  if (layer < 0 || layer >= impl_->geometry.num_layers()) return nullptr;
  return impl_->LayerBase(layer);
}

void EmulatedHbm::BeginDeviceWrite(SlotId slot) {
  if (slot.value() < static_cast<uint64_t>(impl_->info.capacity_blocks)) {
    impl_->contents.Invalidate(slot);
  }
}

void EmulatedHbm::EndDeviceWrite(SlotId slot, const BlockKey& key) {
  if (slot.value() < static_cast<uint64_t>(impl_->info.capacity_blocks)) {
    impl_->contents.Set(slot, key);
  }
}

std::optional<DevicePoolView> EmulatedHbm::device_pool() const {
  return internal::MakeDevicePoolView(
      impl_->geometry, impl_->layout, [this](int l) -> void* { return impl_->LayerBase(l); },
      /*host_accessible=*/true);
}

Completion EmulatedHbm::WriteBlock(SlotId slot, const BlockKey& key,
                                   absl::Span<const std::byte> src, const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIo(impl_->info, slot, src.size()); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  Completion done;
  Impl* impl = impl_.get();
  impl->host_to_device.Enqueue([impl, slot, key, src, deadline = options.deadline, done] {
    if (absl::Now() > deadline) {
      done.Complete(internal::DeadlinePassed(impl->info, slot));
      return;
    }
    impl->contents.Invalidate(slot);
    impl->ToPool(slot, src.data());
    impl->contents.Set(slot, key);
    done.Complete(absl::OkStatus());
  });
  return done;
}

Completion EmulatedHbm::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                                  const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIo(impl_->info, slot, dst.size()); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  Completion done;
  Impl* impl = impl_.get();
  impl->device_to_host.Enqueue([impl, slot, key, dst, deadline = options.deadline, done] {
    if (absl::Now() > deadline) {
      done.Complete(internal::DeadlinePassed(impl->info, slot));
      return;
    }
    if (absl::Status s = impl->contents.Check(slot, key, impl->info); !s.ok()) {
      done.Complete(std::move(s));
      return;
    }
    impl->FromPool(slot, dst.data());
    done.Complete(absl::OkStatus());
  });
  return done;
}

}  // namespace kvtier
