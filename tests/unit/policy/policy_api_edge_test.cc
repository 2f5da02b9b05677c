// Edge cases of the public eviction-policy API (eviction_policy.h, reuse_life_table.h,
// eviction_candidacy.h), tested from outside through the public headers only.
#include <sys/resource.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/eviction_candidacy.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/reuse_life_table.h"
#include "tests/testing/policy_testing.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::At;
using ::kvtier::testing::IsError;
using ::kvtier::testing::Key;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Every policy a factory makes, by a label.
struct Made {
  std::string label;
  std::unique_ptr<EvictionPolicy> policy;
};

std::unique_ptr<EvictionPolicy> Unwrap(absl::StatusOr<std::unique_ptr<EvictionPolicy>> made) {
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *std::move(made) : nullptr;
}

std::vector<Made> AllPolicies(uint64_t seed = 1) {
  std::vector<Made> all;
  all.push_back({"lru", MakeLruPolicy()});
  all.push_back({"cost_aware", Unwrap(MakeCostAwarePolicy({.seed = seed}))});
  all.push_back({"reuse_index", Unwrap(MakeReuseIndexPolicy({.seed = seed}))});
  all.push_back({"learned", Unwrap(MakeLearnedPolicy(1000, {.seed = seed}))});
  std::vector<EvictionPolicyFactory> two;
  two.push_back(
      []() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); });
  two.push_back([seed]() { return MakeCostAwarePolicy({.seed = seed}); });
  all.push_back(
      {"follow_best(lru,cost_aware)", Unwrap(MakeFollowBestPolicy(two, {.capacity_blocks = 100}))});
  return all;
}

// --- Factories ----------------------------------------------------------------------------------

TEST(PolicyApiEdgeTest, CostAwareOptionsOutOfRange) {
  const absl::Duration bad_half_lives[] = {absl::ZeroDuration(), absl::Seconds(-1),
                                           absl::InfiniteDuration(), -absl::InfiniteDuration()};
  for (absl::Duration h : bad_half_lives) {
    EXPECT_THAT(MakeCostAwarePolicy({.half_life = h}),
                IsError(StatusCode::kInvalidArgument, "half_life"))
        << h;
  }
  for (int s : {0, -1, INT_MIN}) {
    EXPECT_THAT(MakeCostAwarePolicy({.sample_size = s}),
                IsError(StatusCode::kInvalidArgument, "sample_size"));
  }
  for (int r : {0, -5}) {
    EXPECT_THAT(MakeCostAwarePolicy({.reconfigure_outcomes = r}),
                IsError(StatusCode::kInvalidArgument, "reconfigure_outcomes"));
  }
  EXPECT_THAT(MakeCostAwarePolicy({.max_ghosts = -1}),
              IsError(StatusCode::kInvalidArgument, "max_ghosts"));
  for (absl::Duration g :
       {absl::Seconds(-1), absl::InfiniteDuration(), -absl::InfiniteDuration()}) {
    EXPECT_THAT(MakeCostAwarePolicy({.ghost_horizon = g}),
                IsError(StatusCode::kInvalidArgument, "ghost_horizon"));
  }
  // The bounds themselves and huge values are in range.
  KVTIER_EXPECT_OK(MakeCostAwarePolicy({.half_life = absl::Nanoseconds(1),
                                        .sample_size = 1,
                                        .reconfigure_outcomes = 1,
                                        .ghost_horizon = absl::ZeroDuration(),
                                        .max_ghosts = 0}));
  KVTIER_EXPECT_OK(MakeCostAwarePolicy({.half_life = absl::Hours(1e6),
                                        .sample_size = INT_MAX,
                                        .seed = ~uint64_t{0},
                                        .reconfigure_outcomes = INT_MAX,
                                        .ghost_horizon = absl::Hours(1e6),
                                        .max_ghosts = INT64_MAX}));
}

TEST(PolicyApiEdgeTest, ReuseIndexOptionsOutOfRange) {
  EXPECT_THAT(MakeReuseIndexPolicy({.sample_size = -1}),
              IsError(StatusCode::kInvalidArgument, "sample_size"));
  for (absl::Duration h : {absl::ZeroDuration(), absl::Seconds(-3), absl::InfiniteDuration(),
                           -absl::InfiniteDuration()}) {
    EXPECT_THAT(MakeReuseIndexPolicy({.history = h}),
                IsError(StatusCode::kInvalidArgument, "history"));
  }
  // The tables' errors come through (ReuseLifeTable::Create's messages).
  ReuseIndexOptions bad_table;
  bad_table.table.prior = kNaN;
  EXPECT_THAT(MakeReuseIndexPolicy(bad_table), IsError(StatusCode::kInvalidArgument, "prior"));
  ReuseIndexOptions bad_session;
  bad_session.session_table.grid_seconds = 0;
  EXPECT_THAT(MakeReuseIndexPolicy(bad_session),
              IsError(StatusCode::kInvalidArgument, "grid_seconds"));
  ReuseIndexOptions bad_edges;
  bad_edges.session_table.edges_seconds = {1, 2};
  EXPECT_THAT(MakeReuseIndexPolicy(bad_edges),
              IsError(StatusCode::kInvalidArgument, "edges_seconds"));
  // Bounds: 0 is "all of them"; a tiny history is positive.
  KVTIER_EXPECT_OK(MakeReuseIndexPolicy({.sample_size = 0, .history = absl::Nanoseconds(1)}));
  KVTIER_EXPECT_OK(MakeReuseIndexPolicy({.sample_size = INT_MAX, .history = absl::Hours(1e5)}));
}

TEST(PolicyApiEdgeTest, FollowBestOptionsOutOfRange) {
  auto lru = []() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); };
  EXPECT_THAT(MakeFollowBestPolicy({}, {.capacity_blocks = 10}),
              IsError(StatusCode::kInvalidArgument, "no candidates"));
  const FollowBestOptions bad[] = {
      {.capacity_blocks = 0},
      {.capacity_blocks = -1},
      {.capacity_blocks = 10, .half_life_accesses = 0},
      {.capacity_blocks = 10, .half_life_accesses = -1},
      {.capacity_blocks = 10, .hysteresis = -0.1},
      {.capacity_blocks = 10, .hysteresis = kNaN},
      {.capacity_blocks = 10, .confidence = -1},
      {.capacity_blocks = 10, .confidence = kNaN},
      {.capacity_blocks = 10, .sample_rate = -0.5},
      {.capacity_blocks = 10, .sample_rate = 1.0001},
      {.capacity_blocks = 10, .sample_rate = kNaN},
      {.capacity_blocks = 10, .sample_rate = kInf},
      {.capacity_blocks = 10, .sample_rate = -kInf},
  };
  for (const FollowBestOptions& o : bad) {
    EXPECT_THAT(MakeFollowBestPolicy({lru}, o),
                IsError(StatusCode::kInvalidArgument, "follow_best"))
        << o.capacity_blocks << " " << o.half_life_accesses << " " << o.hysteresis << " "
        << o.confidence << " " << o.sample_rate;
  }
  KVTIER_EXPECT_OK(MakeFollowBestPolicy({lru}, {.capacity_blocks = 1, .sample_rate = 1}));
  KVTIER_EXPECT_OK(MakeFollowBestPolicy(
      {lru},
      {.capacity_blocks = INT64_MAX, .half_life_accesses = 1, .hysteresis = 0, .confidence = 0}));
  // A factory's error comes back as it is, on the first call or the second.
  auto failing = []() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
    return absl::UnavailableError("factory says no");
  };
  EXPECT_THAT(MakeFollowBestPolicy({lru, failing}, {.capacity_blocks = 10}),
              IsError(StatusCode::kUnavailable, "factory says no"));
  int calls = 0;
  auto second_fails = [&calls]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
    if (++calls == 2) return absl::ResourceExhaustedError("second call");
    return MakeLruPolicy();  // no shared shadow: asked twice
  };
  EXPECT_THAT(MakeFollowBestPolicy({second_fails}, {.capacity_blocks = 10}),
              IsError(StatusCode::kResourceExhausted, "second call"));
}

TEST(PolicyApiEdgeTest, LearnedAndNamedFactories) {
  EXPECT_THAT(MakeLearnedPolicy(0), IsError(StatusCode::kInvalidArgument, "capacity_blocks"));
  EXPECT_THAT(MakeLearnedPolicy(-5), IsError(StatusCode::kInvalidArgument, "capacity_blocks"));
  EXPECT_THAT(MakeLearnedPolicy(100, {.sample_size = -1}),
              IsError(StatusCode::kInvalidArgument, "sample_size"));
  auto learned = Unwrap(MakeLearnedPolicy(100));
  ASSERT_NE(learned, nullptr);
  EXPECT_EQ(learned->name(), "follow_best");
  EXPECT_EQ(FollowedPolicy(*learned), "reuse_index");  // it leads at the start
  EXPECT_TRUE(learned->observes_requests());
  EXPECT_EQ(learned->MakeSharedShadow(), nullptr);
  const FollowBestStats stats = FollowBestStatsOf(*learned);
  EXPECT_EQ(stats.sampled_accesses, 0);
  EXPECT_EQ(stats.leader_changes, 0);

  auto lru = MakeLruPolicy();
  EXPECT_EQ(FollowedPolicy(*lru), "");
  EXPECT_EQ(FollowBestStatsOf(*lru).sampled_accesses, 0);
  EXPECT_EQ(FollowBestStatsOf(*lru).shadow_seconds, 0);
  EXPECT_FALSE(lru->reads_run_blocks());
  EXPECT_FALSE(lru->observes_requests());

  for (const char* name : {"lru", "cost_aware", "reuse_index"}) {
    auto p = Unwrap(MakeEvictionPolicy(name));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->name(), name);
  }
  for (const char* name : {"", "LRU", "learned", "follow_best", "lru "}) {
    EXPECT_THAT(MakeEvictionPolicy(name), IsError(StatusCode::kInvalidArgument, "reuse_index"))
        << '"' << name << '"';
  }
}

// --- ReuseLifeTable -----------------------------------------------------------------------------

TEST(PolicyApiEdgeTest, ReuseLifeTableCreateErrors) {
  auto bad = [](std::vector<int> groups, ReuseLifeTableOptions o, const char* named) {
    EXPECT_THAT(ReuseLifeTable::Create(std::move(groups), std::move(o)),
                IsError(StatusCode::kInvalidArgument, named))
        << named;
  };
  bad({}, {}, "no classes");
  bad({0, -1}, {}, "negative");
  bad({0}, {.edges_seconds = {0}}, "edges_seconds");
  bad({0}, {.edges_seconds = {1, 2}}, "edges_seconds");
  bad({0}, {.edges_seconds = {0, 0}}, "edges_seconds");
  bad({0}, {.edges_seconds = {0, 20, 10}}, "edges_seconds");
  bad({0}, {.edges_seconds = {0, kNaN}}, "edges_seconds");
  bad({0}, {.edges_seconds = {0, kInf}}, "edges_seconds");
  bad({0}, {.edges_seconds = {kNaN, 10}}, "edges_seconds");
  bad({0}, {.horizons_seconds = {0}}, "horizon");
  bad({0}, {.horizons_seconds = {-5}}, "horizon");
  bad({0}, {.horizons_seconds = {kNaN}}, "horizon");
  bad({0}, {.horizons_seconds = {kInf}}, "horizon");
  bad({0}, {.horizons_seconds = {7}}, "horizon");  // not a multiple of grid 5
  bad({0}, {.prior = -1}, "prior");
  bad({0}, {.prior = kNaN}, "prior");
  bad({0}, {.prior = kInf}, "prior");
  bad({0}, {.refresh = absl::ZeroDuration()}, "refresh");
  bad({0}, {.refresh = absl::Seconds(-1)}, "refresh");
  bad({0}, {.refresh = absl::InfiniteDuration()}, "refresh");
  bad({0}, {.grid_seconds = 0}, "grid_seconds");
  bad({0}, {.grid_seconds = -5}, "grid_seconds");
  bad({0}, {.grid_seconds = kNaN}, "grid_seconds");
  bad({0}, {.grid_seconds = kInf}, "grid_seconds");
  // Bounds in range: prior 0, two edges, sparse groups.
  KVTIER_EXPECT_OK(ReuseLifeTable::Create({0, 3}, {.edges_seconds = {0, 10},
                                                   .horizons_seconds = {10},
                                                   .prior = 0,
                                                   .refresh = absl::Nanoseconds(1),
                                                   .grid_seconds = 10}));
}

TEST(PolicyApiEdgeTest, ReuseLifeTableDefaultsAndNoData) {
  const ReuseLifeTableOptions d = WithReuseLifeTableDefaults({});
  ASSERT_GE(d.edges_seconds.size(), 2u);
  EXPECT_EQ(d.edges_seconds.front(), 0);
  EXPECT_EQ(d.edges_seconds.back(), 3600);
  EXPECT_EQ(d.horizons_seconds, (std::vector<double>{15, 30, 60, 120, 240, 480, 960, 1920}));
  // Given edges and horizons are kept.
  const ReuseLifeTableOptions kept =
      WithReuseLifeTableDefaults({.edges_seconds = {0, 7}, .horizons_seconds = {5}});
  EXPECT_EQ(kept.edges_seconds, (std::vector<double>{0, 7}));
  EXPECT_EQ(kept.horizons_seconds, (std::vector<double>{5}));

  KVTIER_ASSERT_OK_AND_ASSIGN(ReuseLifeTable t, ReuseLifeTable::Create({0, 0, 1}));
  EXPECT_EQ(t.num_classes(), 3);
  EXPECT_EQ(t.num_buckets(), static_cast<int>(d.edges_seconds.size()) - 1);
  EXPECT_EQ(t.births_kept(), 0);
  EXPECT_EQ(t.rebuilds(), 0);
  // With no data every index is 0 and S is 1; ChanceOfReuse has too few lives.
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(t.Index(c, absl::ZeroDuration()), 0);
    EXPECT_EQ(t.Index(c, absl::Hours(100)), 0);
    EXPECT_EQ(t.Index(c, absl::InfiniteDuration()), 0);
    EXPECT_EQ(t.Survival(c, 0), 1);
    EXPECT_EQ(t.Survival(c, 1e9), 1);
    EXPECT_EQ(t.ChanceOfReuse(c, 0, kInf, 1), std::nullopt);
  }
  // Rebuilt from no data: still 0 and 1.
  EXPECT_TRUE(t.Advance(At(0)));
  EXPECT_EQ(t.rebuilds(), 1);
  EXPECT_EQ(t.Index(1, absl::Seconds(30)), 0);
  EXPECT_EQ(t.Survival(2, 100), 1);
}

// A small table with 10 s buckets: an access reused 5 s later is an event in bucket 0.
ReuseLifeTableOptions Small() {
  return {.edges_seconds = {0, 10, 20},
          .horizons_seconds = {10},
          .prior = 0,
          .refresh = absl::Seconds(1),
          .grid_seconds = 5};
}

TEST(PolicyApiEdgeTest, ReuseLifeTableRefreshGridAndBackwardsTime) {
  KVTIER_ASSERT_OK_AND_ASSIGN(ReuseLifeTable t, ReuseLifeTable::Create({0}, Small()));
  EXPECT_TRUE(t.Advance(At(0)));     // the first refresh point
  EXPECT_FALSE(t.Advance(At(0.5)));  // no point passed
  EXPECT_TRUE(t.Advance(At(1)));     // next point
  EXPECT_FALSE(t.Advance(At(0)));    // backwards: taken as the latest (1)
  const uint64_t b = t.Birth(0, At(10));
  t.Reuse(b, At(5));    // backwards: taken as 10, so the outcome is 0
  t.Reuse(b, At(100));  // only the first Reuse counts
  EXPECT_TRUE(t.Advance(At(40)));
  EXPECT_EQ(t.at_risk(0, 0), 1);
  EXPECT_EQ(t.events(0, 0), 1);
  EXPECT_EQ(t.at_risk(0, 1), 0);
  EXPECT_EQ(t.births_kept(), 0);
  // Unknown birth ids are ignored.
  t.Reuse(b + 1000, At(41));
  t.Reuse(~uint64_t{0}, At(41));
  // Hazard 1 in bucket 0: S(10) = 0, the index at age 0 is (1 - 0) / 5 = 0.2.
  EXPECT_DOUBLE_EQ(t.Survival(0, 10), 0);
  EXPECT_DOUBLE_EQ(t.Survival(0, 5), 0.5);
  EXPECT_DOUBLE_EQ(t.Index(0, absl::ZeroDuration()), 0.2);
  EXPECT_EQ(t.ChanceOfReuse(0, 0, kInf, 1), 1.0);
  EXPECT_EQ(t.ChanceOfReuse(0, 0, kInf, 2), std::nullopt);  // one life, fewer than 2
  EXPECT_EQ(t.ChanceOfReuse(0, 0, -5, 1), 0.0);             // a negative window is empty
  EXPECT_EQ(t.ChanceOfReuse(0, 0, 0, 1), 0.0);
}

// "out of range is clamped: below 0 to class 0, above to the last class".
TEST(PolicyApiEdgeTest, ReuseLifeTableOutOfRangeClassIsClamped) {
  for (int cls : {2, 1000, -1, INT_MIN}) {
    KVTIER_ASSERT_OK_AND_ASSIGN(ReuseLifeTable t, ReuseLifeTable::Create({0, 0}, Small()));
    const uint64_t b = t.Birth(cls, At(0));
    t.Reuse(b, At(3));
    t.Advance(At(40));
    const int in = cls < 0 ? 0 : 1;
    EXPECT_EQ(t.at_risk(in, 0), 1) << "class " << cls;
    EXPECT_EQ(t.events(in, 0), 1) << "class " << cls;
    EXPECT_EQ(t.at_risk(1 - in, 0), 0) << "class " << cls;
  }
}

TEST(PolicyApiEdgeTest, ReuseLifeTableInfiniteTimes) {
  for (absl::Time first : {absl::InfinitePast(), absl::InfiniteFuture(), At(0)}) {
    for (absl::Time second : {absl::InfinitePast(), absl::InfiniteFuture(), At(5)}) {
      KVTIER_ASSERT_OK_AND_ASSIGN(ReuseLifeTable t, ReuseLifeTable::Create({0}, Small()));
      const uint64_t b = t.Birth(0, first);
      t.Advance(first);
      t.Reuse(b, second);
      t.Birth(0, second);
      t.Advance(second);
      t.Advance(absl::InfiniteFuture());
      const double index = t.Index(0, absl::Seconds(1));
      EXPECT_TRUE(std::isfinite(index) && index >= 0) << index;
      const double s = t.Survival(0, 1);
      EXPECT_TRUE(s >= 0 && s <= 1) << s;
      const std::optional<double> c = t.ChanceOfReuse(0, 1, kInf, 0);
      if (c.has_value()) {
        EXPECT_TRUE(*c >= 0 && *c <= 1) << *c;
      }
    }
  }
}

// Sanitizers reserve terabytes of address space for their shadow memory: an address-space limit
// would fail every allocation there.
constexpr bool kLimitAddressSpace = !testing::kUnderSanitizer;

// Options that are in the documented range but huge: Create must answer an error or a table
// that works, not crash. Run in a child with a 2 GiB address-space limit (but under a
// sanitizer), so a huge allocation fails fast there instead of exhausting this machine. Before
// Create bounded the tables' sizes, each of these crashed or threw.
void CreateAndUseOrError(std::vector<int> groups, ReuseLifeTableOptions o) {
  if (kLimitAddressSpace) {
    struct rlimit limit = {.rlim_cur = rlim_t{2} << 30, .rlim_max = rlim_t{2} << 30};
    setrlimit(RLIMIT_AS, &limit);
  }
  std::optional<absl::StatusOr<ReuseLifeTable>> t;
  try {
    t.emplace(ReuseLifeTable::Create(std::move(groups), std::move(o)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "Create threw: %s\n", e.what());
    std::_Exit(10);
  }
  if (!t->ok()) std::_Exit(t->status().code() == StatusCode::kInvalidArgument ? 0 : 3);
  ReuseLifeTable& table = **t;
  try {
    const uint64_t b = table.Birth(0, At(0));
    table.Reuse(b, At(1));
    table.Advance(At(0));
    table.Advance(At(100000));
    const double index = table.Index(0, absl::Seconds(1));
    std::_Exit(std::isfinite(index) ? 0 : 4);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "Create succeeded, then Birth/Advance threw: %s\n", e.what());
    std::_Exit(11);
  }
}

TEST(PolicyApiEdgeDeathTest, ReuseLifeTableHugeGroupId) {
  EXPECT_EXIT(CreateAndUseOrError({0, INT_MAX}, {}), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(CreateAndUseOrError({0, INT_MAX - 1}, {}), ::testing::ExitedWithCode(0), "");
}

TEST(PolicyApiEdgeDeathTest, ReuseLifeTableTinyGrid) {
  // 2^-20 s divides every default horizon exactly; the last edge / grid is past INT_MAX.
  EXPECT_EXIT(CreateAndUseOrError({0}, {.grid_seconds = std::ldexp(1.0, -20)}),
              ::testing::ExitedWithCode(0), "");
}

TEST(PolicyApiEdgeDeathTest, ReuseLifeTableHugeLastEdge) {
  EXPECT_EXIT(CreateAndUseOrError({0}, {.edges_seconds = {0, 1e12}}), ::testing::ExitedWithCode(0),
              "");
}

TEST(PolicyApiEdgeDeathTest, ReuseLifeTableHugeHorizon) {
  EXPECT_EXIT(CreateAndUseOrError({0}, {.horizons_seconds = {5e10}}), ::testing::ExitedWithCode(0),
              "");
}

// --- The EvictionPolicy contract, every policy --------------------------------------------------

TEST(PolicyApiEdgeTest, TraitsOutOfRangeAreInvalidArgument) {
  const BlockTraits bad[] = {
      {.expected_reuse = 0},
      {.expected_reuse = -1},
      {.expected_reuse = kNaN},
      {.recompute_seconds = -1},
      {.recompute_seconds = kNaN},
      {.bytes = 0},
      {.bytes = -1},
      {.bytes = INT64_MIN},
      {.retention_priority = -1},
      {.retention_priority = kNaN},
      {.retention_priority = -kInf},
  };
  for (Made& m : AllPolicies()) {
    EvictionPolicy& p = *m.policy;
    KVTIER_ASSERT_OK(p.Add(Key(1), {}, At(0)));
    for (const BlockTraits& t : bad) {
      EXPECT_THAT(p.Add(Key(2), t, At(0)), IsError(StatusCode::kInvalidArgument, ""))
          << m.label << " reuse " << t.expected_reuse << " recompute " << t.recompute_seconds
          << " bytes " << t.bytes << " priority " << t.retention_priority;
      EXPECT_THAT(p.Touch(Key(1), t, At(1)), IsError(StatusCode::kInvalidArgument, "")) << m.label;
    }
    // The failed Adds left no candidate: Key(2) is unknown, only Key(1) is a victim.
    EXPECT_EQ(p.size(), 1) << m.label;
    EXPECT_THAT(p.Remove(Key(2)), IsError(StatusCode::kNotFound, "")) << m.label;
    EXPECT_EQ(p.Victim(At(2)), Key(1)) << m.label;
    // Infinite values: an error or accepted, never a non-candidate victim.
    for (const BlockTraits& t :
         {BlockTraits{.expected_reuse = kInf}, BlockTraits{.recompute_seconds = kInf},
          BlockTraits{.retention_priority = kInf}}) {
      const absl::Status s = p.Add(Key(3), t, At(0));
      EXPECT_TRUE(s.ok() || s.code() == StatusCode::kInvalidArgument) << m.label << " " << s;
      if (s.ok()) {
        KVTIER_EXPECT_OK(p.Remove(Key(3)));
      }
    }
    EXPECT_EQ(p.size(), 1) << m.label;
  }
}

// BlockTraits::run_blocks: ">= 1", "at most 32"; Add: "kInvalidArgument for traits out of range".
TEST(PolicyApiEdgeTest, RunBlocksOutOfRangeIsInvalidArgument) {
  for (Made& m : AllPolicies()) {
    uint64_t k = 0;
    for (int r : {0, -1, INT_MIN, 33, INT_MAX}) {
      EXPECT_THAT(m.policy->Add(Key(++k), {.run_blocks = r}, At(0)),
                  IsError(StatusCode::kInvalidArgument, ""))
          << m.label << " run_blocks " << r;
    }
  }
}

// follow_best answers Add with the first error among its candidates; whatever it answers, a
// block whose Add failed (the caller does not Remove it: SyncCandidacy) must not be a victim.
// Traits every policy refuses are refused before any candidate sees them.
TEST(PolicyApiEdgeTest, FollowBestFailedAddLeavesNoCandidate) {
  std::vector<EvictionPolicyFactory> two;
  two.push_back(
      []() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); });
  two.push_back([]() { return MakeCostAwarePolicy(); });
  auto p = Unwrap(MakeFollowBestPolicy(two, {.capacity_blocks = 100}));
  ASSERT_NE(p, nullptr);
  EXPECT_THAT(p->Add(Key(1), {.run_blocks = 0}, At(0)),
              IsError(StatusCode::kInvalidArgument, "run_blocks"));
  EXPECT_EQ(p->size(), 0);
  EXPECT_EQ(p->Victim(At(1)), std::nullopt);
  // The caller may try again with good traits.
  KVTIER_EXPECT_OK(p->Add(Key(1), {}, At(0)));
  EXPECT_EQ(p->size(), 1);
}

// LRU that refuses to Add one key (kInternal), as a caller's own candidate policy might.
class RefusingLru final : public EvictionPolicy {
 public:
  explicit RefusingLru(BlockKey refused) : refused_(refused) {}
  std::string_view name() const override { return "refusing_lru"; }
  bool reads_run_blocks() const override { return false; }
  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    if (key == refused_) return absl::InternalError("refused");
    return lru_->Add(key, traits, now);
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    return lru_->Touch(key, traits, now);
  }
  absl::Status Remove(const BlockKey& key) override { return lru_->Remove(key); }
  std::optional<BlockKey> Victim(absl::Time now) override { return lru_->Victim(now); }
  int64_t size() const override { return lru_->size(); }

 private:
  BlockKey refused_;
  std::unique_ptr<EvictionPolicy> lru_ = MakeLruPolicy();
};

// A candidate after the first refuses the Add: the ones before it give the block back, so the
// leader (the first) never names it.
TEST(PolicyApiEdgeTest, FollowBestRollsBackAnAddALaterCandidateRefused) {
  std::vector<EvictionPolicyFactory> two;
  two.push_back(
      []() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); });
  two.push_back([]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
    return std::unique_ptr<EvictionPolicy>(new RefusingLru(Key(1)));
  });
  auto p = Unwrap(MakeFollowBestPolicy(two, {.capacity_blocks = 100}));
  ASSERT_NE(p, nullptr);
  KVTIER_ASSERT_OK(p->Add(Key(2), {}, At(5)));
  EXPECT_THAT(p->Add(Key(1), {}, At(0)), IsError(StatusCode::kInternal, "refused"));
  EXPECT_EQ(p->size(), 1);
  EXPECT_EQ(p->Victim(At(10)), Key(2)) << "key 1, older, is no candidate";
  KVTIER_EXPECT_OK(p->Remove(Key(2)));
  EXPECT_EQ(p->Victim(At(10)), std::nullopt);
}

TEST(PolicyApiEdgeTest, DuplicatesUnknownKeysAndEmpty) {
  for (Made& m : AllPolicies()) {
    EvictionPolicy& p = *m.policy;
    EXPECT_EQ(p.size(), 0) << m.label;
    EXPECT_EQ(p.Victim(At(0)), std::nullopt) << m.label;
    EXPECT_EQ(p.Victim(absl::InfinitePast()), std::nullopt) << m.label;
    EXPECT_EQ(p.Victim(absl::InfiniteFuture()), std::nullopt) << m.label;
    EXPECT_THAT(p.Touch(Key(1), {}, At(0)), IsError(StatusCode::kNotFound, "")) << m.label;
    EXPECT_THAT(p.Remove(Key(1)), IsError(StatusCode::kNotFound, "")) << m.label;
    EXPECT_THAT(p.Remove(kRootBlockKey), IsError(StatusCode::kNotFound, "")) << m.label;
    KVTIER_ASSERT_OK(p.Add(Key(1), {}, At(0)));
    EXPECT_THAT(p.Add(Key(1), {}, At(0)), IsError(StatusCode::kAlreadyExists, "")) << m.label;
    EXPECT_THAT(p.Add(Key(1), {.expected_reuse = 3}, At(9)),
                IsError(StatusCode::kAlreadyExists, ""))
        << m.label;
    EXPECT_EQ(p.size(), 1) << m.label;
    KVTIER_EXPECT_OK(p.Touch(Key(1), {}, At(1)));
    KVTIER_EXPECT_OK(p.Remove(Key(1)));
    EXPECT_THAT(p.Remove(Key(1)), IsError(StatusCode::kNotFound, "")) << m.label;
    EXPECT_THAT(p.Touch(Key(1), {}, At(2)), IsError(StatusCode::kNotFound, "")) << m.label;
    EXPECT_EQ(p.size(), 0) << m.label;
    EXPECT_EQ(p.Victim(At(3)), std::nullopt) << m.label;
    // A key may come back after its Remove.
    KVTIER_EXPECT_OK(p.Add(Key(1), {}, At(4)));
    EXPECT_EQ(p.size(), 1) << m.label;
  }
}

// "it stays a candidate until Removed"; a single candidate is the victim.
TEST(PolicyApiEdgeTest, VictimDoesNotRemoveAndSingleCandidate) {
  for (Made& m : AllPolicies()) {
    EvictionPolicy& p = *m.policy;
    KVTIER_ASSERT_OK(p.Add(Key(5), {.retention_priority = 3, .priority_until = At(1e6)}, At(0)));
    for (double t : {1.0, 1.0, 2.0, 1e7}) {
      EXPECT_EQ(p.Victim(At(t)), Key(5)) << m.label << " at " << t;
      EXPECT_EQ(p.size(), 1) << m.label;
    }
    EXPECT_EQ(p.Victim(absl::InfiniteFuture()), Key(5)) << m.label;
    EXPECT_EQ(p.Victim(absl::InfinitePast()), Key(5)) << m.label;
    KVTIER_EXPECT_OK(p.Touch(Key(5), {}, At(3)));
    KVTIER_EXPECT_OK(p.Remove(Key(5)));
    EXPECT_EQ(p.Victim(At(4)), std::nullopt) << m.label;
  }
}

// 200k candidates, drained by Victim + Remove: every victim a current candidate, size() to 0.
// 200k for lru; 20k for the others, which cost 5-10 us a block, to keep the suite fast.
TEST(PolicyApiEdgeTest, LargeDrainReturnsOnlyCandidates) {
  for (Made& m : AllPolicies()) {
    const int kN = m.label == "lru" ? 200000 : 20000;
    EvictionPolicy& p = *m.policy;
    std::set<uint64_t> live;
    for (int i = 0; i < kN; ++i) {
      BlockTraits t;
      if (i % 7 == 0) t = {.retention_priority = 1, .priority_until = At(kN / 2.0)};
      if (i % 11 == 0) t.parent = Key(static_cast<uint64_t>(i + 1));
      ASSERT_TRUE(p.Add(Key(static_cast<uint64_t>(i)), t, At(i * 0.01)).ok()) << m.label;
    }
    ASSERT_EQ(p.size(), kN) << m.label;
    for (int i = 0; i < kN; ++i) live.insert(static_cast<uint64_t>(i));
    for (int n = 0; n < kN; ++n) {
      const std::optional<BlockKey> v = p.Victim(At(kN * 0.01 + n * 0.001));
      ASSERT_TRUE(v.has_value()) << m.label << " after " << n;
      ASSERT_EQ(v->lo, v->hi * 7 + 1) << m.label;
      ASSERT_EQ(live.erase(v->hi), 1u) << m.label << ": victim " << v->hi << " not a candidate";
      ASSERT_TRUE(p.Remove(*v).ok()) << m.label;
    }
    EXPECT_EQ(p.size(), 0) << m.label;
    EXPECT_EQ(p.Victim(At(1e6)), std::nullopt) << m.label;
  }
}

// "runs repeat exactly": same seed, same calls, same victims (more candidates than sampled).
TEST(PolicyApiEdgeTest, SameSeedSameVictims) {
  for (uint64_t seed : {uint64_t{1}, uint64_t{12345}}) {
    std::vector<std::vector<BlockKey>> runs;
    for (int run = 0; run < 2; ++run) {
      std::vector<Made> all = AllPolicies(seed);
      std::vector<BlockKey> victims;
      for (Made& m : all) {
        EvictionPolicy& p = *m.policy;
        for (uint64_t i = 0; i < 500; ++i) {
          p.ObserveRequest({.blocks = std::vector<BlockKey>{Key(i)}, .now = At(i % 50)});
          KVTIER_ASSERT_OK(p.Add(Key(i), {}, At(static_cast<double>(i % 50))));
        }
        for (int n = 0; n < 300; ++n) {
          std::optional<BlockKey> v = p.Victim(At(100 + n));
          ASSERT_TRUE(v.has_value());
          victims.push_back(*v);
          KVTIER_ASSERT_OK(p.Remove(*v));
        }
      }
      runs.push_back(std::move(victims));
    }
    EXPECT_EQ(runs[0], runs[1]) << "seed " << seed;
  }
}

TEST(PolicyApiEdgeTest, InfiniteAndBackwardsTimes) {
  const absl::Time times[] = {absl::InfinitePast(), At(100), absl::InfiniteFuture(), At(-100),
                              At(50)};
  for (Made& m : AllPolicies()) {
    EvictionPolicy& p = *m.policy;
    std::set<uint64_t> live;
    for (uint64_t i = 0; i < 5; ++i) {
      p.ObserveRequest({.blocks = std::vector<BlockKey>{Key(i)}, .now = times[i]});
      KVTIER_ASSERT_OK(
          p.Add(Key(i), {.retention_priority = 1, .priority_until = times[4 - i]}, times[i]));
      live.insert(i);
    }
    for (uint64_t i = 0; i < 5; ++i) KVTIER_ASSERT_OK(p.Touch(Key(i), {}, times[(i + 2) % 5]));
    for (int n = 0; n < 5; ++n) {
      const std::optional<BlockKey> v = p.Victim(times[(n * 3) % 5]);
      ASSERT_TRUE(v.has_value()) << m.label;
      ASSERT_EQ(live.erase(v->hi), 1u) << m.label;
      KVTIER_ASSERT_OK(p.Remove(*v));
      const std::optional<double> c = p.ReuseChance(Key(0), absl::Seconds(10), times[n]);
      if (c.has_value()) {
        EXPECT_TRUE(*c >= 0 && *c <= 1) << m.label << " " << *c;
      }
    }
    EXPECT_EQ(p.size(), 0) << m.label;
  }
}

TEST(PolicyApiEdgeTest, ReuseChanceOfUnknownKeysAndNoData) {
  for (Made& m : AllPolicies()) {
    EvictionPolicy& p = *m.policy;
    EXPECT_EQ(p.ReuseChance(Key(77), absl::InfiniteDuration(), At(0)), std::nullopt) << m.label;
    EXPECT_EQ(p.ReuseChance(kRootBlockKey, absl::Seconds(-1), At(0)), std::nullopt) << m.label;
    KVTIER_ASSERT_OK(p.Add(Key(1), {}, At(0)));
    // No outcomes yet: no estimate anyone trusts.
    EXPECT_EQ(p.ReuseChance(Key(1), absl::Seconds(60), At(1)), std::nullopt) << m.label;
    EXPECT_EQ(p.ReuseChance(Key(1), -absl::InfiniteDuration(), absl::InfiniteFuture()),
              std::nullopt)
        << m.label;
  }
}

TEST(PolicyApiEdgeTest, SharedShadow) {
  EXPECT_EQ(MakeLruPolicy()->MakeSharedShadow(), nullptr);
  EXPECT_EQ(Unwrap(MakeCostAwarePolicy())->MakeSharedShadow(), nullptr);
  auto live = Unwrap(MakeReuseIndexPolicy());
  ASSERT_NE(live, nullptr);
  std::unique_ptr<EvictionPolicy> shadow = live->MakeSharedShadow();
  ASSERT_NE(shadow, nullptr);
  EXPECT_EQ(shadow->Victim(At(0)), std::nullopt);
  EXPECT_THAT(shadow->Remove(Key(1)), IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT(shadow->Touch(Key(1), {}, At(0)), IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT(shadow->Add(Key(1), {.bytes = 0}, At(0)), IsError(StatusCode::kInvalidArgument, ""));
  KVTIER_ASSERT_OK(shadow->Add(Key(1), {}, At(0)));
  EXPECT_THAT(shadow->Add(Key(1), {}, At(0)), IsError(StatusCode::kAlreadyExists, ""));
  EXPECT_EQ(shadow->Victim(At(1)), Key(1));
  EXPECT_EQ(shadow->Victim(At(1)), Key(1));  // stays a candidate
  EXPECT_EQ(shadow->size(), 1);
  // Its own observations do nothing; the live policy is unaffected by the shadow's candidates.
  shadow->ObserveRequest({.blocks = std::vector<BlockKey>{Key(2)}, .now = At(2), .session = 4});
  EXPECT_EQ(live->size(), 0);
  // Many candidates: victims are its candidates, sampled from the live model.
  std::set<uint64_t> keys = {1};
  for (uint64_t i = 2; i < 300; ++i) {
    live->ObserveRequest({.blocks = std::vector<BlockKey>{Key(i)}, .now = At(i)});
    KVTIER_ASSERT_OK(shadow->Add(Key(i), {}, At(i)));
    keys.insert(i);
  }
  for (int n = 0; n < 299; ++n) {
    const std::optional<BlockKey> v = shadow->Victim(At(400));  // all at one time (batched)
    ASSERT_TRUE(v.has_value());
    ASSERT_EQ(keys.erase(v->hi), 1u) << v->hi;
    KVTIER_ASSERT_OK(shadow->Remove(*v));
    if (n % 10 == 0) {  // a key Removed and Added back between batched victims
      const uint64_t k = *keys.begin();
      KVTIER_ASSERT_OK(shadow->Remove(Key(k)));
      KVTIER_ASSERT_OK(shadow->Add(Key(k), {}, At(400)));
    }
  }
  EXPECT_EQ(shadow->size(), 0);
}

// --- LRU ----------------------------------------------------------------------------------------

TEST(PolicyApiEdgeTest, LruPriorityPastFutureAndBoundary) {
  auto p = MakeLruPolicy();
  // Key 1 touched first, but with a priority until t=100: touched 30 min later while it lasts.
  KVTIER_ASSERT_OK(p->Add(Key(1), {.retention_priority = 1, .priority_until = At(100)}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(2), {}, At(10)));
  // Key 3: a priority already over.
  KVTIER_ASSERT_OK(p->Add(Key(3), {.retention_priority = 5, .priority_until = At(-1)}, At(20)));
  EXPECT_EQ(p->Victim(At(50)), Key(2));
  KVTIER_ASSERT_OK(p->Remove(Key(2)));
  EXPECT_EQ(p->Victim(At(50)), Key(3));  // its priority no longer counts
  // At priority_until the priority has ended ("until then").
  EXPECT_EQ(p->Victim(At(100)), Key(1));
  // A priority of 0 is none; a priority until InfiniteFuture lasts.
  auto q = MakeLruPolicy();
  KVTIER_ASSERT_OK(
      q->Add(Key(1), {.retention_priority = 0.5, .priority_until = absl::InfiniteFuture()}, At(0)));
  KVTIER_ASSERT_OK(
      q->Add(Key(2), {.retention_priority = 0, .priority_until = absl::InfiniteFuture()}, At(899)));
  EXPECT_EQ(q->Victim(At(1e9)), Key(2));  // 0 + 900 s > 899 s
}

// Ordering by touch time on a clock far from 1970 (a trace's time, say): 2286 vs 2603.
TEST(PolicyApiEdgeTest, LruOrdersFarFutureAndFarPastTimes) {
  auto p = MakeLruPolicy();
  KVTIER_ASSERT_OK(p->Add(Key(2), {}, absl::FromUnixSeconds(10'000'000'000)));
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, absl::FromUnixSeconds(20'000'000'000)));
  EXPECT_EQ(p->Victim(absl::FromUnixSeconds(30'000'000'000)), Key(2));
  auto q = MakeLruPolicy();
  KVTIER_ASSERT_OK(q->Add(Key(2), {}, absl::FromUnixSeconds(-20'000'000'000)));
  KVTIER_ASSERT_OK(q->Add(Key(1), {}, absl::FromUnixSeconds(-10'000'000'000)));
  EXPECT_EQ(q->Victim(absl::FromUnixSeconds(0)), Key(2));
}

// A block touched at InfinitePast with a large (finite, valid) retention priority, then removed:
// it must not come back as a victim, and the order of the others must hold.
TEST(PolicyApiEdgeTest, LruInfinitePastWithHugePriority) {
  auto p = MakeLruPolicy();
  for (uint64_t i = 10; i < 40; ++i)
    KVTIER_ASSERT_OK(p->Add(Key(i), {}, At(static_cast<double>(i))));
  KVTIER_ASSERT_OK(p->Add(Key(1),
                          {.retention_priority = 1e306, .priority_until = absl::InfiniteFuture()},
                          absl::InfinitePast()));
  KVTIER_ASSERT_OK(p->Add(Key(2),
                          {.retention_priority = 1e306, .priority_until = absl::InfiniteFuture()},
                          absl::InfinitePast()));
  KVTIER_ASSERT_OK(p->Remove(Key(1)));
  KVTIER_ASSERT_OK(p->Remove(Key(2)));
  // The 30 blocks go oldest first, and only they: Keys 10, 11, ..., 39.
  std::vector<uint64_t> order, expected;
  for (uint64_t i = 10; i < 40; ++i) {
    expected.push_back(i);
    const std::optional<BlockKey> v = p->Victim(At(100));
    if (!v.has_value()) {
      ADD_FAILURE() << "no victim with size() " << p->size() << " after " << order.size();
      break;
    }
    order.push_back(v->hi);
    if (!p->Remove(*v).ok()) break;  // a victim that is not a candidate
  }
  EXPECT_EQ(order, expected);
  EXPECT_EQ(p->size(), 0);
}

// Times must not go backwards; an earlier `now` is no error, and "a retention priority seen ended
// stays ended": after Victim at t=200, key 0's priority (until 100) no longer counts at t=50.
TEST(PolicyApiEdgeTest, LruPrioritySeenEndedStaysEnded) {
  auto p = MakeLruPolicy();
  KVTIER_ASSERT_OK(p->Add(Key(0), {.retention_priority = 1, .priority_until = At(100)}, At(-10)));
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(0)));
  EXPECT_EQ(p->Victim(At(50)), Key(1)) << "the priority lasts at 50";
  EXPECT_EQ(p->Victim(At(200)), Key(0));
  EXPECT_EQ(p->Victim(At(50)), Key(0));
}

// The same promise of reuse_index (eviction_policy.h), which ranked by the `now` it was given, so
// the priority counted again at 50. (cost_aware ranks every block 0 until it has outcomes, and
// a priority then counts for nothing.)
TEST(PolicyApiEdgeTest, ReuseIndexPrioritySeenEndedStaysEnded) {
  std::vector<std::unique_ptr<EvictionPolicy>> policies;
  policies.push_back(MakeLruPolicy());
  policies.push_back(Unwrap(MakeReuseIndexPolicy({.sample_size = 0})));
  for (auto& p : policies) {
    SCOPED_TRACE(p->name());
    KVTIER_ASSERT_OK(p->Add(Key(0), {.retention_priority = 1, .priority_until = At(100)}, At(-10)));
    KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(0)));
    EXPECT_EQ(p->Victim(At(50)), Key(1)) << "the priority lasts at 50";
    EXPECT_EQ(p->Victim(At(200)), Key(0));
    EXPECT_EQ(p->Victim(At(50)), Key(0));
  }
}

// --- cost_aware ---------------------------------------------------------------------------------

TEST(PolicyApiEdgeTest, CostAwareColdStartIsLruWhateverPriorityOrBytes) {
  auto p = Unwrap(MakeCostAwarePolicy({.sample_size = 1000}));
  KVTIER_ASSERT_OK(p->Add(Key(3), {.bytes = 1}, At(5)));
  KVTIER_ASSERT_OK(p->Add(
      Key(1), {.bytes = INT64_MAX, .retention_priority = 100, .priority_until = At(1e6)}, At(1)));
  KVTIER_ASSERT_OK(p->Add(Key(2), {.expected_reuse = 1e300, .run_blocks = 32}, At(3)));
  // Before any outcome every rank is 0: least recently used first.
  EXPECT_EQ(p->Victim(At(10)), Key(1));
  KVTIER_ASSERT_OK(p->Remove(Key(1)));
  EXPECT_EQ(p->Victim(At(10)), Key(2));
  KVTIER_ASSERT_OK(p->Touch(Key(2), {}, At(20)));
  EXPECT_EQ(p->Victim(At(20)), Key(3));
}

// --- reuse_index --------------------------------------------------------------------------------

std::unique_ptr<EvictionPolicy> SmallReuseIndex() {
  return Unwrap(MakeReuseIndexPolicy({.sample_size = 0, .table = Small()}));
}

TEST(PolicyApiEdgeTest, ReuseIndexNoDataOldestFirstAndPriority) {
  auto p = SmallReuseIndex();
  KVTIER_ASSERT_OK(p->Add(Key(1), {.retention_priority = 0.01, .priority_until = At(100)}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(2), {}, At(5)));
  KVTIER_ASSERT_OK(p->Add(Key(3), {.retention_priority = 9, .priority_until = At(-5)}, At(3)));
  EXPECT_EQ(p->Victim(At(10)), Key(3));  // oldest unboosted (its priority is over)
  KVTIER_ASSERT_OK(p->Remove(Key(3)));
  EXPECT_EQ(p->Victim(At(11)), Key(2));   // key 1, older, is boosted
  EXPECT_EQ(p->Victim(At(100)), Key(1));  // until then
}

// "while a retention priority p lasts, index x (1 + p) + p: above every block without one whose
// index is below p". The root learns an index of about 0.2 at age 0; an unnamed block (index 0)
// ranks p: below the root at p = 0.01, above it at p = 1.
TEST(PolicyApiEdgeTest, ReuseIndexRetentionRanksIndexTimesOnePlusPPlusP) {
  auto p = SmallReuseIndex();
  // Root block R is accessed every 5 s: its class (the root) learns a high index at age 0.
  const BlockKey r = Key(1);
  for (int s = 0; s <= 60; s += 5) {
    p->ObserveRequest({.blocks = std::vector<BlockKey>{r}, .now = At(s)});
  }
  KVTIER_ASSERT_OK(p->Add(r, {}, At(60)));
  // U: never named, with a small retention priority that lasts.
  KVTIER_ASSERT_OK(p->Add(
      Key(2), {.retention_priority = 0.01, .priority_until = absl::InfiniteFuture()}, At(60)));
  EXPECT_EQ(p->Victim(At(60)), Key(2));
  KVTIER_ASSERT_OK(p->Touch(
      Key(2), {.retention_priority = 1, .priority_until = absl::InfiniteFuture()}, At(60)));
  EXPECT_EQ(p->Victim(At(60)), r);
}

// Parent follows: the victim's parent, Added after the victim's Remove and ranking no higher,
// is the next victim at the same time, before an older candidate.
TEST(PolicyApiEdgeTest, ReuseIndexParentFollows) {
  auto p = SmallReuseIndex();
  const BlockKey a = Key(1), b = Key(2), c = Key(3);
  KVTIER_ASSERT_OK(p->Add(b, {.parent = a}, At(0)));  // unnamed, accessed at 0
  KVTIER_ASSERT_OK(p->Add(c, {}, At(3)));             // unnamed, accessed at 3
  p->ObserveRequest({.blocks = std::vector<BlockKey>{a}, .now = At(5)});
  EXPECT_EQ(p->Victim(At(8)), b);
  KVTIER_ASSERT_OK(p->Remove(b));
  KVTIER_ASSERT_OK(p->Add(a, {}, At(5)));
  EXPECT_EQ(p->Victim(At(8)), a);  // c is older (3 < 5), but the chain goes in one pass
  // At another time the rule does not apply: oldest first.
  EXPECT_EQ(p->Victim(At(9)), c);
}

TEST(PolicyApiEdgeTest, ReuseIndexSessionMovedOnGoesFirst) {
  auto p = SmallReuseIndex();
  const BlockKey x = Key(1), y = Key(2);
  KVTIER_ASSERT_OK(p->Add(y, {}, At(0)));  // older, no session
  p->ObserveRelease({.blocks = std::vector<BlockKey>{x},
                     .now = At(1),
                     .session = 7,
                     .stop_reason = StopReason::kToolUse});
  KVTIER_ASSERT_OK(p->Add(x, {}, At(1)));
  EXPECT_EQ(p->Victim(At(2)), y);  // no data: oldest first
  p->ObserveRequest({.blocks = std::vector<BlockKey>{Key(9)}, .now = At(3), .session = 7});
  EXPECT_EQ(p->Victim(At(4)), x);  // rank -1: first to go
  const std::optional<double> chance = p->ReuseChance(x, absl::InfiniteDuration(), At(4));
  if (chance.has_value()) {
    EXPECT_EQ(*chance, 0.0);
  }
}

// Observations at their edges: nothing crashes, candidates stay candidates, ranks stay sane.
TEST(PolicyApiEdgeTest, ReuseIndexObservationEdges) {
  for (Made& m : AllPolicies()) {
    EvictionPolicy& p = *m.policy;
    const std::vector<BlockKey> none;
    const std::vector<BlockKey> some = {Key(1), Key(2), Key(3)};
    p.ObserveRequest({.blocks = none, .now = At(0)});
    p.ObserveRequest({.blocks = none, .now = At(0), .session = 5});
    p.ObserveRelease({.blocks = none, .now = At(1), .session = 5});
    p.ObserveRelease({.blocks = some, .now = At(1), .session = 0});
    p.ObserveRelease({.blocks = some,
                      .now = At(2),
                      .session = 6,
                      .stop_reason = static_cast<StopReason>(200),
                      .expected_idle = absl::Seconds(-5)});
    p.ObserveRelease({.blocks = some,
                      .now = At(3),
                      .session = 6,
                      .stop_reason = static_cast<StopReason>(4),
                      .expected_idle = absl::InfiniteDuration()});
    p.ObserveRelease({.blocks = some,
                      .now = At(4),
                      .session = 6,
                      .expected_idle = -absl::InfiniteDuration(),
                      .superseded = true});
    p.ObserveRelease({.blocks = some,
                      .now = absl::InfiniteFuture(),
                      .session = ~uint64_t{0},
                      .expected_idle = absl::ZeroDuration()});
    p.ObserveRequest({.blocks = some, .now = absl::InfinitePast(), .session = ~uint64_t{0}});
    // The same key twice in one request, and kRootBlockKey as a block.
    p.ObserveRequest(
        {.blocks = std::vector<BlockKey>{Key(4), Key(4), kRootBlockKey}, .now = At(5)});
    for (uint64_t i = 1; i <= 4; ++i) KVTIER_ASSERT_OK(p.Add(Key(i), {}, At(5)));
    std::set<uint64_t> live = {1, 2, 3, 4};
    for (int n = 0; n < 4; ++n) {
      const std::optional<BlockKey> v = p.Victim(At(6));
      ASSERT_TRUE(v.has_value()) << m.label;
      ASSERT_EQ(live.erase(v->hi), 1u) << m.label;
      KVTIER_ASSERT_OK(p.Remove(*v));
    }
    EXPECT_EQ(p.size(), 0) << m.label;
  }
}

// --- eviction_candidacy.h -----------------------------------------------------------------------

TEST(PolicyApiEdgeTest, CandidacyRule) {
  int held_calls = 0;
  auto held = [&held_calls](bool answer) {
    return [&held_calls, answer]() {
      ++held_calls;
      return answer;
    };
  };
  EXPECT_TRUE(IsEvictionCandidate({.ready = true}, held(false)));
  EXPECT_FALSE(IsEvictionCandidate({.ready = true}, held(true)));
  EXPECT_EQ(held_calls, 2);
  EXPECT_FALSE(IsEvictionCandidate({.ready = false}, held(false)));
  EXPECT_FALSE(IsEvictionCandidate({.ready = true, .leaving = true}, held(false)));
  EXPECT_FALSE(
      IsEvictionCandidate({.ready = true, .child_copies = 2, .leaving_children = 1}, held(false)));
  EXPECT_EQ(held_calls, 2);  // called only when the other facts allow candidacy
  EXPECT_TRUE(
      IsEvictionCandidate({.ready = true, .child_copies = 2, .leaving_children = 2}, held(false)));
  EXPECT_EQ(held_calls, 3);
}

TEST(PolicyApiEdgeTest, CandidateTraitsWalk) {
  auto cost = Unwrap(MakeCostAwarePolicy());
  auto lru = MakeLruPolicy();
  const CandidateFacts block = {.uses = 0,
                                .retention_priority = 2,
                                .priority_until = At(9),
                                .parent = Key(1),
                                .last_use = At(3)};
  int calls = 0;
  // A cycle: every parent has the same use count and a parent of its own.
  auto cycle = [&calls](const BlockKey& k) -> std::optional<CandidateFacts> {
    ++calls;
    return CandidateFacts{.uses = 0, .parent = Key(k.hi + 1)};
  };
  BlockTraits t = CandidateTraits(*cost, block, 4096, cycle);
  EXPECT_EQ(t.expected_reuse, 1);  // max(1, uses)
  EXPECT_EQ(t.recompute_seconds, 0);
  EXPECT_EQ(t.bytes, 4096);
  EXPECT_EQ(t.retention_priority, 2);
  EXPECT_EQ(t.priority_until, At(9));
  EXPECT_EQ(t.parent, Key(1));
  EXPECT_EQ(t.run_blocks, kMaxRunBlocks);
  EXPECT_LE(calls, kMaxRunBlocks - 1);
  calls = 0;
  t = CandidateTraits(*lru, {.uses = 5, .parent = Key(1)}, 1, cycle);
  EXPECT_EQ(t.run_blocks, 1);
  EXPECT_EQ(t.expected_reuse, 5);
  EXPECT_EQ(calls, 0);
  // Stops at a differing use count, an unknown parent, the root.
  auto chain = [](const BlockKey& k) -> std::optional<CandidateFacts> {
    if (k == Key(1)) return CandidateFacts{.uses = 3, .parent = Key(2)};
    if (k == Key(2)) return CandidateFacts{.uses = 3, .parent = Key(3)};
    if (k == Key(3)) return CandidateFacts{.uses = 4, .parent = kRootBlockKey};
    return std::nullopt;
  };
  EXPECT_EQ(CandidateTraits(*cost, {.uses = 3, .parent = Key(1)}, 1, chain).run_blocks, 3);
  EXPECT_EQ(CandidateTraits(*cost, {.uses = 3, .parent = Key(9)}, 1, chain).run_blocks, 1);
  EXPECT_EQ(CandidateTraits(*cost, {.uses = 3, .parent = kRootBlockKey}, 1, chain).run_blocks, 1);
}

TEST(PolicyApiEdgeTest, SyncCandidacy) {
  auto p = MakeLruPolicy();
  auto none = [](const BlockKey&) -> std::optional<CandidateFacts> { return std::nullopt; };
  const CandidateFacts facts = {.uses = 1, .last_use = At(2)};
  bool registered = false;
  // Out-of-range bytes: the Add's error, not registered.
  EXPECT_THAT(SyncCandidacy(*p, Key(1), true, facts, 0, none, &registered),
              IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_FALSE(registered);
  EXPECT_THAT(SyncCandidacy(*p, Key(1), true, {.retention_priority = kNaN}, 10, none, &registered),
              IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_FALSE(registered);
  EXPECT_EQ(p->size(), 0);
  KVTIER_EXPECT_OK(SyncCandidacy(*p, Key(1), true, facts, 10, none, &registered));
  EXPECT_TRUE(registered);
  EXPECT_EQ(p->size(), 1);
  // Already registered: nothing called (a second Add would be kAlreadyExists).
  KVTIER_EXPECT_OK(SyncCandidacy(*p, Key(1), true, facts, 10, none, &registered));
  EXPECT_TRUE(registered);
  // Not a candidate, not registered: nothing called.
  bool other = false;
  KVTIER_EXPECT_OK(SyncCandidacy(*p, Key(2), false, facts, 10, none, &other));
  EXPECT_FALSE(other);
  // Registered but the policy lost it: kNotFound, and no longer registered.
  KVTIER_ASSERT_OK(p->Remove(Key(1)));
  EXPECT_THAT(SyncCandidacy(*p, Key(1), false, facts, 10, none, &registered),
              IsError(StatusCode::kNotFound, ""));
  EXPECT_FALSE(registered);
  // Already a candidate in the policy, not registered here: kAlreadyExists, not registered.
  KVTIER_ASSERT_OK(p->Add(Key(3), {}, At(0)));
  bool third = false;
  EXPECT_THAT(SyncCandidacy(*p, Key(3), true, facts, 10, none, &third),
              IsError(StatusCode::kAlreadyExists, ""));
  EXPECT_FALSE(third);
}

}  // namespace
}  // namespace kvtier
