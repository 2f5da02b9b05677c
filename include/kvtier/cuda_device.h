// Whether a CUDA device answers, asked at run time. A build flag only decides whether the CUDA
// code exists (KVTIER_CUDA); whether a GPU is there is always this question, so one binary runs
// on a GPU machine and falls back to the host-emulated device tier elsewhere (STYLE rule 5).
//
// Thread-safety: safe to call from any thread.
#ifndef KVTIER_CUDA_DEVICE_H_
#define KVTIER_CUDA_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier {

struct CudaDeviceInfo {
  int device_count = 0;        // devices the runtime sees, >= 1
  int runtime_version = 0;     // e.g. 13000 for CUDA 13.0
  int driver_version = 0;      // e.g. 13000
  std::string name;            // device 0, e.g. "NVIDIA H200"
  int compute_major = 0;       // device 0 compute capability, e.g. 9
  int compute_minor = 0;
  int64_t total_memory_bytes = 0;  // device 0
};

// True when this library was built with its CUDA sources (nvcc was found).
bool BuiltWithCuda();

// Asks the CUDA runtime for devices.
// Errors: kUnimplemented when built without CUDA; kUnavailable when no device answers, with the
// CUDA error name and text (without a driver: "cudaErrorInsufficientDriver: CUDA driver version
// is insufficient for CUDA runtime version"). Any non-success is "no GPU here".
absl::StatusOr<CudaDeviceInfo> ProbeCudaDevices();

// Runs a kernel on device 0 that writes a pattern into `num_bytes` of device memory, copies it
// back and checks every byte: proof that the device executes kvtier's code (sm_90 build).
// Errors: as ProbeCudaDevices; kInvalidArgument if num_bytes < 1; kInternal naming the first
// wrong byte; kUnavailable with the CUDA error text if an allocation, launch or copy fails.
absl::Status RunCudaSelfTest(int64_t num_bytes);

}  // namespace kvtier

#endif  // KVTIER_CUDA_DEVICE_H_
