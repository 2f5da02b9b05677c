// Restore versus recompute: for a prompt whose leading blocks are cached in some tiers, which
// leading blocks to restore and where prefill should start (DESIGN.md section 7).
//
// Prefill cost of the first n tokens of a sequence, in FLOPs:
//   F(n) = 2 * params * n + 2 * layers * d_model * n^2
// The first term is the weight matmuls: 2 FLOPs per multiply-add, each (active) parameter once
// per token (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1: forward pass
// ~ 2N per token). The second is attention's scores and weighted sum over the causal prefix:
// 4 * layers * d_model FLOPs per token per earlier token (Kaplan et al.'s 2 * n_layer * n_ctx *
// d_attn for each of QK^T and AV, with d_attn = d_model), summed over a causal prefix of n
// tokens: 4 * layers * d_model * n^2 / 2. Recomputing tokens [a, b) after a cached prefix of a
// tokens costs F(b) - F(a); its time is that over a sustained FLOP rate (model FLOP utilization
// included). For a mixture of experts, params is the active parameter count.
//
// Restore time of blocks from one source tier: latency + bytes / bandwidth (bandwidth measured
// online by the transfer engine, or configured). Blocks from several tiers are charged one
// after another (a conservative bound; the engine may overlap them). Blocks already in HBM cost
// nothing.
//
// Thread-safety: the types are values; the functions are pure.
#ifndef KVTIER_COST_MODEL_H_
#define KVTIER_COST_MODEL_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/ids.h"
#include "kvtier/kv_geometry.h"

namespace kvtier {

struct PrefillCostOptions {
  double params = 0;            // active parameters, > 0
  int num_layers = 0;           // > 0
  int64_t d_model = 0;          // hidden size, > 0
  double flops_per_second = 0;  // sustained prefill FLOP rate of one instance, > 0
};

class PrefillCostModel {
 public:
  // Errors: kInvalidArgument naming the first option that is not positive and finite.
  static absl::StatusOr<PrefillCostModel> Create(const PrefillCostOptions& options);

  // F(n) above, for n >= 0 tokens.
  double Flops(int64_t tokens) const;
  // Time to prefill tokens [from, to) after a cached prefix of `from` tokens; zero if to <= from.
  absl::Duration RecomputeTime(int64_t from, int64_t to) const;
  const PrefillCostOptions& options() const { return options_; }

 private:
  explicit PrefillCostModel(const PrefillCostOptions& options) : options_(options) {}
  PrefillCostOptions options_;
};

// Cost of moving blocks from one tier into HBM.
struct TierLinkCost {
  absl::Duration latency = absl::ZeroDuration();  // once per restore from this tier
  double bytes_per_second = 0;                    // > 0 for a tier blocks are restored from
};

struct RestorePlan {
  int64_t restore_blocks = 0;        // restore matched blocks [0, restore_blocks)
  int64_t recompute_from_token = 0;  // prefill tokens [recompute_from_token, prompt_tokens)
  absl::Duration restore_time;       // of the restored blocks (HBM ones cost nothing)
  absl::Duration recompute_time;     // of the recomputed tokens
  absl::Duration total_time;         // restore_time + recompute_time: the minimum over choices
  // Matched blocks left to recompute because restoring them would take longer (e.g. a slow
  // remote tier behind a short prefix), or because the prompt's last token must be computed.
  int64_t cached_but_recomputed = 0;
};

// The plan minimizing total time over every choice of a restored leading run of the matched
// blocks: `matched[i]` is where block i of the prompt is cached (a contiguous matched prefix),
// `links[tier]` what moving a block from that tier costs. At least the prompt's last token is
// always computed (its logits start decoding; vLLM does the same), so a fully cached prompt
// restores all but its last block when tokens_per_block divides it. Errors: kInvalidArgument for
// sizes that are not positive, more matched blocks than the prompt has, or a matched tier other
// than HBM whose link has no bandwidth.
absl::StatusOr<RestorePlan> PlanRestore(const PrefillCostModel& model,
                                        absl::Span<const Tier> matched,
                                        const std::array<TierLinkCost, kNumTiers>& links,
                                        int64_t tokens_per_block, int64_t bytes_per_block,
                                        int64_t prompt_tokens);

// A model whose public config (config.json) and model card give its KV geometry and prefill cost
// shape: the models of shared/models/kv_geometry.csv, which checks the figures against the
// published configs. The one table of them; the replay's model table is read from it.
struct KnownModel {
  std::string_view name;  // e.g. "Llama-3.1-70B"; static storage
  // geometry.num_layers counts the layers whose cache grows with context (for gpt-oss the
  // full-attention ones, kv_geometry.h); tokens_per_block and dtype are left at their defaults.
  KvGeometryOptions geometry;
  // Active parameters (for a mixture of experts), all layers and the hidden size;
  // flops_per_second is 0 (the caller's hardware sets it).
  PrefillCostOptions cost;
};

// Every known model, in a fixed order (the CSV's); the span points to static storage.
absl::Span<const KnownModel> KnownModels();

// KnownModels()' cost for the model named exactly `model`: nullopt for a name not in the table.
std::optional<PrefillCostOptions> KnownModelCost(std::string_view model);

}  // namespace kvtier

#endif  // KVTIER_COST_MODEL_H_
