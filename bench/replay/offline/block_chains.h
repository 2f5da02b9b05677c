// A Trace's prompts as chains of dense cache-block keys, shared by the offline bounds
// (bounds.h) and the policy simulator (policy_sim.h), so both see exactly the same blocks.
//
// A trace block (of Trace::block_tokens tokens) splits into block_tokens / tokens_per_block cache
// blocks; a cache block is named by (trace block id, index within the trace block) alone, because
// a trace id names its whole prefix. A request's chain is its floor(input_tokens /
// tokens_per_block) full cache blocks; the partial last one is never part of it.
//
// Thread safety: BuildBlockChains is pure; a BlockChains is a plain value.
#ifndef KVTIER_BENCH_REPLAY_OFFLINE_BLOCK_CHAINS_H_
#define KVTIER_BENCH_REPLAY_OFFLINE_BLOCK_CHAINS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {

// Every full cache block of every prompt, in trace order, as a dense key in [0, num_keys).
struct BlockChains {
  int tokens_per_block = 0;
  // Request r's chain is keys[offset[r] .. offset[r + 1]); position in the chain = depth, so
  // keys[offset[r] + j - 1] is the parent of keys[offset[r] + j] in every chain holding it.
  std::vector<int64_t> offset;  // requests + 1 entries
  std::vector<uint32_t> keys;
  uint32_t num_keys = 0;
};

// Validates the trace and numbers its cache blocks. A trace id gets a dense index on first
// sight; its cache blocks get consecutive keys from a base, as many as the most full cache
// blocks any prompt has in it (always its leading ones), so keys stay dense even at a fine
// tokens_per_block where most trace blocks end partial.
//
// Errors, all kInvalidArgument with the request index and field named:
//   - trace.block_tokens <= 0, tokens_per_block <= 0, or tokens_per_block does not divide
//     trace.block_tokens;
//   - a request with negative input_tokens, or whose block_ids count is not
//     ceil(input_tokens / block_tokens);
//   - ids that cannot name whole prefixes: one id at two positions, or after two different ids.
// kResourceExhausted when the trace has 2^31 requests or 2^32 distinct cache blocks or more.
absl::StatusOr<BlockChains> BuildBlockChains(const Trace& trace, int tokens_per_block);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_OFFLINE_BLOCK_CHAINS_H_
