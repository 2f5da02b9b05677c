// Device-side helpers shared by the kernel (fill_pattern.cu) and its host check.
#ifndef KVTIER_PLATFORM_FILL_PATTERN_H_
#define KVTIER_PLATFORM_FILL_PATTERN_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace kvtier::cuda_internal {

// The byte the self-test kernel writes at offset i.
__host__ __device__ inline unsigned char PatternByte(int64_t i) {
  return static_cast<unsigned char>((i * 131) ^ (i >> 8));
}

// Launches a kernel writing PatternByte(i) into device_bytes[0, n) on the default stream.
cudaError_t LaunchFillPattern(unsigned char* device_bytes, int64_t n);

}  // namespace kvtier::cuda_internal

#endif  // KVTIER_PLATFORM_FILL_PATTERN_H_
