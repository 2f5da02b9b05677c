// SimulatePolicy: a hand-computed LRU trace (every hit and every policy call written out below),
// the argument and misbehaving-policy checks, agreement with the bounds on random traces (an
// unbounded cache is UnlimitedBound, no policy beats OptimalBound), and, when shared/ has the
// Mooncake trace, lru and cost_aware against the optimum at several capacities.
#include "bench/replay/offline/policy_sim.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "bench/replay/offline/bounds.h"
#include "bench/replay/trace/agentic_workload.h"
#include "bench/replay/trace/mooncake_trace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/cost_model.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/kv_geometry.h"
#include "tests/testing/logging_lru.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/shared_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::replay {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;
using ::kvtier::testing::LoggingLru;
using ::testing::ElementsAre;

TraceRequest Request(double at, std::vector<uint64_t> ids, int64_t input_tokens) {
  TraceRequest request;
  request.arrival_seconds = at;
  request.input_tokens = input_tokens;
  request.block_ids = std::move(ids);
  return request;
}

Trace MakeTrace(int block_tokens, std::vector<TraceRequest> requests) {
  Trace trace;
  trace.name = "test";
  trace.block_tokens = block_tokens;
  trace.requests = std::move(requests);
  return trace;
}

PolicySimOptions Capacity(int64_t blocks, int tokens_per_block = 4) {
  return PolicySimOptions{.tokens_per_block = tokens_per_block, .capacity_blocks = blocks};
}

// Trace blocks of 4 tokens, ids naming prefixes 1 -> 2 -> 5 -> 6 and 3; dense keys in order of
// first sight: id 1 -> 0, 2 -> 1, 3 -> 2, 5 -> 3, 6 -> 4.
Trace HandTrace() {
  return MakeTrace(4, {
                          Request(0, {1, 2}, 8),         // R0: miss, miss
                          Request(1, {3}, 4),            // R1: miss
                          Request(2, {1, 2, 5}, 12),     // R2: hit 2; evicts 3 (key 2)
                          Request(3, {3}, 4),            // R3: miss; evicts 5, then 2 is a leaf
                          Request(4, {1, 2, 5}, 12),     // R4: hit 2; evicts 3 again
                          Request(5, {1}, 3),            // R5: no full block
                          Request(6, {1}, 4),            // R6: hit 1 (1 is not a leaf)
                          Request(7, {1, 2, 5, 6}, 16),  // R7: hit 3; 6 does not fit
                      });
}

TEST(PolicySimTest, HandComputedLru) {
  const Trace trace = HandTrace();
  LoggingLru policy;
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult result, SimulatePolicy(trace, policy, Capacity(3)));
  EXPECT_EQ(result.name, "logging_lru");
  EXPECT_EQ(result.capacity_blocks, 3);
  EXPECT_EQ(result.requests, 8);
  EXPECT_EQ(result.prompt_tokens, 8 + 4 + 12 + 4 + 12 + 3 + 4 + 16);
  EXPECT_EQ(result.queried_blocks, 2 + 1 + 3 + 1 + 3 + 0 + 1 + 4);
  EXPECT_EQ(result.hit_blocks, 2 + 2 + 1 + 3);
  EXPECT_EQ(result.hit_tokens, 32);
  EXPECT_DOUBLE_EQ(result.hit_ratio, 32.0 / 63.0);
  EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 0, 8, 0, 8, 0, 4, 12));
  EXPECT_THAT(policy.log, ElementsAre(
                              // R0 leaves key 1 the only leaf; R1 adds key 2.
                              "add 1@0", "add 2@1",
                              // R2 pins 1, evicts 2 for 5 (key 3), releases 3.
                              "remove 1", "victim 2", "remove 2", "add 3@2",
                              // R3 evicts 3; its parent 1 (last used at 2) becomes a leaf.
                              "victim 3", "remove 3", "add 1@2", "add 2@3",
                              // R4 pins 1, evicts 2 (used at 3, before 1's use at 4).
                              "remove 1", "victim 2", "remove 2", "add 3@4",
                              // R6 hits key 0, which has a cached child: no call.
                              // R7 pins 0, 1, 3 and keeps only those: 3 is still the leaf.
                              "remove 3", "add 3@7"));
  // Key 3 (id 5, depth 2): inserted again by R4, hit by R7.
  EXPECT_EQ(policy.traits_of_last_add.expected_reuse, 2);
  EXPECT_EQ(policy.traits_of_last_add.parent, SimBlockKey(1));
  EXPECT_EQ(policy.traits_of_last_add.run_blocks, 1) << "its parent (id 2) has 4 uses";
  EXPECT_EQ(policy.traits_of_last_add.bytes, 4 * 327680);
  EXPECT_EQ(policy.traits_of_last_add.recompute_seconds, 0) << "KvCache's: no policy weighs it";
  EXPECT_EQ(policy.size(), 1);

  // The same trace under the optimal bound: LRU's choices were optimal here.
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult optimal, OptimalBound(trace, 4, 3));
  EXPECT_EQ(optimal.hit_tokens, result.hit_tokens);
}

TEST(PolicySimTest, SplitsTraceBlocks) {
  // One trace block of 8 tokens is two cache blocks of 4: the second one's prefix is longer.
  const Trace trace = MakeTrace(8, {Request(0, {1}, 8), Request(1, {1}, 8)});
  LoggingLru policy;
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult result,
                              SimulatePolicy(trace, policy, Capacity(2, 4)));
  EXPECT_EQ(result.hit_tokens, 8);
  EXPECT_THAT(policy.log, ElementsAre("add 1@0", "remove 1", "add 1@1"));
  EXPECT_EQ(policy.traits_of_last_add.expected_reuse, 2);
  EXPECT_EQ(policy.traits_of_last_add.run_blocks, 2) << "both blocks have 2 uses";
  EXPECT_EQ(policy.traits_of_last_add.parent, SimBlockKey(0));
}

TEST(PolicySimTest, DefaultsAreLlama70bFromTheLibrarysTable) {
  const PolicySimOptions options;
  EXPECT_EQ(options.tokens_per_block, 512);
  EXPECT_EQ(options.capacity_blocks, 0);
  EXPECT_EQ(options.bytes_per_token, 327680);  // 80 layers x 8 KV heads x 128 x 2 (K, V) x 2
  int found = 0;
  for (const KnownModel& m : KnownModels()) {
    if (m.name != "Llama-3.1-70B") continue;
    ++found;
    KVTIER_ASSERT_OK_AND_ASSIGN(const KvGeometry g, KvGeometry::Create(m.geometry));
    EXPECT_EQ(options.bytes_per_token, g.bytes_per_token());
  }
  EXPECT_EQ(found, 1);
}

TEST(PolicySimTest, Errors) {
  const Trace trace = HandTrace();
  auto lru = MakeLruPolicy();
  EXPECT_THAT(SimulatePolicy(trace, *lru, Capacity(-1)),
              IsError(StatusCode::kInvalidArgument, "capacity_blocks"));
  EXPECT_THAT(SimulatePolicy(trace, *lru, Capacity(3, 3)),
              IsError(StatusCode::kInvalidArgument, "tokens_per_block"));
  PolicySimOptions no_bytes = Capacity(3);
  no_bytes.bytes_per_token = 0;
  EXPECT_THAT(SimulatePolicy(trace, *lru, no_bytes),
              IsError(StatusCode::kInvalidArgument, "bytes_per_token 0"));

  // A policy that names a block that is not a candidate is caught, with the request.
  class Liar final : public EvictionPolicy {
   public:
    std::string_view name() const override { return "liar"; }
    absl::Status Add(const BlockKey&, const BlockTraits&, absl::Time) override {
      return absl::OkStatus();
    }
    absl::Status Touch(const BlockKey&, const BlockTraits&, absl::Time) override {
      return absl::OkStatus();
    }
    absl::Status Remove(const BlockKey&) override { return absl::OkStatus(); }
    std::optional<BlockKey> Victim(absl::Time) override { return SimBlockKey(0); }
    int64_t size() const override { return 0; }
  } liar;
  EXPECT_THAT(SimulatePolicy(trace, liar, Capacity(3)),
              IsError(StatusCode::kInternal, "request 2: victim"));

  // Capacity 0 keeps nothing and asks for no victim.
  LoggingLru policy;
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult none, SimulatePolicy(trace, policy, Capacity(0)));
  EXPECT_EQ(none.hit_tokens, 0);
  EXPECT_TRUE(policy.log.empty());
}

// Random prefix trees: with room for everything the simulator is UnlimitedBound; with less, no
// policy beats OptimalBound.
TEST(PolicySimTest, AgreesWithTheBoundsOnRandomTraces) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 40; ++round) {
    Trace trace = MakeTrace(4, {});
    std::vector<std::vector<uint64_t>> prefixes = {{}};
    uint64_t next_id = 1;
    for (int r = 0; r < 60; ++r) {
      std::vector<uint64_t> ids = prefixes[rng() % prefixes.size()];
      const int grow = static_cast<int>(rng() % 4);
      for (int g = 0; g < grow; ++g) ids.push_back(next_id++);
      if (ids.empty()) ids.push_back(next_id++);
      prefixes.push_back(ids);
      const int64_t tokens = static_cast<int64_t>(ids.size()) * 4 - static_cast<int64_t>(rng() % 2);
      trace.requests.push_back(Request(r, ids, tokens));
    }
    KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult unlimited, UnlimitedBound(trace, 4));
    for (const char* name : {"lru", "cost_aware"}) {
      KVTIER_ASSERT_OK_AND_ASSIGN(auto big, MakeEvictionPolicy(name));
      KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult all,
                                  SimulatePolicy(trace, *big, Capacity(1 << 20)));
      EXPECT_EQ(all.hit_tokens_per_request, unlimited.hit_tokens_per_request) << name;
      for (int64_t capacity : {1, 3, 8, 20}) {
        KVTIER_ASSERT_OK_AND_ASSIGN(auto policy, MakeEvictionPolicy(name));
        KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult sim,
                                    SimulatePolicy(trace, *policy, Capacity(capacity)));
        KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult optimal, OptimalBound(trace, 4, capacity));
        EXPECT_LE(sim.hit_tokens, optimal.hit_tokens) << name << " at " << capacity;
      }
    }
  }
}

// ---- Real and generated workloads: lru and cost_aware against the optimum ----

struct Row {
  int64_t capacity = 0;
  double lru = 0;
  double cost_aware = 0;
  double optimal = 0;
  double gap_closed() const { return (cost_aware - lru) / (optimal - lru); }
};

std::vector<Row> Compare(const Trace& trace, int tokens_per_block,
                         const std::vector<int64_t>& capacities) {
  std::vector<Row> rows;
  std::printf("%s at %d tokens per block\n%10s %8s %11s %8s %11s\n", trace.name.c_str(),
              tokens_per_block, "blocks", "lru", "cost_aware", "optimal", "gap closed");
  for (int64_t capacity : capacities) {
    Row row{.capacity = capacity};
    const PolicySimOptions options{.tokens_per_block = tokens_per_block,
                                   .capacity_blocks = capacity};
    auto lru = MakeLruPolicy();
    auto cost_aware = MakeCostAwarePolicy();
    EXPECT_TRUE(cost_aware.ok());
    absl::StatusOr<BoundResult> a = SimulatePolicy(trace, *lru, options);
    absl::StatusOr<BoundResult> b = SimulatePolicy(trace, **cost_aware, options);
    absl::StatusOr<BoundResult> o = OptimalBound(trace, tokens_per_block, capacity);
    EXPECT_TRUE(a.ok() && b.ok() && o.ok());
    if (!a.ok() || !b.ok() || !o.ok()) return rows;
    row.lru = a->hit_ratio;
    row.cost_aware = b->hit_ratio;
    row.optimal = o->hit_ratio;
    const std::string gap = row.optimal > row.lru
                                ? absl::StrFormat("%.1f%%", 100 * row.gap_closed())
                                : std::string("no gap");
    std::printf("%10lld %7.2f%% %10.2f%% %7.2f%% %11s\n", static_cast<long long>(capacity),
                100 * row.lru, 100 * row.cost_aware, 100 * row.optimal, gap.c_str());
    rows.push_back(row);
  }
  std::fflush(stdout);
  return rows;
}

TEST(PolicySimMooncakeTest, CostAwareBeatsLruAtEveryCapacity) {
  // Eighteen simulations of the whole trace: ~12 s in the default build, past the 120 s test
  // timeout under a sanitizer, which adds nothing to a measurement. The default build runs it.
  if (kvtier::testing::kUnderSanitizer) {
    GTEST_SKIP() << "the full-trace policy comparison runs in the default build, not under a "
                    "sanitizer (too slow for the test timeout)";
  }
  const std::filesystem::path path =
      kvtier::testing::SharedFile("traces/mooncake/conversation_trace.jsonl");
  if (path.empty()) GTEST_SKIP() << "shared/traces/mooncake/conversation_trace.jsonl not found";
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadMooncakeTrace(path.string()));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Row> rows =
      Compare(trace, kMooncakeBlockTokens, {1000, 2000, 3000, 5000, 7500, 10000});
  ASSERT_EQ(rows.size(), 6u);
  std::printf("(%.1f s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  for (const Row& row : rows) {
    EXPECT_GT(row.cost_aware, row.lru) << row.capacity << " blocks";
    EXPECT_LE(row.cost_aware, row.optimal) << row.capacity << " blocks";
  }
}

// cost_aware is within a quarter of a point of lru here (slightly below at every capacity that
// evicts: tool pauses of seconds leave LRU little to gain on); the test bounds that loss.
TEST(PolicySimAgenticTest, CostAwareStaysCloseToLru) {
  Trace trace = GenerateAgenticWorkload(AgenticOptions{});
  trace.name = "agentic (defaults)";
  const std::vector<Row> rows =
      Compare(trace, kAgenticBlockTokens, {2000, 5000, 10000, 20000, 40000});
  ASSERT_EQ(rows.size(), 5u);
  for (const Row& row : rows) {
    EXPECT_GE(row.cost_aware, row.lru - 0.005) << row.capacity << " blocks";
    EXPECT_LE(row.cost_aware, row.optimal) << row.capacity << " blocks";
  }
}

}  // namespace
}  // namespace kvtier::replay
