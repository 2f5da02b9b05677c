// The models kvtier-replay knows by name: KV geometry and prefill cost shape. The built-in ones
// are the library's table (kvtier::KnownModels, cost_model.h); more models load from a CSV with
// shared/models/kv_geometry.csv's columns (LoadGeometryCsv).
//
// Thread-safety: pure functions over values.
#ifndef KVTIER_BENCH_REPLAY_SIM_MODEL_TABLE_H_
#define KVTIER_BENCH_REPLAY_SIM_MODEL_TABLE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/cost_model.h"
#include "kvtier/kv_geometry.h"

namespace kvtier::replay {

struct ModelSpec {
  std::string name;            // e.g. "Llama-3.1-70B"
  KvGeometryOptions geometry;  // tokens_per_block left at its default; the caller sets it
  // Prefill cost shape (flops_per_second 0: the caller sets it); nullopt when the CSV row names
  // a model without a known active parameter count.
  std::optional<PrefillCostOptions> cost;
  int64_t hidden_size = 0;  // d_model, for a cost model from --active-params; 0 if unknown
};

// kvtier::KnownModels(), in its order, with hidden_size its cost's d_model.
std::vector<ModelSpec> BuiltInModels();

// Rows of a CSV with shared/models/kv_geometry.csv's header (columns model, attention,
// layers_growing_with_context, num_key_value_heads, head_dim, kv_lora_rank, qk_rope_head_dim,
// and hidden_size when present; others ignored). attention "MLA" gives an MLA geometry, anything
// else MHA/GQA. A row's cost is KnownModelCost(model): nullopt for a model not in that table (the
// caller supplies the active parameters, e.g. kvtier-replay --active-params).
// Errors: kNotFound if the file cannot be read; kInvalidArgument naming the file, line and column
// for a missing column or a field that is not a positive integer where one is required.
absl::StatusOr<std::vector<ModelSpec>> LoadGeometryCsv(const std::string& path);

// The model called `name` in `models` (exact, then case-insensitive). Errors: kNotFound listing
// the names.
absl::StatusOr<ModelSpec> FindModel(const std::vector<ModelSpec>& models, const std::string& name);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SIM_MODEL_TABLE_H_
