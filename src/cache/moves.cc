// Moves: the transfers the cache starts between tiers (onboarding, offloading, moves_in_flight),
// the work deferred until the lock is dropped (registering their callbacks, firing completions,
// publishing written blocks), and what the cache does when a transfer or a kernel's write lands.
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "cache/layer_fanout.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"

namespace kvtier {
namespace {

// A transfer whose caller set no deadline gets max(room_wait, this) (StartMove).
constexpr absl::Duration kMinTransferBound = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::shared_ptr<KvCache::Impl::Move>> KvCache::Impl::StartMove(const BlockKey& key,
                                                                              Tier from, SlotId src,
                                                                              Tier to, bool pin,
                                                                              Deferred& d,
                                                                              absl::Time deadline) {
  auto m = blocks.find(key);
  if (m == blocks.end()) return absl::InternalError("a move of a block the cache does not know");
  if (const std::optional<BlockRecord> rec = IndexedCopies(key);
      rec.has_value() && rec->state(to) != CopyState::kAbsent) {
    return absl::AlreadyExistsError("the destination tier already has a copy of the block");
  }
  TransferOptions options;
  options.pin_destination = pin;
  options.deadline = deadline != absl::InfiniteFuture()
                         ? deadline
                         : absl::Now() + std::max(room_wait, kMinTransferBound);
  options.deadline_bounds_start = true;
  // Started after the lock is dropped (RunDeferred), with the other moves of this call: a
  // request's blocks in one tier are read in one batch.
  options.defer_start = true;
  if (d.batch == 0) d.batch = ++next_batch;
  options.batch = d.batch;
  // Onboards report each layer as it lands where the HBM tier can (layer-wise readiness).
  std::shared_ptr<internal::LayerFanout> layers;
  if (to == Tier::kHbm && (tiers[0]->info().capabilities & kCapLayerwise) != 0) {
    layers = std::make_shared<internal::LayerFanout>(geometry.num_layers());
    options.layers = layers->MakeProgress();
  }
  KVTIER_ASSIGN_OR_RETURN(Transfer transfer, engine->Copy(key, from, src, to, options));
  auto move = std::make_shared<Move>();
  if (layers != nullptr) {
    layers->SetDestination(transfer.destination);  // before RunDeferred starts the write
    move->layers = std::move(layers);
  }
  move->key = key;
  move->batch = d.batch;
  move->from = from;
  move->src = src;
  move->to = to;
  move->dst = transfer.destination;
  move->pin = pin;
  move->deadline = options.deadline;
  move->completion = transfer.completion;
  const BlockKey parent = ParentKey(m->second);
  // Cannot fail: the destination tier was checked to have no copy above.
  (void)AddCopy(key, to, move->dst, CopyState::kPending, parent);
  ++MutableCold(blocks[key]).readers[TierIndex(from)];
  UpdateCandidate(key, from);
  ++moves_in_flight;
  if (to == Tier::kHbm) {
    onboarding[key] = move;
  } else {
    offloading[key].push_back(move);
  }
  d.moves.push_back(move);
  return move;
}

bool KvCache::Impl::DeferredRelease(Deferred& d) {
  if (d.moves.empty() && d.fire.empty() && d.publish.empty() && d.kernel_holds.empty()) {
    return false;
  }
  Deferred now;
  std::swap(now, d);
  d.batch = now.batch;  // the scope's moves after this are still one batch with those before
  // Queued now, in order with what others make while the lock is dropped; the scope delivers.
  d.events_published = now.events_published || PublishEvents();
  now.events_published = false;
  mu.Unlock();
  RunDeferred(now);
  mu.Lock();
  return true;
}

void KvCache::Impl::RunDeferred(Deferred& work) {
  Deferred d;  // taken, so running a Deferred twice does nothing the second time
  std::swap(d, work);
  for (auto& [done, status] : d.fire) done.Complete(status);
  for (auto& [ready, written] : d.publish) {
    std::weak_ptr<internal::Lifeline> weak = lifeline;
    ready.OnDone([weak, written = std::move(written)](const absl::Status& s) {
      auto life = weak.lock();
      if (!life) return;
      auto* impl = static_cast<Impl*>(life->Enter());
      if (impl == nullptr) return;
      impl->OnWritten(written, s);
      life->Exit();
    });
  }
  for (auto& [ready, slots] : d.kernel_holds) {
    std::weak_ptr<internal::Lifeline> weak = lifeline;
    ready.OnDone([weak, slots = std::move(slots)](const absl::Status&) {
      auto life = weak.lock();
      if (!life) return;
      auto* impl = static_cast<Impl*>(life->Enter());
      if (impl == nullptr) return;
      impl->EndKernelHolds(slots);
      life->Exit();
    });
  }
  for (auto& move : d.moves) {
    std::shared_ptr<internal::Lifeline> life = lifeline;
    move->completion.OnDone([life, move](const absl::Status& s) {
      auto* impl = static_cast<Impl*>(life->Enter());
      if (impl == nullptr) return;
      impl->OnMoveDone(move, s);
      life->Exit();
    });
  }
  if (!d.moves.empty()) engine->StartDeferred();  // StartMove queued them (defer_start)
}

void KvCache::Impl::OnWritten(const std::vector<std::pair<BlockKey, SlotId>>& written,
                              const absl::Status& status) {
  CacheScope scope(*this);
  Deferred& d = scope.deferred();
  for (const auto& [key, slot] : written) {
    if (TwinWritten(key, slot, status)) continue;
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    if (!rec.has_value() || rec->state(Tier::kHbm) != CopyState::kPending ||
        rec->slots[0] != slot || onboarding.contains(key)) {
      continue;
    }
    if (!status.ok()) {
      RemoveCopy(key, Tier::kHbm);
      SettleSlot(Tier::kHbm, slot);  // a released sequence's block: freed
      SettleTwins(key);              // a twin, if written, is the block now
      continue;
    }
    tiers[0]->EndDeviceWrite(slot, key);
    AddUse(blocks[key]);
    MarkReady(key, Tier::kHbm);
    if (write_policy == WritePolicy::kWriteThrough) {
      const std::optional<Tier> lower = NextLower(Tier::kHbm);
      auto m = blocks.find(key);
      if (lower.has_value() && m != blocks.end() &&
          Uses(m->second) >= static_cast<uint32_t>(admit_after_uses[TierIndex(*lower)]) &&
          IndexedCopies(key)->state(*lower) == CopyState::kAbsent && RoomBelowNow(*lower, d)) {
        (void)StartMove(key, Tier::kHbm, slot, *lower, false, d);
      }
    }
    if (publish_to_remote && tiers[TierIndex(Tier::kRemote)] != nullptr) {
      // Published for the fleet at once (KvCacheOptions::publish_to_remote).
      auto m = blocks.find(key);
      if (m != blocks.end() &&
          Uses(m->second) >= static_cast<uint32_t>(admit_after_uses[TierIndex(Tier::kRemote)]) &&
          IndexedCopies(key)->state(Tier::kRemote) == CopyState::kAbsent &&
          RoomBelowNow(Tier::kRemote, d)) {
        (void)StartMove(key, Tier::kHbm, slot, Tier::kRemote, false, d);
      }
    }
    SettleTwins(key);  // written twins' holders take this copy
  }
  for (const auto& [key, slot] : written) WakeWriteWaiters(key, d);
}

void KvCache::Impl::EndKernelHolds(const std::vector<SlotId>& slots) {
  CacheScope scope(*this);
  for (const SlotId slot : slots) {
    const uint32_t s = slot.value();
    if (auto it = kernel_holds.find(s); it != kernel_holds.end() && --it->second == 0) {
      kernel_holds.erase(it);
    }
    if (--ticket_refs[s] == 0) {
      --locked;
      if (seq_refs[s] == 0) SettleSlot(Tier::kHbm, slot);
    }
  }
  cv.SignalAll();  // a room wait in progress (for demotions) looks again at once
}

void KvCache::Impl::AddWaiter(Move& m, Move::Waiter w, Deferred& d) {
  if (m.layers != nullptr && w.batch != nullptr && w.batch->ticket != nullptr) {
    std::vector<Completion> ready;
    m.layers->AddReader(w.batch, w.batch_index, ready);
    for (Completion& c : ready) d.fire.emplace_back(std::move(c), absl::OkStatus());
  }
  m.waiters.push_back(std::move(w));
}

std::shared_ptr<KvCache::Impl::Move> KvCache::Impl::RetryOnboard(const Move& failed,
                                                                 const absl::Status& status,
                                                                 Deferred& d) {
  const std::optional<BlockRecord> rec = IndexedCopies(failed.key);
  if (!rec.has_value() || failed.waiters.empty()) return nullptr;
  absl::Time deadline = absl::InfinitePast();
  for (const Move::Waiter& w : failed.waiters) {
    deadline = std::max(deadline, w.batch != nullptr ? w.batch->deadline : absl::InfiniteFuture());
  }
  if (absl::Now() >= deadline) return nullptr;
  // A copy that could not start before its own deadline failed no tier: a waiter that joined
  // it with a later deadline (another caller's onboard of the same block) reads from the same
  // tier again, once.
  const bool ran_out = status.code() == absl::StatusCode::kDeadlineExceeded &&
                       !failed.deadline_retry && failed.deadline < deadline &&
                       absl::Now() >= failed.deadline;
  const uint8_t tried =
      static_cast<uint8_t>(failed.tried_tiers | (ran_out ? 0u : 1u << TierIndex(failed.from)));
  // The retries of one request's failed batch (a remote Get that failed whole) read together.
  if (d.batch == 0) d.batch = failed.batch;
  for (int t = TierIndex(Tier::kDram); t < kNumTiers; ++t) {
    if (((tried >> t) & 1) != 0 || rec->state(static_cast<Tier>(t)) != CopyState::kReady) continue;
    auto retry = StartMove(failed.key, static_cast<Tier>(t), rec->slots[t], Tier::kHbm,
                           /*pin=*/true, d, deadline);
    if (!retry.ok()) continue;
    for (const Move::Waiter& w : failed.waiters) AddWaiter(**retry, w, d);
    (*retry)->tried_tiers = tried;
    (*retry)->deadline_retry = failed.deadline_retry || (ran_out && t == TierIndex(failed.from));
    return *retry;
  }
  return nullptr;
}

void KvCache::Impl::OnMoveDone(const std::shared_ptr<Move>& move, const absl::Status& status) {
  {
    CacheScope scope(*this);
    Deferred& d = scope.deferred();
    const BlockKey& key = move->key;
    const int from = TierIndex(move->from);
    if (auto m = blocks.find(key); m != blocks.end() && Readers(m->second, from) > 0) {
      --MutableCold(m->second).readers[from];
      TrimCold(m->second);
    }
    if (move->to == Tier::kHbm) {
      auto it = onboarding.find(key);
      if (it != onboarding.end() && it->second == move) onboarding.erase(it);
      if (move->layers != nullptr) move->layers->Close();
    } else {
      auto it = offloading.find(key);
      if (it != offloading.end()) {
        std::erase(it->second, move);
        if (it->second.empty()) offloading.erase(it);
      }
    }
    if (status.ok()) {
      MarkReady(key, move->to);
      if (move->to != Tier::kHbm) NoteStore(move->to, /*landed=*/true);
      if (move->to == Tier::kHbm) {
        for (const Move::Waiter& w : move->waiters) {
          if (w.sequence.valid()) {
            auto s = seqs.find(w.sequence);
            // A sequence paused again while its Resume onboarded keeps its reference below.
            if (s != seqs.end() && !s->second->paused &&
                w.block < static_cast<int64_t>(s->second->keys.size()) &&
                s->second->keys[static_cast<size_t>(w.block)] == key &&
                s->second->blocks[static_cast<size_t>(w.block)].tier != Tier::kHbm) {
              (void)RepointBlock(*s->second, w.block, Tier::kHbm, move->dst);
            }
          }
          if (w.batch != nullptr && OnboardPending(*w.batch, w.batch_index)) {
            if (w.batch->ticket != nullptr && !w.batch->ticket->released) PinTicket(move->dst);
            ResolveOnboard(w.batch, w.batch_index, move->dst, absl::OkStatus(), d);
          }
        }
        if (move->pin) {
          (void)Alloc(Tier::kHbm, [&](BlockAllocator& a) { return a.Release(move->dst); });
          SettleSlot(Tier::kHbm, move->dst);
        }
        if (inclusion == TierInclusion::kExclusive) DropIfDroppable(key, move->from);
      } else {
        for (const auto& [id, block] : move->pause_waiters) {
          auto s = seqs.find(id);
          if (s == seqs.end() || !s->second->paused) continue;
          Sequence& seq = *s->second;
          if (block >= static_cast<int64_t>(seq.blocks.size()) ||
              seq.blocks[static_cast<size_t>(block)].tier != move->from ||
              seq.blocks[static_cast<size_t>(block)].slot != move->src) {
            continue;
          }
          (void)RepointBlock(seq, block, move->to, move->dst);
        }
      }
      UpdateCandidate(key, move->to);
    } else {
      RemoveCopy(key, move->to);  // the engine freed or quarantined the destination
      if (move->to == Tier::kHbm) {
        ++counters.tiers[from].failed_loads;
        if (status.code() == absl::StatusCode::kDataLoss ||
            status.code() == absl::StatusCode::kNotFound) {
          // The source is damaged, or the tier no longer has it (a remote store evicted it):
          // never match it again, or every later request would fail to load it again. Holders
          // keep their (now private) reference, freed when they let go.
          ++(status.code() == absl::StatusCode::kDataLoss ? counters.tiers[from].corrupt_reads
                                                          : counters.tiers[from].missing_reads);
          // Only the copy read: a holder's private slot failing says nothing of the indexed
          // copy of the same key elsewhere in that tier (computed again since).
          if (const std::optional<BlockRecord> src = IndexedCopies(key);
              src.has_value() && src->state(move->from) != CopyState::kAbsent &&
              src->slots[from] == move->src) {
            RemoveCopy(key, move->from);
          }
          // Another transfer may still read it; the last reader's callback settles it.
          auto mm = blocks.find(key);
          if (mm == blocks.end() || Readers(mm->second, from) == 0) {
            SettleSlot(move->from, move->src);
          }
        }
        // A ticket whose block is committed to this move's slot (a layer landed there, or a
        // stream waits on its copy) cannot switch to another slot: that block fails for it.
        if (move->layers != nullptr) {
          // Called within erase_if, under mu (the analysis does not follow it into a lambda).
          std::erase_if(move->waiters, [&](const Move::Waiter& w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            if (w.batch == nullptr || w.batch->ticket == nullptr) return false;
            bool partly = false;
            {
              internal::TicketState& t = *w.batch->ticket;
              internal::MutexLock tl(&t.mu);
              const auto b = static_cast<size_t>(w.batch_index);
              partly = b < t.committed.size() && t.committed[b] != 0;
              if (!partly && b < t.fanouts.size() && t.status[b] == BlockResidency::kPending) {
                // Not committed: it no longer follows this copy (a retry may give it another
                // slot), so EnqueueStreamWait must not queue a stream on this copy's fences.
                t.fanouts[b] = nullptr;
                t.table.slots[b] = -1;
              }
            }
            if (partly) ResolveOnboard(w.batch, w.batch_index, std::nullopt, status, d);
            return partly;
          });
        }
        // Another tier may still have the block (the store lost it, NVMe did not): its waiters
        // get it from there rather than recompute it.
        if (RetryOnboard(*move, status, d) == nullptr) {
          for (const Move::Waiter& w : move->waiters) {
            if (w.batch != nullptr) {
              ResolveOnboard(w.batch, w.batch_index, std::nullopt, status, d);
            }
          }
        }
      } else {
        ++counters.tiers[TierIndex(move->to)].failed_stores;
        NoteStore(move->to, /*landed=*/false);
      }
    }
    if (move->to == Tier::kHbm) SettleTwins(key);  // an onboard was the indexed HBM copy
    if (move->evict_source) {
      --evicting[from];
      --arriving[TierIndex(move->to)];
      auto m = blocks.find(key);
      if (m != blocks.end()) SetLeaving(key, move->from, false);
      const std::optional<BlockRecord> rec = IndexedCopies(key);
      if (status.ok() && m != blocks.end() && rec.has_value() &&
          rec->state(move->from) == CopyState::kReady && rec->slots[from] == move->src &&
          WantCandidate(m->second, move->from)) {
        DropCopy(key, move->from);
        ++counters.tiers[from].evictions;
        ++counters.tiers[from].demotions;
      }
    }
    // The source may have lost its last holder while it was read (a sequence released it): once
    // no transfer of the cache reads it, settle it (a candidate again, or freed if private).
    auto src_meta = blocks.find(key);
    if (src_meta == blocks.end() || Readers(src_meta->second, from) == 0) {
      SettleSlot(move->from, move->src);
      // Readers count by key and tier: a holder's private copy read here kept the indexed copy
      // of the key in that tier (another slot, which SettleSlot does not visit) from being a
      // candidate, and it may be one again.
      if (const std::optional<BlockRecord> rec = IndexedCopies(key);
          rec.has_value() && rec->state(move->from) == CopyState::kReady &&
          rec->slots[from] != move->src) {
        UpdateCandidate(key, move->from);
      }
    }
  }
  CacheLock lock(*this);
  --moves_in_flight;
  cv.SignalAll();
}

}  // namespace kvtier
