// Options validation: every check KvCache::Create makes on KvCacheOptions before it builds
// anything, and the option-derived parts built before the cache exists (the prefill cost model,
// one eviction policy per tier). Owns no state.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "internal/status_macros.h"
#include "internal/strings.h"
#include "kvtier/hbm_layout.h"
#include "tiers/device_pool_view.h"

namespace kvtier {
namespace {

using internal::ToAbsl;

bool Finite(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

absl::Status KvCache::Impl::ValidateOptions(const CacheNamespace& ns,
                                            const KvCacheOptions& options) {
  const KvGeometry& g = ns.geometry();
  const TierBackend* hbm = options.tiers[0].get();
  if (hbm == nullptr) return absl::InvalidArgumentError("KvCache: the HBM tier is required");
  for (int t = 0; t < kNumTiers; ++t) {
    const TierBackend* b = options.tiers[t].get();
    if (b == nullptr) continue;
    if (TierIndex(b->info().tier) != t) {
      return absl::InvalidArgumentError(absl::StrCat("KvCache: the ", b->info().name,
                                                     " backend is at the index of tier ",
                                                     ToAbsl(TierName(static_cast<Tier>(t)))));
    }
    if (b->info().block_bytes != g.bytes_per_block()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: the ", b->info().name, " tier has ", b->info().block_bytes,
                       "-byte blocks; the namespace's geometry has ", g.bytes_per_block()));
    }
  }
  if ((hbm->info().capabilities & kCapDeviceMemory) == 0 || !hbm->device_pool().has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("KvCache: the HBM tier ", hbm->info().name,
                                                   " has no device pool for block tables"));
  }
  // Equal block sizes are not enough: a pool shaped for another geometry or layout (built for
  // another namespace) would be read with this namespace's tokens_per_block and strides, past
  // its blocks, and offloaded as scrambled bytes under valid keys. A pool without addresses (a
  // metadata tier) holds no bytes to misread.
  if (const DevicePoolView pool = *hbm->device_pool(); !pool.k_base.empty()) {
    const DevicePoolView want = internal::MakeDevicePoolView(
        g, ns.options().hbm_layout, hbm->info().capacity_blocks,
        [](int) -> void* { return nullptr; }, /*host_accessible=*/false);
    if (pool.block_stride_bytes != want.block_stride_bytes ||
        pool.token_stride_bytes != want.token_stride_bytes ||
        pool.head_stride_bytes != want.head_stride_bytes ||
        pool.k_base.size() != want.k_base.size() || pool.v_base.size() != want.v_base.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: the HBM tier ", hbm->info().name, "'s pool (", pool.k_base.size(),
                       " layers; block, token and head strides ", pool.block_stride_bytes, ", ",
                       pool.token_stride_bytes, ", ", pool.head_stride_bytes,
                       " bytes) is not the namespace's geometry in its hbm_layout ",
                       HbmLayoutName(ns.options().hbm_layout), " (", want.k_base.size(),
                       " layers; ", want.block_stride_bytes, ", ", want.token_stride_bytes, ", ",
                       want.head_stride_bytes, " bytes): build the tier stack for this namespace"));
    }
  }
  if (!options.make_eviction_policy && options.eviction_policy != "lru" &&
      options.eviction_policy != "cost_aware" && options.eviction_policy != "reuse_index" &&
      options.eviction_policy != "learned") {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: eviction_policy \"", options.eviction_policy,
                     "\" is not one of \"lru\", \"cost_aware\", \"reuse_index\", \"learned\""));
  }
  if (options.write_policy != WritePolicy::kWriteBack &&
      options.write_policy != WritePolicy::kWriteThrough) {
    return absl::InvalidArgumentError("KvCache: unknown write_policy");
  }
  if (options.inclusion != TierInclusion::kInclusive &&
      options.inclusion != TierInclusion::kExclusive) {
    return absl::InvalidArgumentError("KvCache: unknown inclusion");
  }
  if (options.inclusion == TierInclusion::kExclusive &&
      options.write_policy == WritePolicy::kWriteThrough) {
    return absl::InvalidArgumentError(
        "KvCache: exclusive tiers cannot be written through (write-through keeps two copies)");
  }
  if (options.admit_after_uses[0] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: admit_after_uses[hbm] = ", options.admit_after_uses[0],
                     " must be 1: every block starts in HBM"));
  }
  for (int t = 1; t < kNumTiers; ++t) {
    if (options.admit_after_uses[t] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: admit_after_uses[", ToAbsl(TierName(static_cast<Tier>(t))),
                       "] = ", options.admit_after_uses[t], " must be >= 1"));
    }
  }
  for (int t = 1; t < kNumTiers; ++t) {
    const TierLinkCost& l = options.links[t];
    if (!Finite(l.bytes_per_second) || l.latency < absl::ZeroDuration() ||
        l.latency == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: links[", ToAbsl(TierName(static_cast<Tier>(t))),
                       "] needs a positive finite "
                       "bandwidth (",
                       l.bytes_per_second, " B/s) and a finite latency >= 0"));
    }
  }
  if (options.event_buffer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: event_buffer = ", options.event_buffer, " must be >= 1"));
  }
  if (options.worker_id.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCache: worker_id is ", options.worker_id.size(), " bytes; at most 256 are allowed"));
  }
  if (options.room_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCache: room_wait = ", absl::FormatDuration(options.room_wait), " must not be negative"));
  }
  if (options.bounce_buffers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: bounce_buffers = ", options.bounce_buffers, " must be >= 1"));
  }
  if (options.remote_probe_window_blocks < 0 || options.remote_probe_window_blocks > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: remote_probe_window_blocks = ", options.remote_probe_window_blocks,
                     " must be in [0, 4096] (0: no remote discovery)"));
  }
  if (options.remote_probe_window_blocks > 0 &&
      (options.remote_probe_timeout <= absl::ZeroDuration() ||
       options.remote_probe_timeout == absl::InfiniteDuration())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvCache: remote_probe_timeout = ", absl::FormatDuration(options.remote_probe_timeout),
        " must be positive and finite (a probe never waits without bound)"));
  }
  if (!options.prefill_cost.has_value() && KnownModelCost(ns.options().model_id).has_value() &&
      !Finite(options.prefill_flops_per_second)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvCache: prefill_flops_per_second = ", options.prefill_flops_per_second,
                     " must be positive and finite"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<PrefillCostModel>> KvCache::Impl::MakeCostModel(
    const CacheNamespace& ns, const KvCacheOptions& options) {
  std::optional<PrefillCostModel> cost;
  if (options.prefill_cost.has_value()) {
    KVTIER_ASSIGN_OR_RETURN(PrefillCostModel model,
                            PrefillCostModel::Create(*options.prefill_cost));
    cost = model;
  } else if (auto known = KnownModelCost(ns.options().model_id); known.has_value()) {
    // ValidateOptions checked the rate.
    known->flops_per_second = options.prefill_flops_per_second;
    KVTIER_ASSIGN_OR_RETURN(PrefillCostModel model, PrefillCostModel::Create(*known));
    cost = model;
  }
  return cost;
}

absl::StatusOr<KvCache::Impl::Policies> KvCache::Impl::MakePolicies(const KvCacheOptions& options) {
  Policies policies;
  // A learned tier's shadows model the stack down to it (the sum of the capacities: at most
  // that many distinct blocks, fewer where tiers are inclusive): what a lower tier keeps decides
  // the hits of it and the tiers above together, and its shadows see every request, as the top's
  // do. Sized to the tier alone, a small DRAM tier under a large HBM simulated a cache smaller
  // than HBM, at a larger sample than HBM's (docs/performance.md, "Cost").
  int64_t stack_blocks = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    if (options.tiers[t] == nullptr) continue;
    const int64_t tier_blocks = std::max<int64_t>(0, options.tiers[t]->info().capacity_blocks);
    stack_blocks = tier_blocks > std::numeric_limits<int64_t>::max() - stack_blocks
                       ? std::numeric_limits<int64_t>::max()
                       : stack_blocks + tier_blocks;
    if (options.make_eviction_policy) {
      const Tier tier = static_cast<Tier>(t);
      absl::StatusOr<std::unique_ptr<EvictionPolicy>> made =
          options.make_eviction_policy(tier, stack_blocks);
      if (!made.ok() || *made == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KvCache: make_eviction_policy gave no policy for the ", std::string(TierName(tier)),
            " tier", made.ok() ? std::string() : absl::StrCat(": ", made.status().message())));
      }
      policies[t] = *std::move(made);
    } else if (options.eviction_policy == "lru") {
      policies[t] = MakeLruPolicy();
    } else if (options.eviction_policy == "learned") {
      KVTIER_ASSIGN_OR_RETURN(
          policies[t], MakeLearnedPolicy(std::max<int64_t>(1, stack_blocks), options.reuse_index));
    } else if (options.eviction_policy == "reuse_index") {
      KVTIER_ASSIGN_OR_RETURN(policies[t], MakeReuseIndexPolicy(options.reuse_index));
    } else {
      KVTIER_ASSIGN_OR_RETURN(policies[t], MakeCostAwarePolicy(options.cost_aware));
    }
  }
  return policies;
}

}  // namespace kvtier
