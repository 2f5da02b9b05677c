// Residency: tickets (tickets, next_ticket), onboard batches (each block's outcome: a ticket's,
// or Resume's batch, which is no ticket), making a sequence's blocks resident in HBM (adopting
// an HBM copy, joining an onboard, or starting one) for EnsureResident, Resume and Prefetch,
// moving a paused sequence's references down (Pause), and expiring a ticket at its deadline.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "cache/layer_fanout.h"
#include "cache/ticket_state.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "internal/strings.h"

namespace kvtier {
namespace {

using internal::SeqName;
using internal::ToAbsl;

}  // namespace

// Owned by every copy of a handed-out ResidencyTicket (an aliasing shared_ptr): the last copy's
// destruction closes the ticket. The cache's own references to the TicketState (its ticket map,
// onboard waiters, the deadline timer) are separate, so they never keep a ticket open.
struct KvCache::Impl::TicketHolder {
  TicketHolder(std::shared_ptr<internal::TicketState> s, std::weak_ptr<internal::Lifeline> l)
      : state(std::move(s)), lifeline(std::move(l)) {}
  TicketHolder(const TicketHolder&) = delete;
  TicketHolder& operator=(const TicketHolder&) = delete;

  ~TicketHolder() {
    std::shared_ptr<internal::Lifeline> life = lifeline.lock();
    if (life == nullptr) return;
    auto* impl = static_cast<Impl*>(life->Enter());
    if (impl == nullptr) return;  // the cache is gone or going: nothing left to unpin
    {
      CacheLock lock(*impl);
      // kFailedPrecondition when ReleaseTicket came first: nothing to do.
      (void)impl->CloseTicket(state);
    }
    life->Exit();
  }

  std::shared_ptr<internal::TicketState> state;
  std::weak_ptr<internal::Lifeline> lifeline;
};

std::shared_ptr<internal::TicketState> KvCache::Impl::HandOut(
    std::shared_ptr<internal::TicketState> t) {
  auto holder = std::make_shared<TicketHolder>(t, lifeline);
  internal::TicketState* raw = t.get();
  return std::shared_ptr<internal::TicketState>(std::move(holder), raw);
}

bool KvCache::Impl::ResolveOnboard(const std::shared_ptr<internal::OnboardBatch>& t, int64_t i,
                                   std::optional<SlotId> slot, absl::Status error, Deferred& d) {
  {
    internal::MutexLock lock(&t->mu);
    if (t->status[static_cast<size_t>(i)] != BlockResidency::kPending) return false;
    if (t->ticket != nullptr) {  // every layer of the block is settled now
      if (slot.has_value()) {
        std::vector<Completion> ready;
        internal::AdvanceLayersLocked(*t->ticket, i, t->ticket->num_layers,
                                      static_cast<int32_t>(slot->value()), ready);
        for (Completion& c : ready) d.fire.emplace_back(std::move(c), absl::OkStatus());
      } else {
        internal::FailLayersLocked(*t->ticket, i, error, d.fire);
      }
    }
    if (slot.has_value()) {
      t->status[static_cast<size_t>(i)] = BlockResidency::kResident;
    } else {
      t->status[static_cast<size_t>(i)] = BlockResidency::kNotResident;
      t->errors[i] = std::move(error);
    }
    if (t->ticket != nullptr) {
      internal::SetSlotLocked(*t->ticket, i,
                              slot.has_value() ? static_cast<int32_t>(slot->value()) : -1);
    }
  }
  if (--t->pending == 0) d.fire.emplace_back(t->done, BatchOutcome(*t));
  return true;
}

bool KvCache::Impl::OnboardPending(internal::OnboardBatch& t, int64_t i) {
  internal::MutexLock lock(&t.mu);
  return t.status[static_cast<size_t>(i)] == BlockResidency::kPending;
}

void KvCache::Impl::ExpireTicket(const std::shared_ptr<internal::TicketState>& t) {
  CacheScope scope(*this);
  Deferred& d = scope.deferred();
  std::vector<int64_t> late;
  {
    internal::MutexLock tl(&t->mu);
    for (size_t i = 0; i < t->status.size(); ++i) {
      // A committed block (a layer landed, or a stream waits on its copy) is being written into
      // HBM (a started copy is not cut, TransferOptions::deadline_bounds_start), and a kernel
      // may read it: it stays pending, pinned when it lands, so its slot is not reused under
      // that kernel.
      if (t->status[i] == BlockResidency::kPending &&
          (i >= t->committed.size() || t->committed[i] == 0)) {
        late.push_back(static_cast<int64_t>(i));
      }
    }
  }
  for (int64_t i : late) {
    ResolveOnboard(t, i, std::nullopt,
                   absl::DeadlineExceededError("the block was not resident by the deadline"), d);
  }
}

void KvCache::Impl::AdoptHbmCopies(Sequence& seq, int64_t first, int64_t last) {
  for (int64_t i = first; i < last && i < static_cast<int64_t>(seq.keys.size()); ++i) {
    const SeqBlock b = seq.blocks[static_cast<size_t>(i)];
    if (b.tier == Tier::kHbm) continue;
    const BlockKey key = seq.keys[static_cast<size_t>(i)];
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    if (!rec.has_value() || rec->state(Tier::kHbm) != CopyState::kReady) continue;
    if (!RepointBlock(seq, i, Tier::kHbm, rec->slots[0])) continue;
    if (inclusion == TierInclusion::kExclusive) DropIfDroppable(key, b.tier);
  }
}

int64_t KvCache::Impl::MissingBlocks(const Sequence& seq, int64_t first, int64_t last) {
  int64_t missing = 0;
  for (int64_t i = first; i < last; ++i) {
    if (seq.blocks[static_cast<size_t>(i)].tier == Tier::kHbm) continue;
    const BlockKey& key = seq.keys[static_cast<size_t>(i)];
    if (onboarding.contains(key)) continue;
    // Another sequence's kernel is writing it into HBM: Onboard waits and shares that slot.
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    if (rec.has_value() && rec->state(Tier::kHbm) == CopyState::kPending) continue;
    ++missing;
  }
  return missing;
}

absl::Status KvCache::Impl::BatchOutcome(internal::OnboardBatch& t) {
  internal::MutexLock lock(&t.mu);
  for (size_t i = 0; i < t.status.size(); ++i) {
    if (t.status[i] != BlockResidency::kResident) {
      auto it = t.errors.find(static_cast<int64_t>(i));
      return absl::UnavailableError(absl::StrCat(
          "block ", t.first_block + static_cast<int64_t>(i), " of ", SeqName(t.sequence),
          " is not resident: ", it != t.errors.end() ? it->second.ToString() : "pending"));
    }
  }
  return absl::OkStatus();
}

void KvCache::Impl::Onboard(Sequence& seq, int64_t i,
                            const std::shared_ptr<internal::OnboardBatch>& t, int64_t ti,
                            Deferred& d) {
  const SeqBlock b = seq.blocks[static_cast<size_t>(i)];
  // A ticket released while its block waited for a write (WakeWriteWaiters) pins nothing.
  const bool pin = t->ticket != nullptr && !t->ticket->released;
  if (b.tier == Tier::kHbm) {  // also the partial last block, which has no key
    if (pin) PinTicket(b.slot);
    ResolveOnboard(t, ti, b.slot, absl::OkStatus(), d);
    return;
  }
  const BlockKey key = seq.keys[static_cast<size_t>(i)];
  const std::optional<BlockRecord> rec = IndexedCopies(key);
  if (rec.has_value() && rec->state(Tier::kHbm) == CopyState::kReady) {
    const SlotId hbm = rec->slots[0];
    if (RepointBlock(seq, i, Tier::kHbm, hbm)) {  // an HBM copy exists: adopt it, no bytes move
      if (inclusion == TierInclusion::kExclusive) DropIfDroppable(key, b.tier);
      if (pin) PinTicket(hbm);
      ResolveOnboard(t, ti, hbm, absl::OkStatus(), d);
      return;
    }
  }
  auto in_flight = onboarding.find(key);
  if (in_flight != onboarding.end()) {
    AddWaiter(*in_flight->second, Move::Waiter{seq.id, i, t, ti}, d);
    return;
  }
  if (rec.has_value() && rec->state(Tier::kHbm) == CopyState::kPending) {
    // Another sequence's kernel is writing this block into HBM: wait for it rather than copy
    // the same bytes in again (WakeWriteWaiters; the batch's deadline still bounds the wait).
    write_waiters[key].push_back(Move::Waiter{seq.id, i, t, ti});
    return;
  }
  auto move = StartMove(key, b.tier, b.slot, Tier::kHbm, /*pin=*/true, d, t->deadline);
  if (!move.ok()) {
    ResolveOnboard(t, ti, std::nullopt, move.status(), d);
    return;
  }
  AddWaiter(**move, Move::Waiter{seq.id, i, t, ti}, d);
}

void KvCache::Impl::WakeWriteWaiters(const BlockKey& key, Deferred& d) {
  auto it = write_waiters.find(key);
  if (it == write_waiters.end()) return;
  const std::optional<BlockRecord> rec = IndexedCopies(key);
  if (rec.has_value() && rec->state(Tier::kHbm) == CopyState::kPending &&
      !onboarding.contains(key)) {
    return;  // still being written (a twin settled, not the indexed copy)
  }
  std::vector<Move::Waiter> waiters = std::move(it->second);
  write_waiters.erase(it);
  for (const Move::Waiter& w : waiters) {
    if (w.batch == nullptr || !OnboardPending(*w.batch, w.batch_index)) continue;  // expired
    auto s = seqs.find(w.sequence);
    if (s == seqs.end() || s->second->paused ||
        w.block >= static_cast<int64_t>(s->second->keys.size()) ||
        s->second->keys[static_cast<size_t>(w.block)] != key) {
      ResolveOnboard(w.batch, w.batch_index, std::nullopt,
                     absl::UnavailableError(
                         "the sequence was released, paused or cut while the block was written"),
                     d);
      continue;
    }
    Onboard(*s->second, w.block, w.batch, w.batch_index, d);
  }
}

void KvCache::Impl::FailWriteWaiters(Deferred& d) {
  for (const auto& [key, waiters] : write_waiters) {
    for (const Move::Waiter& w : waiters) {
      if (w.batch == nullptr) continue;
      ResolveOnboard(w.batch, w.batch_index, std::nullopt,
                     absl::UnavailableError("the cache was destroyed before the block's write "
                                            "landed"),
                     d);
    }
  }
  write_waiters.clear();
}

absl::Status KvCache::Impl::IssueTicket(SequenceId id, int64_t begin_token, int64_t end_token,
                                        const EnsureResidentOptions& options,
                                        const std::shared_ptr<internal::TicketState>& t,
                                        Deferred& d) {
  const int64_t b_tokens = block_tokens;
  KVTIER_ASSIGN_OR_RETURN(Sequence * seq, FindSeq(id));
  if (end_token > static_cast<int64_t>(seq->tokens.size())) {
    return absl::OutOfRangeError(absl::StrCat("EnsureResident: token ", end_token,
                                              " is past the end of ", SeqName(id), " (",
                                              seq->tokens.size(), " tokens)"));
  }
  // After the sequence's own errors (the header's order): an unknown id is kNotFound whatever
  // the deadline.
  if (options.deadline <= absl::Now()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "EnsureResident: the deadline ", absl::FormatTime(options.deadline), " has passed"));
  }
  const int64_t first = begin_token / b_tokens;
  const int64_t last = end_token == begin_token ? first : (end_token + b_tokens - 1) / b_tokens;
  // Pin first (DESIGN section 5): HBM copies this request can use are taken before any room
  // is made, so making room cannot evict them.
  AdoptHbmCopies(*seq, first, last);
  if (options.mode != ResidencyMode::kBestEffort) {
    const int64_t missing = MissingBlocks(*seq, first, last);
    if (missing > 0 && FreeBlocks(Tier::kHbm) < missing) {
      // Room for as many as possible; what still does not fit is reported not resident.
      (void)MakeHbmRoom(missing, std::min(options.deadline, absl::Now() + room_wait), d);
      KVTIER_ASSIGN_OR_RETURN(seq, FindSeq(id));
      if (end_token > static_cast<int64_t>(seq->tokens.size())) {
        return absl::OutOfRangeError("EnsureResident: the sequence shrank meanwhile");
      }
      AdoptHbmCopies(*seq, first, last);  // the lock was dropped: others may have onboarded
    }
  }
  t->id = next_ticket++;
  t->owner = this;
  t->sequence = id;
  t->deadline = options.deadline;
  t->begin = begin_token;
  t->end = end_token;
  t->first_block = first;
  const size_t count = static_cast<size_t>(last - first);
  t->pending = static_cast<int64_t>(count) + 1;
  size_t i = 0;
  {
    internal::MutexLock tl(&t->mu);
    t->table.first_block = static_cast<int32_t>(first);
    t->table.tokens_per_block = b_tokens;
    t->table.tokens_in_last_block =
        last > first
            ? static_cast<int32_t>(std::min<int64_t>(
                  b_tokens, static_cast<int64_t>(seq->tokens.size()) - (last - 1) * b_tokens))
            : 0;
    t->table.pool = pool;
    t->table.slots.assign(count, -1);
    t->status.assign(count, BlockResidency::kPending);
    // The common case first: every block already in HBM. One counter per block, nothing else.
    for (; i < count; ++i) {
      const SeqBlock& b = seq->blocks[static_cast<size_t>(first) + i];
      if (b.tier != Tier::kHbm) break;
      // The sequence holds the slot, so it is no eviction candidate: no policy update needed.
      if (ticket_refs[b.slot.value()]++ == 0) ++locked;
      t->table.slots[i] = static_cast<int32_t>(b.slot.value());
      t->status[i] = BlockResidency::kResident;
    }
  }
  t->pending -= static_cast<int64_t>(i);
  const bool all_resident = i == count;
  t->num_layers = geometry.num_layers();
  if (!all_resident) {
    // Layer-wise readiness: blocks from i on are still to come, each layer of each.
    const int layers = t->num_layers;
    t->layer_ready.resize(static_cast<size_t>(layers));
    internal::MutexLock tl(&t->mu);
    t->landed_layers.assign(count, 0);
    std::fill(t->landed_layers.begin(), t->landed_layers.begin() + static_cast<std::ptrdiff_t>(i),
              layers);
    t->layer_pending.assign(static_cast<size_t>(layers), static_cast<int64_t>(count - i));
    t->fanouts.assign(count, nullptr);
    t->committed.assign(count, 0);
  }
  for (; i < count; ++i) {
    const int64_t block = first + static_cast<int64_t>(i);
    if (options.mode == ResidencyMode::kBestEffort) {
      const SeqBlock b = seq->blocks[static_cast<size_t>(block)];
      if (b.tier == Tier::kHbm) {
        PinTicket(b.slot);
        ResolveOnboard(t, static_cast<int64_t>(i), b.slot, absl::OkStatus(), d);
      } else {
        ResolveOnboard(t, static_cast<int64_t>(i), std::nullopt,
                       absl::UnavailableError(
                           absl::StrCat("best effort: the block is in ", ToAbsl(TierName(b.tier)))),
                       d);
      }
      continue;
    }
    Onboard(*seq, block, t, static_cast<int64_t>(i), d);
  }
  if (--t->pending == 0) {
    d.fire.emplace_back(t->done, all_resident ? absl::OkStatus() : BatchOutcome(*t));
  }
  tickets[t->id] = t;
  return absl::OkStatus();
}

void KvCache::Impl::AwaitTicket(const std::shared_ptr<internal::TicketState>& t,
                                const EnsureResidentOptions& options) {
  if (!t->done.done() && options.mode == ResidencyMode::kWait) {
    // Blocks that joined an onboard started by someone else (a prefetch, another request) wait
    // for it only until this call's deadline.
    (void)t->done.WaitUntil(options.deadline);
    if (!t->done.done()) ExpireTicket(t);
  } else if (!t->done.done() && options.deadline != absl::InfiniteFuture()) {
    std::weak_ptr<internal::TicketState> weak = t;
    std::shared_ptr<internal::Lifeline> life = lifeline;
    timer->Schedule(options.deadline, [life, weak] {
      std::shared_ptr<internal::TicketState> ticket = weak.lock();
      if (ticket == nullptr || ticket->done.done()) return;
      auto* impl = static_cast<Impl*>(life->Enter());
      if (impl == nullptr) return;
      impl->ExpireTicket(ticket);
      life->Exit();
    });
  }
}

absl::Status KvCache::Impl::CloseTicket(const std::shared_ptr<internal::TicketState>& state) {
  internal::TicketState& t = *state;
  auto it = tickets.find(t.id);
  if (it == tickets.end() || it->second != state) {
    if (t.released) {
      return absl::FailedPreconditionError(
          absl::StrCat("ReleaseTicket: ticket ", t.id, " was already released"));
    }
    // A ticket of a destroyed cache that lived at this address (ids restart at 1).
    return absl::NotFoundError(
        absl::StrCat("ReleaseTicket: ticket ", t.id, " was issued by another cache"));
  }
  t.released = true;
  // Unpin in one pass; only slots no sequence holds any more need settling.
  std::vector<SlotId> settle;
  {
    internal::MutexLock tl(&t.mu);
    for (size_t i = 0; i < t.status.size(); ++i) {
      if (t.status[i] != BlockResidency::kResident) continue;
      const auto s = static_cast<uint32_t>(t.table.slots[i]);
      if (--ticket_refs[s] == 0) {
        --locked;
        if (seq_refs[s] == 0) settle.push_back(SlotId(s));
      }
    }
  }
  for (SlotId s : settle) SettleSlot(Tier::kHbm, s);
  tickets.erase(it);
  return absl::OkStatus();
}

absl::Status KvCache::Impl::PauseSequence(SequenceId id, const PauseHints& hints, Deferred& d) {
  KVTIER_ASSIGN_OR_RETURN(Sequence * seq, FindSeq(id));
  if (seq->paused) {
    return absl::FailedPreconditionError(absl::StrCat("Pause: ", SeqName(id), " is paused"));
  }
  if (!seq->options.enable_caching) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Pause: ", SeqName(id), " has caching off: its blocks cannot move to another tier"));
  }
  seq->paused = true;
  seq->pause_preempted = hints.preempted;
  if (hints.preempted) ++counters.preemptions;
  ObserveRelease(*seq, hints.preempted ? StopReason::kUnknown : StopReason::kToolUse,
                 hints.expected_idle, Now(), /*last_turn=*/false, hints.preempted);
  const std::optional<Tier> lower = NextLower(Tier::kHbm);
  const int64_t written_full = seq->written / block_tokens;
  for (int64_t j = 0; lower.has_value() && j < written_full; ++j) {
    const SeqBlock b = seq->blocks[static_cast<size_t>(j)];
    const BlockKey key = seq->keys[static_cast<size_t>(j)];
    if (b.tier != Tier::kHbm) continue;
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    if (!rec.has_value() || rec->state(Tier::kHbm) != CopyState::kReady ||
        rec->slots[0] != b.slot) {
      continue;  // a private twin or not yet written: stays held in HBM
    }
    // Move the reference to the fastest lower copy there is, or make one.
    bool moved = false;
    for (int t = 1; t < kNumTiers && !moved; ++t) {
      if (rec->state(static_cast<Tier>(t)) == CopyState::kReady &&
          RepointBlock(*seq, j, static_cast<Tier>(t), rec->slots[t])) {
        moved = true;
      }
    }
    if (moved) continue;
    auto off = offloading.find(key);
    if (off != offloading.end()) {
      auto move = std::find_if(off->second.begin(), off->second.end(), [&](const auto& m) {
        return m->from == Tier::kHbm && m->src == b.slot;
      });
      if (move != off->second.end()) {
        (*move)->pause_waiters.emplace_back(id, j);
        continue;
      }
    }
    // The next tier down with room now, or further down: a full tier whose victims are
    // demoted makes room only when those copies land, and the pause does not wait for them
    // (nothing would copy the block later, and it would stay held in HBM).
    std::optional<Tier> to = lower;
    while (to.has_value() && rec->state(*to) == CopyState::kAbsent && !RoomBelowNow(*to, d)) {
      to = NextLower(*to);
    }
    // No tier has room now, or a copy is on its way there: stays held in HBM.
    if (!to.has_value() || rec->state(*to) != CopyState::kAbsent) continue;
    auto move = StartMove(key, Tier::kHbm, b.slot, *to, false, d);
    if (move.ok()) (*move)->pause_waiters.emplace_back(id, j);
  }
  return absl::OkStatus();
}

absl::Status KvCache::Impl::ResumeSequence(SequenceId id,
                                           const std::shared_ptr<internal::OnboardBatch>& t,
                                           Deferred& d) {
  Sequence* seq = nullptr;
  for (int round = 0;; ++round) {
    KVTIER_ASSIGN_OR_RETURN(seq, FindSeq(id));
    if (!seq->paused) {
      return absl::FailedPreconditionError(absl::StrCat("Resume: ", SeqName(id), " is not paused"));
    }
    const int64_t full = static_cast<int64_t>(seq->keys.size());
    AdoptHbmCopies(*seq, 0, full);
    const int64_t missing = MissingBlocks(*seq, 0, full);
    if (round > 0 || missing == 0 || FreeBlocks(Tier::kHbm) >= missing) break;
    // Room for as many as possible (waiting for demotions like Append); what still does not
    // fit is left below and onboarded by a later EnsureResident.
    (void)MakeHbmRoom(missing, absl::Now() + room_wait, d);
  }
  seq->paused = false;
  // A readmission is no return; nor is the resume of a request a later one of its session
  // superseded (that one's request was the return).
  if (!seq->pause_preempted && !Superseded(*seq)) ObserveResume(*seq);
  t->sequence = id;
  t->first_block = 0;
  const int64_t full = static_cast<int64_t>(seq->keys.size());
  {
    internal::MutexLock tl(&t->mu);
    t->status.assign(static_cast<size_t>(full), BlockResidency::kPending);
  }
  t->pending = full + 1;  // +1 released below, so an empty sequence completes too
  for (int64_t j = 0; j < full; ++j) Onboard(*seq, j, t, j, d);
  if (--t->pending == 0) d.fire.emplace_back(t->done, BatchOutcome(*t));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvCache::Impl::PrefetchBlocks(const std::vector<BlockKey>& keys,
                                                      int64_t num_tokens, Deferred& d) {
  int64_t started = 0;
  std::vector<BlockLocation> where;
  KVTIER_ASSIGN_OR_RETURN(const PrefixMatch match, MatchBlocks(keys, num_tokens, &where));
  (void)match;
  for (size_t i = 0; i < where.size(); ++i) {
    if (where[i].tier == Tier::kHbm || onboarding.contains(keys[i])) continue;
    const std::optional<BlockRecord> rec = IndexedCopies(keys[i]);
    if (!rec.has_value() || rec->state(Tier::kHbm) != CopyState::kAbsent) continue;
    // A hint: take a free slot or one victim that can go at once, never wait for room.
    if (FreeBlocks(Tier::kHbm) < 1 &&
        (evicting[0] > 0 || EvictOne(Tier::kHbm, d) != EvictResult::kEvicted ||
         FreeBlocks(Tier::kHbm) < 1)) {
      break;
    }
    // Re-read: an eviction above may have demoted or dropped this very block's neighbours.
    const std::optional<BlockRecord> now = IndexedCopies(keys[i]);
    if (!now.has_value()) break;
    const std::optional<Tier> from = now->fastest_ready_tier();
    if (!from.has_value() || *from == Tier::kHbm) continue;
    if (StartMove(keys[i], *from, now->slots[TierIndex(*from)], Tier::kHbm, false, d).ok()) {
      ++started;
    }
  }
  return started;
}

}  // namespace kvtier
