// The life table over ages in units of each birth's idle estimate (src/policy/scaled_life_table.h):
// counts, survival and index on hand-computed lives; the index per second divides by the scale.
#include "policy/scaled_life_table.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/policy_testing.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::internal {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::At;
using ::kvtier::testing::IsError;

ScaledLifeTableOptions Small() {
  return {.edges = {0, 0.5, 1, 2},
          .grid = 0.25,
          .horizon_steps = {4},  // one unit
          .prior = 0,
          .refresh = absl::Seconds(10)};
}

// Four births at 0, estimates 10, 20, 4 and 100 s; outcomes 10 s (x = 1), 5 s (x = 0.25), never,
// 150 s (x = 1.5). [0, .5): 4 at risk, 1 event; [.5, 1): 3, 0; [1, 2): 3, 2.
// S(.5) = 3/4, S(1) = 3/4, S(2) = 3/4 x 1/3 = 1/4.
TEST(ScaledLifeTableTest, CountsSurvivalAndIndexInUnitsOfTheEstimate) {
  auto t = ScaledLifeTable::Create(1, Small());
  KVTIER_ASSERT_OK(t.status());
  const uint64_t b0 = t->Birth(0, At(0), absl::Seconds(10));
  const uint64_t b1 = t->Birth(0, At(0), absl::Seconds(20));
  t->Birth(0, At(0), absl::Seconds(4));
  const uint64_t b3 = t->Birth(0, At(0), absl::Seconds(100));
  EXPECT_TRUE(t->Advance(At(0)));
  t->Reuse(b1, At(5));
  t->Reuse(b0, At(10));
  EXPECT_TRUE(t->Advance(At(60)));
  // At 60 s every bucket has ended for the first three; for b3 only [0, .5) (50 s).
  EXPECT_EQ(t->at_risk(0, 0), 4);
  EXPECT_EQ(t->events(0, 0), 1);
  EXPECT_EQ(t->at_risk(0, 1), 2);
  EXPECT_EQ(t->at_risk(0, 2), 2);
  EXPECT_EQ(t->events(0, 2), 1);
  EXPECT_EQ(t->births_kept(), 1);
  EXPECT_FALSE(t->Advance(At(65)));  // the next refresh point is 70
  t->Reuse(b1, At(70));              // no longer kept: ignored
  t->Reuse(b3, At(150));
  EXPECT_TRUE(t->Advance(At(200)));
  EXPECT_EQ(t->births_kept(), 0);
  EXPECT_EQ(t->at_risk(0, 1), 3);
  EXPECT_EQ(t->events(0, 1), 0);
  EXPECT_EQ(t->at_risk(0, 2), 3);
  EXPECT_EQ(t->events(0, 2), 2);
  // Index per unit at x = 0: (1 - 3/4) / (integral of S over [0, 1] = 0.4375 + 0.375); per
  // second, divided by the estimate.
  EXPECT_DOUBLE_EQ(t->Index(0, absl::ZeroDuration(), absl::Seconds(10)), 0.25 / 0.8125 / 10);
  EXPECT_DOUBLE_EQ(t->Index(0, absl::ZeroDuration(), absl::Seconds(40)), 0.25 / 0.8125 / 40);
  // x = 0.5 (5 s of 10): (3/4 - S(1.5) = 1/2) / (0.375 + 0.3125).
  EXPECT_DOUBLE_EQ(t->Index(0, absl::Seconds(5), absl::Seconds(10)), 0.25 / 0.6875 / 10);
  // x = 1 (20 s of 20): (3/4 - 1/4) / (integral over [1, 2] = 1/2) = 1 per unit.
  EXPECT_DOUBLE_EQ(t->Index(0, absl::Seconds(20), absl::Seconds(20)), 1.0 / 20);
  EXPECT_DOUBLE_EQ(t->Index(0, absl::Seconds(80), absl::Seconds(20)), 0.0);  // past the edges
  // The chance of a return within one estimate, at x = 1: (3/4 - 1/4) / (3/4).
  auto c = t->ChanceOfReuse(0, absl::Seconds(10), absl::Seconds(10), absl::Seconds(10), 3);
  ASSERT_TRUE(c.has_value());
  EXPECT_DOUBLE_EQ(*c, 2.0 / 3);
  EXPECT_FALSE(
      t->ChanceOfReuse(0, absl::Seconds(10), absl::Seconds(10), absl::Seconds(10), 4).has_value());
}

// An exact estimate, learned: the index rises as a birth nears its estimate, and a birth due
// sooner outranks one due later whatever their ages.
TEST(ScaledLifeTableTest, ExactEstimatesOrderBirthsByTheirDueTime) {
  auto t = ScaledLifeTable::Create(1);
  KVTIER_ASSERT_OK(t.status());
  // Births every 5 s with estimates of 10 to 88 s, each back exactly on time; calls in time order.
  std::vector<std::pair<double, uint64_t>> returns;  // (time, birth)
  for (int i = 0; i < 200; ++i) {
    const double now = i * 5.0;
    std::sort(returns.begin(), returns.end());
    while (!returns.empty() && returns.front().first <= now) {
      t->Reuse(returns.front().second, At(returns.front().first));
      returns.erase(returns.begin());
    }
    const double e = 10 + (i % 7) * 13;
    returns.emplace_back(now + e, t->Birth(0, At(now), absl::Seconds(e)));
  }
  std::sort(returns.begin(), returns.end());
  for (const auto& [time, birth] : returns) t->Reuse(birth, At(time));
  t->Advance(At(5000));
  // Due in 10 s (released 30 s ago, estimate 40 s) against due in 200 s (just released).
  const double soon = t->Index(0, absl::Seconds(30), absl::Seconds(40));
  const double late = t->Index(0, absl::Seconds(1), absl::Seconds(201));
  EXPECT_GT(soon, 5 * late);
  EXPECT_GT(t->Index(0, absl::Seconds(30), absl::Seconds(40)),
            t->Index(0, absl::Seconds(10), absl::Seconds(40)));
}

// A birth whose outcome can no longer come (the caller forgets sessions after max_age) is
// withdrawn at max_age: counted in the buckets that had ended, never in the later ones.
TEST(ScaledLifeTableTest, ABirthWithNoOutcomeIsWithdrawnAtMaxAge) {
  ScaledLifeTableOptions o = Small();
  o.max_age = absl::Seconds(100);
  auto t = ScaledLifeTable::Create(1, o);
  KVTIER_ASSERT_OK(t.status());
  t->Advance(At(0));
  t->Birth(0, At(0), absl::Hours(10));  // bucket [0, .5) ends after 5 hours
  const uint64_t back = t->Birth(0, At(0), absl::Seconds(40));
  t->Reuse(back, At(90));  // x = 2.25: past the last edge, never an event
  EXPECT_TRUE(t->Advance(At(90)));  // point 90: every bucket of `back` has ended (80 s)
  EXPECT_EQ(t->births_kept(), 1);   // the 10-hour birth, 90 s old
  EXPECT_EQ(t->at_risk(0, 0), 1);
  EXPECT_TRUE(t->Advance(At(110)));  // point 110: it is withdrawn, never counted
  EXPECT_EQ(t->births_kept(), 0);
  EXPECT_EQ(t->at_risk(0, 0), 1);
  EXPECT_EQ(t->at_risk(0, 2), 1);
  EXPECT_EQ(t->events(0, 2), 0);
}

TEST(ScaledLifeTableTest, RejectsBadOptions) {
  EXPECT_THAT(ScaledLifeTable::Create(0).status(), IsError(StatusCode::kInvalidArgument, "classes"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.edges = {1, 2}}).status(),
              IsError(StatusCode::kInvalidArgument, "edges"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.edges = {0, 2, 1}}).status(),
              IsError(StatusCode::kInvalidArgument, "edges"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.grid = 0}).status(),
              IsError(StatusCode::kInvalidArgument, "grid"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.horizon_steps = {0}}).status(),
              IsError(StatusCode::kInvalidArgument, "horizon"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.prior = -1}).status(),
              IsError(StatusCode::kInvalidArgument, "prior"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.refresh = absl::ZeroDuration()}).status(),
              IsError(StatusCode::kInvalidArgument, "refresh"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.min_scale = absl::ZeroDuration()}).status(),
              IsError(StatusCode::kInvalidArgument, "scale"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.max_age = absl::ZeroDuration()}).status(),
              IsError(StatusCode::kInvalidArgument, "max_age"));
  EXPECT_THAT(ScaledLifeTable::Create(1, {.grid = 1e-9}).status(),
              IsError(StatusCode::kInvalidArgument, "rows"));
}

}  // namespace
}  // namespace kvtier::internal
