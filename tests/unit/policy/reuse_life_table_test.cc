#include "kvtier/reuse_life_table.h"

#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/policy_testing.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

using ::kvtier::testing::At;

ReuseLifeTableOptions Small(std::vector<double> edges, std::vector<double> horizons,
                            double prior = 0) {
  return {.edges_seconds = std::move(edges),
          .horizons_seconds = std::move(horizons),
          .prior = prior,
          .refresh = absl::Seconds(10),
          .grid_seconds = 5};
}

// Four births at 0: one reused at 5 s, one at 15 s, two never. Bucket [0,10): 4 at risk, 1 event;
// [10,20): 3 at risk, 1 event. S(10) = 3/4, S(20) = 3/4 x 2/3 = 1/2.
TEST(ReuseLifeTableTest, HazardsSurvivalAndIndexFromHandCountedLives) {
  auto t = ReuseLifeTable::Create({0}, Small({0, 10, 20}, {10}));
  KVTIER_ASSERT_OK(t.status());
  std::vector<uint64_t> b;
  for (int i = 0; i < 4; ++i) b.push_back(t->Birth(0, At(0)));
  EXPECT_TRUE(t->Advance(At(0)));  // the first refresh point: nothing has ended yet
  t->Reuse(b[0], At(5));
  EXPECT_FALSE(t->Advance(At(9)));  // the next point is 10
  t->Reuse(b[1], At(15));
  t->Reuse(b[1], At(18));  // only the first reuse counts
  EXPECT_TRUE(t->Advance(At(20)));
  EXPECT_EQ(t->at_risk(0, 0), 4);
  EXPECT_EQ(t->events(0, 0), 1);
  EXPECT_EQ(t->at_risk(0, 1), 3);
  EXPECT_EQ(t->events(0, 1), 1);
  EXPECT_DOUBLE_EQ(t->Survival(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(t->Survival(0, 5), 0.875);
  EXPECT_DOUBLE_EQ(t->Survival(0, 10), 0.75);
  EXPECT_DOUBLE_EQ(t->Survival(0, 20), 0.5);
  EXPECT_DOUBLE_EQ(t->Survival(0, 100), 0.5);  // flat after the last edge
  // index(0) = (1 - 3/4) / (integral of S over [0,10] = 8.75); index(10) = (1/4) / 6.25.
  EXPECT_DOUBLE_EQ(t->Index(0, absl::ZeroDuration()), 0.25 / 8.75);
  EXPECT_DOUBLE_EQ(t->Index(0, absl::Seconds(10)), 0.25 / 6.25);
  EXPECT_DOUBLE_EQ(t->Index(0, absl::Seconds(12)), 0.25 / 6.25);  // the grid's entry below
  EXPECT_DOUBLE_EQ(t->Index(0, absl::Seconds(20)), 0.0);          // S is flat from there
  EXPECT_DOUBLE_EQ(t->Index(0, absl::Hours(5)), 0.0);
  // Every bucket has counted the births: none is kept.
  EXPECT_EQ(t->births_kept(), 0);
  // The chance of a reuse: (S(a) - S(a + w)) / S(a), with enough lives at risk at a.
  EXPECT_DOUBLE_EQ(*t->ChanceOfReuse(0, 0, 10, 4), 0.25);                    // 1 - 3/4
  EXPECT_DOUBLE_EQ(*t->ChanceOfReuse(0, 10, 10, 3), (0.75 - 0.5) / 0.75);    // 1/3
  EXPECT_DOUBLE_EQ(*t->ChanceOfReuse(0, 5, 5, 4), (0.875 - 0.75) / 0.875);   // 1/7
  const double ever = std::numeric_limits<double>::infinity();
  EXPECT_DOUBLE_EQ(*t->ChanceOfReuse(0, 10, ever, 3), 1.0 / 3);  // as far as the last edge
  EXPECT_DOUBLE_EQ(*t->ChanceOfReuse(0, 20, ever, 3), 0.0);      // past it: never seen back
  // Too few lives at risk in the age's bucket ([10, 20) has 3): no estimate.
  EXPECT_FALSE(t->ChanceOfReuse(0, 12, ever, 4).has_value());
}

// With no outcomes, S is 1 everywhere: that must not read as "never reused".
TEST(ReuseLifeTableTest, NoChanceOfReuseWithoutLives) {
  auto t = ReuseLifeTable::Create({0}, Small({0, 10, 20}, {10}));
  KVTIER_ASSERT_OK(t.status());
  EXPECT_FALSE(t->ChanceOfReuse(0, 5, 10, 1).has_value());
  EXPECT_DOUBLE_EQ(*t->ChanceOfReuse(0, 5, 10, 0), 0.0);  // asked to trust nothing: S is flat
}

// Only outcomes already observed count: a birth enters bucket k once it is edge[k+1] old, at a
// refresh point.
TEST(ReuseLifeTableTest, CountsABirthOnlyOnceItsBucketHasEnded) {
  auto t = ReuseLifeTable::Create({0}, Small({0, 10, 20}, {10}));
  KVTIER_ASSERT_OK(t.status());
  t->Advance(At(0));
  const uint64_t b = t->Birth(0, At(12));
  t->Reuse(b, At(14));
  EXPECT_TRUE(t->Advance(At(21)));  // point 20: 12 > 20 - 10, not yet
  EXPECT_EQ(t->at_risk(0, 0), 0);
  EXPECT_DOUBLE_EQ(t->Index(0, absl::ZeroDuration()), 0.0);  // no data: every index 0
  EXPECT_TRUE(t->Advance(At(35)));                           // point 30: counted in [0,10)
  EXPECT_EQ(t->at_risk(0, 0), 1);
  EXPECT_EQ(t->events(0, 0), 1);
  EXPECT_EQ(t->at_risk(0, 1), 0);  // outcome 2 < 10: never at risk in [10,20)
  EXPECT_EQ(t->births_kept(), 1);  // [10,20) has not counted it yet (12 > 30 - 20)
  EXPECT_TRUE(t->Advance(At(40)));
  EXPECT_EQ(t->births_kept(), 0);
}

// An infinite time reads as the table's latest: as the first time seen it set the origin, every
// finite time after it was infinitely far, and nothing was ever learned.
TEST(ReuseLifeTableTest, AnInfiniteTimeDoesNotStopTheLearning) {
  auto t = ReuseLifeTable::Create({0}, Small({0, 10, 20}, {10}));
  KVTIER_ASSERT_OK(t.status());
  (void)t->Birth(0, absl::InfinitePast());
  t->Advance(absl::InfiniteFuture());
  const uint64_t b = t->Birth(0, At(0));
  t->Reuse(b, At(3));
  EXPECT_TRUE(t->Advance(At(60)));
  EXPECT_EQ(t->events(0, 0), 1);
  EXPECT_FALSE(t->Advance(At(60)));  // no rebuild until the next refresh
}

// The counts' accessors read nothing outside the table: a class or bucket out of range is 0
// (at_risk(-1, 0) indexed about 2^64 bytes away).
TEST(ReuseLifeTableTest, CountsOutOfRangeAreZero) {
  auto t = ReuseLifeTable::Create({0}, Small({0, 10, 20}, {10}));
  KVTIER_ASSERT_OK(t.status());
  t->Reuse(t->Birth(0, At(0)), At(1));
  EXPECT_TRUE(t->Advance(At(60)));
  EXPECT_EQ(t->at_risk(0, 0), 1);
  for (const auto& [cls, bucket] : std::vector<std::pair<int, int>>{
           {-1, 0}, {1, 0}, {0, -1}, {0, 2}, {1 << 30, 0}, {0, 1 << 30}}) {
    EXPECT_EQ(t->at_risk(cls, bucket), 0) << cls << " " << bucket;
    EXPECT_EQ(t->events(cls, bucket), 0) << cls << " " << bucket;
  }
}

// Each class's hazard shrinks towards its group's, which shrinks towards the pooled one
// (prior 2). Class 0: 4 births, 1 reused in [0,10); class 1: 2 births, none. Pooled and group
// hazard 1/6; class 0 (1 + 2/6) / (4 + 2) = 2/9; class 1 (0 + 2/6) / (2 + 2) = 1/12.
TEST(ReuseLifeTableTest, ShrinksEachClassTowardsItsGroup) {
  auto t = ReuseLifeTable::Create({0, 0}, Small({0, 10}, {10}, /*prior=*/2));
  KVTIER_ASSERT_OK(t.status());
  const uint64_t first = t->Birth(0, At(0));
  for (int i = 0; i < 3; ++i) t->Birth(0, At(0));
  for (int i = 0; i < 2; ++i) t->Birth(1, At(0));
  t->Reuse(first, At(3));
  t->Advance(At(10));
  EXPECT_DOUBLE_EQ(t->Survival(0, 10), 1 - 2.0 / 9);
  EXPECT_DOUBLE_EQ(t->Survival(1, 10), 1 - 1.0 / 12);
}

// Reuse concentrated late: S = 1, 1, 1, 0 at 0, 10, 20, 30. One horizon of 10 s sees no reuse at
// age 0; the index is the best over horizons, (1 - 0) / 25 at H = 30.
TEST(ReuseLifeTableTest, IndexIsTheBestOverHorizons) {
  for (bool long_horizon : {false, true}) {
    auto t = ReuseLifeTable::Create(
        {0}, Small({0, 10, 20, 30},
                   long_horizon ? std::vector<double>{10, 30} : std::vector<double>{10}));
    KVTIER_ASSERT_OK(t.status());
    const uint64_t b0 = t->Birth(0, At(0)), b1 = t->Birth(0, At(0));
    t->Reuse(b0, At(25));
    t->Reuse(b1, At(25));
    t->Advance(At(30));
    EXPECT_EQ(t->events(0, 2), 2);
    EXPECT_DOUBLE_EQ(t->Survival(0, 30), 0.0);
    if (long_horizon) {
      EXPECT_DOUBLE_EQ(t->Index(0, absl::ZeroDuration()), 1.0 / 25);
      EXPECT_DOUBLE_EQ(t->Index(0, absl::Seconds(10)), 1.0 / 15);
    } else {
      EXPECT_DOUBLE_EQ(t->Index(0, absl::ZeroDuration()), 0.0);
      EXPECT_DOUBLE_EQ(t->Index(0, absl::Seconds(20)), 1.0 / 5);
    }
  }
}

TEST(ReuseLifeTableTest, DefaultsAreTheRecipes) {
  ReuseLifeTableOptions o = WithReuseLifeTableDefaults({});
  ASSERT_EQ(o.edges_seconds.size(), 12u + 16u + 10u + 3u);
  EXPECT_EQ(o.edges_seconds[12], 120);
  EXPECT_EQ(o.edges_seconds[28], 600);
  EXPECT_EQ(o.edges_seconds.back(), 3600);
  EXPECT_EQ(o.horizons_seconds, (std::vector<double>{15, 30, 60, 120, 240, 480, 960, 1920}));
  KVTIER_EXPECT_OK(ReuseLifeTable::Create({0, 0, 1}).status());
}

TEST(ReuseLifeTableTest, RejectsBadOptions) {
  EXPECT_THAT(ReuseLifeTable::Create({}).status(), IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(ReuseLifeTable::Create({-1}).status(), IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(ReuseLifeTable::Create({0}, Small({5, 10}, {10})).status(),
              IsError(StatusCode::kInvalidArgument, "start at 0"));
  EXPECT_THAT(ReuseLifeTable::Create({0}, Small({0, 10, 10}, {10})).status(),
              IsError(StatusCode::kInvalidArgument, "increasing"));
  EXPECT_THAT(ReuseLifeTable::Create({0}, Small({0, 10}, {7})).status(),
              IsError(StatusCode::kInvalidArgument, "multiple of grid"));
  EXPECT_THAT(ReuseLifeTable::Create({0}, Small({0, 10}, {10}, -1)).status(),
              IsError(StatusCode::kInvalidArgument, "prior"));
  ReuseLifeTableOptions o = Small({0, 10}, {10});
  o.refresh = absl::ZeroDuration();
  EXPECT_THAT(ReuseLifeTable::Create({0}, o).status(),
              IsError(StatusCode::kInvalidArgument, "refresh"));
}

}  // namespace
}  // namespace kvtier
