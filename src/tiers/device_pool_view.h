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
  if (layout != HbmLayout::kLayerFirst && layout != HbmLayout::kBlockFirst) {
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

// `layer_base(l)` is slot 0's first byte of layer l (both layouts; see HbmLayout).
inline DevicePoolView MakeDevicePoolView(const KvGeometry& g, HbmLayout layout,
                                         absl::FunctionRef<void*(int)> layer_base,
                                         bool host_accessible) {
  DevicePoolView v;
  const int64_t plane_bytes = g.bytes_per_block_per_layer() / g.kv_planes();
  v.block_stride_bytes =
      layout == HbmLayout::kBlockFirst ? g.bytes_per_block() : g.bytes_per_block_per_layer();
  v.token_stride_bytes = g.bytes_per_token_per_layer() / g.kv_planes();
  v.head_stride_bytes =
      g.attention() == AttentionKind::kMha ? int64_t{g.head_dim()} * KvDtypeBytes(g.dtype()) : 0;
  v.host_accessible = host_accessible;
  for (int l = 0; l < g.num_layers(); ++l) {
    auto* base = static_cast<std::byte*>(layer_base(l));
    v.k_base.push_back(base);
    if (g.kv_planes() == 2) v.v_base.push_back(base + plane_bytes);
  }
  return v;
}

}  // namespace kvtier::internal

#endif  // KVTIER_TIERS_DEVICE_POOL_VIEW_H_
