// Offline bounds on prefix-cache hits over a Trace: what no cache policy can beat, computed
// without a KvCache, for the replay harness to print beside the policies it runs (`--compare`).
//
// The model. The cache holds cache blocks of `tokens_per_block` tokens; a trace block (of
// Trace::block_tokens tokens) splits into block_tokens / tokens_per_block cache blocks, and a
// cache block is named by (trace block id, index within the trace block) alone, because a trace
// id names its whole prefix. Requests are taken one at a time, in trace order. A request's
// prompt has floor(input_tokens / tokens_per_block) full cache blocks, its chain; the partial
// last one is never looked up, never inserted and never counts. For each request:
//   1. lookup: its hit is the longest leading run of its chain present in the cache (a gap ends
//      it: a block after a missing one is recomputed anyway);
//   2. insert: it computed or read every block of its chain, so they all enter the cache, and a
//      bound with finite capacity evicts other blocks to make room.
// hit tokens = hit blocks x tokens_per_block.
//
// Thread safety: the functions are pure; call them from any thread. The Trace is only read.
#ifndef KVTIER_BENCH_REPLAY_OFFLINE_BOUNDS_H_
#define KVTIER_BENCH_REPLAY_OFFLINE_BOUNDS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {

// What one bound achieves over a whole trace.
struct BoundResult {
  std::string name;                        // "unlimited" or "optimal"
  int tokens_per_block = 0;                // the cache granularity the bound was computed at
  std::optional<int64_t> capacity_blocks;  // in cache blocks; nullopt for "unlimited"
  int64_t requests = 0;
  int64_t prompt_tokens = 0;   // sum of input_tokens, partial last blocks included
  int64_t queried_blocks = 0;  // full cache blocks looked up, sum over requests
  int64_t hit_blocks = 0;      // of those, hits (leading runs)
  int64_t hit_tokens = 0;      // hit_blocks x tokens_per_block
  double hit_ratio = 0;        // hit_tokens / prompt_tokens; 0 when prompt_tokens is 0
  // hit tokens of each request, indexed like Trace::requests (for modeled TTFT).
  std::vector<int64_t> hit_tokens_per_request;
};

// The bookkeeping every simulator over a Trace shares (the bounds here, policy_sim.h,
// release_model.h), so hit ratios are counted one way.
//
// A result named `name` for `trace` at `tokens_per_block`: requests and prompt_tokens summed over
// the whole trace, hit_tokens_per_request sized to it and zero, no hits yet.
BoundResult NewBoundResult(std::string name, const Trace& trace, int tokens_per_block);
// Request `request` (an index into the trace, < result.requests) looked up `chain_blocks` full
// cache blocks and hit the first `hit_blocks` of them.
void RecordRequestHits(BoundResult& result, size_t request, int64_t chain_blocks,
                       int64_t hit_blocks);
// Sets hit_tokens and hit_ratio from the recorded hits; call once, after the last request.
void FinishBoundResult(BoundResult& result);

// The hits of an infinite cache: a request hits the longest leading run of its chain made of
// cache blocks that any earlier request had in its chain. Time O(Q) and memory O(Q + B), where
// Q is the number of full cache blocks over all prompts and B the distinct ones.
//
// Errors, all kInvalidArgument with the request index and field named:
//   - trace.block_tokens <= 0, tokens_per_block <= 0, or tokens_per_block does not divide
//     trace.block_tokens;
//   - a request with negative input_tokens, or whose block_ids count is not
//     ceil(input_tokens / block_tokens);
//   - ids that cannot name whole prefixes: one id at two positions, or after two different ids.
// kResourceExhausted when the trace has 2^31 requests or 2^32 distinct cache blocks or more.
absl::StatusOr<BoundResult> UnlimitedBound(const Trace& trace, int tokens_per_block);

// The most hits any cache of `capacity_blocks` cache blocks can get on this trace, under the
// model above with one constraint every real cache shares (a running request holds its blocks):
// after a request, the cache holds its chain, or the first capacity_blocks blocks of a chain
// longer than the capacity (the rest was computed but cannot be kept; a deeper block without its
// parent could never be hit anyway), and at most capacity_blocks blocks in all.
//
// The schedule is offline furthest-next-use (Belady) eviction: to insert a block into a full
// cache, evict the cached block, not in the current request's chain, whose next use (the index
// of the next request whose chain contains it; never = infinity) is furthest; on a tie, the
// deeper block (larger position in its chain) first. A block's parent is in every chain that
// holds the block, so its next use is never later; with deeper-first ties a parent therefore
// never leaves before its child, the cached set stays prefix-closed, every cached block of a
// chain's leading run is a hit, and furthest-next-use, optimal for blocks present, is the exact
// optimum for prefix hits (tests/unit/replay/offline/bounds_test.cc checks it against an
// exhaustive search). Exact only for traces whose ids name whole prefixes, which is checked.
// Blocks never used again leave before all others, in an unspecified but deterministic order:
// none of them can hit again, so it changes no count.
//
// Capacity 0 gives no hits. A capacity of at least the number of distinct cache blocks gives
// UnlimitedBound's result. Time O(Q log Q), memory O(Q + B) (Q and B as above).
//
// Errors: those of UnlimitedBound, and kInvalidArgument when capacity_blocks < 0.
absl::StatusOr<BoundResult> OptimalBound(const Trace& trace, int tokens_per_block,
                                         int64_t capacity_blocks);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_OFFLINE_BOUNDS_H_
