// Block records: the one entry of each block (its copies per tier, parent, child copies, and its
// ColdFields: readers, children leaving, retention) and the SlotOwner of each slot, changed
// together so they agree; and the cache's event log (events, next_event) of copies stored and
// removed.
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "internal/status_macros.h"

namespace kvtier {

void KvCache::Impl::Event(CacheEventKind kind, const BlockKey& key, Tier tier) {
  events.push_back(CacheEvent{next_event++, kind, key, tier});
  while (events.size() > event_buffer) events.pop_front();
}

void KvCache::Impl::MaybeEraseMeta(const BlockKey& key) {
  auto it = blocks.find(key);
  if (it == blocks.end()) return;
  BlockEntry& m = it->second;
  const ColdFields* c = ColdOf(m);
  for (int t = 0; t < kNumTiers; ++t) {
    if (m.small_child(t) != 0) return;
    if (c != nullptr && (c->readers[t] != 0 || c->leaving_children[t] != 0)) return;
  }
  if (m.copies.has_copy()) return;
  if (m.has_cold) cold.erase(&m);  // a retention priority goes with its block
  blocks.erase(it);
}

absl::Status KvCache::Impl::AddCopy(const BlockKey& key, Tier t, SlotId slot, CopyState state,
                                    const BlockKey& parent) {
  // Checked before the entry is made, so a refused copy leaves no entry behind (BlockRecord's
  // checks and errors, as the index gave).
  if (TierIndex(t) < 0 || TierIndex(t) >= kNumTiers || !slot.valid() ||
      (state != CopyState::kPending && state != CopyState::kReady)) {
    return BlockRecord().AddCopy(key, t, slot, state);
  }
  BlockMap::value_type& element = *blocks.try_emplace(key).first;
  BlockEntry& m = element.second;
  const bool had_copy = m.copies.has_copy();
  KVTIER_RETURN_IF_ERROR(m.copies.AddCopy(key, t, slot, state));
  if (!had_copy) {  // a new block, or one only its children knew (parent set now)
    ++indexed_blocks;
    // The parent's element is found or made here; it stays while this copy counts in it.
    m.parent = parent == kRootBlockKey ? BlockEntry::kNoParent
                                       : BlockMap::handle(blocks.try_emplace(parent).first);
    m.set_last_use(Now());
  }
  owner[TierIndex(t)][slot.value()] = SlotOwner{key, &element};
  if (BlockMap::value_type* p = Parent(m); p != nullptr) {
    AddChildCopy(p->second, TierIndex(t), +1);
    UpdateCandidate(*p, t);
  }
  if (state == CopyState::kReady) {
    Event(CacheEventKind::kStored, key, t);
    ++counters.tiers[TierIndex(t)].stored;
  }
  return absl::OkStatus();
}

void KvCache::Impl::MarkReady(const BlockKey& key, Tier t) {
  auto it = blocks.find(key);
  if (it == blocks.end() || !it->second.copies.MarkReady(key, t).ok()) return;
  Event(CacheEventKind::kStored, key, t);
  ++counters.tiers[TierIndex(t)].stored;
  UpdateCandidate(key, t);
}

void KvCache::Impl::RemoveCopy(const BlockKey& key, Tier t) {
  const std::optional<BlockRecord> rec = IndexedCopies(key);
  if (!rec.has_value() || rec->state(t) == CopyState::kAbsent) return;
  const bool was_ready = rec->state(t) == CopyState::kReady;
  SetLeaving(key, t, false);
  // The entry stays (found again below) until MaybeEraseMeta: children or readers may keep it.
  if (auto e = blocks.find(key); e != blocks.end() && e->second.copies.RemoveCopy(key, t).ok() &&
                                 !e->second.copies.has_copy()) {
    --indexed_blocks;
  }
  // The slot may already belong to another block: a failed transfer's destination is freed
  // (and can be reused) before its callback runs here.
  SlotOwner& o = owner[TierIndex(t)][rec->slots[TierIndex(t)].value()];
  if (o.key == key) o.entry = nullptr;
  auto it = blocks.find(key);
  if (it != blocks.end()) {
    const uint8_t bit = static_cast<uint8_t>(1u << TierIndex(t));
    if (it->second.candidate & bit) {
      (void)policy[TierIndex(t)]->Remove(key);
      it->second.candidate &= static_cast<uint8_t>(~bit);
    }
    if (BlockMap::value_type* p = Parent(it->second);
        p != nullptr && ChildCopies(p->second, TierIndex(t)) > 0) {
      const BlockKey parent = p->first.key();
      if (!it->second.copies.has_copy()) it->second.parent = BlockEntry::kNoParent;
      AddChildCopy(p->second, TierIndex(t), -1);
      UpdateCandidate(*p, t);
      MaybeEraseMeta(parent);
    } else if (!it->second.copies.has_copy()) {
      it->second.parent = BlockEntry::kNoParent;
    }
  }
  if (was_ready) Event(CacheEventKind::kRemoved, key, t);
  MaybeEraseMeta(key);
}

void KvCache::Impl::DropCopy(const BlockKey& key, Tier t) {
  const std::optional<BlockRecord> rec = IndexedCopies(key);
  if (!rec.has_value() || rec->state(t) != CopyState::kReady) return;
  const SlotId slot = rec->slots[TierIndex(t)];
  if (!Alloc(t, [&](BlockAllocator& a) { return a.Evict(slot); }).ok()) return;
  RemoveCopy(key, t);
  // The indexed copy is the tier's only one of the block: a store outside the process may let
  // it go too.
  if (t != Tier::kHbm) tiers[TierIndex(t)]->DiscardBlock(slot, key);
}

void KvCache::Impl::DropIfDroppable(const BlockKey& key, Tier t) {
  auto m = blocks.find(key);
  if (m == blocks.end() || t == Tier::kHbm || Readers(m->second, TierIndex(t)) != 0 ||
      EvictAfter(m->second, TierIndex(t))) {
    return;
  }
  const std::optional<BlockRecord> rec = IndexedCopies(key);
  if (rec.has_value() && rec->state(t) == CopyState::kReady &&
      StateOf(t, rec->slots[TierIndex(t)]) == SlotState::kCached) {
    DropCopy(key, t);
  }
}

}  // namespace kvtier
