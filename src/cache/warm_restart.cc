// Warm restart: the blocks persistent tiers found again when the cache was created become ready
// copies in the index (the only state it changes is the index, BlockEntry and SlotOwner, through
// AddCopy).
#include <algorithm>
#include <vector>

#include "cache/kv_cache_impl.h"

namespace kvtier {

void KvCache::Impl::AdoptRecoveredBlocks() {
  for (int t = 0; t < kNumTiers; ++t) {
    if (tiers[t] == nullptr) continue;
    const Tier tier = static_cast<Tier>(t);
    // The latest write of a key first: its other slots (older copies, one of them perhaps a torn
    // rewrite whose header survived) are then refused as duplicates and freed below.
    std::vector<RecoveredBlock> recovered = tiers[t]->recovered_blocks();
    std::stable_sort(recovered.begin(), recovered.end(),
                     [](const RecoveredBlock& a, const RecoveredBlock& b) {
                       return a.write_sequence > b.write_sequence;
                     });
    for (const RecoveredBlock& b : recovered) {
      if (b.slot.value() >= owner[t].size() || StateOf(tier, b.slot) != SlotState::kCached ||
          owner[t][b.slot.value()].indexed()) {  // a backend listing one slot twice
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
