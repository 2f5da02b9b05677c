// The serving simulation's hardware: GPU kinds, the host's links, and the roofline that turns a
// continuous-batching step (prefill chunks and decode tokens) into its duration.
//
// Step time (docs/replay.md, "Serving simulation"):
//   compute = FLOPs / (tp * peak_flops * mfu)
//   memory  = (weight bytes + KV bytes read + KV bytes written) / (tp * hbm_bandwidth * mbu)
//   step    = max(compute, memory) + step_overhead + (tp > 1: 2 * layers * allreduce_latency)
// FLOPs per token as PrefillCostModel (cost_model.h, after Kaplan et al. 2020): 2 * params per
// token for the weights, plus 4 * layers * d_model per earlier token of its context for
// attention. A prefill chunk of c tokens after a prefix of a tokens costs F(a + c) - F(a); a
// decode token with a context of n tokens 2 * params + 4 * layers * d_model * n. Bytes: the
// weights once per step (every step reads all of them: 2 bytes per parameter, bf16), each
// sequence's KV once per step (its context), and the KV of every new token. The roofline is
// the classic one (Williams et al., CACM 2009) as LLM inference analyses apply it (e.g.
// Yuan et al., "LLM Inference Unveiled", 2024). It does not capture kernel launch gaps,
// attention kernels' lower efficiency at short contexts, MoE expert imbalance, or
// communication overlap; docs/replay.md has its calibration.
//
// Thread-safety: values and pure functions.
#ifndef KVTIER_BENCH_REPLAY_SERVE_HARDWARE_H_
#define KVTIER_BENCH_REPLAY_SERVE_HARDWARE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/cost_model.h"
#include "kvtier/kv_geometry.h"

namespace kvtier::replay {

struct GpuSpec {
  std::string_view name;  // "H100", "H200", "B200"
  double peak_flops = 0;  // dense BF16 tensor FLOP/s
  double hbm_bytes_per_second = 0;
  double hbm_bytes = 0;     // capacity
  std::string_view source;  // where the figures come from
};

// The known GPU kinds (SXM parts), in a fixed order.
absl::Span<const GpuSpec> KnownGpus();
// Exact, then case-insensitive. Errors: kNotFound listing the names.
absl::StatusOr<GpuSpec> FindGpu(std::string_view name);

// One host's links (per instance): PCIe between pinned DRAM and HBM (each direction on its own),
// its NVMe drives, and its network to the remote store. Bytes/s and seconds per transfer.
struct HostLinks {
  double pcie_bytes_per_second = 50e9;  // Gen5 x16 pinned cudaMemcpy, ~78% of 64 GB/s
  double pcie_latency_seconds = 10e-6;
  double nvme_bytes_per_second = 6e9;  // one Gen4 drive's sequential read
  double nvme_latency_seconds = 100e-6;
  double network_bytes_per_second = 12.5e9;  // 100 Gb/s
  double network_latency_seconds = 500e-6;
};

struct RooflineOptions {
  GpuSpec gpu;
  int tensor_parallel = 1;                  // GPUs per instance, >= 1
  double mfu = 0.5;                         // fraction of peak FLOP/s the matmuls reach, (0, 1]
  double mbu = 0.8;                         // fraction of HBM bandwidth reached, (0, 1]
  double step_overhead_seconds = 2e-3;      // scheduler, sampling, launch per step
  double allreduce_latency_seconds = 8e-6;  // one all-reduce of a step's activations (NVLink)
  // Fraction of the instance's HBM the engine may use (vLLM's gpu_memory_utilization): the KV
  // pool is this times tp * hbm_bytes, less the weights and activation_reserve_bytes.
  double memory_utilization = 0.9;
  double activation_reserve_bytes = 4e9;
};

// The model as the roofline sees it.
struct ServingModel {
  PrefillCostOptions cost;        // params (active), layers, d_model; flops_per_second ignored
  double weight_bytes = 0;        // bytes of weights read per step (all of them, bf16)
  double kv_bytes_per_token = 0;  // every layer's K and V of one token
};

// What one step does, accumulated as the scheduler builds it.
struct StepWork {
  double flops = 0;
  double kv_bytes = 0;  // KV read and written
  int64_t tokens = 0;   // prefill + decode tokens scheduled
};

class Roofline {
 public:
  // Errors: kInvalidArgument naming the first option or model field out of range.
  static absl::StatusOr<Roofline> Create(const RooflineOptions& options, const ServingModel& model);

  // Adds a prefill chunk of `chunk` tokens after `context` tokens of the sequence.
  void AddPrefill(StepWork& work, int64_t context, int64_t chunk) const;
  // Adds one decode token whose sequence holds `context` tokens.
  void AddDecode(StepWork& work, int64_t context) const;
  // The step's duration in seconds (the formula above); a step with no tokens takes 0.
  double StepSeconds(const StepWork& work) const;
  // Bytes of the instance's HBM left for the KV pool; may be <= 0 (the model does not fit).
  double KvPoolBytes() const;

  const RooflineOptions& options() const { return options_; }
  const ServingModel& model() const { return model_; }

 private:
  Roofline(const RooflineOptions& options, const ServingModel& model)
      : options_(options), model_(model) {}
  double Flops(int64_t tokens) const;  // F(n) of cost_model.h
  RooflineOptions options_;
  ServingModel model_;
};

// A ServingModel from a geometry and the prefill cost shape: weights 2 bytes per parameter.
ServingModel MakeServingModel(const KvGeometry& geometry, const PrefillCostOptions& cost);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SERVE_HARDWARE_H_
