// The hint commands of KvCache (kv_cache.h RetainPrefix, InvalidatePrefix): retention of a
// prefix's cached blocks, and dropping the blocks a context compaction made dead. Owns no state:
// they change block records (retention) and drop copies through block_records.cc.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"

namespace kvtier {

absl::StatusOr<HintOutcome> KvCache::RetainPrefix(absl::Span<const int32_t> tokens, double priority,
                                                  absl::Duration ttl,
                                                  const SequenceOptions& identity) {
  Impl& I = *impl_;
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys,
                          I.hasher.BlockKeys(tokens, internal::ExtrasOf(identity)));
  HintOutcome out;
  if (!(priority >= 0) || !std::isfinite(priority) || ttl <= absl::ZeroDuration()) {
    out.result = HintOutcome::Result::kRejected;
    out.reason =
        absl::StrCat("priority = ", priority,
                     " must be >= 0 and finite, ttl = ", absl::FormatDuration(ttl), " > 0");
    return out;
  }
  Impl::CacheLock lock(I);
  const absl::Time now = I.Now();
  const absl::Time until = ttl == absl::InfiniteDuration() ? absl::InfiniteFuture() : now + ttl;
  for (const BlockKey& key : keys) {
    auto m = I.blocks.find(key);
    if (m == I.blocks.end() || !m->second.copies.has_copy()) break;  // the cached prefix ends
    KvCache::Impl::ColdFields& c = I.MutableCold(m->second);
    c.retention_priority = priority;
    c.priority_until = until;
    I.TrimCold(m->second);  // priority 0 with an infinite ttl is no retention
    // Registered again with the new traits, at its own last use (not a use: no recency bump).
    for (int t = 0; t < kNumTiers; ++t) {
      if (((m->second.candidate >> t) & 1) == 0) continue;
      I.DropCandidacy(*m, static_cast<Tier>(t));
      I.UpdateCandidate(*m, static_cast<Tier>(t));
    }
    ++out.blocks;
  }
  if (out.blocks < static_cast<int64_t>(keys.size())) {
    out.result = HintOutcome::Result::kClipped;
    out.reason = absl::StrCat(out.blocks, " of the prompt's ", keys.size(),
                              " full blocks are cached; only those are retained");
  }
  return out;
}

absl::StatusOr<HintOutcome> KvCache::InvalidatePrefix(absl::Span<const int32_t> tokens,
                                                      int64_t from_token,
                                                      const SequenceOptions& identity) {
  Impl& I = *impl_;
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys,
                          I.hasher.BlockKeys(tokens, internal::ExtrasOf(identity)));
  HintOutcome out;
  if (from_token < 0) {
    out.result = HintOutcome::Result::kRejected;
    out.reason = absl::StrCat("from_token = ", from_token, " must be >= 0");
    return out;
  }
  Impl::CacheLock lock(I);
  const int64_t first = from_token / I.block_tokens;
  int64_t kept = 0;
  // Deepest first: dropping a block makes its parent a leaf, and so droppable in turn.
  for (int64_t i = static_cast<int64_t>(keys.size()) - 1; i >= first; --i) {
    const BlockKey key = keys[static_cast<size_t>(i)];
    bool any = false, all = true;
    for (int t = 0; t < kNumTiers; ++t) {
      auto m = I.blocks.find(key);
      if (m == I.blocks.end()) break;
      if (m->second.copies.state(static_cast<Tier>(t)) == CopyState::kAbsent) continue;
      // A registered candidate is a droppable leaf: nobody holds or reads it, it is not leaving,
      // and no child copy of it stays in that tier.
      if (((m->second.candidate >> t) & 1) != 0) {
        I.DropCopy(key, static_cast<Tier>(t));
        any = true;
      } else {
        all = false;
      }
    }
    if (any && all) ++out.blocks;
    if (!all) ++kept;
  }
  if (kept > 0) {
    out.result = HintOutcome::Result::kClipped;
    out.reason = absl::StrCat(kept,
                              " blocks keep a copy: held by a sequence or ticket, being moved, or "
                              "parent of a cached block outside the range");
  }
  return out;
}

}  // namespace kvtier
