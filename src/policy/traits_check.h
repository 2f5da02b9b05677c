// The range check every EvictionPolicy makes on the BlockTraits it is given.
#ifndef KVTIER_SRC_POLICY_TRAITS_CHECK_H_
#define KVTIER_SRC_POLICY_TRAITS_CHECK_H_

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/eviction_candidacy.h"
#include "kvtier/eviction_policy.h"

namespace kvtier::internal {

// kInvalidArgument naming the values when a trait is out of the range eviction_policy.h gives.
inline absl::Status CheckTraits(const BlockTraits& t) {
  auto finite_at_least = [](double v, double low) { return std::isfinite(v) && v >= low; };
  if (!finite_at_least(t.expected_reuse, 0) || t.expected_reuse == 0 ||
      !finite_at_least(t.recompute_seconds, 0) || t.bytes <= 0 ||
      !finite_at_least(t.retention_priority, 0) || t.run_blocks < 1 ||
      t.run_blocks > kMaxRunBlocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction policy: traits out of range (expected_reuse ", t.expected_reuse,
                     " > 0, recompute_seconds ", t.recompute_seconds, " >= 0, bytes ", t.bytes,
                     " > 0, retention_priority ", t.retention_priority, " >= 0, run_blocks ",
                     t.run_blocks, " in [1, ", kMaxRunBlocks, "])"));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::internal

#endif  // KVTIER_SRC_POLICY_TRAITS_CHECK_H_
