// Prefix attach: AttachPrefix once the prompt is hashed: the matched blocks are pinned where they
// are, the cost model plans restore versus recompute (with the links' bandwidths as the transfer
// engine measures them), and the hits and misses are counted. Owns no state of its own.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "internal/status_macros.h"

namespace kvtier {
namespace {

using internal::SeqName;

}  // namespace

std::array<TierLinkCost, kNumTiers> KvCache::Impl::CurrentLinks() const {
  std::array<TierLinkCost, kNumTiers> l = links;
  if (!measure_bandwidth) return l;
  for (int t = 1; t < kNumTiers; ++t) {
    if (tiers[t] == nullptr) continue;
    const double bw = engine->stats(static_cast<Tier>(t), Tier::kHbm).bandwidth_bytes_per_second;
    if (bw > 0) l[t].bytes_per_second = bw;
  }
  return l;
}

absl::StatusOr<AttachResult> KvCache::Impl::AttachKeys(SequenceId id, uint64_t generation,
                                                       absl::Span<const BlockKey> keys,
                                                       absl::Span<const int32_t> prompt,
                                                       std::vector<BlockKey>* owned) {
  AttachResult result;
  KVTIER_ASSIGN_OR_RETURN(Sequence * seq, FindSeq(id));
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
  if (!seq->options.enable_caching) return result;  // nothing shared with it (SequenceOptions)
  const absl::Time now = Now();
  // A policy that learns from requests sees every block the prompt names, cached or not.
  const bool readmission = seq->options.readmission;
  for (const std::unique_ptr<EvictionPolicy>& p : policy) {
    if (p != nullptr && p->observes_requests() && !readmission) {
      p->ObserveRequest({.blocks = keys, .now = now, .session = seq->options.session});
    }
  }
  std::vector<BlockLocation> where;
  std::vector<BlockMap::value_type*> entries;  // valid to the end: nothing below erases a block
  std::vector<uint8_t> candidate;              // their candidacy bits, unchanged until phase 2
  KVTIER_ASSIGN_OR_RETURN(
      const PrefixMatch match,
      MatchEntries(keys, static_cast<int64_t>(prompt.size()), &where, &entries, &candidate));
  // Each block below HBM is restored from the ready copy behind the cheapest link (latency +
  // one block over its bandwidth), not the first in tier order: a fleet's store behind a
  // 12.5 GB/s network beats one NVMe drive at 6 GB/s for large blocks.
  // The links as the engine measures them now, read once for the source choice and the plan.
  const bool below_hbm = std::any_of(where.begin(), where.end(),
                                     [](const BlockLocation& l) { return l.tier != Tier::kHbm; });
  const std::array<TierLinkCost, kNumTiers> link =
      below_hbm || cost.has_value() ? CurrentLinks() : links;
  if (below_hbm) {
    auto seconds = [&](int t) {
      return link[t].bytes_per_second > 0
                 ? absl::ToDoubleSeconds(link[t].latency) +
                       static_cast<double>(block_bytes) / link[t].bytes_per_second
                 : std::numeric_limits<double>::infinity();
    };
    for (size_t i = 0; i < where.size(); ++i) {
      if (where[i].tier == Tier::kHbm) continue;
      const BlockRecord& rec = entries[i]->second.copies;
      int best = TierIndex(where[i].tier);
      for (int t = best + 1; t < kNumTiers; ++t) {
        if (rec.state(static_cast<Tier>(t)) == CopyState::kReady && seconds(t) < seconds(best)) {
          best = t;
        }
      }
      if (best != TierIndex(where[i].tier)) {
        where[i] = BlockLocation{static_cast<Tier>(best), rec.slots[best]};
      }
    }
  }
  // Phase 1: pin every matched block where it is.
  // One pass under the engine's lock; a block that was cached (no holder) may have been an
  // eviction candidate and stops being one.
  std::vector<SeqBlock> pinned;
  std::vector<uint8_t> was_cached;  // per pinned block: it had no holder before
  pinned.reserve(where.size());
  was_cached.reserve(where.size());
  (void)engine->WithAllocators([&](const std::array<BlockAllocator*, kNumTiers>& a) {
    for (const BlockLocation& loc : where) {
      BlockAllocator* alloc = a[TierIndex(loc.tier)];
      const SlotState before = alloc->state_or_free(loc.slot);
      if (!alloc->Acquire(loc.slot).ok()) break;
      was_cached.push_back(before == SlotState::kCached ? 1 : 0);
      pinned.push_back(SeqBlock{loc.tier, loc.slot});
    }
    return absl::OkStatus();
  });
  for (const SeqBlock& b : pinned) {
    if (b.tier == Tier::kHbm) ++seq_refs[b.slot.value()];
  }
  // Held now, so no longer candidates (what UpdateCandidate would conclude, without asking).
  // Before anything else reaches the policies (the restore plan's unpinned tail re-registers
  // below): cost_aware learns from the order of its calls, so the order is kept as it was.
  // Only registered copies are visited (the match read their bits; nothing since has changed
  // candidacy), so the unregistered majority's entries are not loaded again here.
  for (size_t i = 0; i < pinned.size(); ++i) {
    if (was_cached[i] && ((candidate[i] >> TierIndex(pinned[i].tier)) & 1) != 0) {
      DropCandidacy(*entries[i], pinned[i].tier);
    }
  }
  // Phase 2: plan, and keep the leading blocks worth restoring.
  std::vector<Tier> tiers_of;
  tiers_of.reserve(pinned.size());
  for (const auto& b : pinned) tiers_of.push_back(b.tier);
  const int64_t b_tokens = block_tokens;
  const int64_t n = static_cast<int64_t>(prompt.size());
  RestorePlan plan;
  if (cost.has_value()) {
    absl::StatusOr<RestorePlan> planned =
        PlanRestore(*cost, tiers_of, link, b_tokens, block_bytes, n);
    if (!planned.ok()) {  // on error nothing changes: unpin what phase 1 pinned
      for (const SeqBlock& b : pinned) DropRef(b);
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
    DropRef(pinned[i]);
  }
  pinned.resize(static_cast<size_t>(plan.restore_blocks));
  for (size_t i = 0; i < pinned.size(); ++i) {
    BlockEntry& m = entries[i]->second;
    // A readmission's blocks are its own KV coming back: no use, and no news for the policies
    // of the tiers that keep other copies (kv_cache.h); its release makes them recent again.
    if (!readmission) {
      AddUse(m);
      m.set_last_use(now);
      TouchCandidates(*entries[i]);
    }
    ++result.attached_blocks_by_tier[TierIndex(pinned[i].tier)];
    if (readmission) {
      ++counters.readmitted_blocks;
    } else {
      ++counters.tiers[TierIndex(pinned[i].tier)].hits;
    }
  }
  seq->tokens.assign(prompt.begin(), prompt.begin() + plan.restore_blocks * b_tokens);
  if (owned != nullptr) {
    owned->resize(static_cast<size_t>(plan.restore_blocks));
    seq->keys = std::move(*owned);
  } else {
    seq->keys.assign(keys.begin(), keys.begin() + plan.restore_blocks);
  }
  seq->blocks = std::move(pinned);
  seq->written = plan.restore_blocks * b_tokens;

  const int64_t query_blocks = n / b_tokens;
  int64_t found_so_far = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    if (!Present(static_cast<Tier>(t))) continue;
    found_so_far += match.blocks_by_tier[t];
    counters.tiers[t].misses += query_blocks - found_so_far;
  }
  ++counters.attach_queries;
  counters.query_tokens += n;
  counters.matched_tokens += match.matched_tokens;
  counters.attached_tokens += plan.restore_blocks * b_tokens;
  counters.cached_but_recomputed_blocks += plan.cached_but_recomputed;
  result.matched_tokens = match.matched_tokens;
  result.attached_tokens = plan.restore_blocks * b_tokens;
  result.plan = plan;
  return result;
}

}  // namespace kvtier
