// KvGeometry: the shape of one model's KV cache as kvtier stores it, and the byte sizes that
// follow from it. An immutable value; every tier, hash namespace and copy is sized from it.
//
// Thread-safety: immutable after creation; safe to share and read from any thread.
//
// Formulas (see ../shared/models/README.md, which checks them against the published HF configs):
//   MHA/GQA/MQA: bytes/token = 2 (K and V) * num_layers * num_kv_heads * head_dim * dtype bytes
//   MLA (DeepSeek-V2/V3, Kimi-K2): one latent per token and layer, no separate K and V:
//                bytes/token = num_layers * (kv_lora_rank + qk_rope_head_dim) * dtype bytes
// `num_layers` counts the layers whose cache grows with context: for alternating sliding-window
// models (gpt-oss) pass the full-attention layers only; the bounded window state is not blocks.
#ifndef KVTIER_KV_GEOMETRY_H_
#define KVTIER_KV_GEOMETRY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvtier {

// Element type of the stored KV cache (not of the weights).
enum class KvDtype : uint8_t {
  kBf16 = 0,
  kFp16 = 1,
  kFp8E4m3 = 2,  // OCP FP8 E4M3 (vLLM "fp8_e4m3")
  kFp8E5m2 = 3,  // OCP FP8 E5M2 (vLLM "fp8_e5m2")
};

// Lower-case name, e.g. "bf16", "fp8_e4m3"; "unknown" for an out-of-range value.
std::string_view KvDtypeName(KvDtype dtype);
// Bytes per element: 2 for bf16/fp16, 1 for the fp8 formats, 0 for an out-of-range value.
int KvDtypeBytes(KvDtype dtype);
// Parses "bf16", "fp16", "fp8_e4m3" or "fp8_e5m2" (also "bfloat16", "float16", "fp8" = e4m3).
// Errors: kInvalidArgument naming the text for anything else.
absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name);

// How attention stores its cache per token and layer.
enum class AttentionKind : uint8_t {
  kMha = 0,  // K and V per KV head: MHA, GQA and MQA
  kMla = 1,  // multi-head latent attention: one compressed latent (+ rope part) per token
};

struct KvGeometryOptions {
  AttentionKind attention = AttentionKind::kMha;
  int num_layers = 0;        // layers whose cache grows with context, >= 1
  int num_kv_heads = 0;      // kMha only, >= 1; 0 for kMla
  int head_dim = 0;          // kMha only, elements per head, >= 1; 0 for kMla
  int kv_lora_rank = 0;      // kMla only, latent width in elements, >= 1; 0 for kMha
  int qk_rope_head_dim = 0;  // kMla only, decoupled rope width in elements, >= 0; 0 for kMha
  KvDtype dtype = KvDtype::kBf16;
  int tokens_per_block = 16;  // tokens in one block, in [1, kMaxTokensPerBlock]
};

class KvGeometry {
 public:
  static constexpr int kMaxLayers = 4096;
  static constexpr int kMaxHeadsOrDim = 65536;
  static constexpr int kMaxTokensPerBlock = 65536;
  // One block must fit one registered I/O buffer (io_uring caps a registered iovec at 1 GiB).
  static constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;

  // Validates `options` and returns the geometry.
  // Errors: kInvalidArgument naming the first bad field and its value: a count below its minimum
  // or above its maximum, a field of the other attention kind set, an unknown dtype, or a block
  // larger than kMaxBlockBytes.
  static absl::StatusOr<KvGeometry> Create(const KvGeometryOptions& options);

  // The geometry one tensor-parallel rank stores when the model runs with `tp_size` ranks.
  // kMha: KV heads are sharded while tp_size <= num_kv_heads (num_kv_heads must divide evenly)
  // and replicated beyond (each rank then holds one head). kMla: the latent is replicated, so
  // the geometry is unchanged. Source: ../shared/models/README.md point 3 (vLLM's sharding).
  // Errors: kInvalidArgument if tp_size < 1, or if tp_size <= num_kv_heads does not divide it,
  // or if tp_size > num_kv_heads is not a multiple of it.
  absl::StatusOr<KvGeometry> ShardedForTensorParallel(int tp_size) const;

  const KvGeometryOptions& options() const { return options_; }
  AttentionKind attention() const { return options_.attention; }
  int num_layers() const { return options_.num_layers; }
  int num_kv_heads() const { return options_.num_kv_heads; }
  int head_dim() const { return options_.head_dim; }
  int kv_lora_rank() const { return options_.kv_lora_rank; }
  int qk_rope_head_dim() const { return options_.qk_rope_head_dim; }
  KvDtype dtype() const { return options_.dtype; }
  int tokens_per_block() const { return options_.tokens_per_block; }

  // Planes per layer: 2 (K, V) for kMha, 1 (the latent) for kMla.
  int kv_planes() const { return options_.attention == AttentionKind::kMla ? 1 : 2; }
  // Elements one token stores in one layer, all planes: 2*heads*head_dim, or rank + rope dim.
  int64_t elements_per_token_per_layer() const;
  // Bytes one token stores in one layer (all planes).
  int64_t bytes_per_token_per_layer() const;
  // Bytes one token stores over all layers.
  int64_t bytes_per_token() const;
  // Bytes of one block in one layer: tokens_per_block * bytes_per_token_per_layer().
  int64_t bytes_per_block_per_layer() const;
  // Bytes of one whole block (all layers, all planes): tokens_per_block * bytes_per_token().
  int64_t bytes_per_block() const;
  // Whole blocks needed for `num_tokens` tokens (rounds up); 0 for num_tokens <= 0.
  int64_t BlocksForTokens(int64_t num_tokens) const;

  // E.g. "mha layers=32 kv_heads=8 head_dim=128 dtype=bf16 tokens_per_block=16".
  std::string ToString() const;

  friend bool operator==(const KvGeometry& a, const KvGeometry& b);

 private:
  explicit KvGeometry(const KvGeometryOptions& options) : options_(options) {}
  KvGeometryOptions options_;
};

}  // namespace kvtier

#endif  // KVTIER_KV_GEOMETRY_H_
