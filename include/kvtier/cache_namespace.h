// CacheNamespace: everything besides tokens that decides what KV bytes a block holds, and its
// 128-bit digest. Two processes with equal namespaces compute equal block keys for equal tokens;
// any difference (model, weights, KV dtype, geometry, HBM layout, tensor-parallel rank or size,
// pipeline-parallel stage or the layers it holds, key schema version) gives unrelated keys, so
// caches of different models, or of different slices of one model, never meet.
// DESIGN section 4. The digest's byte layout is in docs/formats.md.
//
// Thread-safety: immutable after creation; safe to share and read from any thread.
#ifndef KVTIER_CACHE_NAMESPACE_H_
#define KVTIER_CACHE_NAMESPACE_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/kv_geometry.h"

namespace kvtier {

// Version of the block key and namespace digest byte layout. Bumping it is the only legitimate
// way to change any key; the golden-vector tests pin every byte of schema 2. Schema 2 added the
// pipeline-parallel stage and first layer (docs/formats.md); no schema-1 key equals a schema-2
// key, so blocks stored under schema 1 are never matched.
inline constexpr uint32_t kKeySchemaVersion = 2;

struct CacheNamespaceOptions {
  // Model identity, e.g. "meta-llama/Llama-3.1-8B-Instruct". Non-empty, at most 1024 bytes.
  std::string model_id;
  // Identity of the exact weights, e.g. a checkpoint commit or a hash of the weight files.
  // Non-empty, at most 1024 bytes: equal model ids with other weights must not share KV.
  std::string weights_fingerprint;
  HbmLayout hbm_layout = HbmLayout::kLayerFirst;
  int tp_rank = 0;  // in [0, tp_size)
  int tp_size = 1;  // >= 1, at most 65536
  // Pipeline-parallel stage of this process: in [0, pp_size). Two stages of one model can have
  // equal per-rank geometry (same layer count, heads, dtype) yet hold other layers' KV, so the
  // stage is part of the namespace. Default 0.
  int pp_rank = 0;
  // Number of pipeline-parallel stages: >= 1, at most 65536. Default 1 (no pipeline parallelism).
  int pp_size = 1;
  // Index, in the whole model, of the first layer this rank holds (a layer index, not a count);
  // the rank holds layers [first_layer, first_layer + geometry.num_layers()). >= 0, and the end
  // of that range must fit in int32. Default 0: the rank holds layers from the first one.
  int first_layer = 0;
};

class CacheNamespace {
 public:
  static constexpr size_t kMaxStringBytes = 1024;

  // `geometry` is the per-rank geometry this process stores (see KvGeometry::
  // ShardedForTensorParallel). Errors: kInvalidArgument naming the field for an empty or too long
  // model_id or weights_fingerprint, tp_size < 1 or > 65536, tp_rank outside [0, tp_size),
  // pp_size < 1 or > 65536, pp_rank outside [0, pp_size), first_layer < 0 or first_layer +
  // geometry.num_layers() above INT32_MAX, or an unknown hbm_layout.
  static absl::StatusOr<CacheNamespace> Create(const KvGeometry& geometry,
                                               const CacheNamespaceOptions& options);

  const KvGeometry& geometry() const { return geometry_; }
  const CacheNamespaceOptions& options() const { return options_; }
  // SHA-256 (truncated to 16 bytes) of the typed, length-prefixed fields; docs/formats.md.
  const std::array<uint8_t, 16>& digest() const { return digest_; }
  // 32 lower-case hex digits of digest().
  std::string DigestHex() const;

 private:
  CacheNamespace(const KvGeometry& geometry, const CacheNamespaceOptions& options,
                 const std::array<uint8_t, 16>& digest)
      : geometry_(geometry), options_(options), digest_(digest) {}

  KvGeometry geometry_;
  CacheNamespaceOptions options_;
  std::array<uint8_t, 16> digest_;
};

}  // namespace kvtier

#endif  // KVTIER_CACHE_NAMESPACE_H_
