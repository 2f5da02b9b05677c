// Eviction candidacy: which cached copies of a tier are eviction candidates (the leaf-first rule,
// DESIGN.md section 7) and what a tier's EvictionPolicy is told of one (BlockTraits). KvCache
// (src/cache/eviction_candidates.cc) and the policy simulator (bench/replay/offline/policy_sim.h)
// both call these functions, so a simulated figure is a figure of the rule that ships.
//
// The rule. A copy of a block in one tier is a candidate iff it is ready (written, readable),
// nobody holds it (no sequence or ticket holds it, no transfer reads it), it is not being
// demoted away (leaving), and every copy of its children in that tier is gone or leaving: a child
// without its parent can never be hit, so a parent waits for its children, but not for children
// already on their way down. So a copy becomes a candidate when it is released with no child copy
// there, or when its last child copy there is evicted (or starts leaving) while nobody holds it;
// it stops being one when it is used again (hit, pinned), gains a child copy, or is evicted.
//
// The caller owns every block and its facts (this component owns none): whenever a fact of a copy
// changes it asks IsEvictionCandidate again and brings the tier's policy in line with
// SyncCandidacy, keeping one "registered" bit per copy.
//
// Thread-safety: IsEvictionCandidate and CandidateTraits are pure (but for the lookups and the
// policy's const reads_run_blocks()); SyncCandidacy calls the policy, so its caller serializes as
// EvictionPolicy requires.
#ifndef KVTIER_EVICTION_CANDIDACY_H_
#define KVTIER_EVICTION_CANDIDACY_H_

#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvtier/block_key.h"
#include "kvtier/eviction_policy.h"

namespace kvtier {

// What a block's ranking is made from: the same in every tier.
struct CandidateFacts {
  uint32_t uses = 0;              // its first write plus the hits on it since
  double retention_priority = 0;  // >= 0, while priority_until lasts (BlockTraits)
  absl::Time priority_until = absl::InfinitePast();
  BlockKey parent = kRootBlockKey;             // the block before it (kRootBlockKey: none)
  absl::Time last_use = absl::InfinitePast();  // the policy's "last touched" (Add's `now`)
};

// The facts of the block of `key`, or nullopt if the caller no longer knows it. Asked for the
// parents CandidateTraits walks.
using CandidateFactsLookup = absl::FunctionRef<std::optional<CandidateFacts>(const BlockKey&)>;

// BlockTraits::run_blocks is counted up to this (the block and at most 31 parents).
inline constexpr int kMaxRunBlocks = 32;

// What `policy` is told of the block of facts `block`, `bytes` bytes in the policy's tier (> 0):
//   expected_reuse      max(1, uses)
//   bytes, retention_priority, priority_until, parent   as given
//   recompute_seconds   0: no policy weighs it (eviction_policy.h)
//   run_blocks          1 plus the parents before it, walked through `facts_of`, whose use count
//                       equals its own, stopping at the first that differs, is unknown (nullopt)
//                       or is the root, and at kMaxRunBlocks in all. Only walked when
//                       policy.reads_run_blocks(); 1 otherwise.
// `facts_of` is called only during the call, at most kMaxRunBlocks - 1 times.
BlockTraits CandidateTraits(const EvictionPolicy& policy, const CandidateFacts& block,
                            int64_t bytes, CandidateFactsLookup facts_of);

// What one tier knows of one copy of a block, but for whether somebody holds it.
struct CopyFacts {
  bool ready = false;             // written and readable (not absent, not still being written)
  bool leaving = false;           // being demoted away: dropped once its demotion lands
  uint32_t child_copies = 0;      // copies of its children in this tier
  uint32_t leaving_children = 0;  // of those, the ones leaving; <= child_copies
};

// The leaf-first rule above: ready, not leaving, every child copy leaving (child_copies ==
// leaving_children), and not held. `held` is a callable () -> bool, whether any sequence, ticket
// or reader holds the copy; it is called last, and only when the other facts allow candidacy, so
// a caller may compute it where that costs (KvCache reads the slot's state under the transfer
// engine's lock).
template <typename Held>
bool IsEvictionCandidate(const CopyFacts& copy, Held&& held) {
  return copy.ready && !copy.leaving && copy.child_copies == copy.leaving_children && !held();
}

// Brings `key`'s registration with `policy` in line with `candidate` (IsEvictionCandidate's
// answer). `*registered` is whether it is registered now, and is updated:
//   candidate, not registered   policy.Add(key, CandidateTraits(policy, block, bytes, facts_of),
//                               block.last_use); registered iff that succeeded
//   registered, not candidate   policy.Remove(key); no longer registered, whatever it answered
//   otherwise                   nothing is called
// Returns the status of the Add or Remove made (OK if none): the policy's errors (kAlreadyExists,
// kNotFound, kInvalidArgument for traits out of range). `facts_of` as for CandidateTraits.
absl::Status SyncCandidacy(EvictionPolicy& policy, const BlockKey& key, bool candidate,
                           const CandidateFacts& block, int64_t bytes,
                           CandidateFactsLookup facts_of, bool* registered);

}  // namespace kvtier

#endif  // KVTIER_EVICTION_CANDIDACY_H_
