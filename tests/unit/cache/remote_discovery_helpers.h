// What the remote discovery tests (remote_discovery_test.cc, remote_discovery_redis_fault_test.cc)
// build on: a namespace of the cache tests' model under given weights, a cache of 16 HBM blocks
// over a shared store, a kernel's computing and storing of a prompt, another cache that stores a
// prompt and goes, and the checks every test makes of a cache it is done with.
//
// Block i of a prompt computed with seed s holds kv_cache_fixture.h's pattern of seed s + i, so a
// reader checks any block it onboarded byte-exact with BlockPatternMismatches.
//
// Thread-safety: plain functions; each call uses only the cache it is given.
#ifndef KVTIER_TESTS_UNIT_CACHE_REMOTE_DISCOVERY_HELPERS_H_
#define KVTIER_TESTS_UNIT_CACHE_REMOTE_DISCOVERY_HELPERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "internal/status_macros.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/device_block_table.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_stack.h"
#include "kvtier/transport.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::discovery_testing {

inline constexpr int kB = testing::KvCacheEnv::kTokensPerBlock;
inline constexpr int kRemote = TierIndex(Tier::kRemote);

inline SequenceId Seq(uint64_t id) { return SequenceId(id); }

// Expects blocks 0..count-1 of `table` to hold the bytes a kernel wrote from seed + i
// (kv_cache_fixture.h's pattern), naming the first block that does not.
inline void ExpectBlocksFromSeed(const KvGeometry& g, const DeviceBlockTable& table, size_t count,
                                 uint32_t seed) {
  for (size_t i = 0; i < count; ++i) {
    EXPECT_EQ(testing::BlockPatternMismatches(g, table, i, seed + static_cast<uint32_t>(i)), 0)
        << "block " << i;
  }
}

// The cache tests' namespace (tiny model, layer-first HBM) with weights `weights`, over
// `geometry` (KvCacheEnv::Geometry(): 512-byte blocks, unless a test needs larger ones).
inline CacheNamespace NamespaceWithWeights(
    const std::string& weights, const KvGeometry& geometry = testing::KvCacheEnv::Geometry()) {
  auto ns = CacheNamespace::Create(geometry, {.model_id = "kvtier-test/tiny-model",
                                              .weights_fingerprint = weights,
                                              .hbm_layout = HbmLayout::kLayerFirst});
  EXPECT_TRUE(ns.ok()) << ns.status();
  return *ns;
}

// A cache of 16 HBM blocks and, when remote_blocks > 0, a remote tier of that many over
// `transport` (kMetadata: a MetadataTier standing for it), written through (every written block
// is copied to the store at once); `edit` changes the options last.
inline absl::StatusOr<std::unique_ptr<KvCache>> NewCache(
    const CacheNamespace& ns, std::shared_ptr<Transport> transport, int64_t remote_blocks,
    const std::function<void(KvCacheOptions&)>& edit = {},
    TierBackendKind remote_kind = TierBackendKind::kNative) {
  TierStackOptions stack;
  stack.tiers[TierIndex(Tier::kHbm)].capacity_blocks = 16;
  stack.hbm.layout = HbmLayout::kLayerFirst;
  if (remote_blocks > 0) {
    stack.tiers[kRemote] = {.capacity_blocks = remote_blocks, .kind = remote_kind};
    stack.remote.transport = std::move(transport);
  }
  KVTIER_ASSIGN_OR_RETURN(TierBackends tiers, BuildTierStack(ns, stack));
  KvCacheOptions options;
  options.tiers = std::move(tiers);
  options.write_policy = WritePolicy::kWriteThrough;
  options.room_wait = absl::Seconds(5);
  if (edit) edit(options);
  return KvCache::Create(ns, std::move(options));
}

// What every test checks of a cache it is done with.
inline void ExpectHealthy(const KvCache& cache) {
  KVTIER_EXPECT_OK(cache.WaitIdle(absl::Now() + absl::Seconds(30)));
  KVTIER_EXPECT_OK(cache.CheckInvariants());
  testing::ExpectTierAccounting(cache.stats());
}

// Computes `prompt` through sequence `id` as a kernel would (block i's bytes from seed + i),
// reports it written, waits until write-through has copied it down, and releases it.
inline void ComputeAndStore(KvCache& cache, uint64_t id, const std::vector<int32_t>& prompt,
                            uint32_t seed, const SequenceOptions& options = {}) {
  KVTIER_ASSERT_OK(cache.CreateSequence(Seq(id), options));
  KVTIER_ASSERT_OK(cache.Append(Seq(id), prompt).status());
  const auto n = static_cast<int64_t>(prompt.size());
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache.EnsureResident(Seq(id), 0, n));
  const auto blocks =
      static_cast<size_t>(n / cache.cache_namespace().geometry().tokens_per_block());
  for (size_t i = 0; i < blocks; ++i) {
    ASSERT_NO_FATAL_FAILURE(testing::WriteBlockPattern(
        cache.cache_namespace().geometry(), t.block_table(), i, seed + static_cast<uint32_t>(i)));
  }
  KVTIER_ASSERT_OK(cache.ReportWritten(Seq(id), n));
  KVTIER_ASSERT_OK(cache.ReleaseTicket(t));
  KVTIER_ASSERT_OK(cache.WaitIdle(absl::Now() + absl::Seconds(30)));
  KVTIER_ASSERT_OK(cache.Release(Seq(id)));
}

// Another cache of `ns` over `store` (32 remote slots) computes `prompt` (block i's bytes from
// seed + i), stores it through write-through, and is destroyed: the store alone has the blocks.
inline void StoreFromAnotherCache(const CacheNamespace& ns, std::shared_ptr<Transport> store,
                                  const std::vector<int32_t>& prompt, uint32_t seed) {
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> a, NewCache(ns, std::move(store), 32));
  ASSERT_NO_FATAL_FAILURE(ComputeAndStore(*a, 1, prompt, seed));
}

}  // namespace kvtier::discovery_testing

#endif  // KVTIER_TESTS_UNIT_CACHE_REMOTE_DISCOVERY_HELPERS_H_
