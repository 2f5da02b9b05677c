// The replay's model table (model_table.h): geometries and costs of the known models.
#include "bench/replay/sim/model_table.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/replay/trace/csv.h"

namespace kvtier::replay {

std::vector<ModelSpec> BuiltInModels() {
  std::vector<ModelSpec> out;
  for (const KnownModel& m : KnownModels()) {
    out.push_back(ModelSpec{.name = std::string(m.name),
                            .geometry = m.geometry,
                            .cost = m.cost,
                            .hidden_size = m.cost.d_model});
  }
  return out;
}

absl::StatusOr<std::vector<ModelSpec>> LoadGeometryCsv(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::string line;
  if (!std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": empty, expected a header line"));
  }
  absl::flat_hash_map<std::string, size_t> col;
  const std::vector<std::string> header = SplitCsvLine(line);
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  for (const char* need : {"model", "attention", "layers_growing_with_context",
                           "num_key_value_heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim"}) {
    if (!col.contains(need)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":1: missing column \"", need, "\""));
    }
  }
  std::vector<ModelSpec> out;
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line == "\r") continue;
    const std::vector<std::string> f = SplitCsvLine(line);
    auto field = [&](const char* name) -> std::string {
      const size_t i = col.at(name);
      return i < f.size() ? f[i] : std::string();
    };
    auto positive = [&](const char* name, bool required, int& value) -> absl::Status {
      const std::string text = field(name);
      if (text.empty() && !required) {
        value = 0;
        return absl::OkStatus();
      }
      if (!absl::SimpleAtoi(text, &value) || value < (required ? 1 : 0)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": column \"", name,
                                                       "\" = \"", text, "\" is not ",
                                                       required ? "a positive" : "an", " integer"));
      }
      return absl::OkStatus();
    };
    ModelSpec m;
    m.name = field("model");
    if (m.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": column \"model\" is empty"));
    }
    const bool mla = absl::AsciiStrToUpper(field("attention")) == "MLA";
    m.geometry.attention = mla ? AttentionKind::kMla : AttentionKind::kMha;
    absl::Status s = positive("layers_growing_with_context", true, m.geometry.num_layers);
    if (s.ok() && mla) s = positive("kv_lora_rank", true, m.geometry.kv_lora_rank);
    if (s.ok() && mla) s = positive("qk_rope_head_dim", false, m.geometry.qk_rope_head_dim);
    if (s.ok() && !mla) s = positive("num_key_value_heads", true, m.geometry.num_kv_heads);
    if (s.ok() && !mla) s = positive("head_dim", true, m.geometry.head_dim);
    if (!s.ok()) return s;
    if (auto g = KvGeometry::Create(m.geometry); !g.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": ", g.status().message()));
    }
    m.cost = KnownModelCost(m.name);
    if (col.contains("hidden_size") && !field("hidden_size").empty()) {
      int hidden = 0;
      if (absl::Status h = positive("hidden_size", true, hidden); !h.ok()) return h;
      m.hidden_size = hidden;
    }
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<ModelSpec> FindModel(const std::vector<ModelSpec>& models, const std::string& name) {
  for (const ModelSpec& m : models) {
    if (m.name == name) return m;
  }
  for (const ModelSpec& m : models) {
    if (absl::AsciiStrToLower(m.name) == absl::AsciiStrToLower(name)) return m;
  }
  std::vector<std::string> names;
  for (const ModelSpec& m : models) names.push_back(m.name);
  return absl::NotFoundError(
      absl::StrCat("unknown model \"", name, "\" (known: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace kvtier::replay
