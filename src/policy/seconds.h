// Seconds of an absl::Duration as a double, on the policies' hot paths: absl::ToDoubleSeconds
// divides in 128 bits (FDivDuration), which ranking thousands of candidates per request notices.
#ifndef KVTIER_SRC_POLICY_SECONDS_H_
#define KVTIER_SRC_POLICY_SECONDS_H_

#include <cstdint>
#include <limits>

#include "absl/time/time.h"

namespace kvtier::internal {

// Exact to the nanosecond for |d| below about 292 years; +-infinity for an infinite duration;
// longer finite ones through absl::ToDoubleSeconds.
inline double FastSeconds(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return std::numeric_limits<double>::infinity();
  if (d == -absl::InfiniteDuration()) return -std::numeric_limits<double>::infinity();
  const int64_t ns = absl::ToInt64Nanoseconds(d);
  // Saturated (beyond about 292 years): the slow exact conversion.
  if (ns == std::numeric_limits<int64_t>::max() || ns == std::numeric_limits<int64_t>::min()) {
    return absl::ToDoubleSeconds(d);
  }
  return static_cast<double>(ns) * 1e-9;
}

}  // namespace kvtier::internal

#endif  // KVTIER_SRC_POLICY_SECONDS_H_
