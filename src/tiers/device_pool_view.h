// The DevicePoolView of an HBM pool (emulated or CUDA) from its geometry and layout.
#ifndef KVTIER_TIERS_DEVICE_POOL_VIEW_H_
#define KVTIER_TIERS_DEVICE_POOL_VIEW_H_

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "kvtier/device_block_table.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/kv_geometry.h"

namespace kvtier::internal {

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
