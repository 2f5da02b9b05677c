// EmulatedHbm: the HBM tier in host memory, for machines without a GPU. It keeps CUDA's
// contract: bytes live in a device-style pool in one of the two HBM layouts, and every read and
// write is queued on a stream-like worker thread (one for host-to-device, one for
// device-to-host, like CUDA's copy engines) and completes later, on that thread. Layer-first
// blocks are gathered into and scattered from the block-contiguous host buffer one layer at a
// time, as the CUDA tier does with its batched copies.
//
// Layouts (HbmLayout): kLayerFirst keeps, per layer, [num_blocks][kv_planes][tokens_per_block]
// [num_kv_heads][head_dim] (vLLM's and FlashInfer's paged layout); kBlockFirst keeps one
// contiguous run per block.
//
// The pool is faulted in at creation, as cudaMalloc backs device memory at once. The TierInfo,
// allocator, slot record and device-write hooks are InMemorySlotTier's.
//
// Thread-safety: as TierBackend. Operations queued on one worker run in submission order; reads
// and writes are on different workers and may overlap (ordering is the transfer engine's job).
#ifndef KVTIER_EMULATED_HBM_H_
#define KVTIER_EMULATED_HBM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/in_memory_slot_tier.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

struct EmulatedHbmOptions {
  HbmLayout layout = HbmLayout::kLayerFirst;
  int64_t capacity_blocks = 0;  // >= 1
  // Refuse a pool larger than MemAvailable (the emulation lives in host memory).
  bool check_available_memory = true;
};

class EmulatedHbm final : public InMemorySlotTier {
 public:
  // Errors: kInvalidArgument for capacity_blocks < 1, an unknown layout, or a pool whose byte
  // size overflows; kResourceExhausted if the pool exceeds available memory.
  static absl::StatusOr<std::unique_ptr<EmulatedHbm>> Create(const KvGeometry& geometry,
                                                             const EmulatedHbmOptions& options);
  ~EmulatedHbm() override;  // runs every queued operation, then stops the workers

  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override;
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override;
  std::optional<DevicePoolView> device_pool() const override;

  HbmLayout layout() const;
  // Base of layer `layer`'s K/V pool (kLayerFirst) or of the whole pool (kBlockFirst, any layer
  // gives the pool base plus the layer's offset inside a block); nullptr for a layer outside
  // [0, num_layers). What a kernel would be handed as the device pointer.
  std::byte* LayerBase(int layer) const;

 private:
  struct Impl;
  EmulatedHbm(TierInfo info, std::unique_ptr<BlockAllocator> allocator, std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_EMULATED_HBM_H_
