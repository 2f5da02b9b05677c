// Slot references: the allocator queries the cache makes (under the engine's lock), and the
// references sequences (seq_refs) and tickets (ticket_refs, locked, orphan_partials) hold on slots,
// with what a slot becomes once the last of them lets go (SettleSlot).
#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cache/kv_cache_impl.h"
#include "internal/status_macros.h"

namespace kvtier {

SlotState KvCache::Impl::StateOf(Tier t, SlotId slot) {
  SlotState state = SlotState::kFree;
  (void)Alloc(t, [&](BlockAllocator& a) -> absl::Status {
    auto s = a.state(slot);
    if (s.ok()) state = *s;
    return s.status();
  });
  return state;
}

int64_t KvCache::Impl::FreeBlocks(Tier t) {
  int64_t n = 0;
  (void)Alloc(t, [&](BlockAllocator& a) {
    n = a.free_blocks();
    return absl::OkStatus();
  });
  return n;
}

void KvCache::Impl::SettleSlot(Tier t, SlotId slot, std::optional<SlotState> known,
                               BlockMap::value_type* entry) {
  if (t == Tier::kHbm && ticket_refs[slot.value()] != 0) return;
  const SlotState state = known.has_value() ? *known : StateOf(t, slot);
  if (state == SlotState::kWritable && t == Tier::kHbm && orphan_partials.erase(slot.value()) > 0) {
    (void)Alloc(t, [&](BlockAllocator& a) { return a.Release(slot); });
    return;
  }
  if (state != SlotState::kCached) return;
  if (entry != nullptr && entry->second.copies.state(t) == CopyState::kReady &&
      entry->second.copies.slots[TierIndex(t)] == slot) {
    // A ready copy's slot names its block (CheckInvariants), so the owner need not be read.
    UpdateCandidate(*entry, t, state);
    return;
  }
  const SlotOwner& o = owner[TierIndex(t)][slot.value()];
  if (o.indexed()) {
    UpdateCandidate(*o.entry, t, state);
  } else if (t == Tier::kHbm && UnwrittenTwin(slot)) {
    // A twin whose kernel may still be writing it: kept until its `ready` fires (TwinWritten),
    // as a pending indexed copy is, so no other block is written into it meanwhile.
  } else {
    // A private copy (computed twice, never written, or found corrupt): nothing to keep. A
    // written twin of it is forgotten with it: a stale entry would make the slot's next block,
    // computed into it, read as a written twin (not kept under its kernel, or published).
    if (t == Tier::kHbm) ForgetTwin(slot);
    (void)Alloc(t, [&](BlockAllocator& a) { return a.Evict(slot); });
  }
}

void KvCache::Impl::DropRef(const SeqBlock& b) {
  std::optional<SlotState> after;
  ReleaseRefs(absl::MakeConstSpan(&b, 1), absl::MakeSpan(&after, 1));
  if (after.has_value()) SettleSlot(b.tier, b.slot, *after);  // nullopt: orphaned
}

void KvCache::Impl::ReleaseRefs(absl::Span<const SeqBlock> refs,
                                absl::Span<std::optional<SlotState>> after) {
  std::fill(after.begin(), after.end(), std::nullopt);
  for (const SeqBlock& b : refs) {
    if (b.tier == Tier::kHbm) --seq_refs[b.slot.value()];
  }
  // The lambda runs under mu (held here); the analysis cannot see that through the call.
  const std::vector<uint32_t>* pinned = &ticket_refs;
  absl::flat_hash_set<uint32_t>* orphans = &orphan_partials;
  (void)engine->WithAllocators([&](const std::array<BlockAllocator*, kNumTiers>& a) {
    for (size_t i = 0; i < refs.size(); ++i) {
      const SeqBlock& b = refs[i];
      BlockAllocator& alloc = *a[TierIndex(b.tier)];
      if (b.tier == Tier::kHbm && (*pinned)[b.slot.value()] != 0 &&
          alloc.state_or_free(b.slot) == SlotState::kWritable) {
        orphans->insert(b.slot.value());  // freed when the last ticket lets go
        continue;
      }
      (void)alloc.Release(b.slot);
      after[i] = alloc.state_or_free(b.slot);
    }
    return absl::OkStatus();
  });
}

absl::Status KvCache::Impl::AcquireRef(Tier t, SlotId slot) {
  KVTIER_RETURN_IF_ERROR(Alloc(t, [&](BlockAllocator& a) { return a.Acquire(slot); }));
  if (t == Tier::kHbm) ++seq_refs[slot.value()];
  const SlotOwner& o = owner[TierIndex(t)][slot.value()];
  if (o.indexed()) UpdateCandidate(*o.entry, t);
  return absl::OkStatus();
}

void KvCache::Impl::PinTicket(SlotId slot) {
  if (ticket_refs[slot.value()]++ == 0) {
    ++locked;
    const SlotOwner& o = owner[0][slot.value()];
    if (o.indexed()) UpdateCandidate(*o.entry, Tier::kHbm);
  }
}

}  // namespace kvtier
