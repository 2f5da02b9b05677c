// A fast simulator of one EvictionPolicy over a Trace, under exactly the model of the offline
// bounds (bounds.h), so a policy's hits can be set beside UnlimitedBound and OptimalBound
// without a KvCache: seconds for the whole Mooncake trace.
//
// The model (bounds.h's, with the policy choosing the victims). Requests are taken one at a time,
// in trace order, each at time UnixEpoch + arrival_seconds. For each request:
//   0. observe: a policy that observes_requests() is given the chain (ObserveRequest, as
//      KvCache gives it a prompt's full blocks);
//   1. lookup: its hit is the longest leading run of its chain (block_chains.h) that is cached;
//      the hit blocks are used: uses + 1, last use = now, and they are pinned (a block that was
//      an eviction candidate is Removed from the policy);
//   2. insert: the first min(chain, capacity_blocks) blocks of the chain are cached and pinned
//      (the rest was computed but cannot be kept). Each new block has uses 1 and last use now;
//      while the cache holds capacity_blocks blocks, the policy's Victim(now) is Removed and
//      evicted;
//   3. release: the chain's blocks are unpinned at the same time now.
// Candidates are what KvCache makes them, decided by the same code (sim_tier.h, over
// kvtier/eviction_candidacy.h): a cached, unpinned block with no cached child. The rule is asked
// again for each block whose facts change (hit, inserted, a child inserted, released, evicted, a
// child evicted), so a block becomes a candidate (Add, touched at its last use) when it is released
// without a cached child or when its last cached child is evicted while it is not pinned, and stops
// being one (Remove) when it is hit or evicted. A non-candidate is never evicted, and a full cache
// always has a candidate outside the current chain (any unpinned cached block has an unpinned leaf
// below it), so the policy only chooses among valid victims.
//
// Traits are KvCache's (CandidateTraits): expected_reuse = max(1, uses), bytes = bytes_per_token
// x tokens_per_block, parent = the block before it, run_blocks = it and the parents before it with
// its use count (at most 32; only for a policy that reads_run_blocks()), no retention priority,
// recompute_seconds 0 (no policy weighs it). Block keys handed to the policy are
// SimBlockKey(dense key).
//
// Thread safety: SimulatePolicy uses only its arguments; the policy must not be used by another
// thread during the call.
#ifndef KVTIER_BENCH_REPLAY_OFFLINE_POLICY_SIM_H_
#define KVTIER_BENCH_REPLAY_OFFLINE_POLICY_SIM_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "bench/replay/offline/bounds.h"
#include "bench/replay/offline/sim_tier.h"
#include "bench/replay/trace/trace.h"
#include "kvtier/block_key.h"
#include "kvtier/eviction_policy.h"

namespace kvtier::replay {

// The simulator's default block size: the KV bytes per token of Llama-3.1-70B from the library's
// table (cost_model.h KnownModels) in bf16, 327,680.
int64_t DefaultSimBytesPerToken();

struct PolicySimOptions {
  int tokens_per_block = 512;   // cache granularity; divides the trace's block_tokens
  int64_t capacity_blocks = 0;  // >= 0
  int64_t bytes_per_token = DefaultSimBytesPerToken();  // > 0: BlockTraits::bytes per token
};

// The hits of `policy` (which should start empty) over `trace`, as a BoundResult named after the
// policy, with capacity_blocks set. The policy ends holding the candidates left at the end.
//
// Errors: those of BuildBlockChains (kInvalidArgument, kResourceExhausted); kInvalidArgument for
// capacity_blocks < 0 or bytes_per_token <= 0; kInternal naming the request when the policy
// misbehaves (fails an Add or Remove the model makes, returns no victim while the cache is full, or
// a victim that is not a candidate).
absl::StatusOr<BoundResult> SimulatePolicy(const Trace& trace, EvictionPolicy& policy,
                                           const PolicySimOptions& options);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_OFFLINE_POLICY_SIM_H_
