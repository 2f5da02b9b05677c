// internal::StableHashMap: agrees with std::map under random inserts and erasures, keeps
// elements in place as it grows, reuses erased slots and costs 4 bytes of table per element.
#include "internal/stable_hash_map.h"

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::internal {
namespace {

// A hash that sends every key to few buckets, so chains are long and unlinking walks them.
struct CollidingHash {
  size_t operator()(uint64_t k) const { return static_cast<size_t>(k % 3); }
};

TEST(StableHashMapTest, InsertFindEraseAgreeWithAReferenceMap) {
  StableHashMap<uint64_t, std::string> map;
  std::map<uint64_t, std::string> ref;
  std::mt19937_64 rng(11);
  for (int step = 0; step < 200000; ++step) {
    const uint64_t k = rng() % 5000;
    switch (rng() % 3) {
      case 0: {
        auto [it, inserted] = map.try_emplace(k, std::to_string(step));
        auto [rit, rinserted] = ref.try_emplace(k, std::to_string(step));
        ASSERT_EQ(inserted, rinserted);
        ASSERT_EQ(it->second, rit->second);
        break;
      }
      case 1:
        ASSERT_EQ(map.erase(k), ref.erase(k));
        break;
      default: {
        auto it = map.find(k);
        auto rit = ref.find(k);
        ASSERT_EQ(it == map.end(), rit == ref.end());
        if (rit != ref.end()) {
          ASSERT_EQ(it->second, rit->second);
        }
      }
    }
    ASSERT_EQ(map.size(), ref.size());
  }
  std::map<uint64_t, std::string> seen;
  for (const auto& [k, v] : map) ASSERT_TRUE(seen.emplace(k, v).second) << "key twice: " << k;
  EXPECT_EQ(seen, ref);
}

TEST(StableHashMapTest, ElementsDoNotMoveWhenTheMapGrows) {
  StableHashMap<uint64_t, uint64_t> map;
  std::vector<const std::pair<const uint64_t, uint64_t>*> where;
  for (uint64_t k = 0; k < 3000; ++k) where.push_back(&*map.try_emplace(k, k * 7).first);
  for (uint64_t k = 3000; k < 50000; ++k) map[k] = k * 7;  // many rehashes and chunks
  for (uint64_t k = 0; k < 3000; ++k) {
    auto it = map.find(k);
    ASSERT_NE(it, map.end());
    EXPECT_EQ(&*it, where[k]);
    EXPECT_EQ(it->second, k * 7);
  }
}

TEST(StableHashMapTest, HandlesNameTheirElementsAcrossGrowthAndOtherErasures) {
  StableHashMap<uint64_t, uint64_t> map;
  std::vector<uint32_t> handle;
  for (uint64_t k = 0; k < 10000; ++k) {
    handle.push_back(decltype(map)::handle(map.try_emplace(k, k * 3).first));
  }
  for (uint64_t k = 0; k < 10000; k += 2) ASSERT_EQ(map.erase(k), 1u);
  for (uint64_t k = 20000; k < 25000; ++k) map[k] = k;  // reuses the erased slots
  for (uint64_t k = 1; k < 10000; k += 2) {
    const auto& element = map.at_handle(handle[k]);
    ASSERT_EQ(element.first, k);
    ASSERT_EQ(element.second, k * 3);
    ASSERT_EQ(decltype(map)::handle(map.find(k)), handle[k]);
  }
}

TEST(StableHashMapTest, ErasedSlotsAreReusedAndChainsStayIntact) {
  StableHashMap<uint64_t, uint64_t, CollidingHash> map;
  for (uint64_t k = 0; k < 300; ++k) map[k] = k;
  // Erase from the middle, the head and the tail of the three chains.
  for (uint64_t k = 0; k < 300; k += 2) ASSERT_EQ(map.erase(k), 1u);
  ASSERT_EQ(map.erase(uint64_t{0}), 0u);
  EXPECT_EQ(map.size(), 150u);
  for (uint64_t k = 0; k < 300; ++k) EXPECT_EQ(map.contains(k), k % 2 == 1) << k;
  // Reinserting fills the freed slots: iteration still sees each key once.
  for (uint64_t k = 1000; k < 1150; ++k) map[k] = k;
  EXPECT_EQ(map.size(), 300u);
  size_t n = 0;
  for (const auto& [k, v] : map) {
    EXPECT_EQ(k, v);
    ++n;
  }
  EXPECT_EQ(n, 300u);
}

TEST(StableHashMapTest, EraseWhileIteratingVisitsTheRest) {
  StableHashMap<uint64_t, uint64_t> map;
  for (uint64_t k = 0; k < 10000; ++k) map[k] = k;
  uint64_t kept = 0;
  for (auto it = map.begin(); it != map.end();) {
    if (it->first % 3 == 0) {
      it = map.erase(it);
    } else {
      kept += it->first;
      ++it;
    }
  }
  uint64_t expect = 0;
  for (uint64_t k = 0; k < 10000; ++k) expect += k % 3 == 0 ? 0 : k;
  EXPECT_EQ(kept, expect);
  EXPECT_EQ(map.size(), 10000u - 3334u);
}

TEST(StableHashMapTest, DestroysWhatItHolds) {
  auto counter = std::make_shared<int>(0);
  {
    StableHashMap<uint64_t, std::shared_ptr<int>> map;
    for (uint64_t k = 0; k < 100; ++k) map[k] = counter;
    EXPECT_EQ(counter.use_count(), 101);
    map.erase(uint64_t{5});
    EXPECT_EQ(counter.use_count(), 100);
    map.clear();
    EXPECT_EQ(counter.use_count(), 1);
    EXPECT_TRUE(map.empty());
    for (uint64_t k = 0; k < 10; ++k) map[k] = counter;
  }
  EXPECT_EQ(counter.use_count(), 1);
}

TEST(StableHashMapTest, TableCostsFourBytesPerElementAtAPowerOfTwo) {
  StableHashMap<uint64_t, uint64_t> map;
  constexpr uint64_t kN = uint64_t{1} << 16;
  for (uint64_t k = 0; k < kN; ++k) map[k] = k;
  // Slots: key 8 + value 8 + link 4 -> 24 bytes; 16 chunks of 4096; 2^16 buckets of 4 bytes.
  const size_t slots = 16 * 4096 * 24;
  EXPECT_GE(map.heap_bytes(), slots + kN * 4);
  EXPECT_LE(map.heap_bytes(), slots + kN * 4 + 4096);
}

}  // namespace
}  // namespace kvtier::internal
