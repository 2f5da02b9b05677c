// Two small functions every part of the replay harness uses alike, kept in one place so the
// cache-mode replay and the serving simulation hash and rank the same way.
#ifndef KVTIER_BENCH_REPLAY_TRACE_REPLAY_MATH_H_
#define KVTIER_BENCH_REPLAY_TRACE_REPLAY_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kvtier::replay {

// splitmix64's step and finalizer on `z` (Steele, Lea and Flood, OOPSLA 2014): a fixed
// bijective mix, the same on every platform, so generated tokens and bytes repeat exactly.
inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The q-quantile of `v` (q in [0, 1]) by nearest rank: the smallest value with at least
// q x size values at or below it; 0 for an empty `v`. Takes `v` by value (it sorts it).
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_REPLAY_MATH_H_
