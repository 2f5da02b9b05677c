// Typed identifiers: a slot, a sequence and a tier are different things and never convert into
// each other, nor silently from or to their integer representation.
//
// Thread-safety: plain values; safe to copy and read from any thread.
// Naming follows TensorRT-LLM's kernels/kvCacheIndex.h (a wrapped index type per meaning).
#ifndef KVTIER_IDS_H_
#define KVTIER_IDS_H_

#include <compare>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

namespace kvtier {

// A strongly typed integer. `Tag` only distinguishes types; two StrongIds with different tags do
// not compare, assign or convert into each other. Construction from the integer is explicit.
template <typename Tag, typename Rep>
class StrongId {
 public:
  using rep_type = Rep;

  // The reserved invalid value (all ones). A default-constructed id is invalid.
  static constexpr Rep kInvalidValue = std::numeric_limits<Rep>::max();

  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep value) : value_(value) {}

  constexpr Rep value() const { return value_; }
  constexpr bool valid() const { return value_ != kInvalidValue; }

  friend constexpr auto operator<=>(StrongId, StrongId) = default;

  template <typename H>
  friend H AbslHashValue(H h, StrongId id) {
    return H::combine(std::move(h), id.value_);
  }

 private:
  Rep value_ = kInvalidValue;
};

// A physical place for one block inside one tier. Tier-local: slot 7 of HBM and slot 7 of DRAM
// are unrelated. Values are in [0, capacity_blocks) of the tier's BlockAllocator.
using SlotId = StrongId<struct SlotIdTag, uint32_t>;

// One request's token stream (a conversation turn, a beam, a fork). Chosen by the caller.
using SequenceId = StrongId<struct SequenceIdTag, uint64_t>;

// The memory hierarchy, fastest first. The numeric order is the onboard direction's reverse:
// a smaller value is closer to the attention kernel.
enum class Tier : uint8_t {
  kHbm = 0,     // GPU memory (or the host-emulated device tier)
  kDram = 1,    // pinned host memory
  kNvme = 2,    // local NVMe, O_DIRECT
  kRemote = 3,  // a pooled store shared by a fleet
};
inline constexpr int kNumTiers = 4;

// Lower-case name of a tier, e.g. "hbm". Never fails: an out-of-range value gives "unknown".
constexpr std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return "hbm";
    case Tier::kDram:
      return "dram";
    case Tier::kNvme:
      return "nvme";
    case Tier::kRemote:
      return "remote";
  }
  return "unknown";
}

// Index of a tier in per-tier arrays, in [0, kNumTiers).
constexpr int TierIndex(Tier tier) { return static_cast<int>(tier); }

}  // namespace kvtier

#endif  // KVTIER_IDS_H_
