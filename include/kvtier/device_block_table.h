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
// block of one layer; for block-first it is a whole block (all layers).
//
// Thread-safety: plain values. Ownership: the pointers belong to the HBM tier and stay valid
// while it lives; a slot's bytes are valid while the ticket that returned the table is held.
#ifndef KVTIER_DEVICE_BLOCK_TABLE_H_
#define KVTIER_DEVICE_BLOCK_TABLE_H_

#include <cstdint>
#include <vector>

namespace kvtier {

struct DevicePoolView {
  std::vector<void*> k_base;       // per layer: K (or the MLA latent) of slot 0, token 0
  std::vector<void*> v_base;       // per layer: V of slot 0, token 0; empty for MLA
  int64_t block_stride_bytes = 0;  // from slot s to slot s + 1 within one layer
  int64_t token_stride_bytes = 0;  // from token t to t + 1 within a block
  int64_t head_stride_bytes = 0;   // from KV head h to h + 1 (head_dim elements); 0 for MLA
  // True when the CPU may dereference the pointers (the emulated HBM); false for CUDA memory.
  bool host_accessible = false;
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

}  // namespace kvtier

#endif  // KVTIER_DEVICE_BLOCK_TABLE_H_
