#include "kvtier/eviction_policy.h"

#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/eviction_candidacy.h"
#include "tests/testing/policy_testing.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

using ::kvtier::testing::At;
using ::kvtier::testing::Key;
BlockTraits Value(double recompute_seconds, int64_t bytes = 1 << 20) {
  return {.expected_reuse = 1, .recompute_seconds = recompute_seconds, .bytes = bytes};
}

TEST(LruPolicyTest, EvictsTheLeastRecentlyTouched) {
  auto p = MakeLruPolicy();
  EXPECT_EQ(p->name(), "lru");
  EXPECT_FALSE(p->Victim(At(0)).has_value());
  for (uint64_t i = 0; i < 4; ++i) KVTIER_ASSERT_OK(p->Add(Key(i), Value(1), At(i)));
  EXPECT_EQ(p->Victim(At(10)), Key(0));
  KVTIER_ASSERT_OK(p->Touch(Key(0), Value(1), At(10)));
  EXPECT_EQ(p->Victim(At(10)), Key(1));
  KVTIER_ASSERT_OK(p->Remove(Key(1)));
  EXPECT_EQ(p->Victim(At(10)), Key(2));
  EXPECT_EQ(p->size(), 3);
  // Equal times: the smaller block key goes first, whichever was added first, so the order does
  // not depend on the order transfers landed in.
  KVTIER_ASSERT_OK(p->Add(Key(9), Value(1), At(-5)));
  KVTIER_ASSERT_OK(p->Add(Key(8), Value(1), At(-5)));
  EXPECT_EQ(p->Victim(At(10)), Key(8));
  KVTIER_ASSERT_OK(p->Remove(Key(8)));
  KVTIER_ASSERT_OK(p->Add(Key(7), Value(1), At(-5)));
  EXPECT_EQ(p->Victim(At(10)), Key(7));
}

TEST(LruPolicyTest, ErrorsAndPriority) {
  auto p = MakeLruPolicy();
  KVTIER_ASSERT_OK(p->Add(Key(1), Value(1), At(0)));
  EXPECT_THAT(p->Add(Key(1), Value(1), At(0)), IsError(StatusCode::kAlreadyExists, ""));
  EXPECT_THAT(p->Touch(Key(2), Value(1), At(0)), IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT(p->Remove(Key(2)), IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT(p->Add(Key(3), {.expected_reuse = 0}, At(0)),
              IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(p->Add(Key(3), {.bytes = 0}, At(0)), IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(p->Add(Key(3), {.retention_priority = -1}, At(0)),
              IsError(StatusCode::kInvalidArgument, ""));
  // Key 2, touched later but with a priority until t=100, outlives key 1 until then, not after.
  KVTIER_ASSERT_OK(p->Add(Key(0), {.retention_priority = 1, .priority_until = At(100)}, At(-10)));
  EXPECT_EQ(p->Victim(At(50)), Key(1));
  EXPECT_EQ(p->Victim(At(100)), Key(0));
}

BlockTraits OfRun(int run_blocks, double uses = 1) {
  return {
      .expected_reuse = uses, .recompute_seconds = 1, .bytes = 1 << 20, .run_blocks = run_blocks};
}

std::unique_ptr<EvictionPolicy> CostAware(CostAwareOptions options = {}) {
  auto made = MakeCostAwarePolicy(options);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

TEST(CostAwarePolicyTest, ColdStartIsLeastRecentlyUsedAndErrors) {
  auto p = CostAware();
  EXPECT_EQ(p->name(), "cost_aware");
  EXPECT_FALSE(p->Victim(At(0)).has_value());
  // No life has ended yet: every density is 0 and the oldest last use goes first.
  KVTIER_ASSERT_OK(p->Add(Key(1), OfRun(1), At(5)));
  KVTIER_ASSERT_OK(p->Add(Key(2), OfRun(20), At(1)));
  KVTIER_ASSERT_OK(p->Add(Key(3), OfRun(3), At(3)));
  EXPECT_EQ(p->size(), 3);
  EXPECT_EQ(p->Victim(At(10)), Key(2));
  KVTIER_ASSERT_OK(p->Remove(Key(2)));
  EXPECT_EQ(p->Victim(At(10)), Key(3));
  EXPECT_THAT(p->Add(Key(1), OfRun(1), At(0)), IsError(StatusCode::kAlreadyExists, ""));
  EXPECT_THAT(p->Touch(Key(2), OfRun(1), At(0)), IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT(p->Remove(Key(2)), IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT(p->Add(Key(4), OfRun(0), At(0)), IsError(StatusCode::kInvalidArgument, "run_blocks"));
  EXPECT_THAT(p->Add(Key(4), {.bytes = 0}, At(0)), IsError(StatusCode::kInvalidArgument, ""));

  EXPECT_THAT(MakeCostAwarePolicy({.half_life = absl::ZeroDuration()}).status(),
              IsError(StatusCode::kInvalidArgument, "half_life"));
  EXPECT_THAT(MakeCostAwarePolicy({.sample_size = 0}).status(),
              IsError(StatusCode::kInvalidArgument, "sample_size"));
  EXPECT_THAT(MakeCostAwarePolicy({.reconfigure_outcomes = 0}).status(),
              IsError(StatusCode::kInvalidArgument, "reconfigure_outcomes"));
  EXPECT_THAT(MakeCostAwarePolicy({.ghost_horizon = absl::Seconds(-1)}).status(),
              IsError(StatusCode::kInvalidArgument, "ghost_horizon"));
  EXPECT_THAT(MakeEvictionPolicy("fifo").status(),
              IsError(StatusCode::kInvalidArgument, "lru, cost_aware"));
}

// Blocks of one class (run_blocks 1) are used again 10 s after their last use; blocks of another
// (run_blocks 20) never are and get evicted. Afterwards a fresh block of the second class goes
// before an older one of the first, which LRU would evict.
TEST(CostAwarePolicyTest, LearnsWhichClassIsReused) {
  auto p = CostAware({.reconfigure_outcomes = 1});
  double t = 0;
  for (uint64_t i = 0; i < 200; ++i, t += 20) {
    const BlockKey reused = Key(2 * i);
    const BlockKey unused = Key(2 * i + 1);
    KVTIER_ASSERT_OK(p->Add(unused, OfRun(20), At(t)));
    KVTIER_ASSERT_OK(p->Add(reused, OfRun(1), At(t + 1)));
    if (i < 3) {
      // Cold: the least recently used goes, whatever its class.
      EXPECT_EQ(p->Victim(At(t + 10)), unused);
    } else {
      // Learned: the block of the unused class goes first at any age.
      EXPECT_EQ(p->Victim(At(t + 10)), unused) << "round " << i;
    }
    KVTIER_ASSERT_OK(p->Remove(unused));  // evicted: the Remove of the victim
    KVTIER_ASSERT_OK(p->Remove(reused));  // pinned by a request at t + 10: a reuse at age 9
  }
  EXPECT_EQ(p->size(), 0);
  KVTIER_ASSERT_OK(p->Add(Key(1000), OfRun(1), At(t)));
  KVTIER_ASSERT_OK(p->Add(Key(1001), OfRun(25), At(t + 5)));  // same class as run 20 (16-31)
  EXPECT_EQ(p->Victim(At(t + 6)), Key(1001));
  // A block used twice is another class, one with no outcome yet: it borrows the pooled
  // estimate (a reuse about half the time), which ranks between the two.
  KVTIER_ASSERT_OK(p->Add(Key(1002), OfRun(20, 2), At(t + 5)));
  EXPECT_EQ(p->Victim(At(t + 6)), Key(1001));
  KVTIER_ASSERT_OK(p->Remove(Key(1001)));
  EXPECT_EQ(p->Victim(At(t + 6)), Key(1002));
}

// A Discard (dropped unused on the caller's word: an invalidation) ends a life unreused, where a
// Remove not after Victim would count a reuse. Blocks of one class (run_blocks 1) are discarded
// at age 9 s; blocks of another (run_blocks 20) are used again at age 9. Then a fresh block of
// the reused class stays and an older one of the discarded class goes. Were the discards counted
// as reuses, both classes would be reused at 9 s and the older block, nearer its reuse, would stay.
TEST(CostAwarePolicyTest, ADiscardedBlockIsNoReuse) {
  auto p = CostAware({.reconfigure_outcomes = 1});
  double t = 0;
  for (uint64_t i = 0; i < 200; ++i, t += 20) {
    const BlockKey discarded = Key(2 * i);
    const BlockKey reused = Key(2 * i + 1);
    KVTIER_ASSERT_OK(p->Add(discarded, OfRun(1), At(t)));
    KVTIER_ASSERT_OK(p->Add(reused, OfRun(20), At(t)));
    KVTIER_ASSERT_OK(p->Touch(reused, OfRun(20), At(t + 9)));  // a reuse at age 9
    KVTIER_ASSERT_OK(p->Discard(discarded));                   // at age 9 too
    KVTIER_ASSERT_OK(p->Remove(reused));
  }
  EXPECT_EQ(p->size(), 0);
  EXPECT_THAT(p->Discard(Key(1)), IsError(StatusCode::kNotFound, "not a candidate"));
  KVTIER_ASSERT_OK(p->Add(Key(1000), OfRun(1), At(t)));
  KVTIER_ASSERT_OK(p->Add(Key(1001), OfRun(20), At(t + 5)));
  EXPECT_EQ(p->Victim(At(t + 6)), Key(1000));
}

// Blocks evicted at age 1 s that come back 30 s after their last use are reused blocks: the
// ghost of each eviction turns it into a reuse at age 30, beyond any age the policy let a block
// of that class reach. Blocks of another class that never come back rank below them.
TEST(CostAwarePolicyTest, EvictedBlocksThatComeBackCountAsReused) {
  auto p = CostAware({.reconfigure_outcomes = 1});
  double t = 0;
  for (uint64_t i = 0; i < 200; ++i, t += 40) {
    const BlockKey back = Key(2 * i);
    const BlockKey gone = Key(2 * i + 1);
    KVTIER_ASSERT_OK(p->Add(back, OfRun(1), At(t)));
    KVTIER_ASSERT_OK(p->Add(gone, OfRun(20), At(t)));
    for (int j = 0; j < 2; ++j) {
      const std::optional<BlockKey> victim = p->Victim(At(t + 1));
      ASSERT_TRUE(victim.has_value());
      KVTIER_ASSERT_OK(p->Remove(*victim));
    }
    // Requested again (recomputed) and released: a candidate once more, last used at t + 30.
    KVTIER_ASSERT_OK(p->Add(back, OfRun(1), At(t + 30)));
    const std::optional<BlockKey> victim = p->Victim(At(t + 31));
    ASSERT_TRUE(victim.has_value());
    KVTIER_ASSERT_OK(p->Remove(*victim));
  }
  KVTIER_ASSERT_OK(p->Add(Key(1000), OfRun(1), At(t)));
  KVTIER_ASSERT_OK(p->Add(Key(1001), OfRun(20), At(t + 5)));
  EXPECT_EQ(p->Victim(At(t + 6)), Key(1001));
}

// Sampling is deterministic: the same calls give the same victims; with more candidates than
// the sample, the victim is one of the candidates.
TEST(CostAwarePolicyTest, SamplesDeterministically) {
  auto run = [](uint64_t seed) {
    auto p = CostAware({.sample_size = 4, .seed = seed, .reconfigure_outcomes = 8});
    std::vector<uint64_t> victims;
    std::mt19937 rng(3);
    uint64_t next = 0;
    std::map<uint64_t, bool> live;
    for (int step = 0; step < 2000; ++step) {
      const double now = step;
      KVTIER_EXPECT_OK(
          p->Add(Key(next), OfRun(1 + static_cast<int>(rng() % kMaxRunBlocks)), At(now)));
      live[next++] = true;
      if (rng() % 3 == 0) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        KVTIER_EXPECT_OK(p->Remove(Key(it->first)));  // a reuse
        live.erase(it);
      }
      if (live.size() > 50) {
        const std::optional<BlockKey> victim = p->Victim(At(now));
        EXPECT_TRUE(victim.has_value() && live.contains(victim->hi));
        if (!victim.has_value()) break;
        victims.push_back(victim->hi);
        KVTIER_EXPECT_OK(p->Remove(*victim));
        live.erase(victim->hi);
      }
    }
    EXPECT_EQ(p->size(), static_cast<int64_t>(live.size()));
    return victims;
  };
  const std::vector<uint64_t> a = run(1);
  EXPECT_GT(a.size(), 500u);
  EXPECT_EQ(run(1), a);
  EXPECT_NE(run(2), a);
}

}  // namespace
}  // namespace kvtier
