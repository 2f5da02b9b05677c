// Where a block's K or V sits in an HBM pool: the byte offset and address of (slot, token, KV
// head) from one layer's plane base, computed from the pool's three byte strides. Usable from host
// and device code: under nvcc (__CUDACC__) the functions are __host__ __device__. Includes only
// <cstddef> and <cstdint> (no abseil, no containers), so a .cu file may include it alone.
//
// Units: every stride and offset is in bytes; slots, tokens and heads are indices. One formula
// serves both HbmLayouts, because the layout is already folded into the base pointers and
// block_stride_bytes (kvtier/device_block_table.h):
//   offset(slot, token, head) = slot * block_stride_bytes + token * token_stride_bytes
//                               + head * head_stride_bytes
//   address = base[layer] + offset, with base = k_base (K, or MLA's latent) or v_base (V)
// and element d of the head at address + d * dtype bytes. For kLayerFirst, base[layer] is slot
// 0 of that layer's tensor and block_stride_bytes is one block of one layer; for kBlockFirst,
// base[layer] is slot 0 plus the layer's offset inside a block and block_stride_bytes is a whole
// block (all layers).
//
// Preconditions (not checked: device code has no room for checks): slot is a valid HBM slot of
// the pool (not -1), token in [0, tokens_per_block), head in [0, num_kv_heads) (0 for MLA), the
// plane exists (no V for MLA). kvtier/device_block_table.h has a checked host-side variant.
//
// Model: FlashInfer include/flashinfer/page.cuh, paged_kv_t::get_k_ptr / get_v_ptr (a page's
// base plus page, head and entry strides). kvtier's strides are bytes, not elements, and the
// layer is chosen by the base pointer rather than carried in the struct.
//
// Thread-safety: pure functions of their arguments.
#ifndef KVTIER_KV_ADDRESS_H_
#define KVTIER_KV_ADDRESS_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define KVTIER_HOST_DEVICE __host__ __device__
#else
#define KVTIER_HOST_DEVICE
#endif

namespace kvtier {

// Which plane of a layer: K (for MLA, the latent; the only plane) or V (MHA only).
enum class KvPlane : uint8_t {
  kK = 0,
  kV = 1,
};

// The three byte strides of a pool, the same for every layer (DevicePoolView::strides()).
struct KvStrides {
  int64_t block_stride_bytes = 0;  // from slot s to slot s + 1 within one layer
  int64_t token_stride_bytes = 0;  // from token t to t + 1 within a block
  int64_t head_stride_bytes = 0;   // from KV head h to h + 1; 0 for MLA
};

// Bytes from a layer's plane base (slot 0, token 0, head 0) to head `head` of token `token` of
// slot `slot`.
KVTIER_HOST_DEVICE constexpr int64_t KvOffsetBytes(const KvStrides& strides, int64_t slot,
                                                   int64_t token = 0, int64_t head = 0) {
  return slot * strides.block_stride_bytes + token * strides.token_stride_bytes +
         head * strides.head_stride_bytes;
}

// The first byte of head `head` of token `token` of slot `slot`, from a layer's plane base
// (DevicePoolView::k_base[l] or v_base[l]).
KVTIER_HOST_DEVICE inline std::byte* KvAddress(void* plane_base, const KvStrides& strides,
                                               int64_t slot, int64_t token = 0, int64_t head = 0) {
  return static_cast<std::byte*>(plane_base) + KvOffsetBytes(strides, slot, token, head);
}
KVTIER_HOST_DEVICE inline const std::byte* KvAddress(const void* plane_base,
                                                     const KvStrides& strides, int64_t slot,
                                                     int64_t token = 0, int64_t head = 0) {
  return static_cast<const std::byte*>(plane_base) + KvOffsetBytes(strides, slot, token, head);
}

// What a kernel is handed for a whole pool (FlashInfer's paged_kv_t keeps k_data, v_data and
// strides the same way): per-layer plane bases and the strides. k_base and v_base point to
// num_layers pointers each, in memory the caller may read (device memory for a kernel); v_base
// is nullptr for MLA. The struct does not own them.
struct KvPoolRef {
  void* const* k_base = nullptr;
  void* const* v_base = nullptr;
  KvStrides strides;
};

// The first byte of head `head` of token `token` of slot `slot`'s K or V in layer `layer`.
// Preconditions as above, and layer in [0, num_layers).
KVTIER_HOST_DEVICE inline std::byte* KvAddress(const KvPoolRef& pool, int64_t slot, int layer,
                                               KvPlane plane, int64_t token = 0, int64_t head = 0) {
  void* const* bases = plane == KvPlane::kK ? pool.k_base : pool.v_base;
  return KvAddress(bases[layer], pool.strides, slot, token, head);
}

}  // namespace kvtier

#endif  // KVTIER_KV_ADDRESS_H_
