#include "kvtier/remote_tier.h"

#include <atomic>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvtier/value_frame.h"
#include "tiers/slot_contents.h"

namespace kvtier {

struct RemoteTier::Impl {
  RemoteTierOptions options;
  std::array<uint8_t, 16> ns_digest{};
  TierInfo info;
  std::unique_ptr<BlockAllocator> allocator;
  std::unique_ptr<internal::SlotContents> contents;
  std::atomic<int64_t> corrupt_reads{0};
};

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Create(const CacheNamespace& ns,
                                                               const RemoteTierOptions& options) {
  if (options.transport == nullptr) {
    return absl::InvalidArgumentError("RemoteTier: the transport is null");
  }
  if (options.capacity_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("RemoteTier: capacity_blocks = ",
                                                   options.capacity_blocks, " must be >= 1"));
  }
  if (options.key_prefix.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat("RemoteTier: a key prefix of ",
                                                   options.key_prefix.size(),
                                                   " bytes; at most 64"));
  }
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->ns_digest = ns.digest();
  KVTIER_ASSIGN_OR_RETURN(impl->allocator,
                          BlockAllocator::Create(Tier::kRemote, options.capacity_blocks));
  impl->contents = std::make_unique<internal::SlotContents>(options.capacity_blocks);
  TierInfo& info = impl->info;
  info.tier = Tier::kRemote;
  info.name = absl::StrCat("remote(", options.transport->name(), ", ",
                           absl::string_view(CodecName(options.codec).data(),
                                             CodecName(options.codec).size()),
                           options.hmac_secret.empty() ? "" : ", hmac", ")");
  info.capacity_blocks = options.capacity_blocks;
  info.block_bytes = ns.geometry().bytes_per_block();
  info.capacity_bytes = info.capacity_blocks * info.block_bytes;
  info.metadata_bytes =
      info.capacity_blocks * (8 + internal::SlotContents::kBytesPerSlot + kFrameHeaderBytes);
  info.capabilities = kCapPersistent | kCapChecksummed;
  return std::unique_ptr<RemoteTier>(new RemoteTier(std::move(impl)));
}

RemoteTier::RemoteTier(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteTier::~RemoteTier() = default;

const TierInfo& RemoteTier::info() const { return impl_->info; }
BlockAllocator& RemoteTier::allocator() { return *impl_->allocator; }
int64_t RemoteTier::corrupt_reads() const { return impl_->corrupt_reads.load(); }

std::string RemoteTier::StoreKey(const BlockKey& key) const {
  return RemoteBlockKey(impl_->options.key_prefix, impl_->ns_digest, key);
}

Completion RemoteTier::WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                                  const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIoNow(impl_->info, slot, src.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  auto frame = std::make_shared<std::vector<std::byte>>();
  if (absl::Status s = EncodeFrame(impl_->ns_digest, key, src, impl_->options.codec,
                                   impl_->options.hmac_secret, frame.get());
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  impl_->contents->Invalidate(slot);
  const TransportPut put{StoreKey(key), *frame};
  Completion stored = impl_->options.transport->Put({&put, 1}, options.deadline)[0];
  Completion done;
  std::shared_ptr<Impl> impl = impl_;
  stored.OnDone([impl, frame, slot, key, done](const absl::Status& s) {
    if (s.ok()) impl->contents->Set(slot, key);
    done.Complete(s);
  });
  return done;
}

Completion RemoteTier::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                                 const BlockIoOptions& options) {
  if (absl::Status s = internal::CheckBlockIoNow(impl_->info, slot, dst.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  if (absl::Status s = impl_->contents->Check(slot, key, impl_->info); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  auto value = std::make_shared<std::vector<std::byte>>();
  // No valid frame is larger than the header plus a block that compression made slightly bigger.
  const TransportGet get{StoreKey(key), value.get(),
                         static_cast<int64_t>(kFrameHeaderBytes) + impl_->info.block_bytes +
                             impl_->info.block_bytes / 128 + 4096};
  Completion fetched = impl_->options.transport->Get({&get, 1}, options.deadline)[0];
  Completion done;
  std::shared_ptr<Impl> impl = impl_;
  fetched.OnDone([impl, value, slot, key, dst, done](const absl::Status& s) {
    if (!s.ok()) {
      if (absl::IsDataLoss(s)) impl->corrupt_reads.fetch_add(1);  // e.g. an oversized value
      if (absl::IsNotFound(s) || absl::IsDataLoss(s)) impl->contents->Invalidate(slot);
      done.Complete(s);
      return;
    }
    absl::Status decoded =
        DecodeFrame(*value, impl->ns_digest, key, impl->options.hmac_secret, dst);
    if (!decoded.ok()) {
      impl->corrupt_reads.fetch_add(1);
      impl->contents->Invalidate(slot);
    }
    done.Complete(std::move(decoded));
  });
  return done;
}

}  // namespace kvtier
