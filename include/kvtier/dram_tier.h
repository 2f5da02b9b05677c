// DramTier: host DRAM as a tier. One exact-size region (mmap; huge pages where the system offers
// them) holds capacity_blocks = floor(capacity_bytes / block_bytes) blocks, block-contiguous (all
// layers of a block in one run), so each copy to or from HBM or NVMe is one large transfer. The
// region is page-locked with cudaHostRegister (in 1 GiB pieces) when a CUDA device answers, for
// DMA at full PCIe bandwidth. The budget is checked at creation against MemAvailable and the
// room under the process's cgroup memory limits.
//
// Reads and writes are memcpy on the calling thread: their Completion has fired on return. Slots
// are host addressable (HostAddress), which the transfer engine uses to copy without a bounce.
//
// The TierInfo, allocator, slot record and host-write hooks (BeginHostWrite, EndHostWrite,
// CheckHolds) are InMemorySlotTier's.
//
// Thread-safety: as TierBackend.
#ifndef KVTIER_DRAM_TIER_H_
#define KVTIER_DRAM_TIER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kvtier/in_memory_slot_tier.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

struct DramTierOptions {
  int64_t capacity_bytes = 0;  // budget; the tier uses floor(budget / block_bytes) whole blocks
  bool try_huge_pages = true;
  // Page-lock with cudaHostRegister when a CUDA device answers (ignored otherwise).
  bool pin_for_cuda = true;
  bool check_available_memory = true;
  // Fault every page in at creation (MAP_POPULATE), so the first copies do not pay for it.
  // Pinning with cudaHostRegister faults them in anyway.
  bool prefault = true;
};

class DramTier final : public InMemorySlotTier {
 public:
  // Errors: kInvalidArgument if capacity_bytes holds no whole block; kResourceExhausted if the
  // region exceeds the memory available (MemAvailable, cgroup limits) or cannot be mapped;
  // kUnavailable with the CUDA error text if a device answers but pinning fails.
  static absl::StatusOr<std::unique_ptr<DramTier>> Create(const KvGeometry& geometry,
                                                          const DramTierOptions& options);
  ~DramTier() override;

  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override;
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override;
  std::byte* HostAddress(SlotId slot) override;

  // Bytes mapped for the blocks (the block bytes rounded up to one page, never more).
  int64_t mapped_bytes() const;
  bool huge_pages() const;

 private:
  struct Impl;
  DramTier(TierInfo info, std::unique_ptr<BlockAllocator> allocator, std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_DRAM_TIER_H_
