// The CUDA runtime as host-only code below the CUDA tier sees it (the DRAM tier): whether a
// device answers, and page-locking host memory for DMA with cudaHostRegister. No CUDA types, so
// the tiers compile without the toolkit. Implemented in src/platform/ (cuda_device.cc, or
// cuda_device_stub.cc without CUDA), the layer below the tiers, so no tier calls up into src/cuda/.
//
// Thread-safety: every function is safe to call from any thread.
#ifndef KVTIER_PLATFORM_CUDA_HOST_H_
#define KVTIER_PLATFORM_CUDA_HOST_H_

#include <cstddef>

#include "absl/status/status.h"

namespace kvtier::internal {

// True when ProbeCudaDevices() succeeds: built with CUDA and at least one device answers.
bool CudaDeviceAnswers();

// Registers [data, data + bytes) with the CUDA runtime in pieces of at most kPinChunkBytes, so
// very large pools register. On error nothing stays registered.
// Errors: kUnimplemented without CUDA; kUnavailable with the CUDA error text.
inline constexpr size_t kPinChunkBytes = size_t{1} << 30;
absl::Status PinHostMemory(void* data, size_t bytes);
// Undoes PinHostMemory for the same range.
void UnpinHostMemory(void* data, size_t bytes);

}  // namespace kvtier::internal

#endif  // KVTIER_PLATFORM_CUDA_HOST_H_
