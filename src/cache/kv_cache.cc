// KvCache: sequences, the block index, eviction and the transfers between tiers, under one lock.
// The state and the ownership rules are in kv_cache_impl.h.
#include "kvtier/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/kv_cache_impl.h"
#include "cache/ticket_state.h"
#include "internal/deadline_timer.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "internal/strings.h"
#include "kvtier/block_index.h"
#include "kvtier/transfer_engine.h"

namespace kvtier {
namespace {

using internal::ExtrasOf;
using internal::SeqName;
using internal::ToAbsl;

constexpr size_t kReleasedIdsRemembered = 65536;

bool Finite(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const CacheNamespace& ns,
                                                         KvCacheOptions options) {
  const KvGeometry& g = ns.geometry();
  TierBackend* hbm = options.tiers[0].get();
  if (hbm == nullptr) return absl::InvalidArgumentError("KvCache: the HBM tier is required");
  for (int t = 0; t < kNumTiers; ++t) {
    const TierBackend* b = options.tiers[t].get();
    if (b == nullptr) continue;
    if (TierIndex(b->info().tier) != t) {
      return absl::InvalidArgumentError(absl::StrCat("KvCache: the ", b->info().name,
                                                     " backend is at the index of tier ",
                                                     ToAbsl(TierName(static_cast<Tier>(t)))));
    }
    if (b->info().block_bytes != g.bytes_per_block()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: the ", b->info().name, " tier has ", b->info().block_bytes,
                       "-byte blocks; the namespace's geometry has ", g.bytes_per_block()));
    }
  }
  if ((hbm->info().capabilities & kCapDeviceMemory) == 0 || !hbm->device_pool().has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache: the HBM tier ", hbm->info().name,
                                                   " has no device pool for block tables"));
  }
  if (options.eviction_policy != "lru" && options.eviction_policy != "cost_aware") {
    return absl::InvalidArgumentError(absl::StrCat("KvCache: eviction_policy \"",
                                                   options.eviction_policy,
                                                   "\" is not one of \"lru\", \"cost_aware\""));
  }
  if (options.write_policy != WritePolicy::kWriteBack &&
      options.write_policy != WritePolicy::kWriteThrough) {
    return absl::InvalidArgumentError("KvCache: unknown write_policy");
  }
  if (options.inclusion != TierInclusion::kInclusive &&
      options.inclusion != TierInclusion::kExclusive) {
    return absl::InvalidArgumentError("KvCache: unknown inclusion");
  }
  if (options.inclusion == TierInclusion::kExclusive &&
      options.write_policy == WritePolicy::kWriteThrough) {
    return absl::InvalidArgumentError(
        "KvCache: exclusive tiers cannot be written through (write-through keeps two copies)");
  }
  if (options.admit_after_uses[0] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: admit_after_uses[hbm] = ", options.admit_after_uses[0],
                     " must be 1: every block starts in HBM"));
  }
  for (int t = 1; t < kNumTiers; ++t) {
    if (options.admit_after_uses[t] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: admit_after_uses[", ToAbsl(TierName(static_cast<Tier>(t))),
                       "] = ", options.admit_after_uses[t], " must be >= 1"));
    }
  }
  for (int t = 1; t < kNumTiers; ++t) {
    const TierLinkCost& l = options.links[t];
    if (!Finite(l.bytes_per_second) || l.latency < absl::ZeroDuration() ||
        l.latency == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: links[", ToAbsl(TierName(static_cast<Tier>(t))),
                       "] needs a positive finite "
                       "bandwidth (",
                       l.bytes_per_second, " B/s) and a finite latency >= 0"));
    }
  }
  if (options.event_buffer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: event_buffer = ", options.event_buffer, " must be >= 1"));
  }
  if (options.room_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCache: room_wait = ", absl::FormatDuration(options.room_wait), " must not be negative"));
  }
  if (options.bounce_buffers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: bounce_buffers = ", options.bounce_buffers, " must be >= 1"));
  }
  std::optional<PrefillCostModel> cost;
  if (options.prefill_cost.has_value()) {
    KVTIER_ASSIGN_OR_RETURN(PrefillCostModel model,
                            PrefillCostModel::Create(*options.prefill_cost));
    cost = model;
  } else if (auto known = KnownModelCost(ns.options().model_id); known.has_value()) {
    if (!Finite(options.prefill_flops_per_second)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: prefill_flops_per_second = ", options.prefill_flops_per_second,
                       " must be positive and finite"));
    }
    known->flops_per_second = options.prefill_flops_per_second;
    KVTIER_ASSIGN_OR_RETURN(PrefillCostModel model, PrefillCostModel::Create(*known));
    cost = model;
  }
  std::array<std::unique_ptr<EvictionPolicy>, kNumTiers> policies;
  for (int t = 0; t < kNumTiers; ++t) {
    if (options.tiers[t] == nullptr) continue;
    if (options.eviction_policy == "lru") {
      policies[t] = MakeLruPolicy();
    } else {
      KVTIER_ASSIGN_OR_RETURN(policies[t], MakeCostAwarePolicy(options.cost_aware));
    }
  }
  KVTIER_ASSIGN_OR_RETURN(PrefixHasher hasher, PrefixHasher::Create(ns, options.hash));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockIndex> index,
                          BlockIndex::Create(g.tokens_per_block()));

  auto impl = std::make_unique<Impl>(ns, std::move(hasher));
  impl->block_tokens = g.tokens_per_block();
  impl->block_bytes = g.bytes_per_block();
  impl->pool = *hbm->device_pool();
  TransferEngineOptions engine_options;
  for (int t = 0; t < kNumTiers; ++t) engine_options.tiers[t] = options.tiers[t].get();
  engine_options.bounce_buffers = options.bounce_buffers;
  KVTIER_ASSIGN_OR_RETURN(impl->engine, TransferEngine::Create(engine_options));
  impl->tiers = std::move(options.tiers);
  impl->write_policy = options.write_policy;
  impl->inclusion = options.inclusion;
  impl->admit_after_uses = options.admit_after_uses;
  impl->demote_on_evict = options.demote_on_evict;
  impl->cost = cost;
  impl->links = options.links;
  impl->measure_bandwidth = options.measure_bandwidth;
  impl->clock = std::move(options.clock);
  impl->event_buffer = static_cast<size_t>(options.event_buffer);
  impl->room_wait = options.room_wait;
  {
    internal::MutexLock lock(&impl->mu);
    impl->index = std::move(index);
    impl->policy = std::move(policies);
    for (int t = 0; t < kNumTiers; ++t) {
      if (impl->tiers[t] == nullptr) continue;
      impl->owner[t].resize(static_cast<size_t>(impl->tiers[t]->info().capacity_blocks));
      impl->counters.tiers[t].present = true;
    }
    impl->ticket_refs.assign(static_cast<size_t>(impl->tiers[0]->info().capacity_blocks), 0);
    impl->seq_refs.assign(impl->ticket_refs.size(), 0);
    impl->AdoptRecoveredBlocks();
  }
  impl->lifeline->Set(impl.get());
  return std::unique_ptr<KvCache>(new KvCache(std::move(impl)));
}

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvCache::~KvCache() {
  (void)WaitIdle();
  impl_->lifeline->Close();  // later callbacks (e.g. a ReportWritten completion) do nothing
  impl_->timer.reset();
  impl_->engine.reset();  // waits for anything still in flight, before the tiers go
}

const CacheNamespace& KvCache::cache_namespace() const { return impl_->ns; }
const PrefixHasher& KvCache::hasher() const { return impl_->hasher; }

// ---- Sequences --------------------------------------------------------------------------------

absl::Status KvCache::CreateSequence(SequenceId id, const SequenceOptions& options) {
  if (!id.valid()) return absl::InvalidArgumentError("CreateSequence: an invalid sequence id");
  if (!(options.retention_priority >= 0) || !std::isfinite(options.retention_priority)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateSequence: retention_priority = ", options.retention_priority,
                     " must be finite and >= 0"));
  }
  if (options.retention < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateSequence: retention = ", absl::FormatDuration(options.retention),
                     " must not be negative"));
  }
  auto seq = std::make_unique<Impl::Sequence>();
  seq->id = id;
  seq->options = options;
  seq->extras = ExtrasOf(options);
  // Validates the extras once, so later calls fail only on what they add.
  std::vector<BlockKey> probe;
  KVTIER_RETURN_IF_ERROR(impl_->hasher.AppendBlockKeys(kRootBlockKey, 0, {}, seq->extras, &probe));
  internal::MutexLock lock(&impl_->mu);
  if (impl_->seqs.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat(SeqName(id), " already exists"));
  }
  impl_->released_ids.erase(id);
  seq->generation = impl_->next_generation++;
  impl_->seqs[id] = std::move(seq);
  return absl::OkStatus();
}

absl::StatusOr<AttachResult> KvCache::AttachPrefix(SequenceId id,
                                                   absl::Span<const int32_t> prompt) {
  Impl& I = *impl_;
  if (prompt.empty()) return absl::InvalidArgumentError("AttachPrefix: an empty prompt");
  BlockExtras extras;
  uint64_t generation = 0;
  {
    internal::MutexLock lock(&I.mu);
    KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
    extras = seq->extras;
    generation = seq->generation;
  }
  // Hash outside the lock: it is the expensive part and needs nothing shared.
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys, I.hasher.BlockKeys(prompt, extras));
  AttachResult result;
  internal::MutexLock lock(&I.mu);
  KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
  if (seq->generation != generation) {
    // Released and created again meanwhile, perhaps with another adapter or tenant: keys hashed
    // under the old identity must not be attached to it.
    return absl::FailedPreconditionError(absl::StrCat(
        "AttachPrefix: ", SeqName(id), " was released and created again during the call"));
  }
  if (!seq->tokens.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "AttachPrefix: ", SeqName(id), " already has ", seq->tokens.size(), " tokens"));
  }
  std::vector<BlockLocation> where;
  KVTIER_ASSIGN_OR_RETURN(const PrefixMatch match,
                          I.index->Match(keys, static_cast<int64_t>(prompt.size()), &where));
  // Phase 1: pin every matched block where it is.
  // One pass under the engine's lock; a block that was cached (no holder) may have been an
  // eviction candidate and stops being one.
  std::vector<Impl::SeqBlock> pinned;
  std::vector<size_t> were_cached;
  pinned.reserve(where.size());
  (void)I.engine->WithAllocators([&](const std::array<BlockAllocator*, kNumTiers>& a) {
    for (const BlockLocation& loc : where) {
      BlockAllocator* alloc = a[TierIndex(loc.tier)];
      const SlotState before = alloc->state_or_free(loc.slot);
      if (!alloc->Acquire(loc.slot).ok()) break;
      if (before == SlotState::kCached) were_cached.push_back(pinned.size());
      pinned.push_back(Impl::SeqBlock{loc.tier, loc.slot});
    }
    return absl::OkStatus();
  });
  for (const Impl::SeqBlock& b : pinned) {
    if (b.tier == Tier::kHbm) ++I.seq_refs[b.slot.value()];
  }
  for (size_t i : were_cached) I.UpdateCandidate(keys[i], pinned[i].tier);
  // Phase 2: plan, and keep the leading blocks worth restoring.
  std::vector<Tier> tiers_of;
  tiers_of.reserve(pinned.size());
  for (const auto& b : pinned) tiers_of.push_back(b.tier);
  const int64_t b_tokens = I.block_tokens;
  const int64_t n = static_cast<int64_t>(prompt.size());
  RestorePlan plan;
  if (I.cost.has_value()) {
    absl::StatusOr<RestorePlan> planned =
        PlanRestore(*I.cost, tiers_of, I.CurrentLinks(), b_tokens, I.block_bytes, n);
    if (!planned.ok()) {  // on error nothing changes: unpin what phase 1 pinned
      for (const Impl::SeqBlock& b : pinned) I.DropRef(b);
      return planned.status();
    }
    plan = *planned;
  } else {
    plan.restore_blocks =
        std::min<int64_t>(static_cast<int64_t>(pinned.size()), (n - 1) / b_tokens);
    plan.recompute_from_token = plan.restore_blocks * b_tokens;
    plan.cached_but_recomputed = static_cast<int64_t>(pinned.size()) - plan.restore_blocks;
  }
  for (size_t i = static_cast<size_t>(plan.restore_blocks); i < pinned.size(); ++i) {
    I.DropRef(pinned[i]);
  }
  pinned.resize(static_cast<size_t>(plan.restore_blocks));
  const absl::Time now = I.Now();
  const int64_t now_ns = absl::ToUnixNanos(now);
  for (size_t i = 0; i < pinned.size(); ++i) {
    (void)I.index->RecordHit(keys[i], now_ns);
    Impl::BlockMeta& m = I.meta[keys[i]];
    ++m.uses;
    m.last_use = now;
    I.TouchCandidates(keys[i], m);
    ++result.attached_blocks_by_tier[TierIndex(pinned[i].tier)];
    ++I.counters.tiers[TierIndex(pinned[i].tier)].hits;
  }
  seq->tokens.assign(prompt.begin(), prompt.begin() + plan.restore_blocks * b_tokens);
  seq->keys.assign(keys.begin(), keys.begin() + plan.restore_blocks);
  seq->blocks = std::move(pinned);
  seq->written = plan.restore_blocks * b_tokens;

  const int64_t query_blocks = n / b_tokens;
  int64_t found_so_far = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    if (!I.Present(static_cast<Tier>(t))) continue;
    found_so_far += match.blocks_by_tier[t];
    I.counters.tiers[t].misses += query_blocks - found_so_far;
  }
  ++I.counters.attach_queries;
  I.counters.query_tokens += n;
  I.counters.matched_tokens += match.matched_tokens;
  I.counters.attached_tokens += plan.restore_blocks * b_tokens;
  I.counters.cached_but_recomputed_blocks += plan.cached_but_recomputed;
  result.matched_tokens = match.matched_tokens;
  result.attached_tokens = plan.restore_blocks * b_tokens;
  result.plan = plan;
  return result;
}

absl::StatusOr<KvAppendResult> KvCache::Append(SequenceId id, absl::Span<const int32_t> tokens) {
  Impl& I = *impl_;
  if (tokens.empty()) return absl::InvalidArgumentError("Append: no tokens");
  const int64_t b_tokens = I.block_tokens;
  KvAppendResult result;
  {
    Impl::CacheScope scope(I);
    Impl::Deferred& d = scope.deferred();
    for (int round = 0;; ++round) {
      KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
      const int64_t old_n = static_cast<int64_t>(seq->tokens.size());
      const int64_t new_n = old_n + static_cast<int64_t>(tokens.size());
      if (new_n > PrefixHasher::kMaxPosition) {
        return absl::InvalidArgumentError(
            absl::StrCat("Append: ", SeqName(id), " would hold ", new_n, " tokens"));
      }
      const int64_t need =
          I.geometry.BlocksForTokens(new_n) - static_cast<int64_t>(seq->blocks.size());
      if (need > 0 && I.FreeBlocks(Tier::kHbm) < need) {
        if (round > 0) {
          // Someone took the room while the lock was dropped; try once more, then give up.
          if (round > 2) {
            return absl::ResourceExhaustedError("Append: HBM room was taken by other calls");
          }
        }
        absl::Status room = I.MakeHbmRoom(need, absl::Now() + I.room_wait, d);
        if (!room.ok()) {
          I.DeferredRelease(d);
          return room;
        }
        continue;  // the lock may have been dropped: look everything up again
      }
      // Key the blocks this append fills before changing anything. Only the partial tail and
      // the new tokens are hashed: a decode step costs one block's hashing, not the sequence's.
      const int64_t have = static_cast<int64_t>(seq->keys.size());
      std::vector<int32_t> tail(seq->tokens.begin() + have * b_tokens, seq->tokens.end());
      tail.insert(tail.end(), tokens.begin(), tokens.end());
      std::vector<BlockKey> added;
      KVTIER_RETURN_IF_ERROR(I.hasher.AppendBlockKeys(have == 0 ? kRootBlockKey : seq->keys.back(),
                                                      have * b_tokens, tail, seq->extras, &added));
      std::vector<SlotId> fresh;
      absl::Status alloc = I.Alloc(Tier::kHbm, [&](BlockAllocator& a) -> absl::Status {
        for (int64_t i = 0; i < need; ++i) {
          auto s = a.Allocate();
          if (!s.ok()) {
            for (SlotId f : fresh) (void)a.Release(f);
            fresh.clear();
            return s.status();
          }
          fresh.push_back(*s);
        }
        return absl::OkStatus();
      });
      if (!alloc.ok()) {
        if (round > 2) return alloc;
        continue;
      }
      for (SlotId s : fresh) {
        I.tiers[0]->BeginDeviceWrite(s);
        seq->blocks.push_back(Impl::SeqBlock{Tier::kHbm, s});
        ++I.seq_refs[s.value()];
      }
      seq->tokens.insert(seq->tokens.end(), tokens.begin(), tokens.end());
      const int64_t old_full = old_n / b_tokens;
      const int64_t new_full = new_n / b_tokens;
      for (int64_t j = old_full; j < new_full; ++j) {
        const SlotId s = seq->blocks[static_cast<size_t>(j)].slot;
        (void)I.Alloc(Tier::kHbm, [&](BlockAllocator& a) { return a.Seal(s); });
      }
      seq->keys.insert(seq->keys.end(), added.begin(), added.end());
      result.first_sealed_block = old_full;
      result.num_sealed_blocks = new_full - old_full;
      result.num_new_slots = need > 0 ? need : 0;
      break;
    }
    I.DeferredRelease(d);
  }
  return result;
}

absl::Status KvCache::ReportWritten(SequenceId id, int64_t num_tokens, Completion ready) {
  Impl& I = *impl_;
  {
    Impl::CacheScope scope(I);
    Impl::Deferred& d = scope.deferred();
    KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
    const int64_t n = static_cast<int64_t>(seq->tokens.size());
    if (num_tokens > n) {
      return absl::OutOfRangeError(absl::StrCat("ReportWritten: ", num_tokens, " tokens of ",
                                                SeqName(id), ", which has ", n));
    }
    if (num_tokens < seq->written) {
      return absl::InvalidArgumentError(absl::StrCat("ReportWritten: ", num_tokens, " tokens of ",
                                                     SeqName(id), " after ", seq->written,
                                                     " were reported written"));
    }
    const int64_t b_tokens = I.block_tokens;
    std::vector<std::pair<BlockKey, SlotId>> publish;
    for (int64_t j = seq->written / b_tokens; j < num_tokens / b_tokens; ++j) {
      const Impl::SeqBlock b = seq->blocks[static_cast<size_t>(j)];
      const BlockKey key = seq->keys[static_cast<size_t>(j)];
      if (b.tier != Tier::kHbm) continue;
      const std::optional<BlockRecord> rec = I.index->Lookup(key);
      if (rec.has_value() && rec->state(Tier::kHbm) != CopyState::kAbsent) continue;  // a twin
      const BlockKey parent = j == 0 ? kRootBlockKey : seq->keys[static_cast<size_t>(j - 1)];
      if (I.AddCopy(key, Tier::kHbm, b.slot, CopyState::kPending, parent, j * b_tokens).ok()) {
        publish.emplace_back(key, b.slot);
      }
    }
    seq->written = num_tokens;
    if (!publish.empty()) d.publish.emplace_back(std::move(ready), std::move(publish));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<BlockCopy>> KvCache::Fork(SequenceId parent, SequenceId child,
                                                       int64_t num_tokens) {
  Impl& I = *impl_;
  if (!child.valid()) return absl::InvalidArgumentError("Fork: an invalid child sequence id");
  const int64_t b_tokens = I.block_tokens;
  std::optional<BlockCopy> copy;
  {
    Impl::CacheScope scope(I);
    Impl::Deferred& d = scope.deferred();
    for (int round = 0;; ++round) {
      KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * p, I.FindSeq(parent));
      if (I.seqs.contains(child)) {
        return absl::AlreadyExistsError(absl::StrCat("Fork: ", SeqName(child), " already exists"));
      }
      const int64_t n = static_cast<int64_t>(p->tokens.size());
      if (num_tokens < 0 || num_tokens > n) {
        return absl::OutOfRangeError(
            absl::StrCat("Fork: ", num_tokens, " tokens of ", SeqName(parent), ", which has ", n));
      }
      const int64_t full = num_tokens / b_tokens;
      const int64_t rem = num_tokens % b_tokens;
      if (rem != 0 && p->blocks[static_cast<size_t>(full)].tier != Tier::kHbm) {
        return absl::FailedPreconditionError(
            absl::StrCat("Fork: block ", full, " of ", SeqName(parent),
                         " is not in HBM; make it resident before forking inside it"));
      }
      if (rem != 0 && I.FreeBlocks(Tier::kHbm) < 1) {
        if (round > 2) return absl::ResourceExhaustedError("Fork: no HBM slot for the copy");
        absl::Status room = I.MakeHbmRoom(1, absl::Now() + I.room_wait, d);
        if (!room.ok()) {
          I.DeferredRelease(d);
          return room;
        }
        continue;
      }
      auto c = std::make_unique<Impl::Sequence>();
      c->id = child;
      c->options = p->options;
      c->extras = p->extras;
      c->tokens.assign(p->tokens.begin(), p->tokens.begin() + num_tokens);
      c->keys.assign(p->keys.begin(), p->keys.begin() + full);
      c->written = std::min(p->written, num_tokens);
      for (int64_t i = 0; i < full; ++i) {
        const Impl::SeqBlock b = p->blocks[static_cast<size_t>(i)];
        if (absl::Status s = I.AcquireRef(b.tier, b.slot); !s.ok()) {
          for (const auto& got : c->blocks) I.DropRef(got);
          return s;
        }
        c->blocks.push_back(b);
      }
      if (rem != 0) {
        SlotId dst;
        absl::Status s = I.Alloc(Tier::kHbm, [&](BlockAllocator& a) -> absl::Status {
          KVTIER_ASSIGN_OR_RETURN(dst, a.Allocate());
          return absl::OkStatus();
        });
        if (!s.ok()) {
          for (const auto& got : c->blocks) I.DropRef(got);
          if (round > 2) return s;
          continue;
        }
        I.tiers[0]->BeginDeviceWrite(dst);
        c->blocks.push_back(Impl::SeqBlock{Tier::kHbm, dst});
        ++I.seq_refs[dst.value()];
        copy = BlockCopy{p->blocks[static_cast<size_t>(full)].slot, dst, static_cast<int>(rem)};
      }
      I.released_ids.erase(child);
      c->generation = I.next_generation++;
      I.seqs[child] = std::move(c);
      break;
    }
    I.DeferredRelease(d);
  }
  return copy;
}

absl::Status KvCache::Release(SequenceId id) {
  Impl& I = *impl_;
  internal::MutexLock lock(&I.mu);
  KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
  const absl::Time now = I.Now();
  const absl::Time until = seq->options.retention == absl::InfiniteDuration()
                               ? absl::InfiniteFuture()
                               : now + seq->options.retention;
  for (size_t i = seq->blocks.size(); i-- > 0;) {
    if (i < seq->keys.size()) {
      auto m = I.meta.find(seq->keys[i]);
      if (m != I.meta.end()) {
        m->second.last_use = now;  // in use until now
        if (seq->options.retention_priority > 0) {
          m->second.retention_priority = seq->options.retention_priority;
          m->second.priority_until = until;
        }
        I.TouchCandidates(seq->keys[i], m->second);
      }
    }
    I.DropRef(seq->blocks[i]);
  }
  I.seqs.erase(id);
  const uint64_t serial = I.next_release++;
  I.released_ids[id] = serial;
  I.released_order.emplace_back(id, serial);
  while (I.released_order.size() > kReleasedIdsRemembered) {
    const auto [old_id, old_serial] = I.released_order.front();
    auto it = I.released_ids.find(old_id);
    if (it != I.released_ids.end() && it->second == old_serial) I.released_ids.erase(it);
    I.released_order.pop_front();
  }
  return absl::OkStatus();
}

// ---- Hints ------------------------------------------------------------------------------------

absl::Status KvCache::Pause(SequenceId id, absl::Duration expected_idle) {
  Impl& I = *impl_;
  if (expected_idle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Pause: expected_idle = ", absl::FormatDuration(expected_idle), " must not be negative"));
  }
  {
    Impl::CacheScope scope(I);
    Impl::Deferred& d = scope.deferred();
    KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
    if (seq->paused) {
      return absl::FailedPreconditionError(absl::StrCat("Pause: ", SeqName(id), " is paused"));
    }
    seq->paused = true;
    const std::optional<Tier> lower = I.NextLower(Tier::kHbm);
    const int64_t written_full = seq->written / I.block_tokens;
    for (int64_t j = 0; lower.has_value() && j < written_full; ++j) {
      const Impl::SeqBlock b = seq->blocks[static_cast<size_t>(j)];
      const BlockKey key = seq->keys[static_cast<size_t>(j)];
      if (b.tier != Tier::kHbm) continue;
      const std::optional<BlockRecord> rec = I.index->Lookup(key);
      if (!rec.has_value() || rec->state(Tier::kHbm) != CopyState::kReady ||
          rec->slots[0] != b.slot) {
        continue;  // a private twin or not yet written: stays held in HBM
      }
      // Move the reference to the fastest lower copy there is, or make one.
      bool moved = false;
      for (int t = 1; t < kNumTiers && !moved; ++t) {
        if (rec->state(static_cast<Tier>(t)) == CopyState::kReady &&
            I.RepointBlock(*seq, j, static_cast<Tier>(t), rec->slots[t])) {
          moved = true;
        }
      }
      if (moved) continue;
      auto off = I.offloading.find(key);
      if (off != I.offloading.end()) {
        auto move = std::find_if(off->second.begin(), off->second.end(), [&](const auto& m) {
          return m->from == Tier::kHbm && m->src == b.slot;
        });
        if (move != off->second.end()) {
          (*move)->pause_waiters.emplace_back(id, j);
          continue;
        }
      }
      if (rec->state(*lower) != CopyState::kAbsent || !I.RoomBelowNow(*lower, d)) continue;
      auto move = I.StartMove(key, Tier::kHbm, b.slot, *lower, false, d);
      if (move.ok()) (*move)->pause_waiters.emplace_back(id, j);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Completion> KvCache::Resume(SequenceId id) {
  Impl& I = *impl_;
  auto t = std::make_shared<internal::TicketState>();
  {
    Impl::CacheScope scope(I);
    Impl::Deferred& d = scope.deferred();
    Impl::Sequence* seq = nullptr;
    for (int round = 0;; ++round) {
      KVTIER_ASSIGN_OR_RETURN(seq, I.FindSeq(id));
      if (!seq->paused) {
        return absl::FailedPreconditionError(
            absl::StrCat("Resume: ", SeqName(id), " is not paused"));
      }
      const int64_t full = static_cast<int64_t>(seq->keys.size());
      I.AdoptHbmCopies(*seq, 0, full);
      const int64_t missing = I.MissingBlocks(*seq, 0, full);
      if (round > 0 || missing == 0 || I.FreeBlocks(Tier::kHbm) >= missing) break;
      // Room for as many as possible (waiting for demotions like Append); what still does not
      // fit is left below and onboarded by a later EnsureResident.
      (void)I.MakeHbmRoom(missing, absl::Now() + I.room_wait, d);
    }
    seq->paused = false;
    t->owner = &I;
    t->sequence = id;
    t->pins = false;
    t->released = true;
    const int64_t full = static_cast<int64_t>(seq->keys.size());
    t->table.slots.assign(static_cast<size_t>(full), -1);
    t->table.tokens_per_block = I.block_tokens;
    {
      internal::MutexLock tl(&t->mu);
      t->status.assign(static_cast<size_t>(full), BlockResidency::kPending);
    }
    t->pending = full + 1;  // +1 released below, so an empty sequence completes too
    for (int64_t j = 0; j < full; ++j) I.Onboard(*seq, j, t, j, d);
    if (--t->pending == 0) d.fire.emplace_back(t->done, Impl::TicketOutcome(*t));
  }
  return t->done;
}

absl::StatusOr<int64_t> KvCache::Prefetch(absl::Span<const int32_t> tokens,
                                          const SequenceOptions& identity) {
  Impl& I = *impl_;
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys,
                          I.hasher.BlockKeys(tokens, ExtrasOf(identity)));
  int64_t started = 0;
  {
    Impl::CacheScope scope(I);
    Impl::Deferred& d = scope.deferred();
    std::vector<BlockLocation> where;
    KVTIER_ASSIGN_OR_RETURN(const PrefixMatch match,
                            I.index->Match(keys, static_cast<int64_t>(tokens.size()), &where));
    (void)match;
    for (size_t i = 0; i < where.size(); ++i) {
      if (where[i].tier == Tier::kHbm || I.onboarding.contains(keys[i])) continue;
      const std::optional<BlockRecord> rec = I.index->Lookup(keys[i]);
      if (!rec.has_value() || rec->state(Tier::kHbm) != CopyState::kAbsent) continue;
      // A hint: take a free slot or one victim that can go at once, never wait for room.
      if (I.FreeBlocks(Tier::kHbm) < 1 &&
          (I.evicting[0] > 0 || I.EvictOne(Tier::kHbm, d) != Impl::EvictResult::kEvicted ||
           I.FreeBlocks(Tier::kHbm) < 1)) {
        break;
      }
      // Re-read: an eviction above may have demoted or dropped this very block's neighbours.
      const std::optional<BlockRecord> now = I.index->Lookup(keys[i]);
      if (!now.has_value()) break;
      const std::optional<Tier> from = now->fastest_ready_tier();
      if (!from.has_value() || *from == Tier::kHbm) continue;
      if (I.StartMove(keys[i], *from, now->slots[TierIndex(*from)], Tier::kHbm, false, d).ok()) {
        ++started;
      }
    }
  }
  return started;
}

// ---- ensure-resident --------------------------------------------------------------------------

absl::StatusOr<ResidencyTicket> KvCache::EnsureResident(SequenceId id, int64_t begin_token,
                                                        int64_t end_token,
                                                        const EnsureResidentOptions& options) {
  Impl& I = *impl_;
  if (begin_token < 0 || begin_token > end_token) {
    return absl::InvalidArgumentError(absl::StrCat("EnsureResident: the range [", begin_token, ", ",
                                                   end_token, ") is malformed"));
  }
  if (options.mode != ResidencyMode::kWait && options.mode != ResidencyMode::kBestEffort &&
      options.mode != ResidencyMode::kAsync) {
    return absl::InvalidArgumentError("EnsureResident: unknown mode");
  }
  if (options.deadline <= absl::Now()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "EnsureResident: the deadline ", absl::FormatTime(options.deadline), " has passed"));
  }
  const int64_t b_tokens = I.block_tokens;
  auto t = std::make_shared<internal::TicketState>();
  {
    Impl::CacheScope scope(I);
    Impl::Deferred& d = scope.deferred();
    KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
    if (end_token > static_cast<int64_t>(seq->tokens.size())) {
      return absl::OutOfRangeError(absl::StrCat("EnsureResident: token ", end_token,
                                                " is past the end of ", SeqName(id), " (",
                                                seq->tokens.size(), " tokens)"));
    }
    const int64_t first = begin_token / b_tokens;
    const int64_t last = end_token == begin_token ? first : (end_token + b_tokens - 1) / b_tokens;
    // Pin first (DESIGN section 5): HBM copies this request can use are taken before any room
    // is made, so making room cannot evict them.
    I.AdoptHbmCopies(*seq, first, last);
    if (options.mode != ResidencyMode::kBestEffort) {
      const int64_t missing = I.MissingBlocks(*seq, first, last);
      if (missing > 0 && I.FreeBlocks(Tier::kHbm) < missing) {
        // Room for as many as possible; what still does not fit is reported not resident.
        (void)I.MakeHbmRoom(missing, std::min(options.deadline, absl::Now() + I.room_wait), d);
        KVTIER_ASSIGN_OR_RETURN(seq, I.FindSeq(id));
        if (end_token > static_cast<int64_t>(seq->tokens.size())) {
          return absl::OutOfRangeError("EnsureResident: the sequence shrank meanwhile");
        }
        I.AdoptHbmCopies(*seq, first, last);  // the lock was dropped: others may have onboarded
      }
    }
    t->id = I.next_ticket++;
    t->owner = &I;
    t->sequence = id;
    t->begin = begin_token;
    t->end = end_token;
    t->table.first_block = static_cast<int32_t>(first);
    t->table.tokens_per_block = b_tokens;
    t->table.tokens_in_last_block =
        last > first
            ? static_cast<int32_t>(std::min<int64_t>(
                  b_tokens, static_cast<int64_t>(seq->tokens.size()) - (last - 1) * b_tokens))
            : 0;
    t->table.pool = I.pool;
    const size_t count = static_cast<size_t>(last - first);
    t->table.slots.assign(count, -1);
    t->pending = static_cast<int64_t>(count) + 1;
    {
      internal::MutexLock tl(&t->mu);
      t->status.assign(count, BlockResidency::kPending);
    }
    // The common case first: every block already in HBM. One counter per block, nothing else.
    size_t i = 0;
    for (; i < count; ++i) {
      const Impl::SeqBlock& b = seq->blocks[static_cast<size_t>(first) + i];
      if (b.tier != Tier::kHbm) break;
      // The sequence holds the slot, so it is no eviction candidate: no policy update needed.
      if (I.ticket_refs[b.slot.value()]++ == 0) ++I.locked;
      t->table.slots[i] = static_cast<int32_t>(b.slot.value());
    }
    {
      internal::MutexLock tl(&t->mu);
      std::fill(t->status.begin(), t->status.begin() + static_cast<std::ptrdiff_t>(i),
                BlockResidency::kResident);
    }
    t->pending -= static_cast<int64_t>(i);
    const bool all_resident = i == count;
    for (; i < count; ++i) {
      const int64_t block = first + static_cast<int64_t>(i);
      if (options.mode == ResidencyMode::kBestEffort) {
        const Impl::SeqBlock b = seq->blocks[static_cast<size_t>(block)];
        if (b.tier == Tier::kHbm) {
          I.PinTicket(b.slot);
          I.ResolveTicketBlock(t, static_cast<int64_t>(i), b.slot, absl::OkStatus(), d);
        } else {
          I.ResolveTicketBlock(t, static_cast<int64_t>(i), std::nullopt,
                               absl::UnavailableError(absl::StrCat("best effort: the block is in ",
                                                                   ToAbsl(TierName(b.tier)))),
                               d);
        }
        continue;
      }
      I.Onboard(*seq, block, t, static_cast<int64_t>(i), d);
    }
    if (--t->pending == 0) {
      d.fire.emplace_back(t->done, all_resident ? absl::OkStatus() : Impl::TicketOutcome(*t));
    }
    I.tickets[t->id] = t;
  }
  if (!t->done.done() && options.mode == ResidencyMode::kWait) {
    // Blocks that joined an onboard started by someone else (a prefetch, another request) wait
    // for it only until this call's deadline.
    (void)t->done.WaitUntil(options.deadline);
    if (!t->done.done()) I.ExpireTicket(t);
  } else if (!t->done.done() && options.deadline != absl::InfiniteFuture()) {
    std::weak_ptr<internal::TicketState> weak = t;
    std::shared_ptr<internal::Lifeline> life = I.lifeline;
    I.timer->Schedule(options.deadline, [life, weak] {
      std::shared_ptr<internal::TicketState> ticket = weak.lock();
      if (ticket == nullptr || ticket->done.done()) return;
      auto* impl = static_cast<Impl*>(life->Enter());
      if (impl == nullptr) return;
      impl->ExpireTicket(ticket);
      life->Exit();
    });
  }
  return ResidencyTicket(t);
}

absl::Status KvCache::ReleaseTicket(const ResidencyTicket& ticket) {
  Impl& I = *impl_;
  if (!ticket.valid()) return absl::InvalidArgumentError("ReleaseTicket: an invalid ticket");
  internal::TicketState& t = *ticket.state_;
  if (t.owner != &I) {
    return absl::NotFoundError(
        absl::StrCat("ReleaseTicket: ticket ", t.id, " was issued by another cache"));
  }
  internal::MutexLock lock(&I.mu);
  auto it = I.tickets.find(t.id);
  if (it == I.tickets.end() || it->second != ticket.state_) {
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
      if (--I.ticket_refs[s] == 0) {
        --I.locked;
        if (I.seq_refs[s] == 0) settle.push_back(SlotId(s));
      }
    }
  }
  for (SlotId s : settle) I.SettleSlot(Tier::kHbm, s);
  I.tickets.erase(it);
  return absl::OkStatus();
}

// ---- Lookups, stats, events -------------------------------------------------------------------

absl::StatusOr<PrefixLookup> KvCache::Lookup(absl::Span<const int32_t> tokens,
                                             const SequenceOptions& identity) const {
  const Impl& I = *impl_;
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys,
                          I.hasher.BlockKeys(tokens, ExtrasOf(identity)));
  internal::MutexLock lock(&I.mu);
  KVTIER_ASSIGN_OR_RETURN(const PrefixMatch match,
                          I.index->Match(keys, static_cast<int64_t>(tokens.size())));
  PrefixLookup out;
  out.matched_tokens = match.matched_tokens;
  out.blocks_by_tier = match.blocks_by_tier;
  return out;
}

absl::StatusOr<SequenceInfo> KvCache::GetSequence(SequenceId id) const {
  Impl& I = *impl_;
  internal::MutexLock lock(&I.mu);
  KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
  SequenceInfo info;
  info.num_tokens = static_cast<int64_t>(seq->tokens.size());
  info.written_tokens = seq->written;
  info.num_blocks = static_cast<int64_t>(seq->blocks.size());
  for (const auto& b : seq->blocks) ++info.blocks_by_tier[TierIndex(b.tier)];
  info.paused = seq->paused;
  return info;
}

KvCacheStats KvCache::stats() const {
  Impl& I = *impl_;
  internal::MutexLock lock(&I.mu);
  KvCacheStats s = I.counters;
  s.live_sequences = static_cast<int64_t>(I.seqs.size());
  s.open_tickets = static_cast<int64_t>(I.tickets.size());
  s.indexed_blocks = I.index->size();
  s.last_event_sequence = I.next_event - 1;
  std::array<SlotCounts, kNumTiers> counts{};
  int64_t locked_cached = 0;
  // The lambda runs under I.mu (held here); the analysis cannot see that through the call.
  const std::vector<uint32_t>* ticket_refs = &I.ticket_refs;
  const int64_t locked_now = I.locked;
  (void)I.engine->WithAllocators([&](const std::array<BlockAllocator*, kNumTiers>& a) {
    for (int t = 0; t < kNumTiers; ++t) {
      if (a[t] != nullptr) counts[t] = a[t]->counts();
    }
    if (locked_now > 0) {
      for (size_t slot = 0; slot < ticket_refs->size(); ++slot) {
        if ((*ticket_refs)[slot] == 0) continue;
        auto st = a[0]->state(SlotId(static_cast<uint32_t>(slot)));
        if (st.ok() && *st == SlotState::kCached) ++locked_cached;
      }
    }
    return absl::OkStatus();
  });
  for (int t = 0; t < kNumTiers; ++t) {
    KvTierStats& ts = s.tiers[t];
    if (!ts.present) continue;
    const SlotCounts& c = counts[t];
    const int64_t locked = t == 0 ? I.locked : 0;
    const int64_t lc = t == 0 ? locked_cached : 0;
    ts.capacity_blocks = c.total();
    ts.free_blocks = c.free;
    ts.locked_blocks = locked;
    ts.held_blocks = c.held() - (locked - lc);
    ts.droppable_blocks = c.cached - lc;
    ts.in_flight_blocks = c.in_flight;
    ts.quarantined_blocks = c.quarantined;
    for (int o = 0; o < kNumTiers; ++o) {
      if (o == t || I.tiers[o] == nullptr) continue;
      const TransferStats in = I.engine->stats(static_cast<Tier>(o), static_cast<Tier>(t));
      ts.bytes_in += in.bytes;
      ts.bytes_out += I.engine->stats(static_cast<Tier>(t), static_cast<Tier>(o)).bytes;
      s.blocks_moved[o][t] = in.blocks;
    }
  }
  return s;
}

std::vector<CacheEvent> KvCache::PollEvents(uint64_t after_sequence, size_t max_events) const {
  Impl& I = *impl_;
  internal::MutexLock lock(&I.mu);
  std::vector<CacheEvent> out;
  if (I.events.empty()) return out;
  const uint64_t oldest = I.events.front().sequence;
  size_t start = after_sequence < oldest ? 0 : static_cast<size_t>(after_sequence - oldest + 1);
  for (size_t i = start; i < I.events.size() && out.size() < max_events; ++i) {
    out.push_back(I.events[i]);
  }
  return out;
}

absl::Status KvCache::WaitIdle(absl::Time deadline) const {
  Impl& I = *impl_;
  internal::MutexLock lock(&I.mu);
  while (I.moves_in_flight > 0) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("WaitIdle: ", I.moves_in_flight, " transfers still in flight"));
    }
    I.cv.WaitUntil(&I.mu,
                   absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Milliseconds(100))));
  }
  return absl::OkStatus();
}

absl::Status KvCache::CheckInvariants() const {
  Impl& I = *impl_;
  internal::MutexLock lock(&I.mu);
  return I.CheckInvariantsLocked();
}

}  // namespace kvtier
