// DeviceFence: a point in an HBM tier's copy stream that a compute stream can be made to wait
// for on the device, without the host waiting (a CUDA event recorded after a copy, which a
// kernel's stream waits on with cudaStreamWaitEvent; LMCache's and vLLM's layer-wise
// connectors hand their compute stream such events). Only device tiers whose copies run on a
// GPU stream make fences (CudaHbm); the emulated HBM has none, and callers wait on the host
// (Completion) instead.
//
// Thread-safety: EnqueueWait is thread-safe. Ownership: shared (std::shared_ptr); the fence keeps
// its event alive, and a fence may outlive the tier that made it only if it is never used then.
#ifndef KVTIER_DEVICE_FENCE_H_
#define KVTIER_DEVICE_FENCE_H_

#include "absl/status/status.h"

namespace kvtier {

class DeviceFence {
 public:
  virtual ~DeviceFence() = default;

  // Makes `stream` (a cudaStream_t; nullptr is the legacy default stream) wait on the device
  // until the fence is reached. Returns at once. Errors: kUnavailable with the CUDA error text
  // when the runtime refuses (e.g. a stream of another device).
  virtual absl::Status EnqueueWait(void* stream) const = 0;
};

}  // namespace kvtier

#endif  // KVTIER_DEVICE_FENCE_H_
