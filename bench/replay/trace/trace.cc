// The trace model (trace.h): requests, sessions, and the token ids a block id stands for.
#include "bench/replay/trace/trace.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench/replay/trace/replay_math.h"

namespace kvtier::replay {
namespace {

constexpr uint64_t kTokenIdLimit = (uint64_t{1} << 31) - 1;  // token ids in [0, 2^31 - 1)

}  // namespace

int32_t DeriveTokenId(uint64_t block_id, int position) {
  // Mixing the id first, then the position, keeps (id, position) and (id + 1, position - 1) apart,
  // which a single mix of a sum would not.
  const uint64_t mixed = SplitMix64(SplitMix64(block_id) + static_cast<uint32_t>(position));
  return static_cast<int32_t>(mixed % kTokenIdLimit);
}

std::vector<int32_t> PromptTokens(const TraceRequest& request, int block_tokens) {
  std::vector<int32_t> tokens;
  if (block_tokens <= 0 || request.input_tokens <= 0) return tokens;
  // A request with fewer ids than its length needs (never one a loader returns) yields only the
  // tokens its ids cover, rather than reading past them.
  const int64_t covered = std::min<int64_t>(
      request.input_tokens, static_cast<int64_t>(request.block_ids.size()) * block_tokens);
  tokens.reserve(static_cast<size_t>(covered));
  for (int64_t i = 0; i < covered; ++i) {
    const uint64_t id = request.block_ids[static_cast<size_t>(i / block_tokens)];
    tokens.push_back(DeriveTokenId(id, static_cast<int>(i % block_tokens)));
  }
  return tokens;
}

}  // namespace kvtier::replay
