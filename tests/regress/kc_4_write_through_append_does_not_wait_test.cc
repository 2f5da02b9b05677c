// KC-4: under write-through, Append did not wait for the copies that would free HBM. A released
// sequence's blocks are being copied down (write-through): while a copy reads a block it is no
// eviction candidate, but it becomes droppable (it has a lower copy) the moment the copy lands.
// Making room waited only for demotions, so with HBM full of such blocks Append failed with
// kResourceExhausted in microseconds, although the copies would land well within room_wait. Now
// making room also waits for copies in flight out of HBM whose source nobody else holds.
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

TEST(Regress_KC_4, WriteThroughAppendWaitsForCopiesThatFreeHbm) {
  KvCacheEnv env({.hbm_blocks = 8, .dram_blocks = 32, .fault_injectors = true});
  auto created = env.NewCache([](KvCacheOptions& o) {
    o.write_policy = WritePolicy::kWriteThrough;
    o.room_wait = absl::Seconds(10);
  });
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<KvCache> cache = std::move(*created);

  // A slow copy-down: each read of an HBM block takes 50 ms, one after another.
  env.fault(Tier::kHbm)->SetDelay(absl::Milliseconds(50));
  // Sequence 1 fills HBM and is written: 8 write-through copies start; it is released, so each
  // block is droppable once its copy lands.
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(1)));
  KVTIER_ASSERT_OK(cache->Append(SequenceId(1), Iota(8 * kB, 100)).status());
  KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(1), 8 * kB));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(1)));

  // A new request needs one slot: Append waits for the first copy to land, then drops its
  // source (the DRAM copy stays).
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(2)));
  const absl::Time start = absl::Now();
  absl::StatusOr<KvAppendResult> appended = cache->Append(SequenceId(2), Iota(kB, 9000));
  const absl::Duration took = absl::Now() - start;
  KVTIER_ASSERT_OK(appended.status()) << " after " << took << "\n" << StatsString(cache->stats());
  EXPECT_EQ(appended->num_new_slots, 1);
  EXPECT_LT(took, absl::Seconds(5));

  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(10)));
  const KvCacheStats s = cache->stats();
  EXPECT_EQ(s.tiers[TierIndex(Tier::kDram)].stored, 8) << StatsString(s);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache->Lookup(Iota(8 * kB, 100)));
  EXPECT_EQ(where.matched_tokens, 8 * kB);  // the dropped HBM copy is still in DRAM
  KVTIER_EXPECT_OK(cache->CheckInvariants());
  testing::ExpectTierAccounting(s);
}

}  // namespace
}  // namespace kvtier
