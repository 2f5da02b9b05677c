// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA
// 2014): the policies' sampling RNG and key mixer, with fixed output on every platform so a
// replay repeats exactly.
#ifndef KVTIER_SRC_POLICY_SPLITMIX_H_
#define KVTIER_SRC_POLICY_SPLITMIX_H_

#include <cstdint>

namespace kvtier::internal {

// splitmix64's finalizer: a fixed bijective mix of `z`.
inline uint64_t SplitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMix64Mix(state_ += 0x9e3779b97f4a7c15ULL); }

 private:
  uint64_t state_;
};

}  // namespace kvtier::internal

#endif  // KVTIER_SRC_POLICY_SPLITMIX_H_
