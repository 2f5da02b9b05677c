// The tier stack builder: turns "these tiers, this many blocks each, on these backends and this
// store" into the TierBackends a KvCache (KvCacheOptions::tiers) or a TransferEngine takes, from
// one options struct. What a server, a test or a benchmark would otherwise write by hand for
// every tier: each backend's Create with its capacity converted to that backend's unit, the
// remote tier's store opened from a transport, a directory or a Redis URL, and an optional hook
// that wraps each built backend (a fault injector, a counting decorator).
//
// The builder owns nothing and keeps nothing: each call builds fresh backends and hands them to
// the caller. It chooses among EmulatedHbm or CudaHbm (hbm_backend), DramTier, NvmeTier,
// RemoteTier and MetadataTier. (A CudaHbm the caller builds itself may also go into the
// result's kHbm entry, the HBM tier left absent here.)
//
// Thread-safety: BuildTierStack and RemoteTransportFromUrl are reentrant: they touch no shared
// state (two stacks on one NVMe path are NvmeTier's business, not theirs). `options` is only
// read, and its `wrap` runs on the calling thread before the call returns. The backends returned have the
// thread-safety of their own headers (TierBackend's).
#ifndef KVTIER_TIER_STACK_H_
#define KVTIER_TIER_STACK_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/cuda_hbm.h"
#include "kvtier/dram_tier.h"
#include "kvtier/emulated_hbm.h"
#include "kvtier/ids.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/metadata_store.h"
#include "kvtier/nvme_tier.h"
#include "kvtier/remote_tier.h"
#include "kvtier/tier_backend.h"
#include "kvtier/transport.h"

namespace kvtier {

// Which device a native HBM tier is.
enum class HbmBackend : uint8_t {
  kEmulated = 0,  // EmulatedHbm: host memory with CUDA's asynchrony (any machine)
  kCuda = 1,      // CudaHbm: a GPU's memory (kUnavailable without a GPU)
};

// What stands behind a present tier.
enum class TierBackendKind : uint8_t {
  // The level's own host backend: EmulatedHbm (kHbm), DramTier (kDram), NvmeTier on a file or
  // block device (kNvme), RemoteTier over a Transport (kRemote).
  kNative = 0,
  // A MetadataTier standing for the level (metadata_tier.h): every slot, block id and byte count
  // of the real tier, no KV byte. For capacity planning and metadata-only replays.
  kMetadata = 1,
};

// One tier of the stack.
struct TierSpec {
  // Slots, in blocks of the geometry's bytes_per_block(). 0: the tier is absent (its entry in the
  // result is null and its backend options are not looked at); otherwise >= 1.
  int64_t capacity_blocks = 0;
  TierBackendKind kind = TierBackendKind::kNative;
};

struct TierStackOptions {
  // Index TierIndex(tier); every tier absent by default.
  std::array<TierSpec, kNumTiers> tiers;

  // The native backends' own options, used only when that tier is present and kNative. The
  // capacity field of each is overwritten from tiers[...].capacity_blocks, so the tier gets
  // exactly that many blocks: EmulatedHbm and RemoteTier take the blocks, DramTier
  // blocks x bytes_per_block() bytes, NvmeTier blocks x NvmeTier::SlotBytes() bytes.
  EmulatedHbmOptions hbm;
  // The HBM tier's device, and CudaHbm's options for kCuda (its layout comes from hbm.layout and
  // its capacity from the tier's capacity_blocks; external_pool, device are its own).
  HbmBackend hbm_backend = HbmBackend::kEmulated;
  CudaHbmOptions cuda_hbm;
  DramTierOptions dram;
  // path is required for a native NVMe tier. An existing file is reopened, not cleared: its
  // valid blocks come back as recovered (NvmeTier::recovered(), KvCache's warm restart).
  NvmeTierOptions nvme;
  RemoteTierOptions remote;

  // A native remote tier's store, exactly one of the three: remote.transport if set (a store the
  // caller shares, e.g. an InProcessTransport between two caches, or a transport it configured
  // itself), else a DirectoryTransport created over remote_directory (created if missing), else
  // RemoteTransportFromUrl(remote_url). Not looked at when the remote tier is absent or
  // kMetadata.
  std::string remote_directory;
  std::string remote_url;
  // A kMetadata remote tier's fleet-wide key store (MetadataTierOptions::store), shared by the
  // caches built over it so each finds what the others stored. Null: that tier is this cache's
  // alone. Not looked at for a native or absent remote tier.
  std::shared_ptr<MetadataStore> metadata_store;

  // Called once per present tier, in tier order (kHbm first), after every backend is built,
  // on the calling thread; it takes ownership of the built backend and returns that tier's
  // backend (e.g. the built one behind a fault injector). It must return a non-null backend.
  // The call does not keep it past its return. Unset: the built backends as they are.
  std::function<std::unique_ptr<TierBackend>(Tier, std::unique_ptr<TierBackend>)> wrap;
};

// Index TierIndex(tier); null for an absent tier. The same type as KvCacheOptions::tiers, so a
// result moves straight into a KvCache's options.
using TierBackends = std::array<std::unique_ptr<TierBackend>, kNumTiers>;

// Builds every present tier of `options` for `ns`, HBM first: each backend has ns.geometry()'s
// blocks, TierInfo::tier of its own level and TierInfo::capacity_blocks == capacity_blocks (the
// native remote tier's store keys are namespaced by `ns`, remote_tier.h). Then passes each to
// `options.wrap` if set.
//
// Errors: kInvalidArgument for a native HBM tier whose hbm.layout is not the namespace's
// hbm_layout (the layout the block keys name), a negative capacity_blocks, an unknown kind or
// hbm_backend, a capacity_blocks over BlockAllocator::kMaxCapacityBlocks (checked before any
// backend reserves memory or a file), a
// capacity whose bytes overflow int64, a native remote tier with no store or more than one, or a
// `wrap` that returns null (the message names the tier); otherwise the error of the first backend
// or transport whose Create fails, unchanged (e.g. NvmeTier's kInvalidArgument for an empty path,
// EmulatedHbm's or DramTier's kResourceExhausted for a pool over the memory available,
// DirectoryTransport's kUnavailable, RedisTransport's kInvalidArgument for a bad URL, CudaHbm's
// kUnavailable without a GPU or kUnimplemented in a build without CUDA). On error every backend
// built so far (wrapped or not) is destroyed. `wrap` is called only once every backend is built.
//
// Ownership: the caller owns the backends returned. A shared remote.transport is shared with the
// remote tier (it lives while either holds it). A TransferEngine takes raw pointers to them, so
// the array must outlive the engine.
absl::StatusOr<TierBackends> BuildTierStack(const CacheNamespace& ns,
                                            const TierStackOptions& options);

// The same for a stack without a namespace (a TransferEngine's, or a benchmark's): every tier
// but a native remote one, which needs a namespace for its keys and is kInvalidArgument here
// (a kMetadata remote tier is fine).
absl::StatusOr<TierBackends> BuildTierStack(const KvGeometry& geometry,
                                            const TierStackOptions& options);

// The transport a remote URL names, as RedisTransportOptionsFromUrl parses it
// (redis_transport.h): "redis://[[user]:password@]host:port[/db]" (one RedisTransport) or
// "redis-cluster://[[user]:password@]host:port[,host:port...]" (a Redis Cluster found from its
// seed nodes), every other RedisTransportOptions field at its default. It connects lazily: a
// server that is down now is not an error (its first requests fail with kUnavailable).
// Errors: kInvalidArgument naming the URL and what is wrong with it (another scheme, a bad
// endpoint, credentials or database). The caller owns the transport; it may share it among tiers.
absl::StatusOr<std::shared_ptr<Transport>> RemoteTransportFromUrl(const std::string& url);

}  // namespace kvtier

#endif  // KVTIER_TIER_STACK_H_
