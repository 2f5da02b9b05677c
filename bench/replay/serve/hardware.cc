// The roofline of hardware.h.
#include "bench/replay/serve/hardware.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvtier::replay {
namespace {

constexpr GpuSpec kGpus[] = {
    {"H100", 989.4e12, 3.35e12, 80e9,
     "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989.4 TFLOP/s dense BF16 (1,979 with "
     "sparsity), 3.35 TB/s HBM3, 80 GB"},
    {"H200", 989.4e12, 4.8e12, 141e9,
     "NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TFLOP/s dense BF16 (1,979 with "
     "sparsity), 4.8 TB/s HBM3e, 141 GB"},
    {"B200", 2.25e15, 8e12, 180e9,
     "NVIDIA DGX B200 datasheet: 72 PFLOP/s FP8 training for 8 GPUs (9 per GPU with sparsity, "
     "so 2.25 PFLOP/s dense BF16), 1,440 GB HBM3e (180 GB per GPU), 64 TB/s (8 per GPU)"},
};

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

absl::Span<const GpuSpec> KnownGpus() { return kGpus; }

absl::StatusOr<GpuSpec> FindGpu(std::string_view name) {
  for (const GpuSpec& g : kGpus) {
    if (g.name == name) return g;
  }
  for (const GpuSpec& g : kGpus) {
    if (absl::AsciiStrToLower(std::string(g.name)) == absl::AsciiStrToLower(std::string(name)))
      return g;
  }
  std::vector<std::string> names;
  for (const GpuSpec& g : kGpus) names.emplace_back(g.name);
  return absl::NotFoundError(
      absl::StrCat("unknown GPU ", std::string(name), "; known: ", absl::StrJoin(names, ", ")));
}

ServingModel MakeServingModel(const KvGeometry& geometry, const PrefillCostOptions& cost) {
  ServingModel m;
  m.cost = cost;
  m.weight_bytes = 2.0 * cost.params;
  m.kv_bytes_per_token = static_cast<double>(geometry.bytes_per_block()) /
                         static_cast<double>(geometry.tokens_per_block());
  return m;
}

absl::StatusOr<Roofline> Roofline::Create(const RooflineOptions& o, const ServingModel& m) {
  if (!PositiveFinite(o.gpu.peak_flops) || !PositiveFinite(o.gpu.hbm_bytes_per_second) ||
      !PositiveFinite(o.gpu.hbm_bytes)) {
    return absl::InvalidArgumentError("the GPU's peak FLOP/s, HBM bandwidth and size must be > 0");
  }
  if (o.tensor_parallel < 1 || o.tensor_parallel > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel degree ", o.tensor_parallel, " must be in [1, 64]"));
  }
  if (!PositiveFinite(o.mfu) || o.mfu > 1 || !PositiveFinite(o.mbu) || o.mbu > 1) {
    return absl::InvalidArgumentError("mfu and mbu must be in (0, 1]");
  }
  if (!std::isfinite(o.step_overhead_seconds) || o.step_overhead_seconds < 0 ||
      !std::isfinite(o.allreduce_latency_seconds) || o.allreduce_latency_seconds < 0) {
    return absl::InvalidArgumentError("step overhead and all-reduce latency must be >= 0");
  }
  if (!PositiveFinite(o.memory_utilization) || o.memory_utilization > 1 ||
      !std::isfinite(o.activation_reserve_bytes) || o.activation_reserve_bytes < 0) {
    return absl::InvalidArgumentError(
        "memory utilization must be in (0, 1] and the activation reserve >= 0");
  }
  if (!PositiveFinite(m.cost.params) || m.cost.num_layers <= 0 || m.cost.d_model <= 0 ||
      !PositiveFinite(m.weight_bytes) || !PositiveFinite(m.kv_bytes_per_token)) {
    return absl::InvalidArgumentError(
        "the model needs positive params, layers, d_model, weight bytes and KV bytes per token");
  }
  return Roofline(o, m);
}

double Roofline::Flops(int64_t n) const {
  const double t = static_cast<double>(n);
  return 2.0 * model_.cost.params * t +
         2.0 * model_.cost.num_layers * static_cast<double>(model_.cost.d_model) * t * t;
}

void Roofline::AddPrefill(StepWork& work, int64_t context, int64_t chunk) const {
  if (chunk <= 0) return;
  work.flops += Flops(context + chunk) - Flops(context);
  // The chunk's attention reads the prefix's KV once and writes its own.
  work.kv_bytes += static_cast<double>(context + chunk) * model_.kv_bytes_per_token;
  work.tokens += chunk;
}

void Roofline::AddDecode(StepWork& work, int64_t context) const {
  work.flops += 2.0 * model_.cost.params + 4.0 * model_.cost.num_layers *
                                               static_cast<double>(model_.cost.d_model) *
                                               static_cast<double>(context);
  work.kv_bytes += static_cast<double>(context + 1) * model_.kv_bytes_per_token;
  work.tokens += 1;
}

double Roofline::StepSeconds(const StepWork& work) const {
  if (work.tokens <= 0) return 0;
  const double tp = options_.tensor_parallel;
  const double compute = work.flops / (tp * options_.gpu.peak_flops * options_.mfu);
  const double memory = (model_.weight_bytes + work.kv_bytes) /
                        (tp * options_.gpu.hbm_bytes_per_second * options_.mbu);
  const double comm = options_.tensor_parallel > 1
                          ? 2.0 * model_.cost.num_layers * options_.allreduce_latency_seconds
                          : 0.0;
  return std::max(compute, memory) + options_.step_overhead_seconds + comm;
}

double Roofline::KvPoolBytes() const {
  return options_.tensor_parallel * options_.gpu.hbm_bytes * options_.memory_utilization -
         model_.weight_bytes - options_.activation_reserve_bytes;
}

}  // namespace kvtier::replay
