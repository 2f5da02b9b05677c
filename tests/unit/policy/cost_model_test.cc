#include "kvtier/cost_model.h"

#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/replay/trace/csv.h"
#include "gtest/gtest.h"
#include "kvtier/kv_geometry.h"
#include "tests/testing/shared_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

PrefillCostModel Model(double params = 1e9, int layers = 2, int64_t d_model = 1000,
                       double rate = 1e12) {
  return *PrefillCostModel::Create(
      {.params = params, .num_layers = layers, .d_model = d_model, .flops_per_second = rate});
}

TEST(PrefillCostModelTest, FlopsFollowTheFormula) {
  const PrefillCostModel m = Model();
  // 2 * 1e9 * 10 + 2 * 2 * 1000 * 10^2
  EXPECT_DOUBLE_EQ(m.Flops(10), 2e10 + 4e5);
  EXPECT_DOUBLE_EQ(m.Flops(0), 0);
  // Recomputing [100, 300) after a cached prefix of 100 tokens: F(300) - F(100), at 1e12 FLOP/s.
  const double flops = (2e9 * 300 + 4e3 * 300.0 * 300) - (2e9 * 100 + 4e3 * 100.0 * 100);
  EXPECT_NEAR(absl::ToDoubleSeconds(m.RecomputeTime(100, 300)), flops / 1e12, 1e-15);
  EXPECT_EQ(m.RecomputeTime(300, 300), absl::ZeroDuration());
  EXPECT_EQ(m.RecomputeTime(300, 100), absl::ZeroDuration());
  // Llama-3.1-70B, 32k tokens: the attention term is about a third of the total.
  const PrefillCostOptions llama = *KnownModelCost("Llama-3.1-70B");
  const PrefillCostModel big = *PrefillCostModel::Create({.params = llama.params,
                                                          .num_layers = llama.num_layers,
                                                          .d_model = llama.d_model,
                                                          .flops_per_second = 1e15});
  const double linear = 2 * 70.6e9 * 32768;
  EXPECT_NEAR(big.Flops(32768) / linear, 1 + 2.0 * 80 * 8192 * 32768 / (2 * 70.6e9), 1e-9);
}

TEST(PrefillCostModelTest, RejectsBadOptions) {
  auto make = [](PrefillCostOptions o) { return PrefillCostModel::Create(o).status(); };
  const PrefillCostOptions ok{.params = 1, .num_layers = 1, .d_model = 1, .flops_per_second = 1};
  EXPECT_TRUE(make(ok).ok());
  auto with = [&](auto edit) {
    PrefillCostOptions o = ok;
    edit(o);
    return make(o);
  };
  EXPECT_THAT(with([](auto& o) { o.params = 0; }), IsError(StatusCode::kInvalidArgument, "params"));
  EXPECT_THAT(with([](auto& o) { o.params = std::nan(""); }),
              IsError(StatusCode::kInvalidArgument, "params"));
  EXPECT_THAT(with([](auto& o) { o.num_layers = 0; }),
              IsError(StatusCode::kInvalidArgument, "num_layers"));
  EXPECT_THAT(with([](auto& o) { o.d_model = -1; }),
              IsError(StatusCode::kInvalidArgument, "d_model"));
  EXPECT_THAT(with([](auto& o) { o.flops_per_second = INFINITY; }),
              IsError(StatusCode::kInvalidArgument, "flops_per_second"));
}

std::array<TierLinkCost, kNumTiers> Links(double dram_bps, double remote_bps,
                                          absl::Duration remote_latency = absl::ZeroDuration()) {
  std::array<TierLinkCost, kNumTiers> links{};
  links[TierIndex(Tier::kDram)] = {.latency = absl::ZeroDuration(), .bytes_per_second = dram_bps};
  links[TierIndex(Tier::kNvme)] = {.latency = absl::Microseconds(100), .bytes_per_second = 5e9};
  links[TierIndex(Tier::kRemote)] = {.latency = remote_latency, .bytes_per_second = remote_bps};
  return links;
}

TEST(PlanRestoreTest, CachedInHbmIsRestoredExceptWhatTheLastTokenNeeds) {
  const PrefillCostModel m = Model();
  const std::vector<Tier> hbm(4, Tier::kHbm);
  // 4 blocks of 16 tokens cached; the prompt has 70 tokens: all 4 restored, 6 tokens computed.
  auto plan = PlanRestore(m, hbm, Links(1e10, 1e9), 16, 1 << 20, 70);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->restore_blocks, 4);
  EXPECT_EQ(plan->recompute_from_token, 64);
  EXPECT_EQ(plan->restore_time, absl::ZeroDuration());
  EXPECT_EQ(plan->cached_but_recomputed, 0);
  EXPECT_EQ(plan->total_time, m.RecomputeTime(64, 70));
  // The whole 64-token prompt cached: the last block is recomputed so its last token has logits.
  plan = PlanRestore(m, hbm, Links(1e10, 1e9), 16, 1 << 20, 64);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->restore_blocks, 3);
  EXPECT_EQ(plan->recompute_from_token, 48);
  EXPECT_EQ(plan->cached_but_recomputed, 1);
}

TEST(PlanRestoreTest, RecomputesWhenRestoringIsSlower) {
  // A small model recomputes 16 tokens in about 32 us; 1 MiB over a 1 GB/s link takes 1 ms.
  const PrefillCostModel m = Model(1e9, 2, 1000, 1e15);
  const std::vector<Tier> remote(4, Tier::kRemote);
  auto plan = PlanRestore(m, remote, Links(1e10, 1e9), 16, 1 << 20, 100);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->restore_blocks, 0);
  EXPECT_EQ(plan->cached_but_recomputed, 4);
  EXPECT_EQ(plan->total_time, m.RecomputeTime(0, 100));
  // A fast DRAM prefix followed by slow remote blocks: restore the DRAM part only.
  const std::vector<Tier> mixed = {Tier::kHbm, Tier::kDram, Tier::kDram, Tier::kRemote,
                                   Tier::kRemote};
  const PrefillCostModel slow_gpu = Model(1e9, 2, 1000, 1e12);  // 16 tokens: about 32 ms
  plan = PlanRestore(slow_gpu, mixed, Links(1e11, 1e7), 16, 1 << 20, 100);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->restore_blocks, 3);
  EXPECT_EQ(plan->cached_but_recomputed, 2);
  EXPECT_NEAR(absl::ToDoubleSeconds(plan->restore_time), 2.0 * (1 << 20) / 1e11,
              1e-9);  // 2 DRAM blocks
}

// Against an exhaustive search written from the definition, on random cases.
TEST(PlanRestoreTest, MatchesExhaustiveSearch) {
  std::mt19937 rng(42);
  const Tier tiers[] = {Tier::kHbm, Tier::kDram, Tier::kNvme, Tier::kRemote};
  for (int round = 0; round < 500; ++round) {
    const PrefillCostModel m = Model(std::uniform_real_distribution<double>(1e8, 1e11)(rng),
                                     std::uniform_int_distribution<int>(1, 100)(rng), 4096,
                                     std::uniform_real_distribution<double>(1e11, 1e15)(rng));
    const int64_t tpb = std::uniform_int_distribution<int>(1, 64)(rng);
    const int64_t prompt = std::uniform_int_distribution<int64_t>(1, 4000)(rng);
    const int64_t matched_n = std::uniform_int_distribution<int64_t>(0, prompt / tpb)(rng);
    std::vector<Tier> matched(static_cast<size_t>(matched_n));
    for (Tier& t : matched) t = tiers[std::uniform_int_distribution<int>(0, 3)(rng)];
    const auto links = Links(std::uniform_real_distribution<double>(1e9, 1e11)(rng),
                             std::uniform_real_distribution<double>(1e7, 1e10)(rng),
                             absl::Microseconds(std::uniform_int_distribution<int>(0, 5000)(rng)));
    const int64_t bytes = std::uniform_int_distribution<int64_t>(1, 8 << 20)(rng);
    auto plan = PlanRestore(m, matched, links, tpb, bytes, prompt);
    ASSERT_TRUE(plan.ok()) << plan.status();
    double best = absl::ToDoubleSeconds(m.RecomputeTime(0, prompt));
    for (int64_t k = 1; k <= std::min(matched_n, (prompt - 1) / tpb); ++k) {
      double restore = 0;
      bool used[kNumTiers] = {};
      for (int64_t i = 0; i < k; ++i) {
        const Tier t = matched[static_cast<size_t>(i)];
        if (t == Tier::kHbm) continue;
        if (!used[TierIndex(t)]) restore += absl::ToDoubleSeconds(links[TierIndex(t)].latency);
        used[TierIndex(t)] = true;
        restore += static_cast<double>(bytes) / links[TierIndex(t)].bytes_per_second;
      }
      best = std::min(best, restore + absl::ToDoubleSeconds(m.RecomputeTime(k * tpb, prompt)));
    }
    ASSERT_NEAR(absl::ToDoubleSeconds(plan->total_time), best, 1e-9 + best * 1e-9) << round;
    EXPECT_EQ(plan->recompute_from_token, plan->restore_blocks * tpb);
    EXPECT_EQ(plan->restore_blocks + plan->cached_but_recomputed, matched_n);
  }
}

TEST(PlanRestoreTest, RejectsBadInput) {
  const PrefillCostModel m = Model();
  const std::vector<Tier> two(2, Tier::kHbm);
  EXPECT_THAT(PlanRestore(m, two, Links(1, 1), 0, 1, 10).status(),
              IsError(StatusCode::kInvalidArgument, "tokens_per_block"));
  EXPECT_THAT(PlanRestore(m, two, Links(1, 1), 16, 1, 20).status(),
              IsError(StatusCode::kInvalidArgument, "2 matched blocks"));
  std::array<TierLinkCost, kNumTiers> none{};
  EXPECT_THAT(PlanRestore(m, {Tier::kRemote}, none, 16, 1, 100).status(),
              IsError(StatusCode::kInvalidArgument, "remote"));
}

// Sizes near int64's end: the matched blocks' tokens were a signed product that overflowed (2
// blocks of 2^62 tokens "fit" a prompt of INT64_MAX), and a model of huge size made inf - inf, a
// NaN recompute time that absl turned into minus infinity: recomputing looked free.
TEST(PlanRestoreTest, HugeSizesAreRefusedOrCostInfinitely) {
  const PrefillCostModel m = Model();
  const std::vector<Tier> two(2, Tier::kHbm);
  EXPECT_THAT(PlanRestore(m, two, Links(1, 1), int64_t{1} << 62, 1, INT64_MAX).status(),
              IsError(StatusCode::kInvalidArgument, "2 matched blocks"));
  const PrefillCostModel huge = Model(/*params=*/1e308);
  EXPECT_EQ(huge.RecomputeTime(1, 100), absl::InfiniteDuration());
  EXPECT_GT(huge.RecomputeTime(0, 2), absl::ZeroDuration());
  EXPECT_EQ(m.RecomputeTime(-5, -2), absl::ZeroDuration());  // no tokens: F is 0 at both ends
  EXPECT_EQ(m.RecomputeTime(-5, 10), m.RecomputeTime(0, 10));
  auto plan = PlanRestore(huge, two, Links(1, 1), 16, 1, 100);
  KVTIER_ASSERT_OK(plan.status());
  // Every choice leaves some tokens to recompute, at infinite cost: never a negative one.
  EXPECT_EQ(plan->recompute_time, absl::InfiniteDuration());
  EXPECT_EQ(plan->total_time, absl::InfiniteDuration());
}

TEST(KnownModelCostTest, IsTheKnownModelsCost) {
  EXPECT_FALSE(KnownModelCost("no-such-model").has_value());
  EXPECT_FALSE(KnownModelCost("llama-3.1-70b").has_value());  // exact names only
  ASSERT_GE(KnownModels().size(), 16u);
  for (const KnownModel& m : KnownModels()) {
    const std::optional<PrefillCostOptions> cost = KnownModelCost(m.name);
    ASSERT_TRUE(cost.has_value()) << m.name;
    EXPECT_EQ(cost->params, m.cost.params) << m.name;
    EXPECT_EQ(cost->num_layers, m.cost.num_layers) << m.name;
    EXPECT_EQ(cost->d_model, m.cost.d_model) << m.name;
    EXPECT_EQ(cost->flops_per_second, 0) << m.name;
    EXPECT_TRUE(KvGeometry::Create(m.geometry).ok()) << m.name;
  }
  const PrefillCostOptions llama = *KnownModelCost("Llama-3.1-70B");
  EXPECT_EQ(llama.params, 70.6e9);
  EXPECT_EQ(llama.num_layers, 80);
  EXPECT_EQ(llama.d_model, 8192);
}

// Every row of the shared table is a known model with the row's shapes and KV bytes per token,
// and every known model is a row.
TEST(KnownModelsTest, AreTheSharedModelTableWithItsShapes) {
  const auto path = testing::SharedFile("models/kv_geometry.csv");
  if (path.empty()) {
    GTEST_SKIP() << "shared/models/kv_geometry.csv not found under " << testing::SharedDir();
  }
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const std::vector<std::string> header = replay::SplitCsvLine(line);
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  auto number = [](const std::string& field) { return field.empty() ? 0 : std::stoi(field); };
  std::map<std::string, const KnownModel*> known;
  for (const KnownModel& m : KnownModels()) {
    EXPECT_TRUE(known.emplace(std::string(m.name), &m).second) << m.name << " twice";
  }
  size_t rows = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> f = replay::SplitCsvLine(line);
    const std::string& model = f[col["model"]];
    ASSERT_TRUE(known.contains(model)) << model << " is not a known model";
    const KnownModel& m = *known[model];
    EXPECT_EQ(m.cost.num_layers, std::stoi(f[col["num_hidden_layers"]])) << model;
    EXPECT_EQ(m.cost.d_model, std::stoll(f[col["hidden_size"]])) << model;
    EXPECT_GT(m.cost.params, 1e9) << model;
    const bool mla = f[col["attention"]] == "MLA";
    EXPECT_EQ(m.geometry.attention, mla ? AttentionKind::kMla : AttentionKind::kMha) << model;
    EXPECT_EQ(m.geometry.num_layers, std::stoi(f[col["layers_growing_with_context"]])) << model;
    if (mla) {
      EXPECT_EQ(m.geometry.kv_lora_rank, number(f[col["kv_lora_rank"]])) << model;
      EXPECT_EQ(m.geometry.qk_rope_head_dim, number(f[col["qk_rope_head_dim"]])) << model;
    } else {
      EXPECT_EQ(m.geometry.num_kv_heads, number(f[col["num_key_value_heads"]])) << model;
      EXPECT_EQ(m.geometry.head_dim, number(f[col["head_dim"]])) << model;
    }
    const absl::StatusOr<KvGeometry> g = KvGeometry::Create(m.geometry);
    ASSERT_TRUE(g.ok()) << model << ": " << g.status();
    EXPECT_EQ(std::to_string(g->bytes_per_token()), f[col["kv_bytes_per_token_bf16"]]) << model;
    ++rows;
  }
  EXPECT_EQ(rows, KnownModels().size());
}

}  // namespace
}  // namespace kvtier
