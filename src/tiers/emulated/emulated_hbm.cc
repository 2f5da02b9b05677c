// EmulatedHbm (emulated_hbm.h): device memory emulated in host memory, with CUDA's asynchrony.
#include "kvtier/emulated_hbm.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/host_region.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "internal/stream_worker.h"
#include "tiers/device_pool_view.h"
#include "tiers/slot_contents.h"

namespace kvtier {
namespace {

// What a call made once the tier's destructor has begun gets (from a completion callback of a
// queued operation, say): the workers may be gone.
absl::Status ClosingError(const TierInfo& info) {
  return absl::UnavailableError(absl::StrCat(info.name, ": the tier is being destroyed"));
}

}  // namespace

struct EmulatedHbm::Impl {
  Impl(const KvGeometry& g, HbmLayout pool_layout, int64_t slots,
       std::optional<internal::HostRegion> pool, std::vector<void*> external)
      : geometry(g), layout(pool_layout), capacity_blocks(slots), region(std::move(pool)) {
    host_to_device.emplace();
    device_to_host.emplace();
    // Slot 0's first byte of each layer (LayerPieces' layer base): in our region, or the
    // engine's tensors (one per layer; one for the whole pool, block-first).
    const int64_t per_layer = geometry.bytes_per_block_per_layer();
    for (int l = 0; l < geometry.num_layers(); ++l) {
      std::byte* base = nullptr;
      if (!external.empty()) {
        base = layout == HbmLayout::kBlockFirst
                   ? static_cast<std::byte*>(external[0]) + l * per_layer
                   : static_cast<std::byte*>(external[static_cast<size_t>(l)]);
      } else {
        base = layout == HbmLayout::kBlockFirst ? region->data() + l * per_layer
                                                : region->data() + l * per_layer * capacity_blocks;
      }
      layer_bases.push_back(base);
    }
  }

  // Copies layer `layer` of `slot` from / to the block-contiguous host buffer, in the pool's
  // layout.
  void LayerToPool(SlotId slot, int layer, const std::byte* src) const {
    internal::PoolPiece pieces[2];
    const int n = internal::LayerPieces(geometry, layout, capacity_blocks, slot.value(), layer,
                                        pieces);
    for (int i = 0; i < n; ++i) {
      std::memcpy(LayerBase(layer) + pieces[i].pool_offset, src + pieces[i].host_offset,
                  static_cast<size_t>(pieces[i].bytes));
    }
  }
  void LayerFromPool(SlotId slot, int layer, std::byte* dst) const {
    internal::PoolPiece pieces[2];
    const int n = internal::LayerPieces(geometry, layout, capacity_blocks, slot.value(), layer,
                                        pieces);
    for (int i = 0; i < n; ++i) {
      std::memcpy(dst + pieces[i].host_offset, LayerBase(layer) + pieces[i].pool_offset,
                  static_cast<size_t>(pieces[i].bytes));
    }
  }
  void ToPool(SlotId slot, const std::byte* src) const {
    if (layout == HbmLayout::kBlockFirst) {  // one run: one copy
      std::memcpy(layer_bases[0] + slot.value() * block_bytes(), src, block_bytes());
      return;
    }
    for (int l = 0; l < geometry.num_layers(); ++l) LayerToPool(slot, l, src);
  }
  void FromPool(SlotId slot, std::byte* dst) const {
    if (layout == HbmLayout::kBlockFirst) {
      std::memcpy(dst, layer_bases[0] + slot.value() * block_bytes(), block_bytes());
      return;
    }
    for (int l = 0; l < geometry.num_layers(); ++l) LayerFromPool(slot, l, dst);
  }
  // Slot 0's first byte of layer `layer` (LayerPieces' layer base).
  std::byte* LayerBase(int layer) const { return layer_bases[static_cast<size_t>(layer)]; }
  int64_t block_bytes() const { return geometry.bytes_per_block(); }

  const KvGeometry geometry;
  const HbmLayout layout;
  const int64_t capacity_blocks;
  std::optional<internal::HostRegion> region;  // none: the engine's tensors (external_pool)
  std::vector<std::byte*> layer_bases;
  // Queues `task` on `worker` unless the tier is closing (false then). Checked and queued under
  // one lock, which ~EmulatedHbm takes to set `closing` before it stops the workers: nothing is
  // queued on a worker after that.
  bool EnqueueIfOpen(std::optional<internal::StreamWorker>& worker, std::function<void()> task) {
    internal::MutexLock lock(&closing_mu);
    if (closing) return false;
    worker->Enqueue(std::move(task));
    return true;
  }
  // Queues `op`; the Completion fires with its status, or with kDeadlineExceeded and `op` not
  // run if the worker reaches it after `deadline`, or at once with ClosingError. `info` must
  // outlive the queued work.
  Completion EnqueueUnlessLate(std::optional<internal::StreamWorker>& worker, const TierInfo& info,
                               SlotId slot, absl::Time deadline, std::function<absl::Status()> op) {
    Completion done;
    if (!EnqueueIfOpen(worker, [&info, slot, deadline, done, op = std::move(op)] {
          done.Complete(absl::Now() > deadline ? internal::DeadlinePassed(info, slot) : op());
        })) {
      done.Complete(ClosingError(info));
    }
    return done;
  }

  internal::Mutex closing_mu;
  bool closing ABSL_GUARDED_BY(closing_mu) = false;
  // Last members: the workers, started in the constructor and stopped by ~EmulatedHbm (queued
  // work first) while everything above, and the InMemorySlotTier base, still exists.
  std::optional<internal::StreamWorker> host_to_device;
  std::optional<internal::StreamWorker> device_to_host;
};

absl::StatusOr<std::unique_ptr<EmulatedHbm>> EmulatedHbm::Create(
    const KvGeometry& geometry, const EmulatedHbmOptions& options) {
  KVTIER_RETURN_IF_ERROR(internal::CheckHbmPoolShape("EmulatedHbm", geometry, options.layout,
                                                     options.capacity_blocks));
  TierInfo info =
      MakeInfo(Tier::kHbm, absl::StrCat("emulated_hbm(", HbmLayoutName(options.layout), ")"),
               options.capacity_blocks, geometry.bytes_per_block(),
               kCapDeviceMemory | kCapLayerwise);
  std::optional<internal::HostRegion> region;
  if (options.external_pool.empty()) {
    KVTIER_ASSIGN_OR_RETURN(
        region, internal::HostRegion::Create(static_cast<size_t>(info.capacity_bytes), info.name,
                                             /*try_huge_pages=*/true,
                                             options.check_available_memory,
                                             /*prefault=*/true));
  } else {
    const size_t want = options.layout == HbmLayout::kBlockFirst
                            ? size_t{1}
                            : static_cast<size_t>(geometry.num_layers());
    if (options.external_pool.size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("EmulatedHbm: external_pool has ", options.external_pool.size(),
                       " pointers; the layout needs ", want));
    }
    for (size_t i = 0; i < want; ++i) {
      if (options.external_pool[i] == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("EmulatedHbm: external_pool[", i, "] is null"));
      }
    }
    info.name = absl::StrCat("emulated_hbm(", HbmLayoutName(options.layout), ", registered)");
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockAllocator> allocator,
                          BlockAllocator::Create(Tier::kHbm, options.capacity_blocks));
  return std::unique_ptr<EmulatedHbm>(
      new EmulatedHbm(std::move(info), std::move(allocator),
                      std::make_unique<Impl>(geometry, options.layout, options.capacity_blocks,
                                             std::move(region), options.external_pool)));
}

EmulatedHbm::EmulatedHbm(TierInfo info, std::unique_ptr<BlockAllocator> allocator,
                         std::unique_ptr<Impl> impl)
    : InMemorySlotTier(std::move(info), std::move(allocator)), impl_(std::move(impl)) {}
EmulatedHbm::~EmulatedHbm() {
  {
    internal::MutexLock lock(&impl_->closing_mu);
    impl_->closing = true;
  }
  // Each runs what is queued, then stops; a callback of that work that calls the tier gets
  // ClosingError, so nothing reaches a worker that has stopped.
  impl_->device_to_host.reset();
  impl_->host_to_device.reset();
}

HbmLayout EmulatedHbm::layout() const { return impl_->layout; }

std::byte* EmulatedHbm::LayerBase(int layer) const {
  if (layer < 0 || layer >= impl_->geometry.num_layers()) return nullptr;
  return impl_->LayerBase(layer);
}

std::optional<DevicePoolView> EmulatedHbm::device_pool() const {
  return internal::MakeDevicePoolView(
      impl_->geometry, impl_->layout, impl_->capacity_blocks,
      [this](int l) -> void* { return impl_->LayerBase(l); }, /*host_accessible=*/true);
}

// The workers run each operation's record updates on the tier (`this`) and its copies on the
// Impl; both outlive every queued operation (see Impl's last members).
Completion EmulatedHbm::WriteBlock(SlotId slot, const BlockKey& key,
                                   absl::Span<const std::byte> src, const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIo(info(), slot, src.size()); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  Impl* impl = impl_.get();
  if (options.layers != nullptr) {
    const BlockWrite one{slot, key, src, options.layers};
    return WriteBlocks({&one, 1}, options)[0];
  }
  return impl->EnqueueUnlessLate(impl->host_to_device, info(), slot, options.deadline,
                                 [this, impl, slot, key, src] {
                                   BeginSlotWrite(slot);
                                   impl->ToPool(slot, src.data());
                                   EndSlotWrite(slot, key);
                                   return absl::OkStatus();
                                 });
}

// Layer-major when any block reports layers (kCapLayerwise): every block's layer 0, then each
// block told, then layer 1, ..., as one operation of the host-to-device worker; as CudaHbm
// queues one batch's copies on its stream.
std::vector<Completion> EmulatedHbm::WriteBlocks(absl::Span<const BlockWrite> writes,
                                                 const BlockIoOptions& options) {
  const bool layered =
      options.layers != nullptr || std::any_of(writes.begin(), writes.end(), [](const auto& w) {
        return w.layers != nullptr;
      });
  if (!layered) return TierBackend::WriteBlocks(writes, options);
  std::vector<Completion> out(writes.size());
  struct Job {
    BlockWrite write;
    Completion done;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (absl::Status s = internal::CheckBlockIo(info(), writes[i].slot, writes[i].src.size());
        !s.ok()) {
      out[i] = Completion::Done(std::move(s));
      continue;
    }
    jobs.push_back({writes[i], out[i]});
    if (jobs.back().write.layers == nullptr) jobs.back().write.layers = options.layers;
  }
  if (jobs.empty()) return out;
  Impl* impl = impl_.get();
  const bool open = impl->EnqueueIfOpen(
      impl->host_to_device, [this, impl, jobs = std::move(jobs), deadline = options.deadline] {
        if (absl::Now() > deadline) {
          for (const Job& j : jobs) j.done.Complete(internal::DeadlinePassed(info(), j.write.slot));
          return;
        }
        for (const Job& j : jobs) BeginSlotWrite(j.write.slot);
        const int num_layers = impl->geometry.num_layers();
        for (int l = 0; l < num_layers; ++l) {
          for (const Job& j : jobs) impl->LayerToPool(j.write.slot, l, j.write.src.data());
          for (const Job& j : jobs) {
            if (j.write.layers != nullptr && j.write.layers->landed) j.write.layers->landed(l + 1);
          }
        }
        for (const Job& j : jobs) {
          EndSlotWrite(j.write.slot, j.write.key);
          j.done.Complete(absl::OkStatus());
        }
      });
  if (!open) {  // the jobs' Completions are those in `out` not done yet
    for (const Completion& c : out) c.Complete(ClosingError(info()));
  }
  return out;
}

Completion EmulatedHbm::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                                  const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIo(info(), slot, dst.size()); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  Impl* impl = impl_.get();
  return impl->EnqueueUnlessLate(impl->device_to_host, info(), slot, options.deadline,
                                 [this, impl, slot, key, dst] {
                                   KVTIER_RETURN_IF_ERROR(CheckSlotHolds(slot, key));
                                   impl->FromPool(slot, dst.data());
                                   return absl::OkStatus();
                                 });
}

}  // namespace kvtier
