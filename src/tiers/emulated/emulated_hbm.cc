// EmulatedHbm (emulated_hbm.h): device memory emulated in host memory, with CUDA's asynchrony.
#include "kvtier/emulated_hbm.h"

#include <cstring>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/host_region.h"
#include "internal/status_macros.h"
#include "internal/stream_worker.h"
#include "tiers/device_pool_view.h"
#include "tiers/slot_contents.h"

namespace kvtier {
namespace {

// Queues `op` on `worker`; the Completion fires with its status, or with kDeadlineExceeded and
// `op` not run if the worker reaches it after `deadline`. `info` must outlive the queued work.
Completion EnqueueUnlessLate(internal::StreamWorker& worker, const TierInfo& info, SlotId slot,
                             absl::Time deadline, std::function<absl::Status()> op) {
  Completion done;
  worker.Enqueue([&info, slot, deadline, done, op = std::move(op)] {
    done.Complete(absl::Now() > deadline ? internal::DeadlinePassed(info, slot) : op());
  });
  return done;
}

}  // namespace

struct EmulatedHbm::Impl {
  Impl(const KvGeometry& g, HbmLayout pool_layout, int64_t slots, internal::HostRegion pool)
      : geometry(g), layout(pool_layout), capacity_blocks(slots), region(std::move(pool)) {}

  // Copies between the block-contiguous host buffer and the slot, in the pool's layout.
  void ToPool(SlotId slot, const std::byte* src) const {
    if (layout == HbmLayout::kBlockFirst) {
      std::memcpy(region.data() + slot.value() * block_bytes(), src, block_bytes());
      return;
    }
    const int64_t per_layer = geometry.bytes_per_block_per_layer();
    for (int l = 0; l < geometry.num_layers(); ++l) {
      std::memcpy(LayerBase(l) + slot.value() * per_layer, src + l * per_layer, per_layer);
    }
  }
  void FromPool(SlotId slot, std::byte* dst) const {
    if (layout == HbmLayout::kBlockFirst) {
      std::memcpy(dst, region.data() + slot.value() * block_bytes(), block_bytes());
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
    return region.data() + layer * per_layer * capacity_blocks;
  }
  int64_t block_bytes() const { return geometry.bytes_per_block(); }

  const KvGeometry geometry;
  const HbmLayout layout;
  const int64_t capacity_blocks;
  internal::HostRegion region;
  // Last members: destroyed first, so queued work finishes while everything above (and the
  // InMemorySlotTier base, destroyed after this Impl) still exists.
  internal::StreamWorker host_to_device;
  internal::StreamWorker device_to_host;
};

absl::StatusOr<std::unique_ptr<EmulatedHbm>> EmulatedHbm::Create(
    const KvGeometry& geometry, const EmulatedHbmOptions& options) {
  KVTIER_RETURN_IF_ERROR(internal::CheckHbmPoolShape("EmulatedHbm", geometry, options.layout,
                                                     options.capacity_blocks));
  TierInfo info =
      MakeInfo(Tier::kHbm, absl::StrCat("emulated_hbm(", HbmLayoutName(options.layout), ")"),
               options.capacity_blocks, geometry.bytes_per_block(), kCapDeviceMemory);
  KVTIER_ASSIGN_OR_RETURN(
      internal::HostRegion region,
      internal::HostRegion::Create(static_cast<size_t>(info.capacity_bytes), info.name,
                                   /*try_huge_pages=*/true, options.check_available_memory,
                                   /*prefault=*/true));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockAllocator> allocator,
                          BlockAllocator::Create(Tier::kHbm, options.capacity_blocks));
  return std::unique_ptr<EmulatedHbm>(
      new EmulatedHbm(std::move(info), std::move(allocator),
                      std::make_unique<Impl>(geometry, options.layout, options.capacity_blocks,
                                             std::move(region))));
}

EmulatedHbm::EmulatedHbm(TierInfo info, std::unique_ptr<BlockAllocator> allocator,
                         std::unique_ptr<Impl> impl)
    : InMemorySlotTier(std::move(info), std::move(allocator)), impl_(std::move(impl)) {}
EmulatedHbm::~EmulatedHbm() = default;

HbmLayout EmulatedHbm::layout() const { return impl_->layout; }

std::byte* EmulatedHbm::LayerBase(int layer) const {
  if (layer < 0 || layer >= impl_->geometry.num_layers()) return nullptr;
  return impl_->LayerBase(layer);
}

std::optional<DevicePoolView> EmulatedHbm::device_pool() const {
  return internal::MakeDevicePoolView(
      impl_->geometry, impl_->layout, [this](int l) -> void* { return impl_->LayerBase(l); },
      /*host_accessible=*/true);
}

// The workers run each operation's record updates on the tier (`this`) and its copies on the
// Impl; both outlive every queued operation (see Impl's last members).
Completion EmulatedHbm::WriteBlock(SlotId slot, const BlockKey& key,
                                   absl::Span<const std::byte> src, const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIo(info(), slot, src.size()); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  Impl* impl = impl_.get();
  return EnqueueUnlessLate(impl->host_to_device, info(), slot, options.deadline,
                           [this, impl, slot, key, src] {
                             BeginSlotWrite(slot);
                             impl->ToPool(slot, src.data());
                             EndSlotWrite(slot, key);
                             return absl::OkStatus();
                           });
}

Completion EmulatedHbm::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                                  const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIo(info(), slot, dst.size()); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  Impl* impl = impl_.get();
  return EnqueueUnlessLate(impl->device_to_host, info(), slot, options.deadline,
                           [this, impl, slot, key, dst] {
                             KVTIER_RETURN_IF_ERROR(CheckSlotHolds(slot, key));
                             impl->FromPool(slot, dst.data());
                             return absl::OkStatus();
                           });
}

}  // namespace kvtier
