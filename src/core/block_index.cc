// BlockIndex (block_index.h): block key -> copies per tier, and the longest-prefix match.
#include "kvtier/block_index.h"

#include <algorithm>
#include <bit>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "internal/strings.h"

namespace kvtier {
namespace {

using internal::ToAbsl;

bool ValidTier(Tier tier) { return TierIndex(tier) >= 0 && TierIndex(tier) < kNumTiers; }

// The bit of `tier` in a tier mask; 0 for a tier that does not exist.
uint8_t Bit(Tier tier) { return ValidTier(tier) ? static_cast<uint8_t>(1u << TierIndex(tier)) : 0; }

absl::Status NoSuchTier(Tier tier) {
  return absl::InvalidArgumentError(
      absl::StrCat("BlockIndex: tier ", static_cast<int>(tier), " does not exist"));
}

absl::Status NoCopy(const BlockKey& key, Tier tier) {
  return absl::NotFoundError(absl::StrCat("BlockIndex: no copy of block ", key.ToHex(), " in ",
                                          ToAbsl(TierName(tier))));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlockIndex>> BlockIndex::Create(int tokens_per_block) {
  if (tokens_per_block < 1 || tokens_per_block > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("BlockIndex: tokens_per_block = ",
                                                   tokens_per_block, " is outside [1, 65536]"));
  }
  return std::unique_ptr<BlockIndex>(new BlockIndex(tokens_per_block));
}

absl::Status BlockRecord::AddCopy(const BlockKey& key, Tier tier, SlotId slot, CopyState state) {
  if (!ValidTier(tier)) return NoSuchTier(tier);
  if (!slot.valid()) {
    return absl::InvalidArgumentError(absl::StrCat("BlockIndex: the slot of block ", key.ToHex(),
                                                   " in ", ToAbsl(TierName(tier)),
                                                   " is invalid"));
  }
  if (state != CopyState::kPending && state != CopyState::kReady) {
    return absl::InvalidArgumentError(absl::StrCat("BlockIndex: a new copy of block ", key.ToHex(),
                                                   " must be pending or ready, not state ",
                                                   static_cast<int>(state)));
  }
  if (this->state(tier) != CopyState::kAbsent) {
    return absl::AlreadyExistsError(absl::StrCat("BlockIndex: block ", key.ToHex(),
                                                 " already has a copy in ",
                                                 ToAbsl(TierName(tier)), " at slot ",
                                                 slots[TierIndex(tier)].value()));
  }
  slots[TierIndex(tier)] = slot;
  (state == CopyState::kReady ? ready_tiers : pending_tiers) |= Bit(tier);
  return absl::OkStatus();
}

absl::Status BlockRecord::MarkReady(const BlockKey& key, Tier tier) {
  if (!ValidTier(tier)) return NoSuchTier(tier);
  switch (state(tier)) {
    case CopyState::kAbsent:
      return NoCopy(key, tier);
    case CopyState::kReady:
      return absl::FailedPreconditionError(absl::StrCat(
          "BlockIndex: the copy of block ", key.ToHex(), " in ", ToAbsl(TierName(tier)),
          " is already ready"));
    case CopyState::kPending:
      pending_tiers &= static_cast<uint8_t>(~Bit(tier));
      ready_tiers |= Bit(tier);
      return absl::OkStatus();
  }
  return NoCopy(key, tier);
}

absl::Status BlockRecord::RemoveCopy(const BlockKey& key, Tier tier) {
  if (!ValidTier(tier)) return NoSuchTier(tier);
  if (state(tier) == CopyState::kAbsent) return NoCopy(key, tier);
  pending_tiers &= static_cast<uint8_t>(~Bit(tier));
  ready_tiers &= static_cast<uint8_t>(~Bit(tier));
  slots[TierIndex(tier)] = SlotId();
  return absl::OkStatus();
}

absl::Status BlockIndex::AddCopy(const BlockKey& key, Tier tier, SlotId slot, CopyState state) {
  // Checked before the record is made, so a refused copy leaves no empty record behind.
  if (!ValidTier(tier) || !slot.valid() ||
      (state != CopyState::kPending && state != CopyState::kReady)) {
    return BlockRecord().AddCopy(key, tier, slot, state);
  }
  return records_[key].AddCopy(key, tier, slot, state);
}

absl::Status BlockIndex::MarkReady(const BlockKey& key, Tier tier) {
  if (!ValidTier(tier)) return NoSuchTier(tier);
  auto it = records_.find(key);
  if (it == records_.end()) return NoCopy(key, tier);
  return it->second.MarkReady(key, tier);
}

absl::Status BlockIndex::RemoveCopy(const BlockKey& key, Tier tier) {
  if (!ValidTier(tier)) return NoSuchTier(tier);
  auto it = records_.find(key);
  if (it == records_.end()) return NoCopy(key, tier);
  KVTIER_RETURN_IF_ERROR(it->second.RemoveCopy(key, tier));
  if (!it->second.has_copy()) records_.erase(it);
  return absl::OkStatus();
}

std::optional<BlockRecord> BlockIndex::Lookup(const BlockKey& key) const {
  auto it = records_.find(key);
  if (it == records_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<PrefixMatch> BlockIndex::Match(absl::Span<const BlockKey> keys,
                                              int64_t query_tokens,
                                              std::vector<BlockLocation>* locations) const {
  return MatchPrefix(
      keys, query_tokens, tokens_per_block_,
      [this](const BlockKey& key) -> const BlockRecord* {
        auto it = records_.find(key);
        return it == records_.end() ? nullptr : &it->second;
      },
      locations);
}

}  // namespace kvtier
