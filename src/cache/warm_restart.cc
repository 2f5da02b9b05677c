// Warm restart: the blocks persistent tiers found again when the cache was created become ready
// copies in the index (the only state it changes is the index, BlockEntry and SlotOwner, through
// AddCopy).
#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "cache/kv_cache_impl.h"

namespace kvtier {

void KvCache::Impl::AdoptRecoveredBlocks() {
  for (int t = 0; t < kNumTiers; ++t) {
    if (tiers[t] == nullptr) continue;
    const Tier tier = static_cast<Tier>(t);
    // Two passes. First the copy of each key to keep: the latest write, unless a read shows its
    // payload damaged (a torn rewrite: the header landed, the payload did not), then the latest
    // write before it. Only keys with more than one copy are read, at creation (rare: the same
    // block offloaded again before its older slot was reused). The other slots stay unindexed
    // and are freed below. Then the chosen copies in write order, oldest first. Their last use
    // is unknown; each is given one just before now, 1 us apart in write order (policies key on
    // seconds as doubles, whose step near today's epoch time is about 0.24 us), so that the
    // policy ranks the latest written as the most recently used (LRU keeps it longest). Left
    // unknown, they would tie, and LRU's ties go by block key: an order unrelated to time.
    const std::vector<RecoveredBlock> recovered = tiers[t]->recovered_blocks();
    absl::flat_hash_map<BlockKey, std::vector<size_t>> copies;
    copies.reserve(recovered.size());
    for (size_t i = 0; i < recovered.size(); ++i) copies[recovered[i].key].push_back(i);
    std::vector<size_t> order;  // the copy kept of each key
    order.reserve(copies.size());
    std::vector<std::byte> scratch;
    for (auto& [key, of_key] : copies) {
      std::sort(of_key.begin(), of_key.end(), [&](size_t a, size_t b) {
        return recovered[a].write_sequence != recovered[b].write_sequence
                   ? recovered[a].write_sequence > recovered[b].write_sequence
                   : a < b;
      });
      if (of_key.size() == 1) {
        order.push_back(of_key[0]);
        continue;
      }
      scratch.resize(static_cast<size_t>(tiers[t]->info().block_bytes));
      for (const size_t i : of_key) {
        // Only kDataLoss (a checksum that does not match) rules a copy out; another error says
        // nothing of its bytes. Waited for whole: `scratch` is written until the read completes,
        // and the slot may be freed and rewritten right after (a device that does not answer
        // holds creation here, as it holds the tier's own recovery scan before it).
        const absl::Status read =
            tiers[t]->ReadBlock(recovered[i].slot, key, absl::MakeSpan(scratch)).Wait();
        if (!absl::IsDataLoss(read)) {
          order.push_back(i);
          break;
        }
      }
    }
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
