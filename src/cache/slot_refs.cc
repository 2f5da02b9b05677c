// Slot references: the allocator queries the cache makes (under the engine's lock), and the
// references sequences (seq_refs) and tickets (ticket_refs, locked, orphan_partials) hold on slots,
// with what a slot becomes once the last of them lets go (SettleSlot).
#include "absl/status/status.h"
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

void KvCache::Impl::SettleSlot(Tier t, SlotId slot) {
  if (t == Tier::kHbm && ticket_refs[slot.value()] != 0) return;
  const SlotState state = StateOf(t, slot);
  if (state == SlotState::kWritable && t == Tier::kHbm && orphan_partials.erase(slot.value()) > 0) {
    (void)Alloc(t, [&](BlockAllocator& a) { return a.Release(slot); });
    return;
  }
  if (state != SlotState::kCached) return;
  const SlotOwner& o = owner[TierIndex(t)][slot.value()];
  if (o.indexed) {
    UpdateCandidate(o.key, t);
  } else {
    // A private copy (computed twice, never written, or found corrupt): nothing to keep.
    (void)Alloc(t, [&](BlockAllocator& a) { return a.Evict(slot); });
  }
}

void KvCache::Impl::DropRef(const SeqBlock& b) {
  if (b.tier == Tier::kHbm) --seq_refs[b.slot.value()];
  if (b.tier == Tier::kHbm && ticket_refs[b.slot.value()] != 0 &&
      StateOf(b.tier, b.slot) == SlotState::kWritable) {
    orphan_partials.insert(b.slot.value());  // freed when the last ticket lets go
    return;
  }
  (void)Alloc(b.tier, [&](BlockAllocator& a) { return a.Release(b.slot); });
  SettleSlot(b.tier, b.slot);
}

absl::Status KvCache::Impl::AcquireRef(Tier t, SlotId slot) {
  KVTIER_RETURN_IF_ERROR(Alloc(t, [&](BlockAllocator& a) { return a.Acquire(slot); }));
  if (t == Tier::kHbm) ++seq_refs[slot.value()];
  const SlotOwner& o = owner[TierIndex(t)][slot.value()];
  if (o.indexed) UpdateCandidate(o.key, t);
  return absl::OkStatus();
}

void KvCache::Impl::PinTicket(SlotId slot) {
  if (ticket_refs[slot.value()]++ == 0) {
    ++locked;
    const SlotOwner& o = owner[0][slot.value()];
    if (o.indexed) UpdateCandidate(o.key, Tier::kHbm);
  }
}

}  // namespace kvtier
