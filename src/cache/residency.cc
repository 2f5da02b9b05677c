// Residency: tickets (tickets, next_ticket, and each TicketState's per-block outcome), making a
// sequence's blocks resident in HBM (adopting an HBM copy, joining an onboard, or starting one),
// and expiring a ticket at its deadline.
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/kv_cache_impl.h"
#include "cache/ticket_state.h"
#include "internal/mutex.h"

namespace kvtier {

namespace {

using internal::SeqName;

}  // namespace

bool KvCache::Impl::ResolveTicketBlock(const std::shared_ptr<internal::TicketState>& t, int64_t i,
                                       std::optional<SlotId> slot, absl::Status error,
                                       Deferred& d) {
  {
    internal::MutexLock lock(&t->mu);
    if (t->status[static_cast<size_t>(i)] != BlockResidency::kPending) return false;
    if (slot.has_value()) {
      t->status[static_cast<size_t>(i)] = BlockResidency::kResident;
      t->table.slots[static_cast<size_t>(i)] = static_cast<int32_t>(slot->value());
    } else {
      t->status[static_cast<size_t>(i)] = BlockResidency::kNotResident;
      t->table.slots[static_cast<size_t>(i)] = -1;
      t->errors[i] = std::move(error);
    }
  }
  if (--t->pending == 0) d.fire.emplace_back(t->done, TicketOutcome(*t));
  return true;
}

bool KvCache::Impl::TicketBlockPending(internal::TicketState& t, int64_t i) {
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
      if (t->status[i] == BlockResidency::kPending) late.push_back(static_cast<int64_t>(i));
    }
  }
  for (int64_t i : late) {
    ResolveTicketBlock(t, i, std::nullopt,
                       absl::DeadlineExceededError("the block was not resident by the deadline"),
                       d);
  }
}

void KvCache::Impl::AdoptHbmCopies(Sequence& seq, int64_t first, int64_t last) {
  for (int64_t i = first; i < last && i < static_cast<int64_t>(seq.keys.size()); ++i) {
    const SeqBlock b = seq.blocks[static_cast<size_t>(i)];
    if (b.tier == Tier::kHbm) continue;
    const BlockKey key = seq.keys[static_cast<size_t>(i)];
    const std::optional<BlockRecord> rec = index->Lookup(key);
    if (!rec.has_value() || rec->state(Tier::kHbm) != CopyState::kReady) continue;
    if (!RepointBlock(seq, i, Tier::kHbm, rec->slots[0])) continue;
    if (inclusion == TierInclusion::kExclusive) DropIfDroppable(key, b.tier);
  }
}

int64_t KvCache::Impl::MissingBlocks(const Sequence& seq, int64_t first, int64_t last) {
  int64_t missing = 0;
  for (int64_t i = first; i < last; ++i) {
    if (seq.blocks[static_cast<size_t>(i)].tier != Tier::kHbm &&
        !onboarding.contains(seq.keys[static_cast<size_t>(i)])) {
      ++missing;
    }
  }
  return missing;
}

absl::Status KvCache::Impl::TicketOutcome(internal::TicketState& t) {
  internal::MutexLock lock(&t.mu);
  for (size_t i = 0; i < t.status.size(); ++i) {
    if (t.status[i] != BlockResidency::kResident) {
      auto it = t.errors.find(static_cast<int64_t>(i));
      return absl::UnavailableError(absl::StrCat(
          "block ", t.table.first_block + static_cast<int64_t>(i), " of ", SeqName(t.sequence),
          " is not resident: ", it != t.errors.end() ? it->second.ToString() : "pending"));
    }
  }
  return absl::OkStatus();
}

void KvCache::Impl::Onboard(Sequence& seq, int64_t i,
                            const std::shared_ptr<internal::TicketState>& t, int64_t ti,
                            Deferred& d) {
  const SeqBlock b = seq.blocks[static_cast<size_t>(i)];
  if (b.tier == Tier::kHbm) {  // also the partial last block, which has no key
    if (t->pins) PinTicket(b.slot);
    ResolveTicketBlock(t, ti, b.slot, absl::OkStatus(), d);
    return;
  }
  const BlockKey key = seq.keys[static_cast<size_t>(i)];
  const std::optional<BlockRecord> rec = index->Lookup(key);
  if (rec.has_value() && rec->state(Tier::kHbm) == CopyState::kReady) {
    const SlotId hbm = rec->slots[0];
    if (RepointBlock(seq, i, Tier::kHbm, hbm)) {  // an HBM copy exists: adopt it, no bytes move
      if (inclusion == TierInclusion::kExclusive) DropIfDroppable(key, b.tier);
      if (t->pins) PinTicket(hbm);
      ResolveTicketBlock(t, ti, hbm, absl::OkStatus(), d);
      return;
    }
  }
  auto in_flight = onboarding.find(key);
  if (in_flight != onboarding.end()) {
    in_flight->second->waiters.push_back(Move::Waiter{seq.id, i, t, ti});
    return;
  }
  if (rec.has_value() && rec->state(Tier::kHbm) == CopyState::kPending) {
    ResolveTicketBlock(t, ti, std::nullopt,
                       absl::UnavailableError("another sequence is still writing this block"), d);
    return;
  }
  auto move = StartMove(key, b.tier, b.slot, Tier::kHbm, /*pin=*/true, d);
  if (!move.ok()) {
    ResolveTicketBlock(t, ti, std::nullopt, move.status(), d);
    return;
  }
  (*move)->waiters.push_back(Move::Waiter{seq.id, i, t, ti});
}

}  // namespace kvtier
