// EmulatedHbm: the HBM tier in host memory, for machines without a GPU. It keeps CUDA's
// contract: bytes live in a device-style pool in one of the HBM layouts, and every read and
// write is queued on a stream-like worker thread (one for host-to-device, one for
// device-to-host, like CUDA's copy engines) and completes later, on that thread. Layer-first
// and kv-split blocks are gathered into and scattered from the block-contiguous host buffer one
// layer (one K or V plane) at a time, as the CUDA tier does with its batched copies. A write
// given BlockIoOptions::layers announces each layer as it lands (kCapLayerwise), as CudaHbm
// does with an event per layer.
//
// Layouts (HbmLayout): kLayerFirst keeps, per layer, [num_blocks][kv_planes][tokens_per_block]
// [num_kv_heads][head_dim] (vLLM's and FlashInfer's paged layout); kLayerKvSplit keeps, per
// layer, [kv_planes][num_blocks][tokens_per_block][num_kv_heads][head_dim] (vLLM's
// FlashAttention layout); kBlockFirst keeps one contiguous run per block.
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
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/in_memory_slot_tier.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

struct EmulatedHbmOptions {
  HbmLayout layout = HbmLayout::kLayerFirst;
  int64_t capacity_blocks = 0;  // >= 1
  // Refuse a pool larger than the memory available (MemAvailable, and the room under the
  // process's cgroup memory limits): the emulation lives in host memory.
  bool check_available_memory = true;
  // Host memory the engine owns (e.g. its CPU KV tensors) to use as the pool instead of
  // allocating, as CudaHbmOptions::external_pool: kLayerFirst and kLayerKvSplit, one pointer per
  // layer to that layer's tensor ([capacity_blocks][kv_planes][tokens][heads][head_dim], or
  // [kv_planes][capacity_blocks][...] for kv-split); kBlockFirst, one pointer to the whole pool.
  // Each must hold its layer's (or the pool's) bytes and outlive the tier; the tier writes only
  // through its reads and writes of blocks. Empty: the tier allocates its own.
  std::vector<void*> external_pool;
};

class EmulatedHbm final : public InMemorySlotTier {
 public:
  // Errors: kInvalidArgument for capacity_blocks < 1, an unknown layout, a pool whose byte
  // size overflows, or an external_pool of the wrong length or with a null pointer;
  // kResourceExhausted if the pool it would allocate exceeds available memory.
  static absl::StatusOr<std::unique_ptr<EmulatedHbm>> Create(const KvGeometry& geometry,
                                                             const EmulatedHbmOptions& options);
  // Runs every queued operation, then stops the workers. Must not run inside a completion
  // callback of this tier's own operations (it joins the worker that runs them).
  ~EmulatedHbm() override;

  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override;
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override;
  // Layer-major when a block reports layers (kCapLayerwise); block by block otherwise.
  std::vector<Completion> WriteBlocks(absl::Span<const BlockWrite> writes,
                                      const BlockIoOptions& options = {}) override;
  std::optional<DevicePoolView> device_pool() const override;

  HbmLayout layout() const;
  // Base of layer `layer`'s K/V pool (kLayerFirst, kLayerKvSplit: its K plane, V follows
  // num_blocks blocks later) or of the whole pool (kBlockFirst, any layer gives the pool base
  // plus the layer's offset inside a block); nullptr for a layer outside [0, num_layers). What a
  // kernel would be handed as the device pointer.
  std::byte* LayerBase(int layer) const;

 private:
  struct Impl;
  EmulatedHbm(TierInfo info, std::unique_ptr<BlockAllocator> allocator, std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_EMULATED_HBM_H_
