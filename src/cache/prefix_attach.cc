// Prefix attach: the restore-versus-recompute inputs AttachPrefix plans with (the links' cost,
// with bandwidths measured by the transfer engine).
#include "cache/kv_cache_impl.h"

namespace kvtier {

std::array<TierLinkCost, kNumTiers> KvCache::Impl::CurrentLinks() const {
  std::array<TierLinkCost, kNumTiers> l = links;
  if (!measure_bandwidth) return l;
  for (int t = 1; t < kNumTiers; ++t) {
    if (tiers[t] == nullptr) continue;
    const double bw = engine->stats(static_cast<Tier>(t), Tier::kHbm).bandwidth_bytes_per_second;
    if (bw > 0) l[t].bytes_per_second = bw;
  }
  return l;
}

}  // namespace kvtier
