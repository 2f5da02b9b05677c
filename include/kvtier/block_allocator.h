// BlockAllocator: the slots of one tier, a fixed number of them, each with a state and a
// reference count. Allocation and free are O(1) (an intrusive free list). The allocator moves no
// bytes and knows no keys: it is the bookkeeping every tier backend and page table builds on.
//
// Slot states and the only legal transitions (DESIGN section 5; Dynamo's writable/sealed/
// registered block states, vLLM's free block queue):
//
//   kFree --Allocate--> kWritable --Seal--> kSealed --Release(last ref)--> kCached --Evict--> kFree
//     |                   |                   ^  |                          |
//     |                   +--Release(last)----|--|------> kFree             +--Acquire--> kSealed
//     |                                       |  +--Acquire/Release (refs > 0 stay kSealed)
//     +--AllocateForTransfer--> kInFlight --CompleteTransfer--> kCached
//                                  |  +--CancelTransfer (known never to land)--> kFree
//                                  +--FailTransfer (may still land)--> kQuarantined
//                                                     --ReclaimQuarantined (known dead)--> kFree
//
// kWritable has exactly one owner (the sequence writing it). kSealed is immutable and shared by
// its holders (refs >= 1). kCached holds KV nobody references (refs == 0): evictable.
// kInFlight is the destination of a transfer; it cannot be freed or reused until the transfer is
// complete or known dead, and kQuarantined is one whose transfer failed or timed out and might
// still land. A transfer that *reads* a slot (the source of an offload) pins it with Acquire for
// its duration, so the source cannot be evicted mid-copy; held() counts such pins. The accounting
// invariant, checked by the tests after every operation:
//
//   free + used + quarantined == capacity,  used = writable + sealed + cached + in_flight
//
// Counters follow state transitions only, never reference-count thresholds or call order.
//
// Thread-safety: thread-compatible. Const methods may run concurrently; anything else needs
// external synchronization (the tier or cache that owns the allocator holds the lock).
#ifndef KVTIER_BLOCK_ALLOCATOR_H_
#define KVTIER_BLOCK_ALLOCATOR_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/ids.h"

namespace kvtier {

enum class SlotState : uint8_t {
  kFree = 0,
  kWritable = 1,
  kSealed = 2,
  kCached = 3,
  kInFlight = 4,
  kQuarantined = 5,
};
inline constexpr int kNumSlotStates = 6;

// Lower-case name, e.g. "in_flight"; "unknown" for an out-of-range value.
std::string_view SlotStateName(SlotState state);

// Number of slots in each state. Sums to the capacity at every moment.
struct SlotCounts {
  int64_t free = 0;
  int64_t writable = 0;
  int64_t sealed = 0;
  int64_t cached = 0;
  int64_t in_flight = 0;
  int64_t quarantined = 0;

  // Slots that hold or will hold a block: writable + sealed + cached + in_flight.
  int64_t used() const { return writable + sealed + cached + in_flight; }
  // Slots some sequence references: writable + sealed ("held by sequences").
  int64_t held() const { return writable + sealed; }
  int64_t total() const { return free + used() + quarantined; }
};

class BlockAllocator {
 public:
  // Largest capacity: slot ids are uint32 and one value is reserved as invalid.
  static constexpr int64_t kMaxCapacityBlocks = int64_t{1} << 31;
  // Largest reference count of one slot.
  static constexpr uint32_t kMaxRefCount = (uint32_t{1} << 24) - 1;

  // An allocator for `capacity_blocks` slots of `tier`, all kFree. Uses 8 bytes per slot.
  // Errors: kInvalidArgument for a tier that does not exist or capacity_blocks < 1 or >
  // kMaxCapacityBlocks.
  static absl::StatusOr<std::unique_ptr<BlockAllocator>> Create(Tier tier, int64_t capacity_blocks);
  // As Create, but the slots in `cached` start kCached (blocks found again after a restart) and
  // only the others are free. Errors also kInvalidArgument for a slot outside the capacity or
  // listed twice.
  static absl::StatusOr<std::unique_ptr<BlockAllocator>> CreateWithCached(
      Tier tier, int64_t capacity_blocks, absl::Span<const SlotId> cached);

  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  // kFree -> kWritable with one reference. O(1). The most recently freed slot is reused first.
  // Errors: kResourceExhausted when no slot is free (the caller evicts and retries).
  absl::StatusOr<SlotId> Allocate();
  // kFree -> kInFlight, with no reference: the destination of a transfer. O(1).
  // Errors: kResourceExhausted when no slot is free.
  absl::StatusOr<SlotId> AllocateForTransfer();

  // kWritable -> kSealed; the block is full and keyed and from now on immutable. Keeps the ref.
  absl::Status Seal(SlotId slot);
  // kSealed: adds a reference. kCached -> kSealed with one reference (a hit revives it).
  // Errors also kResourceExhausted past kMaxRefCount references.
  absl::Status Acquire(SlotId slot);
  // Drops one reference. kSealed with its last reference -> kCached (the KV stays, evictable);
  // kWritable (its single reference) -> kFree (a partial block is private: nothing to keep).
  absl::Status Release(SlotId slot);
  // kCached -> kFree: drops the block from this tier.
  absl::Status Evict(SlotId slot);
  // kInFlight -> kCached: the transfer landed and the bytes are valid.
  absl::Status CompleteTransfer(SlotId slot);
  // kInFlight -> kFree: the transfer is known never to write the slot (cancelled before start).
  absl::Status CancelTransfer(SlotId slot);
  // kInFlight -> kQuarantined: the transfer failed or passed its deadline and might still land.
  absl::Status FailTransfer(SlotId slot);
  // kQuarantined -> kFree: the transfer is now known complete or dead.
  absl::Status ReclaimQuarantined(SlotId slot);
  //
  // Every transition above returns kInvalidArgument for a slot id outside [0, capacity) and
  // kFailedPrecondition, naming the slot and its state, when the slot is not in a state the
  // transition starts from. On error nothing changes.

  // State and reference count of a slot. Errors: kInvalidArgument for an id outside the range.
  absl::StatusOr<SlotState> state(SlotId slot) const;
  absl::StatusOr<uint32_t> ref_count(SlotId slot) const;
  // As state(), without a Status, for loops over many slots: kFree for an id outside the range.
  SlotState state_or_free(SlotId slot) const {
    return InRange(slot) ? static_cast<SlotState>(slots_[slot.value()].state) : SlotState::kFree;
  }

  Tier tier() const { return tier_; }
  int64_t capacity_blocks() const { return static_cast<int64_t>(slots_.size()); }
  // Slots per state, O(1).
  SlotCounts counts() const;
  int64_t free_blocks() const { return count_[static_cast<size_t>(SlotState::kFree)]; }

 private:
  // One slot in 8 bytes. A free slot needs no reference count and a used one no free-list link,
  // so one word serves as either (plain fields: no bit-field read-modify-write on the hot path).
  struct Slot {
    uint32_t word;  // kFree: index of the next free slot; otherwise: the reference count
    uint8_t state;  // a SlotState
  };
  static_assert(sizeof(Slot) == 8);
  static constexpr uint32_t kEndOfList = UINT32_MAX;

  BlockAllocator(Tier tier, int64_t capacity_blocks);

  absl::StatusOr<SlotId> Pop(SlotState to);
  absl::Status Exhausted() const;
  absl::Status ReleaseError(SlotId slot) const;
  // The invalid id (all ones) is never in range: capacity is at most 2^31.
  bool InRange(SlotId slot) const { return slot.value() < slots_.size(); }
  absl::Status OutOfRange(SlotId slot) const;
  absl::Status WrongState(SlotId slot, std::string_view transition) const;
  // The transition `from` -> `to` of one slot, or kFailedPrecondition naming `verb`.
  absl::Status Move(SlotId slot, SlotState from, SlotState to, std::string_view verb);
  void SetState(uint32_t index, SlotState to);
  void Push(uint32_t index);

  Tier tier_;
  std::vector<Slot> slots_;
  uint32_t free_head_ = kEndOfList;
  std::array<int64_t, kNumSlotStates> count_{};  // slots per SlotState
};

// ---- Inline fast paths: one allocate/release pair runs per block filled, on every decode step.

inline void BlockAllocator::SetState(uint32_t index, SlotState to) {
  Slot& s = slots_[index];
  --count_[s.state];
  ++count_[static_cast<size_t>(to)];
  s.state = static_cast<uint8_t>(to);
}

inline void BlockAllocator::Push(uint32_t index) {
  SetState(index, SlotState::kFree);
  slots_[index].word = free_head_;
  free_head_ = index;
}

inline absl::StatusOr<SlotId> BlockAllocator::Pop(SlotState to) {
  if (free_head_ == kEndOfList) return Exhausted();
  const uint32_t index = free_head_;
  free_head_ = slots_[index].word;
  SetState(index, to);
  slots_[index].word = to == SlotState::kWritable ? 1 : 0;
  return SlotId(index);
}

inline absl::StatusOr<SlotId> BlockAllocator::Allocate() { return Pop(SlotState::kWritable); }

inline absl::StatusOr<SlotId> BlockAllocator::AllocateForTransfer() {
  return Pop(SlotState::kInFlight);
}

inline absl::Status BlockAllocator::Release(SlotId slot) {
  if (InRange(slot)) {
    Slot& s = slots_[slot.value()];
    if (s.state == static_cast<uint8_t>(SlotState::kWritable)) {
      Push(slot.value());  // a partial block is private: nothing to keep
      return absl::OkStatus();
    }
    if (s.state == static_cast<uint8_t>(SlotState::kSealed)) {
      if (--s.word == 0) SetState(slot.value(), SlotState::kCached);
      return absl::OkStatus();
    }
  }
  return ReleaseError(slot);
}

}  // namespace kvtier

#endif  // KVTIER_BLOCK_ALLOCATOR_H_
