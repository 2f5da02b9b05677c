// TierBackend: one level of the memory hierarchy (HBM, DRAM, NVMe, remote) behind one interface.
// A backend owns a fixed number of slots of one block each (`BlockAllocator` does the
// bookkeeping) and moves whole blocks between a slot and host memory, asynchronously: every read
// and write returns a Completion that carries an absl::Status and can be waited on with a
// deadline. Backends know nothing of sequences; they keep, per slot, the key of the block last
// written there, so a read that expects another block (a stale index, a reused slot) fails
// instead of returning wrong KV.
//
// Host buffers are block-contiguous: `block_bytes` bytes laid out [layer][kv_plane][token]
// [kv_head][head_dim] (block-first, all layers in one run), whatever the tier's own layout.
//
// Thread-safety: ReadBlock, WriteBlock, HostAddress and info() are thread-safe. allocator() is
// thread-compatible: its owner (the transfer engine or cache) serializes every use of it.
// Ownership: a buffer passed to ReadBlock/WriteBlock must stay valid and untouched until the
// returned Completion fires.
#ifndef KVTIER_TIER_BACKEND_H_
#define KVTIER_TIER_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/block_allocator.h"
#include "kvtier/block_key.h"
#include "kvtier/completion.h"
#include "kvtier/device_block_table.h"
#include "kvtier/device_fence.h"
#include "kvtier/ids.h"

namespace kvtier {

// What a backend can do, as bits of TierInfo::capabilities.
enum TierCapability : uint32_t {
  kCapDeviceMemory = 1u << 0,     // slots are device (GPU or emulated GPU) memory
  kCapHostAddressable = 1u << 1,  // HostAddress() returns a CPU pointer to each slot's bytes
  kCapPersistent = 1u << 2,       // blocks survive a restart of the process (warm restart)
  kCapPinnedHost = 1u << 3,       // host memory is page-locked for DMA (cudaHostRegister)
  kCapChecksummed = 1u << 4,      // every read verifies a checksum of the payload
  // ReadBlock and WriteBlock finish on the calling thread before they return, without I/O or
  // waiting (MetadataTier): the transfer engine runs a copy between two such tiers inline.
  kCapInlineIo = 1u << 5,
  // ProbeBlocks asks the backend's store, in one batched call, which blocks it holds, and
  // AdoptStoredBlock lets a slot stand for a block found so (RemoteTier: a store other
  // processes write too). The cache's remote discovery (KvCacheOptions::remote_probe_*) uses
  // it only on the remote tier.
  kCapProbe = 1u << 6,
  // WriteBlock and WriteBlocks report per-layer progress (BlockIoOptions::layers,
  // BlockWrite::layers): layers land in order and each is announced as it does, so a kernel of
  // layer l can start before later layers have landed (layer-wise onboarding). WriteBlocks
  // copies layer-major: layer 0 of every block of the batch, then layer 1, and so on, so layer l
  // of the whole batch lands before layer l + 1 of any of its blocks. EmulatedHbm and CudaHbm.
  kCapLayerwise = 1u << 7,
};

struct TierInfo {
  Tier tier = Tier::kHbm;
  std::string name;             // e.g. "emulated_hbm(layer_first)", "dram"
  int64_t capacity_blocks = 0;  // slots
  int64_t block_bytes = 0;      // bytes of one block, all layers
  int64_t capacity_bytes = 0;   // capacity_blocks * block_bytes: what the KV itself occupies
  int64_t metadata_bytes = 0;   // bookkeeping beside the KV (allocator, per-slot keys)
  uint32_t capabilities = 0;    // TierCapability bits
};

// Per-layer progress of one WriteBlock into a kCapLayerwise tier (layer-wise onboarding, after
// LMCache's and vLLM's layer-wise KV connectors). Both callbacks run on the backend's own
// threads, must not block, and are called before the write's Completion fires; neither is called
// after it has fired.
struct LayerProgress {
  // Layers [0, n) of the block have landed in the slot (their bytes are final), with n
  // increasing from call to call and at most num_layers. A write that fails stops calling it;
  // the layers already announced stay valid bytes of the block until the slot is reused.
  std::function<void(int n)> landed;
  // Devices with copy streams (CudaHbm) only: the copy of layer `layer` has been queued and
  // `fence` is reached once it is done (before `landed` reports it), so a compute stream can
  // wait for it on the device. Called once per layer, in layer order. May be unset.
  std::function<void(int layer, std::shared_ptr<const DeviceFence> fence)> issued;
};

// Per-operation options.
struct BlockIoOptions {
  // An operation that has not started by this time completes with kDeadlineExceeded without
  // touching the slot. One already running is not interrupted.
  absl::Time deadline = absl::InfiniteFuture();
  // WriteBlock on a kCapLayerwise tier reports each layer's landing here. Ignored by reads and
  // by other tiers (their callers learn of the whole block from the Completion). May be null.
  std::shared_ptr<const LayerProgress> layers;
};

// One block of a batched write or read.
struct BlockWrite {
  SlotId slot;
  BlockKey key;
  absl::Span<const std::byte> src;
  // This block's layer progress (as BlockIoOptions::layers), which WriteBlocks uses instead of
  // its options' `layers`. May be null.
  std::shared_ptr<const LayerProgress> layers;
};
struct BlockRead {
  SlotId slot;
  BlockKey key;
  absl::Span<std::byte> dst;
};

// A block a persistent tier found again when it was opened (its slot starts kCached).
struct RecoveredBlock {
  SlotId slot;
  BlockKey key;
  // Order of the writes that left the blocks (higher: later; 0: unknown). Of two slots holding
  // one key, the later write is the one to keep: the other may be a stale, torn rewrite.
  uint64_t write_sequence = 0;
};

class TierBackend {
 public:
  virtual ~TierBackend() = default;

  virtual const TierInfo& info() const = 0;
  // The slot bookkeeping of this tier (see the thread-safety note above).
  virtual BlockAllocator& allocator() = 0;

  // Copies `src` (block_bytes bytes) into `slot` and records `key` as its content. The slot
  // reads as not-written from the moment the write starts until it completes OK.
  // Completion errors: kInvalidArgument for a slot outside the tier or a buffer of the wrong
  // size; kDeadlineExceeded if it could not start by options.deadline; backend errors (kDataLoss,
  // kResourceExhausted for a full device, kUnavailable for an I/O error) with the slot left
  // not-written.
  virtual Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                                const BlockIoOptions& options = {}) = 0;

  // Copies the block in `slot` into `dst` (block_bytes bytes) if `slot` holds `key`.
  // Completion errors: kInvalidArgument as for WriteBlock; kNotFound if the slot holds no
  // complete block; kDataLoss if it holds another key or fails its checksum (a corrupt block:
  // `dst` must then be ignored); kDeadlineExceeded as for WriteBlock. A failed read makes the
  // slot a miss only while it still records `key`: a block a write put there meanwhile stays.
  virtual Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                               const BlockIoOptions& options = {}) = 0;

  // Batched forms: one Completion per element, in order, each with the errors of the single
  // form. A backend that can (NVMe) hands the whole batch to the device in one submission; if
  // that submission fails, every block of it fails. A kCapLayerwise tier writes a batch
  // layer-major (see kCapLayerwise), each block reporting to its BlockWrite::layers (or, if
  // null, to options.layers).
  virtual std::vector<Completion> WriteBlocks(absl::Span<const BlockWrite> writes,
                                              const BlockIoOptions& options = {});
  virtual std::vector<Completion> ReadBlocks(absl::Span<const BlockRead> reads,
                                             const BlockIoOptions& options = {});

  // The CPU address of `slot`'s bytes for tiers with kCapHostAddressable (block_bytes bytes, in
  // the tier's layout); nullptr otherwise or for a slot outside the tier.
  virtual std::byte* HostAddress(SlotId /*slot*/) { return nullptr; }

  // For kCapHostAddressable tiers, whose slots others may fill directly through HostAddress:
  // BeginHostWrite marks `slot` not-written before its bytes change; EndHostWrite records that
  // it now holds `key`. No-ops on other tiers.
  virtual void BeginHostWrite(SlotId /*slot*/) {}
  virtual void EndHostWrite(SlotId /*slot*/, const BlockKey& /*key*/) {}
  // For kCapHostAddressable tiers: OK if `slot` holds `key`, with the errors of ReadBlock.
  // kUnimplemented on other tiers.
  virtual absl::Status CheckHolds(SlotId /*slot*/, const BlockKey& /*key*/) {
    return absl::UnimplementedError("this tier is not host addressable");
  }

  // For kCapDeviceMemory tiers, whose slots the attention kernel fills in place: BeginDeviceWrite
  // marks `slot` not-written before the kernel writes it; EndDeviceWrite records that it now
  // holds `key` (the kernel's completion has fired), so the block can be read out (offloaded).
  // No-ops on other tiers.
  virtual void BeginDeviceWrite(SlotId /*slot*/) {}
  virtual void EndDeviceWrite(SlotId /*slot*/, const BlockKey& /*key*/) {}
  // For kCapDeviceMemory tiers: the pool's addresses and strides (device_block_table.h), what a
  // kernel is handed with a device block table. nullopt on other tiers.
  virtual std::optional<DevicePoolView> device_pool() const { return std::nullopt; }
  // For tiers whose copies run on GPU streams (CudaHbm): a Completion that fires once the CUDA
  // event `cuda_event` (a cudaEvent_t the caller has recorded on its stream, e.g. after the
  // attention kernel that wrote a block) is reached, with kUnavailable and the CUDA error text if
  // the device reports an error. The event's state is captured now: the caller may record or
  // destroy it again at once. Errors: kUnimplemented on other tiers (the default);
  // kInvalidArgument for a null event; kUnavailable when the CUDA runtime refuses it.
  virtual absl::StatusOr<Completion> CompletionOfDeviceEvent(void* /*cuda_event*/) {
    return absl::UnimplementedError("this tier's copies run on no GPU stream");
  }
  // For kCapPersistent tiers: the blocks found when the tier was opened (warm restart), whose
  // slots the allocator starts kCached. Empty on other tiers.
  virtual std::vector<RecoveredBlock> recovered_blocks() const { return {}; }
  // The cache dropped its copy of `key` in `slot` (evicted; the slot is free now and will be
  // reused): a tier that keeps blocks outside the process (a remote store) may delete it there,
  // so the store does not keep blocks nobody indexes. Called under the cache's lock: it must not
  // wait for the store (RemoteTier issues the delete and returns). No-op by default.
  virtual void DiscardBlock(SlotId /*slot*/, const BlockKey& /*key*/) {}

  // For kCapProbe tiers: whether the store holds each of `keys` (found[i] for keys[i]), asked in
  // one batched call (one pipelined round trip on Redis, a stat per file in a directory).
  // Blocks on the store's answers until `deadline` at the latest: a key not answered by then
  // (or answered with an error) reads as not found. Touches no slot. Errors: kUnimplemented on
  // other tiers (the default); kDeadlineExceeded for a deadline already past; kUnavailable when
  // the store is bypassed (RemoteTier's breaker is open) or answered no key at all (with the
  // store's error: kUnavailable, kDeadlineExceeded). Thread-safe.
  virtual absl::StatusOr<std::vector<bool>> ProbeBlocks(absl::Span<const BlockKey> /*keys*/,
                                                        absl::Time /*deadline*/) {
    return absl::UnimplementedError("this tier cannot probe a store");
  }
  // For kCapProbe tiers: `slot` (which the caller's allocator has just taken) now stands for
  // `key`, a block ProbeBlocks found in the store, so ReadBlock(slot, key) fetches it. Nothing
  // is written. Errors: kInvalidArgument for a slot outside the tier; kUnimplemented on other
  // tiers (the default). Thread-safe.
  virtual absl::Status AdoptStoredBlock(SlotId /*slot*/, const BlockKey& /*key*/) {
    return absl::UnimplementedError("this tier cannot adopt a stored block");
  }
};

}  // namespace kvtier

#endif  // KVTIER_TIER_BACKEND_H_
