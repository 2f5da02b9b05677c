// The restore-versus-recompute cost model (cost_model.h) and the table of known models.
#include "kvtier/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

absl::Duration Seconds(double s) { return absl::Seconds(s); }

}  // namespace

absl::StatusOr<PrefillCostModel> PrefillCostModel::Create(const PrefillCostOptions& options) {
  auto bad = [](const char* what, double v) {
    return absl::InvalidArgumentError(
        absl::StrCat("PrefillCostModel: ", what, " = ", v, " must be positive and finite"));
  };
  if (!PositiveFinite(options.params)) return bad("params", options.params);
  if (options.num_layers <= 0) return bad("num_layers", options.num_layers);
  if (options.d_model <= 0) return bad("d_model", static_cast<double>(options.d_model));
  if (!PositiveFinite(options.flops_per_second)) {
    return bad("flops_per_second", options.flops_per_second);
  }
  return PrefillCostModel(options);
}

double PrefillCostModel::Flops(int64_t tokens) const {
  if (tokens <= 0) return 0;
  const auto n = static_cast<double>(tokens);
  return 2.0 * options_.params * n +
         2.0 * options_.num_layers * static_cast<double>(options_.d_model) * n * n;
}

absl::Duration PrefillCostModel::RecomputeTime(int64_t from, int64_t to) const {
  if (to <= from) return absl::ZeroDuration();
  // F(to) - F(from) as one product, never inf - inf (NaN) where both overflow: a negative or
  // NaN duration would rank recomputing as free.
  if (to <= 0) return absl::ZeroDuration();  // F is 0 for no tokens
  const double a = static_cast<double>(std::max<int64_t>(from, 0));
  const auto b = static_cast<double>(to);
  const double flops = 2.0 * (b - a) *
                       (options_.params + static_cast<double>(options_.num_layers) *
                                              static_cast<double>(options_.d_model) * (a + b));
  return Seconds(flops / options_.flops_per_second);
}

absl::StatusOr<RestorePlan> PlanRestore(const PrefillCostModel& model,
                                        absl::Span<const Tier> matched,
                                        const std::array<TierLinkCost, kNumTiers>& links,
                                        int64_t tokens_per_block, int64_t bytes_per_block,
                                        int64_t prompt_tokens) {
  if (tokens_per_block <= 0 || bytes_per_block <= 0 || prompt_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PlanRestore: tokens_per_block = ", tokens_per_block, ", bytes_per_block = ",
                     bytes_per_block, ", prompt_tokens = ", prompt_tokens, "; each must be > 0"));
  }
  const auto n = static_cast<int64_t>(matched.size());
  if (n > prompt_tokens / tokens_per_block) {  // n * tokens_per_block could overflow
    return absl::InvalidArgumentError(absl::StrCat("PlanRestore: ", n, " matched blocks of ",
                                                   tokens_per_block, " tokens in a prompt of ",
                                                   prompt_tokens, " tokens"));
  }
  for (const Tier t : matched) {
    if (TierIndex(t) < 0 || TierIndex(t) >= kNumTiers) {
      return absl::InvalidArgumentError("PlanRestore: a matched block in an unknown tier");
    }
    if (t != Tier::kHbm &&
        !PositiveFinite(links[static_cast<size_t>(TierIndex(t))].bytes_per_second)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PlanRestore: no bandwidth for restoring from ", std::string(TierName(t))));
    }
  }
  // The last prompt token is always computed, so at most this many blocks can be restored.
  const int64_t restorable = std::min(n, (prompt_tokens - 1) / tokens_per_block);
  RestorePlan best;
  best.recompute_time = model.RecomputeTime(0, prompt_tokens);
  best.total_time = best.recompute_time;
  // Walk k = 1..restorable, adding block k-1's restore cost (latency once per tier used).
  std::array<bool, kNumTiers> used{};
  double restore_seconds = 0;
  for (int64_t k = 1; k <= restorable; ++k) {
    const Tier t = matched[static_cast<size_t>(k - 1)];
    if (t != Tier::kHbm) {
      const TierLinkCost& link = links[static_cast<size_t>(TierIndex(t))];
      if (!used[static_cast<size_t>(TierIndex(t))]) {
        used[static_cast<size_t>(TierIndex(t))] = true;
        restore_seconds += absl::ToDoubleSeconds(link.latency);
      }
      restore_seconds += static_cast<double>(bytes_per_block) / link.bytes_per_second;
    }
    const absl::Duration recompute = model.RecomputeTime(k * tokens_per_block, prompt_tokens);
    const absl::Duration total = Seconds(restore_seconds) + recompute;
    if (total < best.total_time) {
      best.restore_blocks = k;
      best.restore_time = Seconds(restore_seconds);
      best.recompute_time = recompute;
      best.total_time = total;
    }
  }
  best.recompute_from_token = best.restore_blocks * tokens_per_block;
  best.cached_but_recomputed = n - best.restore_blocks;
  return best;
}

namespace {

constexpr KnownModel Mha(std::string_view name, int kv_layers, int kv_heads, int head_dim,
                         double params, int layers, int64_t d_model) {
  return {.name = name,
          .geometry = {.attention = AttentionKind::kMha,
                       .num_layers = kv_layers,
                       .num_kv_heads = kv_heads,
                       .head_dim = head_dim},
          .cost = {.params = params, .num_layers = layers, .d_model = d_model}};
}

constexpr KnownModel Mla(std::string_view name, int kv_layers, int kv_lora_rank,
                         int qk_rope_head_dim, double params, int layers, int64_t d_model) {
  return {.name = name,
          .geometry = {.attention = AttentionKind::kMla,
                       .num_layers = kv_layers,
                       .kv_lora_rank = kv_lora_rank,
                       .qk_rope_head_dim = qk_rope_head_dim},
          .cost = {.params = params, .num_layers = layers, .d_model = d_model}};
}

// Per model: the KV geometry (layers growing with context, then KV heads and head dim, or latent
// rank and rope dim), then active parameters, all layers and hidden size. Shapes from the models'
// config.json, active parameters from their Hugging Face model cards. gpt-oss caches 18 (12) of
// its 36 (24) layers: the others slide.
constexpr KnownModel kKnownModels[] = {
    Mha("Llama-3.1-8B", 32, 8, 128, 8.03e9, 32, 4096),
    Mha("Llama-3.1-70B", 80, 8, 128, 70.6e9, 80, 8192),
    Mha("Llama-3.1-405B", 126, 8, 128, 405.9e9, 126, 16384),
    Mha("Llama-3.2-3B", 28, 8, 128, 3.21e9, 28, 3072),
    Mha("Llama-3.2-1B", 16, 8, 64, 1.24e9, 16, 2048),
    Mha("Qwen2.5-7B", 28, 4, 128, 7.61e9, 28, 3584),
    Mha("Qwen2.5-72B", 80, 8, 128, 72.7e9, 80, 8192),
    Mha("Qwen3-8B", 36, 8, 128, 8.2e9, 36, 4096),
    Mha("Qwen3-32B", 64, 8, 128, 32.8e9, 64, 5120),
    Mha("Qwen3-235B-A22B", 94, 4, 128, 22e9, 94, 4096),
    Mha("Mistral-7B-v0.3", 32, 8, 128, 7.25e9, 32, 4096),
    Mha("Mixtral-8x7B", 32, 8, 128, 12.9e9, 32, 4096),
    Mla("DeepSeek-V3", 61, 512, 64, 37e9, 61, 7168),
    Mla("Kimi-K2.5", 61, 512, 64, 32e9, 61, 7168),
    Mha("gpt-oss-120b", 18, 8, 64, 5.1e9, 36, 2880),
    Mha("gpt-oss-20b", 12, 8, 64, 3.6e9, 24, 2880),
};

}  // namespace

absl::Span<const KnownModel> KnownModels() { return kKnownModels; }

std::optional<PrefillCostOptions> KnownModelCost(std::string_view model) {
  for (const KnownModel& m : kKnownModels) {
    if (m.name == model) return m.cost;
  }
  return std::nullopt;
}

}  // namespace kvtier
