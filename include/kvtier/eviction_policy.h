// Which released block of a tier to evict next. A policy ranks candidates only: the caller
// (KvCache) decides what a candidate is. DESIGN.md section 7: only released blocks (no running
// request holds them) and only leaves (no cached child in the same tier, since a child without
// its parent can never be hit) are candidates; the caller Adds a block when it becomes one and
// Removes it when it stops being one (pinned again, a child cached, evicted).
//
// Two policies behind one interface:
//   lru         the block touched longest ago (what vLLM, SGLang and LMCache ship); a retention
//               priority p counts, while it lasts, as a touch p x 30 minutes later.
//   cost_aware  the block of lowest value = expected reuse x recompute seconds saved / bytes,
//               aged over idle time: score(now) = value x exp(-(now - last_touch) / half_life x
//               ln 2), times (1 + retention_priority) while the priority lasts. Because the decay
//               is exponential, the order of two blocks does not change as time passes, so each
//               block keeps one key (ln value + last_touch x ln 2 / half_life) and finding the
//               victim is O(log n); a priority that ends re-keys its block then.
//
// Times are absl::Time (the caller's clock, so a replay can run on trace time). Thread-safety:
// not thread-safe; the caller serializes (KvCache holds its lock). Keys must be unique.
#ifndef KVTIER_EVICTION_POLICY_H_
#define KVTIER_EVICTION_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/block_key.h"

namespace kvtier {

// What a policy may weigh about a candidate. LRU reads only the retention priority.
struct BlockTraits {
  double expected_reuse = 1.0;    // expected future hits, > 0
  double recompute_seconds = 0;   // prefill time its presence saves (cost_model.h), >= 0
  int64_t bytes = 1;              // its size in this tier, > 0
  double retention_priority = 0;  // >= 0: value x (1 + priority) ...
  absl::Time priority_until = absl::InfinitePast();  // ... until then
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;

  // `key` became a candidate, last touched at `now`. kAlreadyExists if it is one;
  // kInvalidArgument for traits out of range.
  virtual absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) = 0;
  // `key` was used at `now` (a hit); its traits may have changed. kNotFound if not a candidate.
  virtual absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) = 0;
  // `key` stopped being a candidate. kNotFound if it was not one.
  virtual absl::Status Remove(const BlockKey& key) = 0;
  // The candidate to evict at `now` (it stays a candidate until Removed), or nullopt if none.
  virtual std::optional<BlockKey> Victim(absl::Time now) = 0;
  virtual int64_t size() const = 0;
};

std::unique_ptr<EvictionPolicy> MakeLruPolicy();

struct CostAwareOptions {
  absl::Duration half_life = absl::Minutes(5);  // idle time that halves a block's value, > 0
};
// Errors: kInvalidArgument for a half-life that is not positive and finite.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeCostAwarePolicy(
    const CostAwareOptions& options = {});

// "lru" or "cost_aware" with default options. Errors: kInvalidArgument naming the choices.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name);

}  // namespace kvtier

#endif  // KVTIER_EVICTION_POLICY_H_
