// cuda_hbm.h for a build without the CUDA toolkit: the tier cannot be created.
#include <cstdlib>

#include "absl/status/status.h"
#include "kvtier/cuda_hbm.h"

namespace kvtier {

struct CudaHbm::Impl {
  TierInfo info;
};

absl::StatusOr<std::unique_ptr<CudaHbm>> CudaHbm::Create(const KvGeometry& /*geometry*/,
                                                         const CudaHbmOptions& /*options*/) {
  return absl::UnimplementedError(
      "CudaHbm: kvtier was built without CUDA (KVTIER_CUDA=OFF, or AUTO with no nvcc found)");
}

CudaHbm::CudaHbm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaHbm::~CudaHbm() = default;

// Unreachable: no CudaHbm object can exist without CUDA.
const TierInfo& CudaHbm::info() const { return impl_->info; }
BlockAllocator& CudaHbm::allocator() { std::abort(); }
Completion CudaHbm::WriteBlock(SlotId, const BlockKey&, absl::Span<const std::byte>,
                               const BlockIoOptions&) {
  return Completion::Done(absl::UnimplementedError("CudaHbm: built without CUDA"));
}
Completion CudaHbm::ReadBlock(SlotId, const BlockKey&, absl::Span<std::byte>,
                              const BlockIoOptions&) {
  return Completion::Done(absl::UnimplementedError("CudaHbm: built without CUDA"));
}
HbmLayout CudaHbm::layout() const { return HbmLayout::kLayerFirst; }
void* CudaHbm::LayerBase(int) const { return nullptr; }
bool CudaHbm::batched_copies() const { return false; }
void CudaHbm::BeginDeviceWrite(SlotId) {}
void CudaHbm::EndDeviceWrite(SlotId, const BlockKey&) {}
std::optional<DevicePoolView> CudaHbm::device_pool() const { return std::nullopt; }

}  // namespace kvtier
