// The shape of an HBM pool (emulated or CUDA): whether a layout and capacity make one, and its
// DevicePoolView from its geometry and layout.
#ifndef KVTIER_TIERS_DEVICE_POOL_VIEW_H_
#define KVTIER_TIERS_DEVICE_POOL_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kvtier/device_block_table.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/kv_geometry.h"

namespace kvtier::internal {

// kInvalidArgument ("<tier_class>: unknown layout <n>", "<tier_class>: capacity_blocks = <n> is
// not usable") unless `layout` is a known HbmLayout and the pool of `capacity_blocks` blocks is
// non-empty with a byte size that fits in int64.
inline absl::Status CheckHbmPoolShape(absl::string_view tier_class, const KvGeometry& g,
                                      HbmLayout layout, int64_t capacity_blocks) {
  if (layout != HbmLayout::kLayerFirst && layout != HbmLayout::kBlockFirst &&
      layout != HbmLayout::kLayerKvSplit) {
    return absl::InvalidArgumentError(
        absl::StrCat(tier_class, ": unknown layout ", static_cast<int>(layout)));
  }
  if (capacity_blocks < 1 ||
      capacity_blocks > std::numeric_limits<int64_t>::max() / g.bytes_per_block()) {
    return absl::InvalidArgumentError(
        absl::StrCat(tier_class, ": capacity_blocks = ", capacity_blocks, " is not usable"));
  }
  return absl::OkStatus();
}

// One contiguous run of a block's bytes in an HBM pool and in the block-contiguous host buffer.
struct PoolPiece {
  int64_t pool_offset = 0;  // from the layer's base (LayerBase / MakeDevicePoolView's layer_base)
  int64_t host_offset = 0;  // from the start of the host buffer ([layer][kv_plane][token]...)
  int64_t bytes = 0;
};

// The pieces of layer `layer` of slot `slot` in a pool of `capacity_blocks` blocks: one for
// kLayerFirst and kBlockFirst, kv_planes (K then V) for kLayerKvSplit. Writes them to `out` and
// returns how many. The layer's base is: kLayerFirst and kLayerKvSplit, that layer's own tensor;
// kBlockFirst, the pool's base plus layer * bytes_per_block_per_layer().
inline int LayerPieces(const KvGeometry& g, HbmLayout layout, int64_t capacity_blocks,
                       int64_t slot, int layer, PoolPiece (&out)[2]) {
  const int64_t per_layer = g.bytes_per_block_per_layer();
  const int64_t host = layer * per_layer;
  switch (layout) {
    case HbmLayout::kBlockFirst:
      out[0] = {slot * g.bytes_per_block(), host, per_layer};
      return 1;
    case HbmLayout::kLayerKvSplit: {
      const int planes = g.kv_planes();
      const int64_t plane = per_layer / planes;
      for (int p = 0; p < planes; ++p) {
        out[p] = {p * capacity_blocks * plane + slot * plane, host + p * plane, plane};
      }
      return planes;
    }
    case HbmLayout::kLayerFirst:
      break;
  }
  out[0] = {slot * per_layer, host, per_layer};
  return 1;
}

// `layer_base(l)` is the base of layer l as LayerPieces has it (slot 0's first byte of layer l
// in every layout).
inline DevicePoolView MakeDevicePoolView(const KvGeometry& g, HbmLayout layout,
                                         int64_t capacity_blocks,
                                         absl::FunctionRef<void*(int)> layer_base,
                                         bool host_accessible) {
  DevicePoolView v;
  const int64_t plane_bytes = g.bytes_per_block_per_layer() / g.kv_planes();
  switch (layout) {
    case HbmLayout::kBlockFirst:
      v.block_stride_bytes = g.bytes_per_block();
      break;
    case HbmLayout::kLayerKvSplit:
      v.block_stride_bytes = plane_bytes;
      break;
    case HbmLayout::kLayerFirst:
      v.block_stride_bytes = g.bytes_per_block_per_layer();
      break;
  }
  // V of a slot: right after its K in a block (layer-first, block-first), or a whole K plane of
  // the layer further (kv-split).
  const int64_t v_offset =
      layout == HbmLayout::kLayerKvSplit ? capacity_blocks * plane_bytes : plane_bytes;
  v.token_stride_bytes = g.bytes_per_token_per_layer() / g.kv_planes();
  v.head_stride_bytes =
      g.attention() == AttentionKind::kMha ? int64_t{g.head_dim()} * KvDtypeBytes(g.dtype()) : 0;
  v.host_accessible = host_accessible;
  for (int l = 0; l < g.num_layers(); ++l) {
    auto* base = static_cast<std::byte*>(layer_base(l));
    v.k_base.push_back(base);
    // A pool without addresses (null bases: a metadata tier, a shape to compare) stays null:
    // an offset applied to a null pointer is undefined behaviour.
    if (g.kv_planes() == 2) v.v_base.push_back(base != nullptr ? base + v_offset : nullptr);
  }
  return v;
}

}  // namespace kvtier::internal

#endif  // KVTIER_TIERS_DEVICE_POOL_VIEW_H_
