// Block records: the one entry of each block (its copies per tier, parent, child copies, and its
// ColdFields: readers, children leaving, retention) and the SlotOwner of each slot, changed
// together so they agree; and the cache's event log (events, next_event) of copies stored and
// removed, with what each event says of its block (parent, adapter) and the batch of events
// waiting for the subscribers (unpublished).
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "internal/interned_string.h"
#include "internal/status_macros.h"

namespace kvtier {

// The size kv_cache_stats.h promises (the ring holds event_buffer of them).
static_assert(sizeof(CacheEvent) == 80);

CacheEvent KvCache::Impl::BlockEvent(CacheEventKind kind, const BlockMap::value_type& element,
                                     Tier t) const {
  const BlockEntry& m = element.second;
  CacheEvent e;
  e.kind = kind;
  e.tier = t;
  e.key = element.first.key();
  e.has_parent = m.parent != BlockEntry::kNoParent;
  e.parent_key = ParentKey(m);
  e.num_tokens = block_tokens;
  if (auto a = adapter_of.find(&m); a != adapter_of.end()) e.adapter_id = adapter_names[a->second];
  return e;
}

void KvCache::Impl::Emit(CacheEvent e) {
  e.sequence = next_event++;
  e.worker_id = worker_id;
  if (hub->has_subscribers()) unpublished.push_back(e);
  events.push_back(e);
  while (events.size() > event_buffer) events.pop_front();
}

bool KvCache::Impl::PublishEvents() {
  if (unpublished.empty()) return false;
  hub->Enqueue(std::move(unpublished));
  unpublished.clear();  // a moved-from vector is valid but unspecified
  return true;
}

uint32_t KvCache::Impl::AdapterIndex(const std::optional<AdapterIdentity>& adapter) {
  if (!adapter.has_value() || adapter->id.empty()) return 0;
  const std::string_view id = strings->Intern(adapter->id);
  auto [it, added] = adapter_index.try_emplace(id, static_cast<uint32_t>(adapter_names.size()));
  if (added) adapter_names.push_back(id);
  return it->second;
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
  adapter_of.erase(&m);
  blocks.erase(it);
}

absl::Status KvCache::Impl::AddCopy(const BlockKey& key, Tier t, SlotId slot, CopyState state,
                                    const BlockKey& parent, uint32_t adapter) {
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
  if (adapter != 0) adapter_of.try_emplace(&m, adapter);
  owner[TierIndex(t)][slot.value()] = SlotOwner{key, &element};
  if (BlockMap::value_type* p = Parent(m); p != nullptr) {
    AddChildCopy(p->second, TierIndex(t), +1);
    UpdateCandidate(*p, t);
  }
  if (state == CopyState::kReady) {
    Emit(BlockEvent(CacheEventKind::kStored, element, t));
    ++counters.tiers[TierIndex(t)].stored;
  }
  return absl::OkStatus();
}

void KvCache::Impl::MarkReady(const BlockKey& key, Tier t) {
  auto it = blocks.find(key);
  if (it == blocks.end() || !it->second.copies.MarkReady(key, t).ok()) return;
  Emit(BlockEvent(CacheEventKind::kStored, *it, t));
  ++counters.tiers[TierIndex(t)].stored;
  UpdateCandidate(key, t);
}

void KvCache::Impl::RemoveCopy(const BlockKey& key, Tier t) {
  const std::optional<BlockRecord> rec = IndexedCopies(key);
  if (!rec.has_value() || rec->state(t) == CopyState::kAbsent) return;
  const bool was_ready = rec->state(t) == CopyState::kReady;
  // Read before the entry loses its parent (with its last copy): kRemoved says what kStored did.
  std::optional<CacheEvent> removed;
  if (auto e = blocks.find(key); was_ready && e != blocks.end()) {
    removed = BlockEvent(CacheEventKind::kRemoved, *e, t);
  }
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
  if (removed.has_value()) Emit(*removed);
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
