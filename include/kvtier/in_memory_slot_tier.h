// InMemorySlotTier: the base of the tiers whose slots live in memory (GPU memory, host memory
// emulating it, host DRAM, or, for MetadataTier, bookkeeping only): EmulatedHbm, DramTier,
// MetadataTier and CudaHbm. It owns what those tiers have in common: the TierInfo, the
// BlockAllocator, and the per-slot record of which block key each slot holds. It implements the
// TierBackend members that need nothing else (info, allocator, the host- and device-write hooks,
// CheckHolds); a subclass keeps what differs: where the bytes live, how they are copied, and on
// which thread a copy completes (WriteBlock, ReadBlock, HostAddress, device_pool).
//
// The slot record. Every slot starts not-written. A subclass's write calls BeginSlotWrite before
// the slot's bytes change and EndSlotWrite once they are in place, so a failed or torn write is
// never read back as a block; its read calls CheckSlotHolds (or CheckReadNow) before copying.
// The TierBackend hooks act on the record for the tiers tier_backend.h names and keep its
// defaults elsewhere: BeginDeviceWrite / EndDeviceWrite on kCapDeviceMemory tiers; BeginHostWrite
// / EndHostWrite / CheckHolds on kCapHostAddressable tiers (elsewhere CheckHolds is
// kUnimplemented). The hooks ignore a slot outside the tier.
//
// Cost: kMetadataBytesPerSlot bytes of host memory a slot, reported in TierInfo::metadata_bytes.
//
// Only kvtier's own tiers derive from it; users hold the concrete tiers or a TierBackend.
// Thread-safety: as TierBackend. The slot record has its own lock: the protected members may be
// called from any thread (a subclass's copy workers and completion threads).
#ifndef KVTIER_IN_MEMORY_SLOT_TIER_H_
#define KVTIER_IN_MEMORY_SLOT_TIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvtier/block_allocator.h"
#include "kvtier/block_key.h"
#include "kvtier/ids.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

namespace internal {
class SlotContents;
}  // namespace internal

class InMemorySlotTier : public TierBackend {
 public:
  // Bytes of host memory each slot costs: 8 for the allocator's state, 24 for the slot's key.
  static constexpr int64_t kMetadataBytesPerSlot = 32;

  ~InMemorySlotTier() override;

  const TierInfo& info() const final;
  BlockAllocator& allocator() final;

  // As TierBackend, on kCapHostAddressable tiers (no-ops, and kUnimplemented for CheckHolds,
  // elsewhere). CheckHolds: kInvalidArgument for a slot outside the tier, else CheckSlotHolds.
  void BeginHostWrite(SlotId slot) final;
  void EndHostWrite(SlotId slot, const BlockKey& key) final;
  absl::Status CheckHolds(SlotId slot, const BlockKey& key) final;
  // As TierBackend, on kCapDeviceMemory tiers (no-ops elsewhere).
  void BeginDeviceWrite(SlotId slot) final;
  void EndDeviceWrite(SlotId slot, const BlockKey& key) final;

 protected:
  // A tier described by `info` (see MakeInfo) whose slots `allocator` keeps (info.capacity_blocks
  // of them, of info.tier). Every slot starts not-written.
  InMemorySlotTier(TierInfo info, std::unique_ptr<BlockAllocator> allocator);

  // A TierInfo with capacity_bytes = capacity_blocks x block_bytes and metadata_bytes =
  // capacity_blocks x kMetadataBytesPerSlot. Precondition: capacity_blocks >= 1 and the product
  // fits in int64 (each tier's Create checks it, with its own message).
  static TierInfo MakeInfo(Tier tier, std::string name, int64_t capacity_blocks,
                           int64_t block_bytes, uint32_t capabilities);

  // Whether `slot` is inside [0, capacity_blocks).
  bool InRange(SlotId slot) const;

  // The slot record; precondition: InRange(slot). BeginSlotWrite marks `slot` not-written;
  // EndSlotWrite records that it holds `key`.
  void BeginSlotWrite(SlotId slot);
  void EndSlotWrite(SlotId slot, const BlockKey& key);
  // OK if `slot` holds `key`; kNotFound ("<name>: slot <n> holds no complete block") if it holds
  // nothing; kDataLoss ("<name>: slot <n> holds block <hex>, not <hex>") if another block.
  absl::Status CheckSlotHolds(SlotId slot, const BlockKey& key) const;

  // The checks of a read that starts on the calling thread, in ReadBlock's order: kInvalidArgument
  // for a slot outside the tier or `bytes` other than block_bytes; kDeadlineExceeded if
  // `deadline` has passed; then CheckSlotHolds.
  absl::Status CheckReadNow(SlotId slot, const BlockKey& key, size_t bytes,
                            absl::Time deadline) const;

 private:
  const TierInfo info_;
  const std::unique_ptr<BlockAllocator> allocator_;
  const std::unique_ptr<internal::SlotContents> contents_;
};

}  // namespace kvtier

#endif  // KVTIER_IN_MEMORY_SLOT_TIER_H_
