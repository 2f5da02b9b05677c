// One simulated cache tier of dense block keys, with KvCache's candidacy rule and traits: the
// part the policy simulators (policy_sim.h: the bounds' model; release_model.h: the reference
// script's release model) share. The simulator owning it decides when blocks are cached, pinned
// and evicted; SimTier keeps the policy's candidate set in line with the shipped rule
// (kvtier/eviction_candidacy.h: IsEvictionCandidate, SyncCandidacy), where a cached block is
// ready, a pinned one is held and nothing is ever leaving, so a candidate is a cached, unpinned
// block with no cached child.
//
// Traits are KvCache's (CandidateTraits): expected_reuse = max(1, uses), bytes = block_bytes,
// parent = the block before it, run_blocks = it and the parents before it with its use count (at
// most 32; only for a policy that reads_run_blocks()), no retention priority, recompute_seconds 0.
// Block keys handed to the policy are SimBlockKey(dense key).
//
// Thread safety: none; one simulator owns it.
#ifndef KVTIER_BENCH_REPLAY_OFFLINE_SIM_TIER_H_
#define KVTIER_BENCH_REPLAY_OFFLINE_SIM_TIER_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvtier/block_key.h"
#include "kvtier/eviction_policy.h"

namespace kvtier::replay {

// The BlockKey the simulators give the block of dense key `key`: hi = key, lo = a fixed mix of
// it (splitmix64's), since hash tables of BlockKeys hash `lo` only.
BlockKey SimBlockKey(uint32_t key);

inline constexpr uint32_t kSimNoParent = std::numeric_limits<uint32_t>::max();

// Per dense key: what the candidacy rule and the traits read. The parent is fixed by the trace.
struct SimBlock {
  uint32_t parent = kSimNoParent;
  uint32_t cached_children = 0;
  uint32_t uses = 0;
  absl::Time last_use = absl::InfinitePast();
  bool cached = false;
  bool pinned = false;
  bool registered = false;  // a candidate with the policy
};

class SimTier {
 public:
  // `policy` must outlive the tier; `block_bytes` > 0 is BlockTraits::bytes.
  SimTier(EvictionPolicy& policy, int64_t block_bytes, uint32_t num_keys)
      : policy_(policy), block_bytes_(block_bytes), blocks_(num_keys) {}

  SimBlock& block(uint32_t key) { return blocks_[key]; }
  EvictionPolicy& policy() { return policy_; }
  // Blocks cached, pinned or not.
  int64_t cached() const { return cached_; }

  // Caches `key` (which is not cached), counts it as its parent's cached child and brings the
  // parent's candidacy up to date. The caller sets pinned, uses and last_use and then calls
  // Update(key).
  absl::Status Cache(uint32_t key);

  // A fact of `key` changed: its candidacy follows the shipped rule (Add or Remove with the
  // policy as needed). Errors: the policy's failed Add or Remove.
  absl::Status Update(uint32_t key);

  // Asks the policy for a victim at `now` and evicts it (its parent may become a candidate).
  // Returns the evicted key. kInternal when the policy has no victim or names a non-candidate;
  // the policy's own error when it fails the Remove or an Add this causes.
  absl::StatusOr<uint32_t> EvictOne(absl::Time now);

 private:
  EvictionPolicy& policy_;
  const int64_t block_bytes_;
  std::vector<SimBlock> blocks_;
  int64_t cached_ = 0;
};

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_OFFLINE_SIM_TIER_H_
