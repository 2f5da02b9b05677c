// The device code of kvtier. Kept free of abseil so nvcc compiles only CUDA and the standard
// library; cuda_device.cc turns its cudaError_t results into absl::Status.
#include <cuda_runtime.h>

#include <cstdint>

#include "platform/fill_pattern.h"

namespace kvtier::cuda_internal {
namespace {

__global__ void FillPatternKernel(unsigned char* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = PatternByte(i);
  }
}

}  // namespace

cudaError_t LaunchFillPattern(unsigned char* device_bytes, int64_t n) {
  FillPatternKernel<<<256, 256>>>(device_bytes, n);
  return cudaGetLastError();
}

}  // namespace kvtier::cuda_internal
