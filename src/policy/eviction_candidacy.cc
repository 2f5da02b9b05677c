// Eviction candidacy (eviction_candidacy.h): the traits a candidate is ranked with, and keeping a
// policy's candidates in line with the leaf-first rule.
#include "kvtier/eviction_candidacy.h"

#include <algorithm>
#include <optional>

namespace kvtier {

BlockTraits CandidateTraits(const EvictionPolicy& policy, const CandidateFacts& block,
                            int64_t bytes, CandidateFactsLookup facts_of) {
  BlockTraits t;
  t.expected_reuse = std::max<double>(1.0, block.uses);
  t.bytes = bytes;
  t.retention_priority = block.retention_priority;
  t.priority_until = block.priority_until;
  t.parent = block.parent;
  if (!policy.reads_run_blocks()) return t;
  // cost_aware's class: how many blocks before it share its use count (the turn that wrote it
  // added about that many).
  for (BlockKey p = block.parent; p != kRootBlockKey && t.run_blocks < kMaxRunBlocks;) {
    const std::optional<CandidateFacts> f = facts_of(p);
    if (!f.has_value() || f->uses != block.uses) break;
    ++t.run_blocks;
    p = f->parent;
  }
  return t;
}

absl::Status SyncCandidacy(EvictionPolicy& policy, const BlockKey& key, bool candidate,
                           const CandidateFacts& block, int64_t bytes,
                           CandidateFactsLookup facts_of, bool* registered) {
  if (candidate == *registered) return absl::OkStatus();
  if (candidate) {
    absl::Status s =
        policy.Add(key, CandidateTraits(policy, block, bytes, facts_of), block.last_use);
    *registered = s.ok();
    return s;
  }
  *registered = false;
  return policy.Remove(key);
}

}  // namespace kvtier
