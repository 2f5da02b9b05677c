// CacheNamespace (cache_namespace.h): the typed fields behind a namespace digest.
#include "kvtier/cache_namespace.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/byte_writer.h"
#include "internal/hex.h"
#include "internal/sha256.h"
#include "internal/status_macros.h"
#include "internal/strings.h"

namespace kvtier {
namespace {

// Field tags of the namespace digest (docs/formats.md, "Namespace digest"). Never reuse a tag.
enum NamespaceTag : uint8_t {
  kTagSchemaVersion = 0x01,
  kTagModelId = 0x02,
  kTagWeightsFingerprint = 0x03,
  kTagGeometry = 0x04,
  kTagHbmLayout = 0x05,
  kTagTensorParallel = 0x06,
  kTagPipelineParallel = 0x07,  // schema 2
  kTagFirstLayer = 0x08,        // schema 2
};

constexpr std::string_view kDomain = "kvtier-namespace";

absl::Status CheckString(std::string_view field, const std::string& value) {
  if (value.empty() || value.size() > CacheNamespace::kMaxStringBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CacheNamespace: ", internal::ToAbsl(field), " has ", value.size(),
        " bytes; it must have 1 to ", CacheNamespace::kMaxStringBytes));
  }
  return absl::OkStatus();
}

std::vector<uint8_t> EncodeFields(const KvGeometry& g, const CacheNamespaceOptions& o) {
  std::vector<uint8_t> buf;
  internal::ByteWriter w(&buf);
  w.Bytes(kDomain.data(), kDomain.size());
  w.U8(kTagSchemaVersion);
  w.U32(4);
  w.U32(kKeySchemaVersion);
  w.Field(kTagModelId, o.model_id);
  w.Field(kTagWeightsFingerprint, o.weights_fingerprint);
  w.U8(kTagGeometry);
  w.U32(26);
  w.U8(static_cast<uint8_t>(g.attention()));
  w.U32(static_cast<uint32_t>(g.num_layers()));
  w.U32(static_cast<uint32_t>(g.num_kv_heads()));
  w.U32(static_cast<uint32_t>(g.head_dim()));
  w.U32(static_cast<uint32_t>(g.kv_lora_rank()));
  w.U32(static_cast<uint32_t>(g.qk_rope_head_dim()));
  w.U8(static_cast<uint8_t>(g.dtype()));
  w.U32(static_cast<uint32_t>(g.tokens_per_block()));
  w.U8(kTagHbmLayout);
  w.U32(1);
  w.U8(static_cast<uint8_t>(o.hbm_layout));
  w.U8(kTagTensorParallel);
  w.U32(8);
  w.U32(static_cast<uint32_t>(o.tp_rank));
  w.U32(static_cast<uint32_t>(o.tp_size));
  w.U8(kTagPipelineParallel);
  w.U32(8);
  w.U32(static_cast<uint32_t>(o.pp_rank));
  w.U32(static_cast<uint32_t>(o.pp_size));
  w.U8(kTagFirstLayer);
  w.U32(4);
  w.U32(static_cast<uint32_t>(o.first_layer));
  return buf;
}

}  // namespace

absl::StatusOr<CacheNamespace> CacheNamespace::Create(const KvGeometry& geometry,
                                                      const CacheNamespaceOptions& options) {
  KVTIER_RETURN_IF_ERROR(CheckString("model_id", options.model_id));
  KVTIER_RETURN_IF_ERROR(CheckString("weights_fingerprint", options.weights_fingerprint));
  if (options.tp_size < 1 || options.tp_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("CacheNamespace: tp_size = ", options.tp_size, " is outside [1, 65536]"));
  }
  if (options.tp_rank < 0 || options.tp_rank >= options.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("CacheNamespace: tp_rank = ", options.tp_rank,
                                                   " is outside [0, tp_size = ", options.tp_size,
                                                   ")"));
  }
  if (options.pp_size < 1 || options.pp_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("CacheNamespace: pp_size = ", options.pp_size, " is outside [1, 65536]"));
  }
  if (options.pp_rank < 0 || options.pp_rank >= options.pp_size) {
    return absl::InvalidArgumentError(absl::StrCat("CacheNamespace: pp_rank = ", options.pp_rank,
                                                   " is outside [0, pp_size = ", options.pp_size,
                                                   ")"));
  }
  if (options.first_layer < 0 ||
      int64_t{options.first_layer} + geometry.num_layers() > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CacheNamespace: first_layer = ", options.first_layer, " with ",
                     geometry.num_layers(), " layers is outside [0, INT32_MAX - num_layers]"));
  }
  if (options.hbm_layout != HbmLayout::kLayerFirst && options.hbm_layout != HbmLayout::kBlockFirst &&
      options.hbm_layout != HbmLayout::kLayerKvSplit) {
    return absl::InvalidArgumentError(absl::StrCat("CacheNamespace: unknown hbm_layout ",
                                                   static_cast<int>(options.hbm_layout)));
  }
  const std::vector<uint8_t> fields = EncodeFields(geometry, options);
  KVTIER_ASSIGN_OR_RETURN(internal::Sha256 sha, internal::Sha256::Create());
  KVTIER_ASSIGN_OR_RETURN(const internal::Sha256Digest full, sha.Hash(fields.data(), fields.size()));
  std::array<uint8_t, 16> digest;
  std::copy_n(full.begin(), digest.size(), digest.begin());
  return CacheNamespace(geometry, options, digest);
}

std::string CacheNamespace::DigestHex() const {
  return internal::HexEncode(digest_.data(), digest_.size());
}

}  // namespace kvtier
