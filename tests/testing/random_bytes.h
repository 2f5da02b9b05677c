// Deterministic pseudo-random block contents for tests: equal seeds, equal bytes.
#ifndef KVTIER_TESTS_TESTING_RANDOM_BYTES_H_
#define KVTIER_TESTS_TESTING_RANDOM_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace kvtier::testing {

inline std::vector<std::byte> RandomBytes(int64_t size, uint32_t seed) {
  std::vector<std::byte> b(static_cast<size_t>(size));
  std::mt19937 rng(seed);
  for (std::byte& x : b) x = static_cast<std::byte>(rng());
  return b;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_RANDOM_BYTES_H_
