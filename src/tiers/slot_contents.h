// Which block each slot of a tier holds, for the backends that keep it in memory
// (InMemorySlotTier owns one; NvmeTier and RemoteTier keep their own beside their slots). A write
// invalidates its slot when it starts and records the key only once the bytes are in place, so
// a failed or torn write can never be read back as a block.
#ifndef KVTIER_TIERS_SLOT_CONTENTS_H_
#define KVTIER_TIERS_SLOT_CONTENTS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/ids.h"
#include "kvtier/tier_backend.h"

namespace kvtier::internal {

class SlotContents {
 public:
  explicit SlotContents(int64_t capacity_blocks)
      : entries_(static_cast<size_t>(capacity_blocks)) {}

  void Invalidate(SlotId slot) {
    MutexLock lock(&mu_);
    entries_[slot.value()].valid = false;
  }
  // Invalidates `slot` only while it still records `key`: a read of `key` that failed must not
  // unrecord a newer block a write put in the slot meanwhile (that read was stale, not the slot).
  // Returns whether it did.
  bool InvalidateIfHolds(SlotId slot, const BlockKey& key) {
    MutexLock lock(&mu_);
    Entry& e = entries_[slot.value()];
    if (!e.valid || e.key != key) return false;
    e.valid = false;
    return true;
  }
  void Set(SlotId slot, const BlockKey& key) {
    MutexLock lock(&mu_);
    entries_[slot.value()] = Entry{key, true};
  }
  // OK if `slot` holds `key`; kNotFound if it holds nothing; kDataLoss if another block.
  absl::Status Check(SlotId slot, const BlockKey& key, const TierInfo& info) const {
    MutexLock lock(&mu_);
    const Entry& e = entries_[slot.value()];
    if (!e.valid) {
      return absl::NotFoundError(absl::StrCat(info.name, ": slot ", slot.value(),
                                              " holds no complete block"));
    }
    if (e.key != key) {
      return absl::DataLossError(absl::StrCat(info.name, ": slot ", slot.value(), " holds block ",
                                              e.key.ToHex(), ", not ", key.ToHex()));
    }
    return absl::OkStatus();
  }
  static constexpr int64_t kBytesPerSlot = 24;

 private:
  struct Entry {
    BlockKey key;
    bool valid = false;
  };
  mutable Mutex mu_;  // Check only reads, but takes the lock
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// kInvalidArgument unless `slot` is inside the tier and `bytes` is one block.
inline absl::Status CheckBlockIo(const TierInfo& info, SlotId slot, size_t bytes) {
  if (slot.value() >= static_cast<uint64_t>(info.capacity_blocks)) {
    return absl::InvalidArgumentError(absl::StrCat(info.name, ": slot ", slot.value(),
                                                   " is outside [0, ", info.capacity_blocks, ")"));
  }
  if (static_cast<int64_t>(bytes) != info.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(info.name, ": a buffer of ", bytes,
                                                   " bytes for a block of ", info.block_bytes));
  }
  return absl::OkStatus();
}

inline absl::Status DeadlinePassed(const TierInfo& info, SlotId slot) {
  return absl::DeadlineExceededError(absl::StrCat(info.name, ": slot ", slot.value(),
                                                  ": the operation could not start by its deadline"));
}

// CheckBlockIo, then DeadlinePassed if `deadline` is already past: the preamble of an operation
// that starts on the calling thread.
inline absl::Status CheckBlockIoNow(const TierInfo& info, SlotId slot, size_t bytes,
                                    absl::Time deadline) {
  if (absl::Status s = CheckBlockIo(info, slot, bytes); !s.ok()) return s;
  if (absl::Now() > deadline) return DeadlinePassed(info, slot);
  return absl::OkStatus();
}

}  // namespace kvtier::internal

#endif  // KVTIER_TIERS_SLOT_CONTENTS_H_
