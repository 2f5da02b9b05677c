// Eviction candidates: which copies are registered with each tier's policy (BlockEntry::candidate,
// kept in line with the shipped leaf-first rule and traits of kvtier/eviction_candidacy.h),
// which are being demoted away (evict_after, leaving_children, evicting, arriving), and making
// room in a tier by evicting the policy's victims: dropped, or demoted to the first lower tier
// admitting them that can take them (a tier backing off after a failed store does not:
// store_backoff, store_backoff_until).
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "kvtier/eviction_candidacy.h"

namespace kvtier {
namespace {

// After a failed store a tier is no demotion target for a back-off, doubling from the first to
// the last while its stores keep failing (NoteStore).
constexpr absl::Duration kStoreBackoffMin = absl::Milliseconds(100);
constexpr absl::Duration kStoreBackoffMax = absl::Seconds(10);

// What ranks the block of entry `m` with ColdFields `c` (nullptr: none) (eviction_candidacy.h).
// Templates, so the cache's private BlockEntry need not be named here.
template <typename Entry, typename Cold>
CandidateFacts FactsOf(const Entry& m, const Cold* c, uint32_t uses, const BlockKey& parent) {
  return CandidateFacts{.uses = uses,
                        .retention_priority = c != nullptr ? c->retention_priority : 0,
                        .priority_until = c != nullptr ? c->priority_until : absl::InfinitePast(),
                        .parent = parent,
                        .last_use = m.last_use()};
}

}  // namespace

CandidateFacts KvCache::Impl::Facts(const BlockEntry& m) const {
  return FactsOf(m, ColdOf(m), Uses(m), ParentKey(m));
}

std::optional<CandidateFacts> KvCache::Impl::FactsAt(const BlockKey& key) const {
  auto it = blocks.find(key);
  if (it == blocks.end()) return std::nullopt;
  return Facts(it->second);
}

BlockTraits KvCache::Impl::Traits(const BlockEntry& m, Tier t) const {
  // The walk runs under mu (held here), unseen through the lambda.
  return CandidateTraits(*policy[TierIndex(t)], Facts(m), block_bytes,
                         [this](const BlockKey& key)
                             ABSL_NO_THREAD_SAFETY_ANALYSIS { return FactsAt(key); });
}

// `m` is the entry of the key (every caller's), so its copies are the indexed ones.
bool KvCache::Impl::WantCandidate(const BlockEntry& m, Tier t,
                                  std::optional<SlotState> slot_state) {
  const int ti = TierIndex(t);
  const CopyFacts copy{.ready = m.copies.state(t) == CopyState::kReady,
                       .leaving = EvictAfter(m, ti),
                       .child_copies = ChildCopies(m, ti),
                       .leaving_children = LeavingChildren(m, ti)};
  const SlotId slot = m.copies.slots[ti];
  const uint32_t* pins = ticket_refs.data();  // read under mu (held here)
  // Held: read by a transfer, pinned by a ticket, or held by a sequence (the slot's state, read
  // under the engine's lock unless the caller just did; asked only when all else allows).
  // Called within this call, under mu; the analysis does not follow the lock into a lambda.
  return IsEvictionCandidate(copy, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return Readers(m, ti) != 0 || (t == Tier::kHbm && pins[slot.value()] != 0) ||
           (slot_state.has_value() ? *slot_state : StateOf(t, slot)) != SlotState::kCached;
  });
}

void KvCache::Impl::UpdateCandidate(const BlockKey& key, Tier t,
                                    std::optional<SlotState> slot_state) {
  auto it = blocks.find(key);
  if (it == blocks.end()) return;
  UpdateCandidate(*it, t, slot_state);
}

void KvCache::Impl::SyncCandidate(BlockMap::value_type& entry, Tier t,
                                  std::optional<SlotState> slot_state) {
  if (!Present(t)) return;
  const BlockKey key = entry.first.key();
  BlockEntry& m = entry.second;
  const uint8_t bit = static_cast<uint8_t>(1u << TierIndex(t));
  bool registered = (m.candidate & bit) != 0;
  // An Add the policy refuses leaves the copy unregistered; a Remove always unregisters it.
  (void)SyncCandidacy(
      *policy[TierIndex(t)], key, WantCandidate(m, t, slot_state), Facts(m), block_bytes,
      [this](const BlockKey& k) ABSL_NO_THREAD_SAFETY_ANALYSIS { return FactsAt(k); }, &registered);
  m.candidate = registered ? static_cast<uint8_t>(m.candidate | bit)
                           : static_cast<uint8_t>(m.candidate & ~bit);
}

void KvCache::Impl::DropCandidacy(const BlockKey& key, Tier t) {
  auto it = blocks.find(key);
  if (it != blocks.end()) DropCandidacy(*it, t);
}

void KvCache::Impl::SetLeaving(const BlockKey& key, Tier t, bool leaving) {
  auto it = blocks.find(key);
  if (it == blocks.end()) return;
  const uint8_t bit = static_cast<uint8_t>(1u << TierIndex(t));
  if (EvictAfter(it->second, TierIndex(t)) == leaving) return;
  ColdFields& c = MutableCold(it->second);
  c.evict_after = static_cast<uint8_t>(leaving ? (c.evict_after | bit) : (c.evict_after & ~bit));
  TrimCold(it->second);
  const BlockKey parent = ParentKey(it->second);
  UpdateCandidate(key, t);
  if (parent == kRootBlockKey) return;
  auto p = blocks.find(parent);
  if (p == blocks.end()) return;
  if (leaving) {
    ++MutableCold(p->second).leaving_children[TierIndex(t)];
  } else {
    --MutableCold(p->second).leaving_children[TierIndex(t)];
    TrimCold(p->second);
  }
  UpdateCandidate(parent, t);
  if (!leaving) MaybeEraseMeta(parent);
}

void KvCache::Impl::ObserveRelease(const Sequence& seq, StopReason stop,
                                   const std::optional<absl::Duration>& expected_idle,
                                   absl::Time now, bool last_turn, bool preempted) {
  // A sequence with caching off shares no block (SequenceOptions::enable_caching): its keys name
  // blocks other requests cached, which its hints must not rank, retain or invalidate.
  if (seq.options.session == 0 || !seq.options.enable_caching) return;
  const size_t written_full = static_cast<size_t>(WrittenFullBlocks(seq));
  ReleaseObservation release{.blocks = absl::MakeConstSpan(seq.keys).first(written_full),
                             .now = now,
                             .session = seq.options.session,
                             .stop_reason = stop,
                             .expected_idle = expected_idle,
                             .superseded = Superseded(seq),
                             .last_turn = last_turn,
                             .preempted = preempted};
  for (const std::unique_ptr<EvictionPolicy>& p : policy) {
    if (p != nullptr && p->observes_requests()) p->ObserveRelease(release);
  }
  if (!release.superseded) RememberSession(seq.options.session, release.blocks, seq.generation);
}

void KvCache::Impl::ObserveResume(const Sequence& seq) {
  if (seq.options.session == 0 || !seq.options.enable_caching) return;
  const RequestObservation back{.now = Now(), .session = seq.options.session, .resumed = true};
  for (const std::unique_ptr<EvictionPolicy>& p : policy) {
    if (p != nullptr && p->observes_requests()) p->ObserveRequest(back);
  }
}

bool KvCache::Impl::Superseded(const Sequence& seq) const {
  if (seq.options.session == 0) return false;
  // Released out of order (parallel requests of one session): the later one let go first.
  if (auto r = session_blocks.find(seq.options.session);
      r != session_blocks.end() && r->second.generation > seq.generation) {
    return true;
  }
  for (const auto& [other_id, other] : seqs) {
    if (other->options.session == seq.options.session && other->generation > seq.generation) {
      return true;
    }
  }
  return false;
}

void KvCache::Impl::TouchRegistered(const BlockKey& key, const BlockEntry& m) {
  for (int t = 0; t < kNumTiers; ++t) {
    if ((m.candidate >> t) & 1) {
      (void)policy[t]->Touch(key, Traits(m, static_cast<Tier>(t)), m.last_use());
    }
  }
}

std::optional<Tier> KvCache::Impl::NextLower(Tier t) const {
  for (int i = TierIndex(t) + 1; i < kNumTiers; ++i) {
    if (tiers[i] != nullptr) return static_cast<Tier>(i);
  }
  return std::nullopt;
}

bool KvCache::Impl::HasCopyBelow(const BlockRecord& rec, Tier t, int until) const {
  for (int i = TierIndex(t) + 1; i < until; ++i) {
    if (rec.state(static_cast<Tier>(i)) != CopyState::kAbsent) return true;
  }
  return false;
}

std::optional<Tier> KvCache::Impl::DemotionTarget(uint32_t uses, Tier t) const {
  for (int i = TierIndex(t) + 1; i < kNumTiers; ++i) {
    const bool backing_off =
        store_backoff_until[i] != absl::InfinitePast() && absl::Now() < store_backoff_until[i];
    if (tiers[i] != nullptr && uses >= static_cast<uint32_t>(admit_after_uses[i]) &&
        !backing_off) {
      return static_cast<Tier>(i);
    }
  }
  return std::nullopt;
}

void KvCache::Impl::NoteStore(Tier t, bool landed) {
  const int i = TierIndex(t);
  if (landed) {
    store_backoff[i] = absl::ZeroDuration();
    store_backoff_until[i] = absl::InfinitePast();
    return;
  }
  store_backoff[i] = store_backoff[i] == absl::ZeroDuration()
                         ? kStoreBackoffMin
                         : std::min(2 * store_backoff[i], kStoreBackoffMax);
  store_backoff_until[i] = absl::Now() + store_backoff[i];
}

bool KvCache::Impl::RoomBelowNow(Tier t, Deferred& d, int64_t window, bool may_wait,
                                 absl::Time deadline) {
  for (int attempts = 0; attempts < 8; ++attempts) {
    if (FreeBlocks(t) > 0) return true;
    if (evicting[TierIndex(t)] >= window) return false;
    if (EvictOne(t, d, window, may_wait, deadline) != EvictResult::kEvicted) return false;
  }
  return FreeBlocks(t) > 0;
}

bool KvCache::Impl::WorthDemoting(const BlockKey& key, Tier from, Tier to) const {
  if (!demote_by_value || !demote_on_evict) return true;
  const std::optional<double> p =
      policy[TierIndex(from)]->ReuseChance(key, absl::InfiniteDuration(), Now());
  if (!p.has_value()) return true;
  // The remote tier pays for sharing and for surviving this worker, which this worker's reuse
  // chance does not see: only a block nobody here will read again is kept out of it.
  if (!cost.has_value() || to == Tier::kRemote) return *p > 0;
  const TierLinkCost link = CurrentLinks()[TierIndex(to)];
  if (!(link.bytes_per_second > 0)) return *p > 0;
  const double copy_s = static_cast<double>(block_bytes) / link.bytes_per_second;
  const double restore_s = absl::ToDoubleSeconds(link.latency) + copy_s;
  auto worth = [&](int64_t depth) {
    const double recompute_s = absl::ToDoubleSeconds(
        cost->RecomputeTime(depth * block_tokens, (depth + 1) * block_tokens));
    return *p * (recompute_s - restore_s) >= copy_s;
  };
  if (*p <= 0) return false;
  if (worth(0)) return true;  // a block costs at least the first block's prefill
  // Deeper blocks cost more to recompute (attention reads every token before them): count the
  // block's depth, rarely needed, and decide with it.
  int64_t depth = 0;
  for (auto it = blocks.find(key); it != blocks.end() && depth < (int64_t{1} << 20); ++depth) {
    const BlockKey parent = ParentKey(it->second);
    if (parent == kRootBlockKey) break;
    it = blocks.find(parent);
  }
  return worth(depth);
}

KvCache::Impl::EvictResult KvCache::Impl::EvictOne(Tier t, Deferred& d, int64_t window,
                                                   bool may_wait, absl::Time deadline) {
  const std::optional<BlockKey> victim = policy[TierIndex(t)]->Victim(Now());
  if (!victim.has_value()) return EvictResult::kNoCandidate;
  const BlockKey key = *victim;
  const std::optional<BlockRecord> rec = IndexedCopies(key);
  auto m = blocks.find(key);
  if (!rec.has_value() || m == blocks.end()) {  // stale: cannot happen, but never loop on it
    (void)policy[TierIndex(t)]->Remove(key);
    return EvictResult::kEvicted;
  }
  // Read now, whatever RoomBelowNow changes below (it may evict, even erase, other entries).
  const uint32_t uses = Uses(m->second);
  // A copy published to the fleet's store (publish_to_remote) is there for the other workers:
  // it does not stand in for this worker's faster tiers, so the block is still demoted to DRAM
  // or NVMe; only the remote tier itself, which has it, is no target.
  const bool published = publish_to_remote && rec->state(Tier::kRemote) != CopyState::kAbsent;
  // Called only here, under mu (the analysis does not follow the lock into a lambda).
  auto target_below = [&](Tier from) ABSL_NO_THREAD_SAFETY_ANALYSIS -> std::optional<Tier> {
    std::optional<Tier> next = DemotionTarget(uses, from);
    if (published && next == Tier::kRemote) return std::nullopt;
    return next;
  };
  const bool covered =
      HasCopyBelow(*rec, t, published ? TierIndex(Tier::kRemote) : kNumTiers);
  const std::optional<Tier> target = target_below(t);
  const bool worth = !target.has_value() || covered || WorthDemoting(key, t, *target);
  if (!worth) ++counters.tiers[TierIndex(t)].value_drops;
  if (demote_on_evict && target.has_value() && !covered && worth &&
      (deadline == absl::InfiniteFuture() || absl::Now() < deadline)) {
    std::optional<Tier> to = target;
    while (to.has_value() &&
           !RoomBelowNow(*to, d, std::max<int64_t>(window, 1), may_wait, deadline)) {
      // Full, and nothing under way there will free a slot: try the next admitting tier.
      to = evicting[TierIndex(*to)] == 0 ? target_below(*to) : std::nullopt;
    }
    if (to.has_value()) {
      const SlotId src = rec->slots[TierIndex(t)];
      auto move = StartMove(key, t, src, *to, /*pin=*/false, d, deadline);
      if (move.ok()) {
        (*move)->evict_source = true;
        SetLeaving(key, t, true);
        ++evicting[TierIndex(t)];
        ++arriving[TierIndex(*to)];
        return EvictResult::kEvicted;
      }
    } else if (may_wait) {
      for (int below = TierIndex(*target); below < kNumTiers; ++below) {
        if (evicting[below] > 0 || arriving[below] > 0) return EvictResult::kWaitBelow;
      }
    }
  }
  DropCopy(key, t);
  ++counters.tiers[TierIndex(t)].evictions;
  return EvictResult::kEvicted;
}

absl::Status KvCache::Impl::MakeHbmRoom(int64_t need, absl::Time deadline, Deferred& d,
                                        RoomWait wait) {
  for (int pass = 0;; ++pass) {
    const bool past_deadline = absl::Now() >= deadline;
    // Demotions in flight free their sources when they land: count them, so no more is
    // evicted than needed. The nested window lets the tier below start as many demotions as
    // HBM still needs slots (more than needed when some victims already have a copy below).
    // Past the deadline they no longer count: none can land in time.
    bool waiting_below = false;
    while (FreeBlocks(Tier::kHbm) + (past_deadline ? 0 : evicting[0]) < need) {
      const int64_t window = need - FreeBlocks(Tier::kHbm) - (past_deadline ? 0 : evicting[0]);
      const EvictResult e = EvictOne(Tier::kHbm, d, window, /*may_wait=*/!past_deadline, deadline);
      waiting_below = e == EvictResult::kWaitBelow;
      if (e != EvictResult::kEvicted) break;
    }
    if (FreeBlocks(Tier::kHbm) >= need) return absl::OkStatus();
    // Demotions started above free their sources when they land; their callbacks need the
    // lock, and must first be registered. A copy that already finished (a synchronous tier)
    // runs its callback right there, while the lock is dropped, and its wake-up is gone by
    // the time we would wait: look again first (not past the deadline).
    const bool dropped_lock = DeferredRelease(d);
    if (FreeBlocks(Tier::kHbm) >= need) return absl::OkStatus();
    // Never waiting: a second pass only where the lock was dropped (a synchronous tier's
    // demotion may have landed meanwhile), then "not now".
    if (wait == RoomWait::kNever && (!dropped_lock || pass > 0)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "HBM has ", FreeBlocks(Tier::kHbm), " free slots, ", need, " needed, ", evicting[0],
          " demotions in flight (RoomWait::kNever does not wait for them)"));
    }
    if (dropped_lock && !past_deadline) continue;
    // Slots only a running kernel's write holds (KernelWritesFreeingHbm) are not waited for:
    // the thread waiting here may be the one that fires that kernel's `ready` (a host-side
    // Completion), and it would wait out room_wait for nothing. CheckRoom counts them as room.
    if ((evicting[0] == 0 && !waiting_below && !CopiesWillFreeHbm()) || past_deadline) {
      const int64_t kernels = KernelWritesFreeingHbm();
      return absl::ResourceExhaustedError(absl::StrCat(
          "HBM has ", FreeBlocks(Tier::kHbm), " free slots, ", need, " needed; ",
          evicting[0] > 0
              ? absl::StrCat(evicting[0], " demotions still in flight at the room wait's end")
              : "every other slot is locked by a ticket or held by a sequence",
          kernels > 0 ? absl::StrCat("; ", kernels,
                                     " are freed once running kernels' ReportWritten completions "
                                     "fire (not waited for)")
                      : ""));
    }
    cv.WaitUntil(&mu, absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Milliseconds(50))));
  }
}

RoomCheck KvCache::Impl::RoomFor(int64_t need) {
  // Cached HBM slots no eviction can take now: those a ticket locks, and those a copy out of
  // HBM reads (a demotion's source is counted as in flight instead). Only cached ones: most
  // locked slots and copy sources are held by a sequence, which a.cached does not count.
  std::vector<uint32_t> read_unlocked;  // copy sources no ticket locks
  for (const auto& [key, moves] : offloading) {
    for (const std::shared_ptr<Move>& m : moves) {
      if (m->from == Tier::kHbm && ticket_refs[m->src.value()] == 0) {
        read_unlocked.push_back(m->src.value());
      }
    }
  }
  std::sort(read_unlocked.begin(), read_unlocked.end());  // a slot two copies read counts once
  read_unlocked.erase(std::unique(read_unlocked.begin(), read_unlocked.end()), read_unlocked.end());
  // The lambda runs under mu (held here); the analysis cannot see that through the call.
  const std::vector<uint32_t>* refs = &ticket_refs;
  const bool any_locked = locked > 0;
  SlotCounts a;
  int64_t busy = 0;
  (void)Alloc(Tier::kHbm, [&](BlockAllocator& alloc) {
    a = alloc.counts();
    for (const uint32_t s : read_unlocked) {
      busy += alloc.state_or_free(SlotId(s)) == SlotState::kCached ? 1 : 0;
    }
    for (size_t s = 0; any_locked && s < refs->size(); ++s) {
      if ((*refs)[s] != 0) {
        busy += alloc.state_or_free(SlotId(static_cast<uint32_t>(s))) == SlotState::kCached;
      }
    }
    return absl::OkStatus();
  });
  RoomCheck r;
  r.needed_slots = std::max<int64_t>(need, 0);
  r.free_slots = a.free;
  r.demotions_in_flight = evicting[0];
  r.evictable_slots = std::max<int64_t>(0, a.cached - busy);
  r.fits_now = r.needed_slots <= r.free_slots;
  // Slots only a running kernel's write holds are free once it completes: no eviction needed.
  const int64_t reachable =
      r.free_slots + r.evictable_slots + r.demotions_in_flight + KernelWritesFreeingHbm();
  r.fits_after_evictions = r.needed_slots <= reachable;
  r.missing_slots = std::max<int64_t>(0, r.needed_slots - reachable);
  return r;
}

int64_t KvCache::Impl::ResetTier(Tier t) {
  const int ti = TierIndex(t);
  std::vector<BlockKey> drop;
  for (const auto& [packed, m] : blocks) {
    if (m.copies.state(t) != CopyState::kReady || Readers(m, ti) != 0 || EvictAfter(m, ti)) {
      continue;
    }
    const SlotId slot = m.copies.slots[ti];
    if (t == Tier::kHbm && ticket_refs[slot.value()] != 0) continue;
    if (StateOf(t, slot) != SlotState::kCached) continue;
    drop.push_back(packed.key());
  }
  int64_t dropped = 0;
  for (const BlockKey& key : drop) {
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    if (!rec.has_value() || rec->state(t) != CopyState::kReady) continue;
    DropCopy(key, t);
    const std::optional<BlockRecord> after = IndexedCopies(key);
    dropped += !after.has_value() || after->state(t) == CopyState::kAbsent ? 1 : 0;
  }
  CacheEvent cleared;
  cleared.kind = CacheEventKind::kAllCleared;
  cleared.tier = t;
  Emit(cleared);
  return dropped;
}

int64_t KvCache::Impl::KernelWritesFreeingHbm() {
  int64_t n = 0;
  for (const auto& [slot, holds] : kernel_holds) {
    if (seq_refs[slot] == 0 && ticket_refs[slot] == holds) ++n;
  }
  return n;
}

bool KvCache::Impl::CopiesWillFreeHbm() {
  for (const auto& [key, moves] : offloading) {
    for (const std::shared_ptr<Move>& m : moves) {
      if (m->from == Tier::kHbm && !m->evict_source && ticket_refs[m->src.value()] == 0 &&
          seq_refs[m->src.value()] <= m->pause_waiters.size()) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace kvtier
