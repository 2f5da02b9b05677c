// Warm restart: the blocks persistent tiers found again when the cache was created become ready
// copies in the index (the only state it changes is the index, BlockEntry and SlotOwner, through
// AddCopy).
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/kv_cache_impl.h"

namespace kvtier {

void KvCache::Impl::AdoptRecoveredBlocks() {
  for (int t = 0; t < kNumTiers; ++t) {
    if (tiers[t] == nullptr) continue;
    const Tier tier = static_cast<Tier>(t);
    // Two passes. First the latest write of each key: its other slots (older copies, one of them
    // perhaps a torn rewrite whose header survived) stay unindexed and are freed below. Then the
    // chosen copies in write order, oldest first. Their last use is unknown; each is given one
    // just before now, 1 us apart in write order (policies key on seconds as doubles, whose step
    // near today's epoch time is about 0.24 us), so that the policy ranks the latest written as
    // the most recently used (LRU keeps it longest). Left unknown, they would tie, and LRU's ties
    // go by block key: an order unrelated to time.
    const std::vector<RecoveredBlock> recovered = tiers[t]->recovered_blocks();
    absl::flat_hash_map<BlockKey, size_t> latest;
    latest.reserve(recovered.size());
    for (size_t i = 0; i < recovered.size(); ++i) {
      auto [it, inserted] = latest.try_emplace(recovered[i].key, i);
      if (!inserted && recovered[i].write_sequence > recovered[it->second].write_sequence) {
        it->second = i;
      }
    }
    std::vector<size_t> order;
    order.reserve(latest.size());
    for (const auto& [key, i] : latest) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return recovered[a].write_sequence != recovered[b].write_sequence
                 ? recovered[a].write_sequence < recovered[b].write_sequence
                 : a < b;
    });
    absl::Time last_use = Now() - absl::Microseconds(static_cast<int64_t>(order.size()));
    for (const size_t i : order) {
      const RecoveredBlock& b = recovered[i];
      last_use += absl::Microseconds(1);
      if (b.slot.value() >= owner[t].size() || StateOf(tier, b.slot) != SlotState::kCached ||
          owner[t][b.slot.value()].indexed()) {  // a backend listing one slot twice
        continue;
      }
      if (AddCopy(b.key, tier, b.slot, CopyState::kReady, kRootBlockKey).ok()) {
        if (auto it = blocks.find(b.key); it != blocks.end()) it->second.set_last_use(last_use);
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
