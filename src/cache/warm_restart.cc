// Warm restart: the blocks persistent tiers found again when the cache was created become ready
// copies in the index (the only state it changes is the index, BlockEntry and SlotOwner, through
// AddCopy).
#include "cache/kv_cache_impl.h"

namespace kvtier {

void KvCache::Impl::AdoptRecoveredBlocks() {
  for (int t = 0; t < kNumTiers; ++t) {
    if (tiers[t] == nullptr) continue;
    const Tier tier = static_cast<Tier>(t);
    for (const RecoveredBlock& b : tiers[t]->recovered_blocks()) {
      if (b.slot.value() >= owner[t].size() || StateOf(tier, b.slot) != SlotState::kCached) {
        continue;
      }
      if (AddCopy(b.key, tier, b.slot, CopyState::kReady, kRootBlockKey).ok()) {
        UpdateCandidate(b.key, tier);
      }
    }
    for (size_t s = 0; s < owner[t].size(); ++s) {
      const SlotId slot(static_cast<uint32_t>(s));
      if (!owner[t][s].indexed() && StateOf(tier, slot) == SlotState::kCached) {
        (void)Alloc(tier, [&](BlockAllocator& a) { return a.Evict(slot); });
      }
    }
  }
}

}  // namespace kvtier
