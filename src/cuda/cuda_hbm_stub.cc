// cuda_hbm.h for a build without the CUDA toolkit: the tier cannot be created.
#include <utility>

#include "absl/status/status.h"
#include "kvtier/cuda_hbm.h"

namespace kvtier {

struct CudaHbm::Impl {};

absl::StatusOr<std::unique_ptr<CudaHbm>> CudaHbm::Create(const KvGeometry& /*geometry*/,
                                                         const CudaHbmOptions& /*options*/) {
  return absl::UnimplementedError(
      "CudaHbm: kvtier was built without CUDA (KVTIER_CUDA=OFF, or AUTO with no nvcc found)");
}

CudaHbm::CudaHbm(TierInfo info, std::unique_ptr<BlockAllocator> allocator,
                 std::unique_ptr<Impl> impl)
    : InMemorySlotTier(std::move(info), std::move(allocator)), impl_(std::move(impl)) {}
CudaHbm::~CudaHbm() = default;

// Unreachable: no CudaHbm object can exist without CUDA.
Completion CudaHbm::WriteBlock(SlotId, const BlockKey&, absl::Span<const std::byte>,
                               const BlockIoOptions&) {
  return Completion::Done(absl::UnimplementedError("CudaHbm: built without CUDA"));
}
Completion CudaHbm::ReadBlock(SlotId, const BlockKey&, absl::Span<std::byte>,
                              const BlockIoOptions&) {
  return Completion::Done(absl::UnimplementedError("CudaHbm: built without CUDA"));
}
std::vector<Completion> CudaHbm::WriteBlocks(absl::Span<const BlockWrite> writes,
                                             const BlockIoOptions& options) {
  return TierBackend::WriteBlocks(writes, options);
}
HbmLayout CudaHbm::layout() const { return HbmLayout::kLayerFirst; }
void* CudaHbm::LayerBase(int) const { return nullptr; }
bool CudaHbm::batched_copies() const { return false; }
std::optional<DevicePoolView> CudaHbm::device_pool() const { return std::nullopt; }
absl::StatusOr<Completion> CudaHbm::CompletionOfDeviceEvent(void*) {
  return absl::UnimplementedError("CudaHbm: built without CUDA");
}

}  // namespace kvtier
