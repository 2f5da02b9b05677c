// The C ABI's long-lived handles: namespace, tier stack and cache, created and destroyed.
#include <memory>
#include <utility>

#include "capi/handles.h"

using namespace kvtier;  // NOLINT: the C entry points below spell every kvtier type
using kvtier::capi::Guard;
using kvtier::capi::Null;

extern "C" {

kvtier_status_code kvtier_namespace_create(const kvtier_geometry_options* geometry,
                                           const kvtier_namespace_options* options,
                                           kvtier_namespace** out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_namespace_create";
    if (geometry == nullptr) return Null(kCall, "geometry");
    if (options == nullptr) return Null(kCall, "options");
    if (out == nullptr) return Null(kCall, "out");
    absl::StatusOr<KvGeometryOptions> g = capi::ToGeometryOptions(*geometry);
    if (!g.ok()) return g.status();
    absl::StatusOr<CacheNamespaceOptions> n = capi::ToNamespaceOptions(*options);
    if (!n.ok()) return n.status();
    absl::StatusOr<KvGeometry> kv_geometry = KvGeometry::Create(*g);
    if (!kv_geometry.ok()) return kv_geometry.status();
    absl::StatusOr<CacheNamespace> ns = CacheNamespace::Create(*kv_geometry, *n);
    if (!ns.ok()) return ns.status();
    *out = new kvtier_namespace{std::move(*ns)};
    return absl::OkStatus();
  });
}

void kvtier_namespace_destroy(kvtier_namespace* ns) { delete ns; }

kvtier_status_code kvtier_namespace_get_info(const kvtier_namespace* ns, kvtier_namespace_info* out,
                                             kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_namespace_get_info";
    if (ns == nullptr) return Null(kCall, "ns");
    if (out == nullptr) return Null(kCall, "out");
    const KvGeometry& g = ns->ns.geometry();
    out->bytes_per_block = g.bytes_per_block();
    out->bytes_per_block_per_layer = g.bytes_per_block_per_layer();
    out->bytes_per_token = g.bytes_per_token();
    out->tokens_per_block = g.tokens_per_block();
    out->num_layers = g.num_layers();
    out->kv_planes = g.kv_planes();
    out->dtype_bytes = KvDtypeBytes(g.dtype());
    const std::string hex = ns->ns.DigestHex();
    capi::CopyText(absl::string_view(hex.data(), hex.size()), out->digest_hex,
                   sizeof(out->digest_hex));
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_tier_stack_build(const kvtier_namespace* ns,
                                           const kvtier_tier_stack_options* options,
                                           kvtier_tier_stack** out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_tier_stack_build";
    if (ns == nullptr) return Null(kCall, "ns");
    if (options == nullptr) return Null(kCall, "options");
    if (out == nullptr) return Null(kCall, "out");
    absl::StatusOr<TierStackOptions> stack = capi::ToTierStackOptions(ns->ns, *options);
    if (!stack.ok()) return stack.status();
    absl::StatusOr<TierBackends> tiers = BuildTierStack(ns->ns, *stack);
    if (!tiers.ok()) return tiers.status();
    *out = new kvtier_tier_stack{std::move(*tiers)};
    return absl::OkStatus();
  });
}

void kvtier_tier_stack_destroy(kvtier_tier_stack* stack) { delete stack; }

kvtier_status_code kvtier_cache_create(const kvtier_namespace* ns, kvtier_tier_stack* tiers,
                                       const kvtier_cache_options* options, kvtier_cache** out,
                                       kvtier_error* error) {
  // The stack is taken whatever happens, so the caller never has to ask whether to free it.
  std::unique_ptr<kvtier_tier_stack> owned(tiers);
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_cache_create";
    if (ns == nullptr) return Null(kCall, "ns");
    if (owned == nullptr) return Null(kCall, "tiers");
    if (out == nullptr) return Null(kCall, "out");
    kvtier_cache_options defaults;
    if (options == nullptr) {
      kvtier_cache_options_init(&defaults);
      options = &defaults;
    }
    absl::StatusOr<KvCacheOptions> cache_options = capi::ToCacheOptions(*options);
    if (!cache_options.ok()) return cache_options.status();
    cache_options->tiers = std::move(owned->tiers);
    owned.reset();
    absl::StatusOr<std::unique_ptr<KvCache>> cache =
        KvCache::Create(ns->ns, std::move(*cache_options));
    if (!cache.ok()) return cache.status();
    *out = new kvtier_cache{std::move(*cache)};
    return absl::OkStatus();
  });
}

void kvtier_cache_destroy(kvtier_cache* cache) { delete cache; }

}  // extern "C"
