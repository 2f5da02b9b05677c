// cuda_device.h and platform/cuda_host.h for a build without the CUDA toolkit: every call says
// so, and no device ever answers.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/cuda_device.h"
#include "platform/cuda_host.h"

namespace kvtier {
namespace {

absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "kvtier was built without CUDA (KVTIER_CUDA=OFF, or AUTO with no nvcc found)");
}

}  // namespace

bool BuiltWithCuda() { return false; }

absl::StatusOr<CudaDeviceInfo> ProbeCudaDevices() { return NotBuilt(); }

absl::Status RunCudaSelfTest(int64_t num_bytes) {
  if (num_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_bytes = ", num_bytes, " must be >= 1"));
  }
  return NotBuilt();
}

namespace internal {

bool CudaDeviceAnswers() { return false; }

absl::Status PinHostMemory(void* /*data*/, size_t /*bytes*/) { return NotBuilt(); }
void UnpinHostMemory(void* /*data*/, size_t /*bytes*/) {}

}  // namespace internal
}  // namespace kvtier
