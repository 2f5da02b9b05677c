// The tier stack builder (kvtier/tier_stack.h): the backends of each tier built from one options
// struct.
#include "kvtier/tier_stack.h"

#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/cuda_hbm.h"
#include "kvtier/directory_transport.h"
#include "kvtier/metadata_tier.h"
#include "kvtier/redis_transport.h"

namespace kvtier {
namespace {

// blocks x bytes_each as a byte budget, or kInvalidArgument when it does not fit int64.
absl::StatusOr<int64_t> BudgetBytes(Tier tier, int64_t blocks, int64_t bytes_each) {
  if (bytes_each > 0 && blocks > std::numeric_limits<int64_t>::max() / bytes_each) {
    return absl::InvalidArgumentError(absl::StrCat("tier stack: ", std::string(TierName(tier)),
                                                   " capacity of ", blocks, " blocks of ",
                                                   bytes_each, " bytes overflows int64"));
  }
  return blocks * bytes_each;
}

absl::StatusOr<std::shared_ptr<Transport>> RemoteStore(const TierStackOptions& o) {
  const int stores =
      (o.remote.transport != nullptr) + !o.remote_directory.empty() + !o.remote_url.empty();
  if (stores != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tier stack: a remote tier needs exactly one store (a transport, a directory or a URL); ",
        stores, " given"));
  }
  if (o.remote.transport != nullptr) return o.remote.transport;
  if (!o.remote_url.empty()) return RemoteTransportFromUrl(o.remote_url);
  auto t = DirectoryTransport::Create({.root = o.remote_directory});
  if (!t.ok()) return t.status();
  return std::shared_ptr<Transport>(std::move(*t));
}

// Widens a concrete backend's StatusOr to a TierBackend's.
template <typename T>
absl::StatusOr<std::unique_ptr<TierBackend>> Erased(absl::StatusOr<std::unique_ptr<T>> backend) {
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<TierBackend>(std::move(*backend));
}

absl::StatusOr<std::unique_ptr<TierBackend>> BuildNative(const KvGeometry& g,
                                                         const CacheNamespace* ns, Tier tier,
                                                         int64_t blocks,
                                                         const TierStackOptions& o) {
  switch (tier) {
    case Tier::kHbm: {
      // The namespace names the layout of the pool its kernels read (and is in every block key);
      // an HBM tier told another would read a registered pool with the wrong strides and offload
      // scrambled bytes under valid keys.
      if (ns != nullptr && o.hbm.layout != ns->options().hbm_layout) {
        return absl::InvalidArgumentError(absl::StrCat(
            "BuildTierStack: hbm.layout is ", HbmLayoutName(o.hbm.layout),
            " but the namespace's hbm_layout is ", HbmLayoutName(ns->options().hbm_layout),
            ": set hbm.layout to the namespace's"));
      }
      if (o.hbm_backend == HbmBackend::kCuda) {
        CudaHbmOptions cuda = o.cuda_hbm;
        cuda.layout = o.hbm.layout;
        cuda.capacity_blocks = blocks;
        return Erased(CudaHbm::Create(g, cuda));
      }
      if (o.hbm_backend != HbmBackend::kEmulated) {
        return absl::InvalidArgumentError(absl::StrCat(
            "BuildTierStack: unknown hbm_backend ", static_cast<int>(o.hbm_backend)));
      }
      EmulatedHbmOptions hbm = o.hbm;
      hbm.capacity_blocks = blocks;
      return Erased(EmulatedHbm::Create(g, hbm));
    }
    case Tier::kDram: {
      DramTierOptions dram = o.dram;
      absl::StatusOr<int64_t> bytes = BudgetBytes(tier, blocks, g.bytes_per_block());
      if (!bytes.ok()) return bytes.status();
      dram.capacity_bytes = *bytes;
      return Erased(DramTier::Create(g, dram));
    }
    case Tier::kNvme: {
      NvmeTierOptions nvme = o.nvme;
      absl::StatusOr<int64_t> bytes = BudgetBytes(tier, blocks, NvmeTier::SlotBytes(g));
      if (!bytes.ok()) return bytes.status();
      nvme.capacity_bytes = *bytes;
      return Erased(NvmeTier::Create(g, nvme));
    }
    case Tier::kRemote: {
      if (ns == nullptr) {
        return absl::InvalidArgumentError(
            "tier stack: a native remote tier needs a CacheNamespace (its keys are namespaced)");
      }
      absl::StatusOr<std::shared_ptr<Transport>> transport = RemoteStore(o);
      if (!transport.ok()) return transport.status();
      RemoteTierOptions remote = o.remote;
      remote.transport = *std::move(transport);
      remote.capacity_blocks = blocks;
      return Erased(RemoteTier::Create(*ns, remote));
    }
  }
  return absl::InvalidArgumentError("tier stack: an unknown tier");
}

absl::StatusOr<TierBackends> Build(const KvGeometry& g, const CacheNamespace* ns,
                                   const TierStackOptions& o) {
  TierBackends tiers;
  for (int t = 0; t < kNumTiers; ++t) {
    const Tier tier = static_cast<Tier>(t);
    const TierSpec& spec = o.tiers[static_cast<size_t>(t)];
    if (spec.capacity_blocks < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tier stack: ", std::string(TierName(tier)),
                                                     " capacity_blocks ", spec.capacity_blocks,
                                                     " is negative"));
    }
    if (spec.capacity_blocks == 0) continue;
    // Checked before a backend reserves memory or a file for that many blocks.
    if (spec.capacity_blocks > BlockAllocator::kMaxCapacityBlocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tier stack: ", std::string(TierName(tier)), " capacity_blocks ", spec.capacity_blocks,
          " is over the ", BlockAllocator::kMaxCapacityBlocks, " blocks a tier may have"));
    }
    absl::StatusOr<std::unique_ptr<TierBackend>> backend;
    switch (spec.kind) {
      case TierBackendKind::kNative:
        backend = BuildNative(g, ns, tier, spec.capacity_blocks, o);
        break;
      case TierBackendKind::kMetadata:
        backend = Erased(
            MetadataTier::Create(g, {.tier = tier,
                                     .capacity_blocks = spec.capacity_blocks,
                                     .store = tier == Tier::kRemote ? o.metadata_store : nullptr}));
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("tier stack: ", std::string(TierName(tier)),
                                                       " has an unknown backend kind ",
                                                       static_cast<int>(spec.kind)));
    }
    if (!backend.ok()) return backend.status();
    tiers[static_cast<size_t>(t)] = *std::move(backend);
  }
  if (o.wrap) {
    for (int t = 0; t < kNumTiers; ++t) {
      std::unique_ptr<TierBackend>& backend = tiers[static_cast<size_t>(t)];
      if (backend == nullptr) continue;
      const Tier tier = static_cast<Tier>(t);
      backend = o.wrap(tier, std::move(backend));
      if (backend == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tier stack: wrap returned no backend for the ", std::string(TierName(tier)), " tier"));
      }
    }
  }
  return tiers;
}

}  // namespace

absl::StatusOr<TierBackends> BuildTierStack(const CacheNamespace& ns,
                                            const TierStackOptions& options) {
  return Build(ns.geometry(), &ns, options);
}

absl::StatusOr<TierBackends> BuildTierStack(const KvGeometry& geometry,
                                            const TierStackOptions& options) {
  return Build(geometry, nullptr, options);
}

absl::StatusOr<std::shared_ptr<Transport>> RemoteTransportFromUrl(const std::string& url) {
  absl::StatusOr<RedisTransportOptions> options = RedisTransportOptionsFromUrl(url);
  if (!options.ok()) return options.status();
  auto t = RedisTransport::Create(*options);
  if (!t.ok()) return t.status();
  return std::shared_ptr<Transport>(std::move(*t));
}

}  // namespace kvtier
