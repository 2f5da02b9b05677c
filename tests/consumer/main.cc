// Links against the installed kvtier and checks a real value: Llama-3.1-8B's 128 KiB per token
// and a two-block prefix match. Then builds a KvCache over tiers built by the tier stack builder
// (layer stack: emulated HBM and DRAM from tiers, a remote tier from remote) and probes the CUDA
// tier, so every installed layer library is linked, in the package's order.
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "kvtier/block_index.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/cuda_hbm.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/prefix_hasher.h"
#include "kvtier/tier_stack.h"

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
                           kvtier::CopyState::kReady).ok()) {
      return 6;
    }
  }
  auto match = (*index)->Match(*keys, 40);
  if (!match.ok() || match->matched_tokens != 32) return 7;
  std::printf("consumer: %lld tokens matched\n", static_cast<long long>(match->matched_tokens));

  // Without a GPU (or CUDA) this is an error, with one a tier: either way the symbol links.
  const bool cuda_tier = kvtier::CudaHbm::Create(*geometry, {.capacity_blocks = 4}).ok();
  kvtier::TierStackOptions stack;
  for (kvtier::Tier t : {kvtier::Tier::kHbm, kvtier::Tier::kDram, kvtier::Tier::kRemote}) {
    stack.tiers[kvtier::TierIndex(t)].capacity_blocks = 8;
  }
  stack.dram.try_huge_pages = false;
  stack.dram.prefault = false;
  stack.remote.transport = std::make_shared<kvtier::InProcessTransport>();
  auto tiers = kvtier::BuildTierStack(*ns, stack);
  if (!tiers.ok()) return 8;
  kvtier::KvCacheOptions options;
  options.tiers = std::move(*tiers);
  auto cache = kvtier::KvCache::Create(*ns, std::move(options));
  if (!cache.ok()) return 9;
  if (!(*cache)->CreateSequence(kvtier::SequenceId(1)).ok()) return 10;
  std::printf("consumer: KvCache over emulated HBM, DRAM and remote tiers (CUDA tier: %s)\n",
              cuda_tier ? "created" : "not here");
  return 0;
}
