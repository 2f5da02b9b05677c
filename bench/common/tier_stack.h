// The tier stack builder: the one place that turns "these tiers, this many blocks each, on these
// backends and stores" into TierBackends, for every program here that runs a KvCache or a
// TransferEngine over several tiers: the replay, the tests and their fixtures, the fuzzer and the
// benchmarks. Each keeps its own sizes and options; only the construction is shared.
//
// Written against the public API alone (include/kvtier/), so it can move into it unchanged.
//
// Thread-safety: BuildTierStack and RemoteTransportFromUrl are reentrant. The backends returned
// belong to the caller, with the thread-safety their own headers give.
#ifndef KVTIER_BENCH_COMMON_TIER_STACK_H_
#define KVTIER_BENCH_COMMON_TIER_STACK_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/dram_tier.h"
#include "kvtier/emulated_hbm.h"
#include "kvtier/ids.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/nvme_tier.h"
#include "kvtier/remote_tier.h"
#include "kvtier/tier_backend.h"
#include "kvtier/transport.h"

namespace kvtier {

// What stands behind a present tier.
enum class TierBackendKind : uint8_t {
  // The level's own backend: EmulatedHbm (HBM), DramTier, NvmeTier (a file or block device),
  // RemoteTier (over a Transport).
  kNative = 0,
  // A MetadataTier standing for the level: every slot and block id, no KV byte (metadata_tier.h).
  kMetadata = 1,
};

struct TierSpec {
  int64_t capacity_blocks = 0;  // 0: the tier is absent; otherwise >= 1
  TierBackendKind kind = TierBackendKind::kNative;
};

struct TierStackOptions {
  std::array<TierSpec, kNumTiers> tiers;  // index TierIndex; every tier absent by default

  // The native backends' own options. Their capacity field is overwritten from
  // tiers[...].capacity_blocks: EmulatedHbm and RemoteTier take the blocks, DramTier
  // blocks x bytes_per_block, NvmeTier blocks x NvmeTier::SlotBytes.
  EmulatedHbmOptions hbm;
  DramTierOptions dram;
  NvmeTierOptions nvme;  // path: required for a native NVMe tier
  RemoteTierOptions remote;
  // A native remote tier's store: remote.transport if set (e.g. an InProcessTransport shared
  // with the test), else a DirectoryTransport created over remote_directory, else
  // RemoteTransportFromUrl(remote_url). Exactly one of the three.
  std::string remote_directory;
  std::string remote_url;

  // Called once per present tier, in tier order, after every backend is built; its result is
  // that tier's backend (e.g. the built one behind a fault injector). It must return a backend.
  // Unset: the built backends as they are.
  std::function<std::unique_ptr<TierBackend>(Tier, std::unique_ptr<TierBackend>)> wrap;
};

// Index TierIndex; null for an absent tier. The same type as KvCacheOptions::tiers.
using TierBackends = std::array<std::unique_ptr<TierBackend>, kNumTiers>;

// Builds every present tier of `options` for `ns` (its geometry; the remote tier's keys are
// namespaced by it), HBM first. Errors: kInvalidArgument for a negative capacity, an unknown
// kind, a capacity whose bytes overflow int64, or a native remote tier with no store or more than
// one; otherwise the error of the first backend or transport whose Create fails, unchanged (the
// tiers built before it are destroyed).
absl::StatusOr<TierBackends> BuildTierStack(const CacheNamespace& ns,
                                            const TierStackOptions& options);

// The same for a stack without a namespace (a TransferEngine's): a native remote tier, which
// needs one, is kInvalidArgument.
absl::StatusOr<TierBackends> BuildTierStack(const KvGeometry& geometry,
                                            const TierStackOptions& options);

// The transport a remote URL names: "redis://host:port" (RedisTransport) or
// "redis-cluster://host:port[,host:port...]" (a Redis Cluster from its seed nodes), with
// RedisTransportOptions' defaults otherwise. Errors: kInvalidArgument naming the URL for another
// scheme or a bad endpoint list; RedisTransport::Create's otherwise.
absl::StatusOr<std::shared_ptr<Transport>> RemoteTransportFromUrl(const std::string& url);

}  // namespace kvtier

#endif  // KVTIER_BENCH_COMMON_TIER_STACK_H_
