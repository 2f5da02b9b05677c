// Block chains (block_chains.h): a trace's prompts as chains of block ids, parent first.
#include "bench/replay/offline/block_chains.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier::replay {
namespace {

constexpr uint32_t kNoParent = std::numeric_limits<uint32_t>::max();

}  // namespace

absl::StatusOr<BlockChains> BuildBlockChains(const Trace& trace, int tokens_per_block) {
  if (trace.block_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace block_tokens is ", trace.block_tokens, "; want > 0"));
  }
  if (tokens_per_block <= 0 || trace.block_tokens % tokens_per_block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tokens_per_block ", tokens_per_block,
                                                   " does not divide the trace's block_tokens ",
                                                   trace.block_tokens));
  }
  if (trace.requests.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("trace has ", trace.requests.size(), " requests; at most 2^31 - 2"));
  }
  const int64_t block_tokens = trace.block_tokens;
  const int64_t subs = block_tokens / tokens_per_block;  // cache blocks per trace block

  absl::flat_hash_map<uint64_t, uint32_t> dense_of;
  std::vector<uint32_t> depth_of;      // per dense id: its position in every chain
  std::vector<uint32_t> parent_of;     // per dense id: the dense id before it, or kNoParent
  std::vector<int64_t> full_subs_of;   // per dense id: most full cache blocks seen in it
  std::vector<uint32_t> dense_blocks;  // per trace block of every prompt, in trace order
  int64_t total_full = 0;
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const TraceRequest& request = trace.requests[r];
    if (request.input_tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", r, ": input_tokens ", request.input_tokens, " is negative"));
    }
    const int64_t want_ids = (request.input_tokens + block_tokens - 1) / block_tokens;
    if (static_cast<int64_t>(request.block_ids.size()) != want_ids) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", r, ": ", request.block_ids.size(), " block_ids for ", request.input_tokens,
          " input_tokens at ", block_tokens, " tokens per trace block; want ", want_ids));
    }
    const int64_t full = request.input_tokens / tokens_per_block;
    total_full += full;
    uint32_t parent = kNoParent;
    for (size_t p = 0; p < request.block_ids.size(); ++p) {
      const uint64_t id = request.block_ids[p];
      auto [it, inserted] = dense_of.try_emplace(id, static_cast<uint32_t>(depth_of.size()));
      const uint32_t dense = it->second;
      if (inserted) {
        if (depth_of.size() >= std::numeric_limits<uint32_t>::max() - 1) {
          return absl::ResourceExhaustedError("trace has 2^32 - 1 distinct block ids or more");
        }
        depth_of.push_back(static_cast<uint32_t>(p));
        parent_of.push_back(parent);
        full_subs_of.push_back(0);
      } else if (depth_of[dense] != p) {
        return absl::InvalidArgumentError(
            absl::StrCat("request ", r, ": block_ids[", p, "] = ", id, " was at position ",
                         depth_of[dense], " in an earlier request (an id names its prefix)"));
      } else if (parent_of[dense] != parent) {
        return absl::InvalidArgumentError(absl::StrCat(
            "request ", r, ": block_ids[", p, "] = ", id,
            " follows a different id than in an earlier request (an id names its prefix)"));
      }
      const int64_t full_here = std::clamp<int64_t>(full - static_cast<int64_t>(p) * subs, 0, subs);
      full_subs_of[dense] = std::max(full_subs_of[dense], full_here);
      dense_blocks.push_back(dense);
      parent = dense;
    }
  }

  std::vector<int64_t> base(full_subs_of.size());
  int64_t num_keys = 0;
  for (size_t d = 0; d < full_subs_of.size(); ++d) {
    base[d] = num_keys;
    num_keys += full_subs_of[d];
  }
  if (num_keys >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) {
    return absl::ResourceExhaustedError(absl::StrCat("trace has ", num_keys,
                                                     " distinct cache blocks at ", tokens_per_block,
                                                     " tokens per block; at most 2^32 - 2"));
  }

  BlockChains chains;
  chains.tokens_per_block = tokens_per_block;
  chains.num_keys = static_cast<uint32_t>(num_keys);
  chains.offset.reserve(trace.requests.size() + 1);
  chains.keys.reserve(static_cast<size_t>(total_full));
  size_t next_block = 0;
  for (const TraceRequest& request : trace.requests) {
    chains.offset.push_back(static_cast<int64_t>(chains.keys.size()));
    const int64_t full = request.input_tokens / tokens_per_block;
    for (int64_t j = 0; j < full; ++j) {
      chains.keys.push_back(
          static_cast<uint32_t>(base[dense_blocks[next_block + j / subs]] + j % subs));
    }
    next_block += request.block_ids.size();
  }
  chains.offset.push_back(static_cast<int64_t>(chains.keys.size()));
  return chains;
}

}  // namespace kvtier::replay
