#include "kvtier/eviction_policy.h"

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }
BlockKey Key(uint64_t i) { return BlockKey{i, i * 7 + 1}; }
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
  // Equal times: the one added first goes first.
  KVTIER_ASSERT_OK(p->Add(Key(8), Value(1), At(-5)));
  KVTIER_ASSERT_OK(p->Add(Key(9), Value(1), At(-5)));
  EXPECT_EQ(p->Victim(At(10)), Key(8));
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

TEST(CostAwarePolicyTest, ValuePerByteAgedByIdleTime) {
  auto made = MakeCostAwarePolicy({.half_life = absl::Seconds(60)});
  ASSERT_TRUE(made.ok());
  auto& p = *made;
  EXPECT_EQ(p->name(), "cost_aware");
  // Same age: the cheaper to recompute (per byte) goes first.
  KVTIER_ASSERT_OK(p->Add(Key(1), Value(4.0), At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(2), Value(1.0), At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(3), Value(4.0, 2 << 20), At(0)));  // same saving, twice the bytes
  EXPECT_EQ(p->Victim(At(0)), Key(2));
  KVTIER_ASSERT_OK(p->Remove(Key(2)));
  EXPECT_EQ(p->Victim(At(0)), Key(3));
  KVTIER_ASSERT_OK(p->Remove(Key(3)));
  // A block worth 4x but idle for more than two half-lives loses to a fresh one worth 1x.
  KVTIER_ASSERT_OK(p->Add(Key(4), Value(1.0), At(119)));
  EXPECT_EQ(p->Victim(At(200)), Key(4)) << "4 x 2^-(119/60) is still above 1";
  KVTIER_ASSERT_OK(p->Touch(Key(4), Value(1.0), At(121)));
  EXPECT_EQ(p->Victim(At(200)), Key(1)) << "4 x 2^-(121/60) is below 1";
  // Expected reuse weighs in, and a block that saves nothing goes before anything.
  KVTIER_ASSERT_OK(
      p->Add(Key(5), {.expected_reuse = 3, .recompute_seconds = 0, .bytes = 1}, At(500)));
  EXPECT_EQ(p->Victim(At(500)), Key(5));
  EXPECT_THAT(MakeCostAwarePolicy({.half_life = absl::ZeroDuration()}).status(),
              IsError(StatusCode::kInvalidArgument, "half_life"));
  EXPECT_THAT(MakeEvictionPolicy("fifo").status(),
              IsError(StatusCode::kInvalidArgument, "lru, cost_aware"));
}

// The victim is always the candidate of lowest score at that moment, computed from the
// definition, whatever the sequence of adds, touches, removes and priorities.
TEST(CostAwarePolicyTest, VictimIsTheArgminOfTheDefinition) {
  const double half_life = 30;
  auto made = MakeCostAwarePolicy({.half_life = absl::Seconds(half_life)});
  ASSERT_TRUE(made.ok());
  auto& p = *made;
  struct Live {
    BlockTraits traits;
    double touched;
  };
  std::map<uint64_t, Live> live;
  std::mt19937 rng(7);
  double now = 0;
  auto score = [&](const Live& l) {
    const BlockTraits& t = l.traits;
    const bool boosted = t.retention_priority > 0 && At(now) < t.priority_until;
    return t.expected_reuse * t.recompute_seconds / static_cast<double>(t.bytes) *
           (boosted ? 1 + t.retention_priority : 1) *
           std::exp(-(now - l.touched) * std::log(2.0) / half_life);
  };
  for (int step = 0; step < 3000; ++step) {
    now += std::uniform_real_distribution<double>(0, 5)(rng);
    const uint64_t id = std::uniform_int_distribution<uint64_t>(0, 40)(rng);
    BlockTraits t{.expected_reuse = std::uniform_real_distribution<double>(0.1, 5)(rng),
                  .recompute_seconds = std::uniform_real_distribution<double>(0.001, 2)(rng),
                  .bytes = std::uniform_int_distribution<int64_t>(1, 1 << 20)(rng)};
    if (std::uniform_int_distribution<int>(0, 4)(rng) == 0) {
      t.retention_priority = std::uniform_real_distribution<double>(0.5, 10)(rng);
      t.priority_until = At(now + std::uniform_real_distribution<double>(0, 60)(rng));
    }
    const int op = std::uniform_int_distribution<int>(0, 2)(rng);
    if (op == 0 && !live.contains(id)) {
      KVTIER_ASSERT_OK(p->Add(Key(id), t, At(now)));
      live[id] = {t, now};
    } else if (op == 1 && live.contains(id)) {
      KVTIER_ASSERT_OK(p->Touch(Key(id), t, At(now)));
      live[id] = {t, now};
    } else if (op == 2 && live.contains(id)) {
      KVTIER_ASSERT_OK(p->Remove(Key(id)));
      live.erase(id);
    }
    ASSERT_EQ(p->size(), static_cast<int64_t>(live.size()));
    const std::optional<BlockKey> victim = p->Victim(At(now));
    if (live.empty()) {
      ASSERT_FALSE(victim.has_value());
      continue;
    }
    ASSERT_TRUE(victim.has_value());
    double lowest = INFINITY;
    for (const auto& [k, l] : live) lowest = std::min(lowest, score(l));
    const uint64_t chosen = victim->hi;
    ASSERT_TRUE(live.contains(chosen));
    ASSERT_NEAR(score(live[chosen]), lowest, lowest * 1e-9) << "step " << step;
  }
}

}  // namespace
}  // namespace kvtier
