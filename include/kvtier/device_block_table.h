// What an attention kernel is handed to read a sequence's KV from the HBM tier: the pool's
// addresses (DevicePoolView) and one sequence's device block table (DeviceBlockTable), the plain
// int32 array of HBM slot indices PagedAttention kernels read (Kwon et al., SOSP 2023; vLLM's
// block_tables tensor, FlashInfer's kv_indices).
//
// Address of element (token t of logical block i, KV head h, dimension d) of layer l:
//   K: k_base[l] + slots[i] * block_stride_bytes + t * token_stride_bytes
//        + h * head_stride_bytes + d * dtype bytes
//   V: the same from v_base[l] (MHA only; for MLA the latent is read from k_base and v_base is
//      empty).
// The strides are the same for every layer. For the layer-first layout block_stride_bytes is one
// block of one layer; for block-first it is a whole block (all layers); for kv-split (vLLM
// FlashAttention) it is one plane (K or V) of one block of one layer, and v_base[l] is the layer's
// whole K plane (num_blocks blocks) past k_base[l]. KvAddress below (host)
// and kvtier/kv_address.h (host and device) compute these addresses; code should not spell the
// stride walk out by hand.
//
// Thread-safety: plain values. Ownership: the pointers belong to the HBM tier and stay valid
// while it lives; a slot's bytes are valid while the ticket that returned the table is held.
#ifndef KVTIER_DEVICE_BLOCK_TABLE_H_
#define KVTIER_DEVICE_BLOCK_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvtier/kv_address.h"

namespace kvtier {

struct DevicePoolView {
  std::vector<void*> k_base;       // per layer: K (or the MLA latent) of slot 0, token 0
  std::vector<void*> v_base;       // per layer: V of slot 0, token 0; empty for MLA
  int64_t block_stride_bytes = 0;  // from slot s to slot s + 1 within one layer
  int64_t token_stride_bytes = 0;  // from token t to t + 1 within a block
  int64_t head_stride_bytes = 0;   // from KV head h to h + 1 (head_dim elements); 0 for MLA
  // True when the CPU may dereference the pointers (the emulated HBM); false for CUDA memory.
  bool host_accessible = false;

  KvStrides strides() const { return {block_stride_bytes, token_stride_bytes, head_stride_bytes}; }
  // The view as a kernel takes it (kv_address.h), pointing into k_base and v_base: valid while
  // this view lives and is not changed; host memory, so a kernel needs the arrays copied first.
  KvPoolRef ref() const {
    return {k_base.data(), v_base.empty() ? nullptr : v_base.data(), strides()};
  }
};

struct DeviceBlockTable {
  // HBM slot index of each logical block of the ticket's range, in order; -1 for a block that is
  // not resident (the caller recomputes it; the kernel must not read it).
  std::vector<int32_t> slots;
  int32_t first_block = 0;  // logical index of slots[0] in the sequence
  int32_t tokens_per_block = 0;
  int32_t tokens_in_last_block = 0;  // tokens of the sequence in the range's last block, in [0, B]
  DevicePoolView pool;
};

// Host side: the first byte of head `head` of token `token` of slot `slot`'s K or V (MLA: kK, the
// latent) in layer `layer`, in bytes as the header comment says. Unchecked: the preconditions of
// kv_address.h, and layer in [0, k_base.size()).
inline std::byte* KvAddress(const DevicePoolView& pool, int64_t slot, int layer, KvPlane plane,
                            int64_t token = 0, int64_t head = 0) {
  const std::vector<void*>& bases = plane == KvPlane::kK ? pool.k_base : pool.v_base;
  return KvAddress(bases[static_cast<size_t>(layer)], pool.strides(), slot, token, head);
}

// Host side, checked: the first byte of head `head` of sequence position `position`'s K or V in
// layer `layer`, through the table's slot for that position's block; nullptr if the position is
// negative or its block is outside the table or not resident (slot -1), tokens_per_block < 1,
// the layer is outside [0, k_base.size()), the plane is kV with no V (MLA, or a pool without
// addresses), or the head is outside [0, token_stride_bytes / head_stride_bytes) ([0, 1) for
// MLA; a token's heads are packed in every kvtier pool). Does not dereference anything.
inline std::byte* CheckedKvAddress(const DeviceBlockTable& table, int64_t position, int layer,
                                   KvPlane plane, int64_t head = 0) {
  const DevicePoolView& pool = table.pool;
  if (position < 0 || table.tokens_per_block < 1) return nullptr;
  const int64_t i = position / table.tokens_per_block - table.first_block;
  if (i < 0 || i >= static_cast<int64_t>(table.slots.size())) return nullptr;
  const int32_t slot = table.slots[static_cast<size_t>(i)];
  const std::vector<void*>& bases = plane == KvPlane::kK ? pool.k_base : pool.v_base;
  if (slot < 0 || layer < 0 || static_cast<size_t>(layer) >= bases.size()) return nullptr;
  const int64_t heads =
      pool.head_stride_bytes == 0 ? 1 : pool.token_stride_bytes / pool.head_stride_bytes;
  if (head < 0 || head >= heads) return nullptr;
  return KvAddress(pool, slot, layer, plane, position % table.tokens_per_block, head);
}

}  // namespace kvtier

#endif  // KVTIER_DEVICE_BLOCK_TABLE_H_
