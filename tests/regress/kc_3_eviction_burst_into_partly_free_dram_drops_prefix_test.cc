// KC-3: a burst of evictions into a partly free DRAM dropped a prefix. HBM 20, DRAM 2 (empty),
// NVMe 64: making room for a 20-block request demoted the first two victims (the released
// prefix's tail, leaf first) into DRAM's two free slots; DRAM was then full of blocks still
// arriving, none of which could be demoted yet, so every other victim was dropped: 16
// evictions, 2 demotions, the two tail blocks left in DRAM without their parents, NVMe empty,
// and the prefix no longer matched at all. (The cascade worked when DRAM started full: its
// own victims were demoted to NVMe and HBM's waited for them.) Now a victim whose first lower
// tier is full with nothing under way that will free a slot goes to the next admitting tier that
// has room, and blocks arriving in a tier count as something to wait for.
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Iota;
using ::kvtier::testing::KvCacheEnv;
using ::kvtier::testing::StatsString;

constexpr int kB = KvCacheEnv::kTokensPerBlock;
constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr int kDram = TierIndex(Tier::kDram);
constexpr int kNvme = TierIndex(Tier::kNvme);

TEST(Regress_KC_3, EvictionBurstIntoPartlyFreeDramKeepsThePrefix) {
  KvCacheEnv env({.hbm_blocks = 20, .dram_blocks = 2, .nvme_blocks = 64});
  auto created = env.NewCache([](KvCacheOptions& o) { o.room_wait = absl::Seconds(2); });
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<KvCache> cache = std::move(*created);

  // A 16-block prefix, computed and released: droppable in HBM, DRAM and NVMe empty.
  const std::vector<int32_t> prefix = Iota(16 * kB, 100);
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(1)));
  KVTIER_ASSERT_OK(cache->Append(SequenceId(1), prefix).status());
  KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(1), 16 * kB));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(1)));
  env.clock().Advance(absl::Seconds(1));

  // A 20-block request takes all of HBM: every block of the prefix is evicted in one burst.
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(2)));
  KVTIER_ASSERT_OK(cache->Append(SequenceId(2), Iota(20 * kB, 90000)).status());
  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(10)));

  const KvCacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[kHbm].evictions, 16) << StatsString(s);
  EXPECT_EQ(s.tiers[kHbm].demotions, 16) << StatsString(s);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache->Lookup(prefix));
  EXPECT_EQ(where.matched_tokens, 16 * kB) << StatsString(s);
  EXPECT_EQ(where.blocks_by_tier[kDram] + where.blocks_by_tier[kNvme], 16) << StatsString(s);
  EXPECT_EQ(s.tiers[kDram].stored + s.tiers[kNvme].stored, 16) << StatsString(s);
  KVTIER_EXPECT_OK(cache->CheckInvariants());
  testing::ExpectTierAccounting(s);
}

}  // namespace
}  // namespace kvtier
