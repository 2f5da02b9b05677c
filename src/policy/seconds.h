// Seconds of an absl::Duration as a double, on the policies' hot paths: absl::ToDoubleSeconds
// divides in 128 bits (FDivDuration), which ranking thousands of candidates per request notices.
#ifndef KVTIER_SRC_POLICY_SECONDS_H_
#define KVTIER_SRC_POLICY_SECONDS_H_

#include <limits>

#include "absl/time/time.h"

namespace kvtier::internal {

// Exact to the nanosecond for |d| below about 292 years; +-infinity for an infinite duration
// (longer finite ones saturate at about 9.2e9 s).
inline double FastSeconds(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return std::numeric_limits<double>::infinity();
  if (d == -absl::InfiniteDuration()) return -std::numeric_limits<double>::infinity();
  return static_cast<double>(absl::ToInt64Nanoseconds(d)) * 1e-9;
}

}  // namespace kvtier::internal

#endif  // KVTIER_SRC_POLICY_SECONDS_H_
