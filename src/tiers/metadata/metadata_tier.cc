// MetadataTier (metadata_tier.h): a tier's slots and block identities, no bytes.
#include "kvtier/metadata_tier.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "internal/host_region.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "internal/strings.h"
#include "tiers/device_pool_view.h"
#include "tiers/slot_contents.h"

namespace kvtier {

struct MetadataTier::Impl {
  Impl(const KvGeometry& g, std::shared_ptr<MetadataStore> s) : geometry(g), store(std::move(s)) {}
  const KvGeometry geometry;
  const std::shared_ptr<MetadataStore> store;  // null: no fleet store
  // With a store: whether this tier's write added the key its slot holds (DiscardBlock erases
  // only those; a block found by discovery is another worker's).
  internal::Mutex mu;
  std::vector<uint8_t> stored_here ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<MetadataTier>> MetadataTier::Create(
    const KvGeometry& geometry, const MetadataTierOptions& options) {
  if (TierIndex(options.tier) < 0 || TierIndex(options.tier) >= kNumTiers) {
    return absl::InvalidArgumentError(
        absl::StrCat("MetadataTier: unknown tier ", TierIndex(options.tier)));
  }
  const int64_t block_bytes = geometry.bytes_per_block();
  if (options.capacity_blocks < 1 || options.capacity_blocks > BlockAllocator::kMaxCapacityBlocks ||
      options.capacity_blocks > std::numeric_limits<int64_t>::max() / block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("MetadataTier: capacity_blocks = ", options.capacity_blocks, " is not in [1, ",
                     BlockAllocator::kMaxCapacityBlocks, "] or its bytes overflow"));
  }
  if (options.store != nullptr && options.tier != Tier::kRemote) {
    return absl::InvalidArgumentError(
        absl::StrCat("MetadataTier: a store is for the remote tier, not ",
                     internal::ToAbsl(TierName(options.tier))));
  }
  // kCapDeviceMemory so KvCache takes it as HBM; never kCapHostAddressable: no bytes to address.
  uint32_t caps = kCapInlineIo;
  if (options.tier == Tier::kHbm) caps |= kCapDeviceMemory;
  if (options.store != nullptr) caps |= kCapProbe;
  TierInfo info = MakeInfo(options.tier,
                           absl::StrCat("metadata(", internal::ToAbsl(TierName(options.tier)),
                                        options.store != nullptr ? ", shared store" : "", ")"),
                           options.capacity_blocks, block_bytes, caps);
  // The bookkeeping is the only memory this tier takes, and at 2^31 slots it is 64 GiB: refuse
  // it up front rather than fail inside a vector allocation.
  if (absl::StatusOr<int64_t> available = internal::AvailableMemoryBytes();
      available.ok() && info.metadata_bytes > *available) {
    return absl::ResourceExhaustedError(absl::StrCat(
        info.name, ": ", info.metadata_bytes, " bytes of slot bookkeeping but only ", *available,
        " bytes of memory are available (MemAvailable and the cgroup's limits)"));
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockAllocator> allocator,
                          BlockAllocator::Create(options.tier, options.capacity_blocks));
  auto impl = std::make_unique<Impl>(geometry, options.store);
  if (options.store != nullptr) {
    internal::MutexLock lock(&impl->mu);
    impl->stored_here.assign(static_cast<size_t>(options.capacity_blocks), 0);
  }
  return std::unique_ptr<MetadataTier>(
      new MetadataTier(std::move(info), std::move(allocator), std::move(impl)));
}

MetadataTier::MetadataTier(TierInfo info, std::unique_ptr<BlockAllocator> allocator,
                           std::unique_ptr<Impl> impl)
    : InMemorySlotTier(std::move(info), std::move(allocator)), impl_(std::move(impl)) {}
MetadataTier::~MetadataTier() = default;

Completion MetadataTier::WriteBlock(SlotId slot, const BlockKey& key,
                                    absl::Span<const std::byte> src,
                                    const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIoNow(info(), slot, src.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  // No bytes to copy, so the write is one step: the slot goes from its old key to `key` under
  // the record's lock, and no reader can see anything in between.
  if (impl_->store != nullptr) {
    const bool added = impl_->store->Store(key);
    internal::MutexLock lock(&impl_->mu);
    impl_->stored_here[slot.value()] = added ? 1 : 0;
  }
  EndSlotWrite(slot, key);
  return Completion::Done(absl::OkStatus());
}

Completion MetadataTier::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                                   const BlockIoOptions& options) {
  absl::Status s = CheckReadNow(slot, key, dst.size(), options.deadline);
  if (s.ok() && impl_->store != nullptr && !impl_->store->Contains(key)) {
    // Its writer evicted it: as a real store's reader, this one finds nothing.
    s = absl::NotFoundError(
        absl::StrCat(info().name, ": the store no longer holds block ", key.ToHex()));
  }
  return Completion::Done(std::move(s));
}

void MetadataTier::DiscardBlock(SlotId slot, const BlockKey& key) {
  if (impl_->store == nullptr || !InRange(slot) || !CheckSlotHolds(slot, key).ok()) return;
  bool mine = false;
  {
    internal::MutexLock lock(&impl_->mu);
    mine = impl_->stored_here[slot.value()] != 0;
    impl_->stored_here[slot.value()] = 0;
  }
  if (mine) impl_->store->Erase(key);
}

absl::StatusOr<std::vector<bool>> MetadataTier::ProbeBlocks(absl::Span<const BlockKey> keys,
                                                            absl::Time deadline) {
  if (impl_->store == nullptr) return TierBackend::ProbeBlocks(keys, deadline);
  if (absl::Now() > deadline) {
    return absl::DeadlineExceededError(absl::StrCat(info().name, ": probe deadline has passed"));
  }
  std::vector<bool> found;
  found.reserve(keys.size());
  for (const BlockKey& key : keys) found.push_back(impl_->store->Contains(key));
  return found;
}

absl::Status MetadataTier::AdoptStoredBlock(SlotId slot, const BlockKey& key) {
  if (impl_->store == nullptr) return TierBackend::AdoptStoredBlock(slot, key);
  if (!InRange(slot)) {
    return absl::InvalidArgumentError(
        absl::StrCat(info().name, ": slot ", slot.value(), " is outside the tier"));
  }
  {
    internal::MutexLock lock(&impl_->mu);
    impl_->stored_here[slot.value()] = 0;
  }
  EndSlotWrite(slot, key);
  return absl::OkStatus();
}

std::optional<DevicePoolView> MetadataTier::device_pool() const {
  if (info().tier != Tier::kHbm) return std::nullopt;
  DevicePoolView view = internal::MakeDevicePoolView(
      impl_->geometry, HbmLayout::kLayerFirst, info().capacity_blocks,
      [](int) -> void* { return nullptr; }, /*host_accessible=*/false);
  // No memory, so no addresses: an empty list cannot be mistaken for a pool at address 0.
  view.k_base.clear();
  view.v_base.clear();
  return view;
}

}  // namespace kvtier
