// CudaHbm: GPU memory as the HBM tier. A cudaMalloc pool (or KV tensors the inference engine
// already owns, registered instead) in the layer-first or block-first layout (HbmLayout), with
// two dedicated non-blocking copy streams (host-to-device, device-to-host) and a CUDA event per
// operation: a kvtier thread waits on the event and fires the Completion, so completions never
// run on a CUDA callback thread and may call CUDA.
//
// Layer-first and kv-split blocks are scattered from / gathered into the block-contiguous host
// buffer with one batched copy per block (cudaMemcpyBatchAsync on CUDA 13+, one cudaMemcpyAsync
// per piece before, or when the driver refuses the batch). A write given
// BlockIoOptions::layers, or a WriteBlocks batch whose blocks have BlockWrite::layers
// (layer-wise onboarding, kCapLayerwise), queues layer l's copies of every block of the batch,
// then an event, then layer l + 1's: the event is handed out as a DeviceFence
// (LayerProgress::issued) that a compute stream can wait on, and the layer is announced
// (LayerProgress::landed) when the completer sees it reached. Host buffers should be pinned (DramTier pins its
// region when a device answers) for full PCIe bandwidth; pageable memory works, slower.
//
// Built only with the CUDA toolkit; elsewhere Create returns kUnimplemented. Whether a device
// answers is asked at run time: Create returns kUnavailable with the CUDA error text without one.
//
// The TierInfo, allocator, slot record and device-write hooks are InMemorySlotTier's.
//
// Thread-safety: as TierBackend. Ownership: a registered pool stays the engine's; it must outlive
// the tier.
#ifndef KVTIER_CUDA_HBM_H_
#define KVTIER_CUDA_HBM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/in_memory_slot_tier.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

struct CudaHbmOptions {
  HbmLayout layout = HbmLayout::kLayerFirst;
  int64_t capacity_blocks = 0;  // >= 1
  int device = 0;               // CUDA device ordinal
  // Engine-owned KV tensors to use instead of allocating: kLayerFirst, one device pointer per
  // layer ([capacity_blocks][kv_planes][tokens][heads][head_dim] each); kLayerKvSplit, one per
  // layer ([kv_planes][capacity_blocks][tokens][heads][head_dim] each, vLLM's FlashAttention
  // kv_cache[layer]); kBlockFirst, one pointer to the whole pool. Empty: kvtier allocates with
  // cudaMalloc.
  std::vector<void*> external_pool;
};

class CudaHbm final : public InMemorySlotTier {
 public:
  // Errors: kUnimplemented without CUDA; kUnavailable with the CUDA error text when no device
  // answers or cudaMalloc/stream creation fails; kInvalidArgument for capacity_blocks < 1, an
  // unknown layout, a device ordinal out of range, or an external pool of the wrong length.
  static absl::StatusOr<std::unique_ptr<CudaHbm>> Create(const KvGeometry& geometry,
                                                         const CudaHbmOptions& options);
  ~CudaHbm() override;  // waits for both streams and every completion

  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override;
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override;
  // Layer-major when a block reports layers (kCapLayerwise): one event per layer for the batch.
  std::vector<Completion> WriteBlocks(absl::Span<const BlockWrite> writes,
                                      const BlockIoOptions& options = {}) override;
  std::optional<DevicePoolView> device_pool() const override;
  // A Completion of a caller's CUDA event (TierBackend::CompletionOfDeviceEvent): a third stream
  // waits for the event and records one of its own, which a completer thread waits on.
  absl::StatusOr<Completion> CompletionOfDeviceEvent(void* cuda_event) override;

  HbmLayout layout() const;
  // Device pointer of layer `layer`'s pool (kLayerFirst) or of the pool plus the layer's offset
  // inside a block (kBlockFirst); nullptr outside [0, num_layers). What a kernel is handed.
  void* LayerBase(int layer) const;
  // True when copies go through cudaMemcpyBatchAsync.
  bool batched_copies() const;

 private:
  struct Impl;
  CudaHbm(TierInfo info, std::unique_ptr<BlockAllocator> allocator, std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_CUDA_HBM_H_
