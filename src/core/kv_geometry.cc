// KvGeometry (kv_geometry.h): validation and the byte arithmetic of a KV shape.
#include "kvtier/kv_geometry.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "internal/strings.h"

namespace kvtier {
namespace {

using internal::ToAbsl;

absl::Status CheckRange(std::string_view field, int value, int min, int max) {
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("KvGeometry: ", ToAbsl(field), " = ",
                                                   value, " is outside [", min, ", ", max, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckUnset(std::string_view field, int value, std::string_view kind) {
  if (value != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvGeometry: ", ToAbsl(field), " = ", value,
        " must be 0 for attention kind ", ToAbsl(kind)));
  }
  return absl::OkStatus();
}

absl::Status Validate(const KvGeometryOptions& o) {
  absl::Status s;
  auto keep_first = [&s](absl::Status next) {
    if (s.ok()) s = std::move(next);
  };
  keep_first(CheckRange("num_layers", o.num_layers, 1, KvGeometry::kMaxLayers));
  switch (o.attention) {
    case AttentionKind::kMha:
      keep_first(CheckRange("num_kv_heads", o.num_kv_heads, 1, KvGeometry::kMaxHeadsOrDim));
      keep_first(CheckRange("head_dim", o.head_dim, 1, KvGeometry::kMaxHeadsOrDim));
      keep_first(CheckUnset("kv_lora_rank", o.kv_lora_rank, "mha"));
      keep_first(CheckUnset("qk_rope_head_dim", o.qk_rope_head_dim, "mha"));
      break;
    case AttentionKind::kMla:
      keep_first(CheckRange("kv_lora_rank", o.kv_lora_rank, 1, KvGeometry::kMaxHeadsOrDim));
      keep_first(CheckRange("qk_rope_head_dim", o.qk_rope_head_dim, 0, KvGeometry::kMaxHeadsOrDim));
      keep_first(CheckUnset("num_kv_heads", o.num_kv_heads, "mla"));
      keep_first(CheckUnset("head_dim", o.head_dim, "mla"));
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("KvGeometry: unknown attention kind ",
                                                     static_cast<int>(o.attention)));
  }
  if (KvDtypeBytes(o.dtype) == 0) {
    keep_first(absl::InvalidArgumentError(
        absl::StrCat("KvGeometry: unknown dtype ", static_cast<int>(o.dtype))));
  }
  keep_first(CheckRange("tokens_per_block", o.tokens_per_block, 1, KvGeometry::kMaxTokensPerBlock));
  return s;
}

}  // namespace

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kFp16:
      return "fp16";
    case KvDtype::kFp8E4m3:
      return "fp8_e4m3";
    case KvDtype::kFp8E5m2:
      return "fp8_e5m2";
  }
  return "unknown";
}

int KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kBf16:
    case KvDtype::kFp16:
      return 2;
    case KvDtype::kFp8E4m3:
    case KvDtype::kFp8E5m2:
      return 1;
  }
  return 0;
}

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(ToAbsl(name));
  if (lower == "bf16" || lower == "bfloat16") return KvDtype::kBf16;
  if (lower == "fp16" || lower == "float16" || lower == "half") return KvDtype::kFp16;
  if (lower == "fp8_e4m3" || lower == "fp8" || lower == "e4m3") return KvDtype::kFp8E4m3;
  if (lower == "fp8_e5m2" || lower == "e5m2") return KvDtype::kFp8E5m2;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown KV dtype \"", lower, "\" (expected bf16, fp16, fp8_e4m3 or fp8_e5m2)"));
}

absl::StatusOr<KvGeometry> KvGeometry::Create(const KvGeometryOptions& options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  KvGeometry geometry(options);
  // Each factor is bounded by Validate, so this product fits in int64 before the check.
  if (geometry.bytes_per_block() > kMaxBlockBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvGeometry: one block is ", geometry.bytes_per_block(), " bytes, over the ",
                     kMaxBlockBytes, "-byte limit (", geometry.ToString(), ")"));
  }
  return geometry;
}

absl::StatusOr<KvGeometry> KvGeometry::ShardedForTensorParallel(int tp_size) const {
  if (tp_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tp_size = ", tp_size, " must be >= 1"));
  }
  if (attention() == AttentionKind::kMla) return *this;
  KvGeometryOptions sharded = options_;
  const int heads = num_kv_heads();
  if (tp_size <= heads) {
    if (heads % tp_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tp_size = ", tp_size,
                                                     " does not divide num_kv_heads = ", heads));
    }
    sharded.num_kv_heads = heads / tp_size;
  } else {
    if (tp_size % heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tp_size = ", tp_size, " is not a multiple of num_kv_heads = ", heads));
    }
    sharded.num_kv_heads = 1;  // replicated: every rank holds one whole head
  }
  return Create(sharded);
}

int64_t KvGeometry::elements_per_token_per_layer() const {
  if (attention() == AttentionKind::kMla) {
    return int64_t{options_.kv_lora_rank} + options_.qk_rope_head_dim;
  }
  return int64_t{2} * options_.num_kv_heads * options_.head_dim;
}

int64_t KvGeometry::bytes_per_token_per_layer() const {
  return elements_per_token_per_layer() * KvDtypeBytes(options_.dtype);
}

int64_t KvGeometry::bytes_per_token() const {
  return bytes_per_token_per_layer() * options_.num_layers;
}

int64_t KvGeometry::bytes_per_block_per_layer() const {
  return bytes_per_token_per_layer() * options_.tokens_per_block;
}

int64_t KvGeometry::bytes_per_block() const {
  return bytes_per_token() * options_.tokens_per_block;
}

int64_t KvGeometry::BlocksForTokens(int64_t num_tokens) const {
  if (num_tokens <= 0) return 0;
  return (num_tokens + options_.tokens_per_block - 1) / options_.tokens_per_block;
}

std::string KvGeometry::ToString() const {
  const absl::string_view dtype_sv = ToAbsl(KvDtypeName(options_.dtype));
  if (attention() == AttentionKind::kMla) {
    return absl::StrCat("mla layers=", options_.num_layers, " kv_lora_rank=", options_.kv_lora_rank,
                        " qk_rope_head_dim=", options_.qk_rope_head_dim, " dtype=", dtype_sv,
                        " tokens_per_block=", options_.tokens_per_block);
  }
  return absl::StrCat("mha layers=", options_.num_layers, " kv_heads=", options_.num_kv_heads,
                      " head_dim=", options_.head_dim, " dtype=", dtype_sv,
                      " tokens_per_block=", options_.tokens_per_block);
}

bool operator==(const KvGeometry& a, const KvGeometry& b) {
  const KvGeometryOptions& x = a.options_;
  const KvGeometryOptions& y = b.options_;
  return x.attention == y.attention && x.num_layers == y.num_layers &&
         x.num_kv_heads == y.num_kv_heads && x.head_dim == y.head_dim &&
         x.kv_lora_rank == y.kv_lora_rank && x.qk_rope_head_dim == y.qk_rope_head_dim &&
         x.dtype == y.dtype && x.tokens_per_block == y.tokens_per_block;
}

}  // namespace kvtier
