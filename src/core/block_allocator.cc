// BlockAllocator (block_allocator.h): the slot state machine and its counters.
#include "kvtier/block_allocator.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "internal/strings.h"

namespace kvtier {

using internal::ToAbsl;

std::string_view SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "free";
    case SlotState::kWritable:
      return "writable";
    case SlotState::kSealed:
      return "sealed";
    case SlotState::kCached:
      return "cached";
    case SlotState::kInFlight:
      return "in_flight";
    case SlotState::kQuarantined:
      return "quarantined";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<BlockAllocator>> BlockAllocator::Create(Tier tier,
                                                                       int64_t capacity_blocks) {
  if (TierIndex(tier) < 0 || TierIndex(tier) >= kNumTiers) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockAllocator: tier ", static_cast<int>(tier), " does not exist"));
  }
  if (capacity_blocks < 1 || capacity_blocks > kMaxCapacityBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("BlockAllocator(", ToAbsl(TierName(tier)),
                                                   "): capacity_blocks = ", capacity_blocks,
                                                   " is outside [1, ", kMaxCapacityBlocks, "]"));
  }
  return std::unique_ptr<BlockAllocator>(new BlockAllocator(tier, capacity_blocks));
}

absl::StatusOr<std::unique_ptr<BlockAllocator>> BlockAllocator::CreateWithCached(
    Tier tier, int64_t capacity_blocks, absl::Span<const SlotId> cached) {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockAllocator> a, Create(tier, capacity_blocks));
  std::vector<bool> is_cached(static_cast<size_t>(capacity_blocks), false);
  for (SlotId s : cached) {
    if (!a->InRange(s)) return a->OutOfRange(s);
    if (is_cached[s.value()]) {
      return absl::InvalidArgumentError(absl::StrCat("BlockAllocator(", ToAbsl(TierName(tier)),
                                                     "): slot ", s.value(), " listed twice"));
    }
    is_cached[s.value()] = true;
  }
  // Rebuild the free list from the remaining slots, lowest first.
  a->free_head_ = kEndOfList;
  for (int64_t i = capacity_blocks - 1; i >= 0; --i) {
    const auto index = static_cast<uint32_t>(i);
    if (is_cached[index]) {
      a->SetState(index, SlotState::kCached);
      a->slots_[index].word = 0;
    } else {
      a->slots_[index].word = a->free_head_;
      a->free_head_ = index;
    }
  }
  return a;
}

BlockAllocator::BlockAllocator(Tier tier, int64_t capacity_blocks)
    : tier_(tier), slots_(static_cast<size_t>(capacity_blocks)) {
  // Link every slot so that slot 0 is allocated first.
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].word = i + 1 < slots_.size() ? static_cast<uint32_t>(i + 1) : kEndOfList;
    slots_[i].state = static_cast<uint8_t>(SlotState::kFree);
  }
  free_head_ = 0;
  count_[static_cast<size_t>(SlotState::kFree)] = capacity_blocks;
}

absl::Status BlockAllocator::Exhausted() const {
  return absl::ResourceExhaustedError(absl::StrCat("BlockAllocator(", ToAbsl(TierName(tier_)),
                                                   "): all ", slots_.size(), " slots are in use"));
}

absl::Status BlockAllocator::OutOfRange(SlotId slot) const {
  return absl::InvalidArgumentError(absl::StrCat("BlockAllocator(", ToAbsl(TierName(tier_)),
                                                 "): slot ", slot.value(), " is outside [0, ",
                                                 slots_.size(), ")"));
}

absl::Status BlockAllocator::WrongState(SlotId slot, std::string_view transition) const {
  const auto state = static_cast<SlotState>(slots_[slot.value()].state);
  return absl::FailedPreconditionError(
      absl::StrCat("BlockAllocator(", ToAbsl(TierName(tier_)), "): cannot ", ToAbsl(transition),
                   " slot ", slot.value(), " in state ", ToAbsl(SlotStateName(state))));
}

absl::Status BlockAllocator::Move(SlotId slot, SlotState from, SlotState to,
                                  std::string_view verb) {
  if (!InRange(slot)) return OutOfRange(slot);
  if (static_cast<SlotState>(slots_[slot.value()].state) != from) return WrongState(slot, verb);
  if (to == SlotState::kFree) {
    Push(slot.value());
  } else {
    SetState(slot.value(), to);
  }
  return absl::OkStatus();
}

absl::Status BlockAllocator::Seal(SlotId slot) {
  return Move(slot, SlotState::kWritable, SlotState::kSealed, "seal");
}

absl::Status BlockAllocator::Acquire(SlotId slot) {
  if (!InRange(slot)) return OutOfRange(slot);
  Slot& s = slots_[slot.value()];
  switch (static_cast<SlotState>(s.state)) {
    case SlotState::kSealed:
      if (s.word >= kMaxRefCount) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "BlockAllocator(", ToAbsl(TierName(tier_)), "): slot ", slot.value(), " has ",
            kMaxRefCount, " references, the most it can hold"));
      }
      ++s.word;
      return absl::OkStatus();
    case SlotState::kCached:
      SetState(slot.value(), SlotState::kSealed);
      s.word = 1;
      return absl::OkStatus();
    default:
      return WrongState(slot, "acquire");
  }
}

absl::Status BlockAllocator::ReleaseError(SlotId slot) const {
  if (!InRange(slot)) return OutOfRange(slot);
  return WrongState(slot, "release");
}

absl::Status BlockAllocator::Evict(SlotId slot) {
  return Move(slot, SlotState::kCached, SlotState::kFree, "evict");
}

absl::Status BlockAllocator::CompleteTransfer(SlotId slot) {
  return Move(slot, SlotState::kInFlight, SlotState::kCached, "complete the transfer into");
}

absl::Status BlockAllocator::CancelTransfer(SlotId slot) {
  return Move(slot, SlotState::kInFlight, SlotState::kFree, "cancel the transfer into");
}

absl::Status BlockAllocator::FailTransfer(SlotId slot) {
  return Move(slot, SlotState::kInFlight, SlotState::kQuarantined, "fail the transfer into");
}

absl::Status BlockAllocator::ReclaimQuarantined(SlotId slot) {
  return Move(slot, SlotState::kQuarantined, SlotState::kFree, "reclaim");
}

SlotCounts BlockAllocator::counts() const {
  auto n = [this](SlotState s) { return count_[static_cast<size_t>(s)]; };
  return SlotCounts{.free = n(SlotState::kFree),
                    .writable = n(SlotState::kWritable),
                    .sealed = n(SlotState::kSealed),
                    .cached = n(SlotState::kCached),
                    .in_flight = n(SlotState::kInFlight),
                    .quarantined = n(SlotState::kQuarantined)};
}

absl::StatusOr<SlotState> BlockAllocator::state(SlotId slot) const {
  if (!InRange(slot)) return OutOfRange(slot);
  return static_cast<SlotState>(slots_[slot.value()].state);
}

absl::StatusOr<uint32_t> BlockAllocator::ref_count(SlotId slot) const {
  if (!InRange(slot)) return OutOfRange(slot);
  const Slot& s = slots_[slot.value()];
  return s.state == static_cast<uint8_t>(SlotState::kFree) ? 0 : s.word;
}

}  // namespace kvtier
