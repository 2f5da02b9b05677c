// cuda_device.h and platform/cuda_host.h with the CUDA runtime. cudaError_t becomes absl::Status
// right here, where it enters kvtier (STYLE rule 4).
#include <cuda_runtime.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/cuda_device.h"
#include "platform/cuda_host.h"
#include "platform/fill_pattern.h"

namespace kvtier {
namespace {

absl::Status FromCuda(cudaError_t err, const char* what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorName(err), ": ",
                                             cudaGetErrorString(err)));
}

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<CudaDeviceInfo> ProbeCudaDevices() {
  CudaDeviceInfo info;
  // Without a driver cudaGetDeviceCount returns cudaErrorInsufficientDriver (not NoDevice) and
  // leaves the count untouched: every error means "no GPU here".
  if (cudaError_t err = cudaGetDeviceCount(&info.device_count); err != cudaSuccess) {
    return FromCuda(err, "cudaGetDeviceCount");
  }
  if (info.device_count < 1) {
    return absl::UnavailableError("cudaGetDeviceCount: no CUDA device");
  }
  cudaRuntimeGetVersion(&info.runtime_version);
  cudaDriverGetVersion(&info.driver_version);
  cudaDeviceProp prop;
  if (cudaError_t err = cudaGetDeviceProperties(&prop, 0); err != cudaSuccess) {
    return FromCuda(err, "cudaGetDeviceProperties");
  }
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  return info;
}

absl::Status RunCudaSelfTest(int64_t num_bytes) {
  if (num_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_bytes = ", num_bytes, " must be >= 1"));
  }
  if (absl::StatusOr<CudaDeviceInfo> probe = ProbeCudaDevices(); !probe.ok()) {
    return probe.status();
  }
  unsigned char* device = nullptr;
  if (cudaError_t err = cudaMalloc(&device, static_cast<size_t>(num_bytes)); err != cudaSuccess) {
    return FromCuda(err, "cudaMalloc");
  }
  std::vector<unsigned char> host(static_cast<size_t>(num_bytes));
  cudaError_t err = cuda_internal::LaunchFillPattern(device, num_bytes);
  if (err == cudaSuccess) {
    err = cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost);
  }
  cudaFree(device);
  if (err != cudaSuccess) return FromCuda(err, "FillPattern/cudaMemcpy");
  for (int64_t i = 0; i < num_bytes; ++i) {
    const unsigned char want = cuda_internal::PatternByte(i);
    if (host[static_cast<size_t>(i)] != want) {
      return absl::InternalError(absl::StrCat("byte ", i, " is ", int{host[static_cast<size_t>(i)]},
                                              ", expected ", int{want}));
    }
  }
  return absl::OkStatus();
}

namespace internal {

bool CudaDeviceAnswers() { return ProbeCudaDevices().ok(); }

absl::Status PinHostMemory(void* data, size_t bytes) {
  auto* base = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += kPinChunkBytes) {
    const size_t n = bytes - done < kPinChunkBytes ? bytes - done : kPinChunkBytes;
    if (cudaError_t err = cudaHostRegister(base + done, n, cudaHostRegisterDefault);
        err != cudaSuccess) {
      UnpinHostMemory(data, done);
      return FromCuda(err, "cudaHostRegister");
    }
  }
  return absl::OkStatus();
}

void UnpinHostMemory(void* data, size_t bytes) {
  auto* base = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += kPinChunkBytes) cudaHostUnregister(base + done);
}

}  // namespace internal
}  // namespace kvtier
