// HbmLayout: how a tier of device memory arranges blocks. Plain enum with no dependencies, usable
// from host and device code (STYLE rule 7; FlashInfer include/flashinfer/layout.cuh).
#ifndef KVTIER_HBM_LAYOUT_H_
#define KVTIER_HBM_LAYOUT_H_

#include <cstdint>

namespace kvtier {

enum class HbmLayout : uint8_t {
  // One tensor per layer, shape [num_blocks][kv_planes][tokens_per_block][num_kv_heads][head_dim]
  // (vLLM's and FlashInfer's paged layout). A block is num_layers strided pieces.
  kLayerFirst = 0,
  // One contiguous run per block, layers outermost: [num_blocks][num_layers][kv_planes]
  // [tokens_per_block][num_kv_heads][head_dim]. A block moves in one copy.
  kBlockFirst = 1,
  // One tensor per layer with K and V apart, shape [kv_planes][num_blocks][tokens_per_block]
  // [num_kv_heads][head_dim] (vLLM's FlashAttention backend: kv_cache[layer] is
  // [2, num_blocks, block_size, num_kv_heads, head_size]). A block is num_layers x kv_planes
  // strided pieces. With one plane (MLA) it is kLayerFirst.
  kLayerKvSplit = 2,
};

// "layer_first", "block_first" or "layer_kv_split"; "unknown" otherwise.
constexpr const char* HbmLayoutName(HbmLayout layout) {
  switch (layout) {
    case HbmLayout::kLayerFirst:
      return "layer_first";
    case HbmLayout::kBlockFirst:
      return "block_first";
    case HbmLayout::kLayerKvSplit:
      return "layer_kv_split";
  }
  return "unknown";
}

}  // namespace kvtier

#endif  // KVTIER_HBM_LAYOUT_H_
