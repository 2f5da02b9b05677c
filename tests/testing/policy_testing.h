// What the eviction policy tests share: a fixed trace clock and distinct block keys.
#ifndef KVTIER_TESTS_TESTING_POLICY_TESTING_H_
#define KVTIER_TESTS_TESTING_POLICY_TESTING_H_

#include <cstdint>

#include "absl/time/time.h"
#include "kvtier/block_key.h"

namespace kvtier::testing {

inline constexpr absl::Time kPolicyT0 = absl::FromUnixSeconds(1'700'000'000);
// `seconds` after kPolicyT0.
inline absl::Time At(double seconds) { return kPolicyT0 + absl::Seconds(seconds); }
// Block i's key: distinct for distinct i, with a `lo` that differs too (maps hash `lo`).
inline BlockKey Key(uint64_t i) { return BlockKey{i, i * 7 + 1}; }

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_POLICY_TESTING_H_
