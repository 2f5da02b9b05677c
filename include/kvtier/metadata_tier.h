// MetadataTier: a tier that keeps the bookkeeping of a real one and none of its bytes. It has the
// slots (BlockAllocator) and remembers which block each slot holds, exactly as the byte-holding
// backends do, but stores no KV: a write records its key and drops the bytes, a read of the right
// key succeeds and leaves the destination untouched. Every decision the cache makes on top of it
// (hits, evictions, demotions, admission, onboarding) and every count it keeps (blocks, and bytes
// as block_bytes per copy) is the one the real tier would produce.
//
// What it is for: metadata-only replays of traces (the replay harness's `--payload none`) and
// capacity planning with real model geometries and capacities of terabytes, on a laptop.
// What it does not do: hold KV. A block reported "resident" has no bytes behind it; a reader
// (ReadBlock, an attention kernel, a byte-holding tier it is copied into) gets nothing. Build
// every tier of a cache from MetadataTier: a real tier paired with one would store keys over
// garbage.
//
// Cost: 32 bytes of host memory per slot (InMemorySlotTier::kMetadataBytesPerSlot: 8 for the
// allocator, 24 for the slot's key), whatever block_bytes is, reported as
// TierInfo::metadata_bytes; nothing per byte of capacity. A remote tier over a shared
// MetadataStore (MetadataTierOptions::store) adds one byte a slot, and the store its keys.
//
// Copies between two MetadataTiers run inline on the caller's thread (kCapInlineIo: the transfer
// engine starts and finishes them inside Copy, with no thread hand-off). The tier is not host
// addressable, so the engine still stages every copy through its bounce buffers
// (KvCacheOptions::bounce_buffers x block_bytes of host memory, mapped when the engine is
// created). The tier never reads or writes them, so those pages are never touched and cost
// virtual memory only, not resident memory: with a 160 MiB block and one bounce buffer, 160 MiB
// of address space. The engine still checks that size against
// the memory available (MemAvailable, cgroup limits; and takes explicit huge pages if some are
// reserved), so keep bounce_buffers small (1) for large blocks.
//
// As HBM (options.tier == kHbm) it reports kCapDeviceMemory and a device_pool(), so KvCache takes
// it as its HBM tier; that pool has the strides of a layer-first pool and no addresses (see
// device_pool()). Reads and writes run on the calling thread: their Completion has fired on
// return.
//
// The TierInfo, allocator, slot record and device-write hooks are InMemorySlotTier's.
//
// Thread-safety: as TierBackend.
#ifndef KVTIER_METADATA_TIER_H_
#define KVTIER_METADATA_TIER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/in_memory_slot_tier.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/metadata_store.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

struct MetadataTierOptions {
  Tier tier = Tier::kHbm;       // the level this tier stands for
  int64_t capacity_blocks = 0;  // slots, in [1, BlockAllocator::kMaxCapacityBlocks]
  // Only for tier kRemote: the fleet-wide key store this tier stands in front of
  // (metadata_store.h), shared with other caches' metadata remote tiers. With it the tier has
  // kCapProbe and behaves as a RemoteTier with write_if_absent and delete_freed: writes store
  // the key there, reads fail (kNotFound) once the store has lost it, ProbeBlocks and
  // AdoptStoredBlock find and take other workers' blocks, DiscardBlock erases a key this tier
  // stored. Null: a remote tier of this cache alone, as before.
  std::shared_ptr<MetadataStore> store;
};

class MetadataTier final : public InMemorySlotTier {
 public:
  // A tier of options.capacity_blocks slots of geometry.bytes_per_block() bytes each (counted,
  // never allocated). Errors: kInvalidArgument for a tier outside [kHbm, kRemote], capacity_blocks
  // < 1 or > BlockAllocator::kMaxCapacityBlocks, a capacity in bytes that overflows int64, or a
  // store on a tier other than kRemote;
  // kResourceExhausted if the per-slot bookkeeping (32 bytes a slot) exceeds the memory
  // available (MemAvailable, and the room under the process's cgroup memory limits).
  static absl::StatusOr<std::unique_ptr<MetadataTier>> Create(const KvGeometry& geometry,
                                                              const MetadataTierOptions& options);
  ~MetadataTier() override;

  // info() (InMemorySlotTier's): name "metadata(<tier>)", e.g. "metadata(hbm)"; block_bytes and
  // capacity_bytes as a real tier of this geometry would have them; metadata_bytes = 32 x
  // capacity_blocks; capabilities kCapInlineIo, plus kCapDeviceMemory for kHbm (in particular
  // not kCapHostAddressable).

  // Records that `slot` holds `key`; the bytes of `src` are not read. Completes before returning.
  // Errors: kInvalidArgument for a slot outside the tier or `src` not block_bytes long;
  // kDeadlineExceeded if options.deadline has passed (the slot is left as it was).
  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override;
  // OK if `slot` holds `key`; `dst` is not written (there are no bytes). Completes before
  // returning. Errors: kInvalidArgument and kDeadlineExceeded as WriteBlock; kNotFound if the slot
  // holds no block, or (with a store) the store no longer holds `key`; kDataLoss if it holds
  // another key.
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override;

  // With a store (MetadataTierOptions::store), as TierBackend's: DiscardBlock erases `key` from
  // the store if `slot` holds it and this tier's write added it there (not a block found by
  // discovery or whose write was skipped); ProbeBlocks answers from the store at once
  // (kDeadlineExceeded for a deadline already past); AdoptStoredBlock records that `slot` holds
  // `key` (kInvalidArgument for a slot outside the tier). Without a store: the defaults
  // (no-op, kUnimplemented, kUnimplemented).
  void DiscardBlock(SlotId slot, const BlockKey& key) override;
  absl::StatusOr<std::vector<bool>> ProbeBlocks(absl::Span<const BlockKey> keys,
                                                absl::Time deadline) override;
  absl::Status AdoptStoredBlock(SlotId slot, const BlockKey& key) override;

  // BeginDeviceWrite / EndDeviceWrite (InMemorySlotTier's): for kHbm, as EmulatedHbm, they mark
  // `slot` not-written and record `key`. No-ops on other tiers and for a slot outside the tier.

  // For kHbm: a pool view with empty k_base and v_base (there is no memory), the strides of a
  // layer-first pool of this geometry, and host_accessible false. Block tables handed out over it
  // are for bookkeeping only: no kernel may read through them. nullopt on other tiers.
  std::optional<DevicePoolView> device_pool() const override;

 private:
  struct Impl;
  MetadataTier(TierInfo info, std::unique_ptr<BlockAllocator> allocator,
               std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_METADATA_TIER_H_
