// Page-locking host memory for DMA with cudaHostRegister, behind a header with no CUDA types so
// host-only code (the DRAM tier) can use it. Implemented in src/cuda/ (or a stub without CUDA).
#ifndef KVTIER_INTERNAL_CUDA_HOST_H_
#define KVTIER_INTERNAL_CUDA_HOST_H_

#include <cstddef>

#include "absl/status/status.h"

namespace kvtier::internal {

// Registers [data, data + bytes) with the CUDA runtime in pieces of at most kPinChunkBytes, so
// very large pools register. On error nothing stays registered.
// Errors: kUnimplemented without CUDA; kUnavailable with the CUDA error text.
inline constexpr size_t kPinChunkBytes = size_t{1} << 30;
absl::Status PinHostMemory(void* data, size_t bytes);
// Undoes PinHostMemory for the same range.
void UnpinHostMemory(void* data, size_t bytes);

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_CUDA_HOST_H_
