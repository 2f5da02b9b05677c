// The hint commands of KvCache (kv_cache.h RetainPrefix, InvalidatePrefix, RetainSession,
// InvalidateSession): retention of a prefix's (or a session's) cached blocks, and dropping the
// blocks a context compaction made dead. Keeps the session records (the blocks of each
// session's latest release) for the session forms. Owns no state:
// they change block records (retention) and drop copies through block_records.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
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
  Impl::CacheLock lock(I);
  HintOutcome out = I.RetainKeys(keys, priority, ttl);
  if (out.result == HintOutcome::Result::kClipped) {
    out.reason = absl::StrCat(out.blocks, " of the prompt's ", keys.size(),
                              " full blocks are cached; only those are retained");
  }
  return out;
}

HintOutcome KvCache::Impl::RetainKeys(absl::Span<const BlockKey> keys, double priority,
                                      absl::Duration ttl) {
  HintOutcome out;
  if (!(priority >= 0) || !std::isfinite(priority) || ttl <= absl::ZeroDuration()) {
    out.result = HintOutcome::Result::kRejected;
    out.reason =
        absl::StrCat("priority = ", priority,
                     " must be >= 0 and finite, ttl = ", absl::FormatDuration(ttl), " > 0");
    return out;
  }
  const absl::Time now = Now();
  const absl::Time until = ttl == absl::InfiniteDuration() ? absl::InfiniteFuture() : now + ttl;
  for (const BlockKey& key : keys) {
    auto m = blocks.find(key);
    if (m == blocks.end() || !m->second.copies.has_copy()) break;  // the cached prefix ends
    ColdFields& c = MutableCold(m->second);
    c.retention_priority = priority;
    c.priority_until = until;
    TrimCold(m->second);  // priority 0 with an infinite ttl is no retention
    // The registered copies re-ranked with the new traits by a Touch at their own last use: not
    // a use (no recency bump), and no reuse for a policy to learn (cost_aware counts a Remove
    // as one).
    TouchCandidates(*m);
    ++out.blocks;
  }
  if (out.blocks < static_cast<int64_t>(keys.size())) {
    out.result = HintOutcome::Result::kClipped;
    out.reason = absl::StrCat(out.blocks, " of ", keys.size(),
                              " blocks are cached; only those are retained");
  }
  return out;
}

absl::StatusOr<HintOutcome> KvCache::InvalidatePrefix(absl::Span<const int32_t> tokens,
                                                      int64_t from_token,
                                                      const SequenceOptions& identity) {
  Impl& I = *impl_;
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys,
                          I.hasher.BlockKeys(tokens, internal::ExtrasOf(identity)));
  if (from_token < 0) {
    HintOutcome out;
    out.result = HintOutcome::Result::kRejected;
    out.reason = absl::StrCat("from_token = ", from_token, " must be >= 0");
    return out;
  }
  Impl::CacheLock lock(I);
  return I.InvalidateKeys(keys, from_token / I.block_tokens);
}

HintOutcome KvCache::Impl::InvalidateKeys(absl::Span<const BlockKey> keys, int64_t first_block) {
  HintOutcome out;
  int64_t kept = 0;
  // Deepest first: dropping a block makes its parent a leaf, and so droppable in turn.
  for (int64_t i = static_cast<int64_t>(keys.size()) - 1; i >= first_block; --i) {
    const BlockKey key = keys[static_cast<size_t>(i)];
    bool any = false, all = true;
    for (int t = 0; t < kNumTiers; ++t) {
      auto m = blocks.find(key);
      if (m == blocks.end()) break;
      if (m->second.copies.state(static_cast<Tier>(t)) == CopyState::kAbsent) continue;
      // A registered candidate is a droppable leaf in its tier: nobody holds or reads it, it is
      // not leaving, and no child copy of it stays in that tier. A child may have a copy in
      // another tier (demoted below, or onboarded alone under exclusive tiers): then the block's
      // last copy stays (tiers are walked top down: the lowest droppable one), or the child could
      // never match.
      const uint8_t bit = static_cast<uint8_t>(1u << t);
      const bool leaf = (m->second.candidate & bit) != 0;
      if (leaf && !(IsLastCopy(m->second, t) && HasChildCopy(m->second))) {
        // Dropped unused on the caller's word: for the policy neither a reuse nor its own
        // eviction (Discard). A copy DropCopy could not drop is registered again.
        DropCandidacy(*m, static_cast<Tier>(t), /*discard=*/true);
        DropCopy(key, static_cast<Tier>(t));
        UpdateCandidate(key, static_cast<Tier>(t));
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

namespace {

// The outcome of a session hint naming no session the cache remembers.
HintOutcome UnknownSession(uint64_t session) {
  HintOutcome out;
  out.result = HintOutcome::Result::kRejected;
  out.reason = absl::StrCat("session ", session,
                            session == 0 ? " is no session"
                                         : " has no released or paused request the cache remembers");
  return out;
}

}  // namespace

absl::StatusOr<HintOutcome> KvCache::RetainSession(uint64_t session, double priority,
                                                   absl::Duration ttl) {
  Impl& I = *impl_;
  Impl::CacheLock lock(I);
  auto it = session == 0 ? I.session_blocks.end() : I.session_blocks.find(session);
  if (it == I.session_blocks.end()) return UnknownSession(session);
  return I.RetainKeys(it->second.keys, priority, ttl);
}

absl::StatusOr<HintOutcome> KvCache::InvalidateSession(uint64_t session) {
  Impl& I = *impl_;
  Impl::CacheLock lock(I);
  auto it = session == 0 ? I.session_blocks.end() : I.session_blocks.find(session);
  if (it == I.session_blocks.end()) return UnknownSession(session);
  const std::vector<BlockKey> keys = it->second.keys;
  I.ForgetSession(session);
  // Another remembered session's prompt that shares a leading run of these blocks (a system
  // prompt, a conversation forked from this one) still reads them: keep that run. Keys chain
  // over their parents, so two prompts share exactly their common leading keys.
  size_t shared = 0;
  for (const auto& [other, record] : I.session_blocks) {
    const std::vector<BlockKey>& k = record.keys;
    const auto n = std::mismatch(k.begin(), k.end(), keys.begin(), keys.end()).first - k.begin();
    shared = std::max(shared, static_cast<size_t>(n));
  }
  HintOutcome out = I.InvalidateKeys(keys, static_cast<int64_t>(shared));
  if (shared > 0) {
    const std::string kept =
        absl::StrCat("the first ", shared,
                     " blocks are kept: another session's remembered prompt starts with them");
    const bool clipped = out.result == HintOutcome::Result::kClipped;
    out.result = HintOutcome::Result::kClipped;
    out.reason = clipped ? absl::StrCat(out.reason, "; and ", kept) : kept;
  }
  return out;
}

void KvCache::Impl::RememberSession(uint64_t session, absl::Span<const BlockKey> keys,
                                    uint64_t generation) {
  ForgetSession(session);
  const uint64_t stamp = ++session_stamp;
  session_blocks[session] =
      SessionRecord{std::vector<BlockKey>(keys.begin(), keys.end()), stamp, generation};
  session_order.emplace_back(session, stamp);
  remembered_session_keys += static_cast<int64_t>(keys.size());
  // Oldest first, past either bound (entries of a session remembered again since are stale).
  while (!session_order.empty() &&
         (session_blocks.size() > static_cast<size_t>(KvCache::kRememberedSessions) ||
          remembered_session_keys > KvCache::kRememberedSessionBlocks)) {
    const auto [oldest, oldest_stamp] = session_order.front();
    session_order.pop_front();
    auto r = session_blocks.find(oldest);
    if (r != session_blocks.end() && r->second.stamp == oldest_stamp) ForgetSession(oldest);
  }
  // A session remembered again leaves a stale entry behind; compact once they outnumber the
  // live ones, so the order takes O(sessions remembered) whatever the release count.
  if (session_order.size() > 2 * session_blocks.size() + 64) {
    std::deque<std::pair<uint64_t, uint64_t>> live;
    for (const auto& [s, st] : session_order) {
      auto r = session_blocks.find(s);
      if (r != session_blocks.end() && r->second.stamp == st) live.emplace_back(s, st);
    }
    session_order = std::move(live);
  }
}

void KvCache::Impl::ForgetSession(uint64_t session) {
  auto r = session_blocks.find(session);
  if (r == session_blocks.end()) return;
  remembered_session_keys -= static_cast<int64_t>(r->second.keys.size());
  session_blocks.erase(r);
}

}  // namespace kvtier
