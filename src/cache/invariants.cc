// The invariant checker: recounts, from the sequences, tickets, block entries and allocators,
// everything the other parts keep in counters (references, child copies, candidates, pins) and
// reports the first disagreement as kInternal. Changes no state.
#include <array>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/kv_cache_impl.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "internal/strings.h"

namespace kvtier {

namespace {

using internal::SeqName;
using internal::ToAbsl;

}  // namespace

absl::Status KvCache::Impl::CheckInvariantsLocked() {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  // Expected references per (tier, slot): one per sequence block.
  std::array<absl::flat_hash_map<uint32_t, uint32_t>, kNumTiers> refs;
  for (const auto& [id, seq] : seqs) {
    if (seq->blocks.size() !=
        static_cast<size_t>(geometry.BlocksForTokens(static_cast<int64_t>(seq->tokens.size())))) {
      return fail(SeqName(id), " has ", seq->blocks.size(), " blocks for ", seq->tokens.size(),
                  " tokens");
    }
    if (seq->keys.size() != seq->tokens.size() / static_cast<size_t>(block_tokens)) {
      return fail(SeqName(id), " has ", seq->keys.size(), " keys");
    }
    for (size_t i = 0; i < seq->blocks.size(); ++i) {
      const SeqBlock& b = seq->blocks[i];
      if (i >= seq->keys.size() && b.tier != Tier::kHbm) {
        return fail(SeqName(id), "'s partial block is in ", ToAbsl(TierName(b.tier)));
      }
      ++refs[TierIndex(b.tier)][b.slot.value()];
    }
    for (const SeqBlock& b : seq->copy_sources) ++refs[TierIndex(b.tier)][b.slot.value()];
  }
  // The lambda runs under mu (held here); the analysis cannot see that through the call.
  const auto* owners = &owner;
  const auto* metas = &blocks;
  const auto* pinned = &ticket_refs;
  const auto* orphans = &orphan_partials;
  absl::Status st =
      // Called synchronously, under mu (the analysis does not follow the lock into a lambda).
      engine->WithAllocators([&](const std::array<BlockAllocator*, kNumTiers>& a)
                                 ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
        for (int t = 0; t < kNumTiers; ++t) {
          if (a[t] == nullptr) continue;
          const SlotCounts c = a[t]->counts();
          if (c.total() != a[t]->capacity_blocks()) {
            return fail(ToAbsl(TierName(static_cast<Tier>(t))),
                        ": free + used + quarantined = ", c.total(), " != capacity ",
                        a[t]->capacity_blocks());
          }
          for (int64_t s = 0; s < a[t]->capacity_blocks(); ++s) {
            const SlotId slot(static_cast<uint32_t>(s));
            const SlotState state = *a[t]->state(slot);
            const uint32_t rc = *a[t]->ref_count(slot);
            auto it = refs[t].find(slot.value());
            const uint32_t want = it == refs[t].end() ? 0 : it->second;
            const SlotOwner& o = (*owners)[t][static_cast<size_t>(s)];
            uint32_t readers_here = 0;
            if (o.indexed()) {
              auto m = metas->find(o.key);
              if (m == metas->end() || &*m != o.entry) {
                return fail(ToAbsl(TierName(static_cast<Tier>(t))), " slot ", s,
                            " names an entry that is not its block's");
              }
              readers_here = Readers(m->second, t);
            }
            const bool ticketed = t == 0 && (*pinned)[static_cast<size_t>(s)] != 0;
            if (state == SlotState::kWritable) {
              const bool orphan = t == 0 && orphans->contains(slot.value());
              if (want != 1 && !(want == 0 && orphan && ticketed)) {
                return fail(ToAbsl(TierName(static_cast<Tier>(t))), " slot ", s,
                            " is writable with ", want, " sequence holders");
              }
            } else if (state == SlotState::kSealed) {
              // Holders plus the engine's pins of running transfers (at most one per reader, and
              // the pinned destination of an onboard until its callback adopts it).
              if (rc < want || rc > want + readers_here + 1) {
                return fail(ToAbsl(TierName(static_cast<Tier>(t))), " slot ", s, " has ", rc,
                            " references; sequences hold ", want, ", readers ", readers_here);
              }
            } else if (want != 0) {
              return fail(ToAbsl(TierName(static_cast<Tier>(t))), " slot ", s, " is ",
                          ToAbsl(SlotStateName(state)), " but sequences hold ", want);
            }
            // An unwritten twin is kept until its kernel's `ready` fires (SettleSlot).
            if (state == SlotState::kCached && !o.indexed() && !ticketed &&
                !(t == 0 && UnwrittenTwin(slot))) {
              return fail(ToAbsl(TierName(static_cast<Tier>(t))), " slot ", s,
                          " is cached but not indexed: leaked");
            }
            if (state == SlotState::kFree && ticketed) {
              return fail("HBM slot ", s, " is free while a ticket pins it");
            }
          }
        }
        return absl::OkStatus();
      });
  KVTIER_RETURN_IF_ERROR(st);
  // The block entries, the owners and the candidates agree.
  std::array<int64_t, kNumTiers> candidates{};
  int64_t with_copies = 0;
  absl::flat_hash_map<BlockKey, std::array<uint32_t, kNumTiers>> child_count;
  absl::flat_hash_map<BlockKey, std::array<uint32_t, kNumTiers>> leaving_count;
  absl::flat_hash_set<uint32_t> handles;  // of the live elements
  for (auto it = blocks.begin(); it != blocks.end(); ++it) handles.insert(BlockMap::handle(it));
  for (const auto& [packed, m] : blocks) {
    const BlockKey key = packed.key();
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    if (!rec.has_value()) {
      if (m.parent != BlockEntry::kNoParent) {
        return fail("block ", key.ToHex(), " has no copy but keeps a parent handle");
      }
      continue;
    }
    ++with_copies;
    if (m.parent != BlockEntry::kNoParent) {
      if (!handles.contains(m.parent)) {
        return fail("block ", key.ToHex(), "'s parent handle ", m.parent, " names no element");
      }
      const BlockKey parent = ParentKey(m);
      for (int t = 0; t < kNumTiers; ++t) {
        if (rec->state(static_cast<Tier>(t)) != CopyState::kAbsent) ++child_count[parent][t];
        if (EvictAfter(m, t)) ++leaving_count[parent][t];
      }
    }
  }
  if (with_copies != indexed_blocks) {
    return fail("indexed_blocks = ", indexed_blocks, ", blocks with a copy ", with_copies);
  }
  // Cold fields: one element per entry with has_cold, none all zero (TrimCold drops those).
  int64_t with_cold = 0;
  for (const auto& [packed, m] : blocks) {
    const BlockKey key = packed.key();
    const ColdFields* c = nullptr;
    if (m.has_cold) {
      ++with_cold;
      auto it = cold.find(&m);
      if (it == cold.end()) return fail("block ", key.ToHex(), " has_cold without cold fields");
      if (it->second.Empty()) return fail("block ", key.ToHex(), " keeps all-zero cold fields");
      c = &it->second;
    }
    // A counter is in `cold` exactly while it does not fit its field.
    if ((m.small_uses == BlockEntry::kUsesInCold) !=
        (c != nullptr && c->uses >= BlockEntry::kUsesInCold)) {
      return fail("block ", key.ToHex(), " keeps its uses in both or neither place");
    }
    for (int t = 0; t < kNumTiers; ++t) {
      if ((m.small_child(t) == BlockEntry::kChildCopiesInCold) !=
          (c != nullptr && c->child_copies[t] >= BlockEntry::kChildCopiesInCold)) {
        return fail("block ", key.ToHex(), " keeps its child copies in ",
                    ToAbsl(TierName(static_cast<Tier>(t))), " in both or neither place");
      }
    }
  }
  if (with_cold != static_cast<int64_t>(cold.size())) {
    return fail(cold.size(), " cold elements, ", with_cold, " entries with has_cold");
  }
  for (const auto& [packed, m] : blocks) {
    const BlockKey key = packed.key();
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    auto cc = child_count.find(key);
    for (int t = 0; t < kNumTiers; ++t) {
      const uint32_t expect = cc == child_count.end() ? 0 : cc->second[t];
      auto lc = leaving_count.find(key);
      const uint32_t leaving = lc == leaving_count.end() ? 0 : lc->second[t];
      if (LeavingChildren(m, t) != leaving) {
        return fail("block ", key.ToHex(), " counts ", LeavingChildren(m, t), " children leaving ",
                    ToAbsl(TierName(static_cast<Tier>(t))), ", there are ", leaving);
      }
      if (ChildCopies(m, t) != expect) {
        return fail("block ", key.ToHex(), " counts ", ChildCopies(m, t), " child copies in ",
                    ToAbsl(TierName(static_cast<Tier>(t))), ", there are ", expect);
      }
      if (!rec.has_value()) continue;
      // A pending copy's slot may already be reused: a failed transfer frees it before the
      // cache's callback forgets the copy.
      if (rec->state(static_cast<Tier>(t)) == CopyState::kReady) {
        const SlotOwner& o = owner[t][rec->slots[t].value()];
        if (!o.indexed() || o.key != key || o.entry->first.key() != key) {
          return fail("block ", key.ToHex(), "'s ", ToAbsl(TierName(static_cast<Tier>(t))),
                      " slot does not name it");
        }
      }
      if (!Present(static_cast<Tier>(t))) continue;
      const bool is = (m.candidate >> t) & 1;
      if (is != WantCandidate(m, static_cast<Tier>(t))) {
        return fail("block ", key.ToHex(), " is ", is ? "" : "not ", "an eviction candidate in ",
                    ToAbsl(TierName(static_cast<Tier>(t))), " against the rules");
      }
      if (is) ++candidates[t];
    }
  }
  for (int t = 0; t < kNumTiers; ++t) {
    if (policy[t] != nullptr && policy[t]->size() != candidates[t]) {
      return fail(ToAbsl(TierName(static_cast<Tier>(t))), " policy has ", policy[t]->size(),
                  " candidates, the blocks say ", candidates[t]);
    }
  }
  // Tickets pin what they say.
  std::vector<uint32_t> pins(ticket_refs.size(), 0);
  for (const auto& [id, t] : tickets) {
    internal::MutexLock tl(&t->mu);
    for (size_t i = 0; i < t->status.size(); ++i) {
      if (t->status[i] == BlockResidency::kResident) ++pins[static_cast<size_t>(t->table.slots[i])];
    }
  }
  for (size_t s = 0; s < seq_refs.size(); ++s) {
    auto it = refs[0].find(static_cast<uint32_t>(s));
    const uint32_t want = it == refs[0].end() ? 0 : it->second;
    if (seq_refs[s] != want) {
      return fail("HBM slot ", s, " counts ", seq_refs[s], " sequence references, there are ",
                  want);
    }
  }
  int64_t locked_count = 0;
  for (size_t s = 0; s < pins.size(); ++s) {
    const auto held = kernel_holds.find(static_cast<uint32_t>(s));
    const uint32_t kernels = held == kernel_holds.end() ? 0 : held->second;
    if (pins[s] + kernels != ticket_refs[s]) {
      return fail("HBM slot ", s, " has ", ticket_refs[s], " ticket pins, tickets say ", pins[s],
                  " and kernels still writing ", kernels);
    }
    if (ticket_refs[s] != 0) ++locked_count;
  }
  if (locked_count != locked) return fail("locked = ", locked, ", counted ", locked_count);
  return absl::OkStatus();
}

}  // namespace kvtier
