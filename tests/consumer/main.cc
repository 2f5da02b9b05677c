// Links against the installed kvtier and checks a real value: Llama-3.1-8B's 128 KiB per token
// and a two-block prefix match.
#include <cstdio>
#include <vector>

#include "kvtier/block_index.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/prefix_hasher.h"

int main() {
  auto geometry = kvtier::KvGeometry::Create(
      {.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .tokens_per_block = 16});
  if (!geometry.ok() || geometry->bytes_per_token() != 131072) return 1;
  auto ns = kvtier::CacheNamespace::Create(
      *geometry, {.model_id = "meta-llama/Llama-3.1-8B", .weights_fingerprint = "consumer"});
  if (!ns.ok()) return 2;
  auto hasher = kvtier::PrefixHasher::Create(*ns);
  if (!hasher.ok()) return 3;
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[i] = i;
  auto keys = hasher->BlockKeys(tokens);
  if (!keys.ok() || keys->size() != 2) return 4;
  auto index = kvtier::BlockIndex::Create(16);
  if (!index.ok()) return 5;
  for (uint32_t i = 0; i < keys->size(); ++i) {
    if (!(*index)->AddCopy((*keys)[i], kvtier::Tier::kHbm, kvtier::SlotId(i),
                           kvtier::CopyState::kReady, 0).ok()) {
      return 6;
    }
  }
  auto match = (*index)->Match(*keys, 40);
  if (!match.ok() || match->matched_tokens != 32) return 7;
  std::printf("consumer: %lld tokens matched\n", static_cast<long long>(match->matched_tokens));
  return 0;
}
