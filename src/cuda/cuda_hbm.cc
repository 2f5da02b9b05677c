// CudaHbm with the CUDA runtime (host code; compiled by the C++ compiler against cudart).
#include "kvtier/cuda_hbm.h"

#include <cuda_runtime.h>

#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "internal/stream_worker.h"
#include "tiers/device_pool_view.h"
#include "tiers/slot_contents.h"

namespace kvtier {
namespace {

absl::Status FromCuda(cudaError_t err, const std::string& what) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace

struct CudaHbm::Impl {
  Impl(const KvGeometry& g, const CudaHbmOptions& o) : geometry(g), options(o) {}
  ~Impl() {
    if (h2d != nullptr) cudaStreamSynchronize(h2d);
    if (d2h != nullptr) cudaStreamSynchronize(d2h);
    // The completers wait on events of these streams: stop them before the streams go.
    h2d_completer.reset();
    d2h_completer.reset();
    if (h2d != nullptr) cudaStreamDestroy(h2d);
    if (d2h != nullptr) cudaStreamDestroy(d2h);
    if (owned_pool != nullptr) cudaFree(owned_pool);
  }

  // Device address of layer `l`'s piece of `slot`.
  char* Piece(SlotId slot, int l) const {
    const int64_t per_layer = geometry.bytes_per_block_per_layer();
    if (options.layout == HbmLayout::kBlockFirst) {
      return static_cast<char*>(layer_bases[0]) + slot.value() * geometry.bytes_per_block() +
             l * per_layer;
    }
    return static_cast<char*>(layer_bases[l]) + slot.value() * per_layer;
  }

  // Queues the copies of one block between `host` and `slot` on `stream`.
  cudaError_t Enqueue(SlotId slot, void* host, bool to_device, cudaStream_t stream) {
    const cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    if (options.layout == HbmLayout::kBlockFirst) {
      void* dev = Piece(slot, 0);
      return cudaMemcpyAsync(to_device ? dev : host, to_device ? host : dev,
                             static_cast<size_t>(geometry.bytes_per_block()), kind, stream);
    }
    const int layers = geometry.num_layers();
    const size_t per_layer = static_cast<size_t>(geometry.bytes_per_block_per_layer());
    std::vector<void*> dsts(layers), srcs(layers);
    std::vector<size_t> sizes(layers, per_layer);
    for (int l = 0; l < layers; ++l) {
      void* dev = Piece(slot, l);
      void* h = static_cast<char*>(host) + l * per_layer;
      dsts[l] = to_device ? dev : h;
      srcs[l] = to_device ? h : dev;
    }
#if CUDART_VERSION >= 13000
    if (batched.load()) {
      cudaMemcpyAttributes attr = {};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_index = 0;
      const cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                                   static_cast<size_t>(layers), &attr,
                                                   &attr_index, 1, stream);
      if (err == cudaSuccess) return err;
      cudaGetLastError();  // not supported here: clear it and use single copies from now on
      batched.store(false);
    }
#endif
    for (int l = 0; l < layers; ++l) {
      if (cudaError_t err = cudaMemcpyAsync(dsts[l], srcs[l], per_layer, kind, stream);
          err != cudaSuccess) {
        return err;
      }
    }
    return cudaSuccess;
  }

  // Records an event after the queued copies; `finish(status)` runs on `completer` once the
  // event is reached (or with the CUDA error that stopped it).
  void FinishAfter(cudaStream_t stream, internal::StreamWorker* completer,
                   std::function<void(absl::Status)> finish) {
    cudaSetDevice(options.device);  // the event must belong to the stream's device
    cudaEvent_t event = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventRecord(event, stream);
    if (err != cudaSuccess) {
      if (event != nullptr) cudaEventDestroy(event);
      // Without an event, wait for the whole stream (correct, just coarser).
      const int device = options.device;
      completer->Enqueue([stream, finish, device] {
        cudaSetDevice(device);
        const cudaError_t e = cudaStreamSynchronize(stream);
        finish(e == cudaSuccess ? absl::OkStatus() : FromCuda(e, "cudaStreamSynchronize"));
      });
      return;
    }
    const int device = options.device;
    completer->Enqueue([event, finish, device] {
      cudaSetDevice(device);  // runtime calls on this thread act on the tier's device
      const cudaError_t e = cudaEventSynchronize(event);
      cudaEventDestroy(event);
      finish(e == cudaSuccess ? absl::OkStatus() : FromCuda(e, "cudaEventSynchronize"));
    });
  }

  const KvGeometry geometry;
  const CudaHbmOptions options;
  std::vector<void*> layer_bases;
  void* owned_pool = nullptr;
  cudaStream_t h2d = nullptr;
  cudaStream_t d2h = nullptr;
  std::atomic<bool> batched{CUDART_VERSION >= 13000};
  std::unique_ptr<internal::StreamWorker> h2d_completer = std::make_unique<internal::StreamWorker>();
  std::unique_ptr<internal::StreamWorker> d2h_completer = std::make_unique<internal::StreamWorker>();
};

absl::StatusOr<std::unique_ptr<CudaHbm>> CudaHbm::Create(const KvGeometry& geometry,
                                                         const CudaHbmOptions& options) {
  KVTIER_RETURN_IF_ERROR(internal::CheckHbmPoolShape("CudaHbm", geometry, options.layout,
                                                     options.capacity_blocks));
  int devices = 0;
  if (cudaError_t err = cudaGetDeviceCount(&devices); err != cudaSuccess) {
    return FromCuda(err, "CudaHbm: cudaGetDeviceCount");
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("CudaHbm: device ", options.device,
                                                   " is outside [0, ", devices, ")"));
  }
  const size_t want_pointers = options.layout == HbmLayout::kLayerFirst
                                   ? static_cast<size_t>(geometry.num_layers())
                                   : size_t{1};
  if (!options.external_pool.empty() && options.external_pool.size() != want_pointers) {
    return absl::InvalidArgumentError(absl::StrCat("CudaHbm: external_pool has ",
                                                   options.external_pool.size(),
                                                   " pointers; the layout needs ", want_pointers));
  }
  if (cudaError_t err = cudaSetDevice(options.device); err != cudaSuccess) {
    return FromCuda(err, "CudaHbm: cudaSetDevice");
  }
  auto impl = std::make_unique<Impl>(geometry, options);
  TierInfo info =
      MakeInfo(Tier::kHbm, absl::StrCat("cuda_hbm(", HbmLayoutName(options.layout), ")"),
               options.capacity_blocks, geometry.bytes_per_block(), kCapDeviceMemory);
  if (options.external_pool.empty()) {
    if (cudaError_t err = cudaMalloc(&impl->owned_pool, static_cast<size_t>(info.capacity_bytes));
        err != cudaSuccess) {
      return FromCuda(err, absl::StrCat("CudaHbm: cudaMalloc of ", info.capacity_bytes, " bytes"));
    }
    const int64_t layer_pool = options.capacity_blocks * geometry.bytes_per_block_per_layer();
    for (size_t l = 0; l < want_pointers; ++l) {
      impl->layer_bases.push_back(static_cast<char*>(impl->owned_pool) + l * layer_pool);
    }
  } else {
    impl->layer_bases = options.external_pool;
  }
  if (cudaError_t err = cudaStreamCreateWithFlags(&impl->h2d, cudaStreamNonBlocking);
      err != cudaSuccess) {
    return FromCuda(err, "CudaHbm: cudaStreamCreate");
  }
  if (cudaError_t err = cudaStreamCreateWithFlags(&impl->d2h, cudaStreamNonBlocking);
      err != cudaSuccess) {
    return FromCuda(err, "CudaHbm: cudaStreamCreate");
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockAllocator> allocator,
                          BlockAllocator::Create(Tier::kHbm, options.capacity_blocks));
  return std::unique_ptr<CudaHbm>(
      new CudaHbm(std::move(info), std::move(allocator), std::move(impl)));
}

CudaHbm::CudaHbm(TierInfo info, std::unique_ptr<BlockAllocator> allocator,
                 std::unique_ptr<Impl> impl)
    : InMemorySlotTier(std::move(info), std::move(allocator)), impl_(std::move(impl)) {}
// impl_ goes first: its destructor drains the streams and the completers, whose callbacks still
// record into the slot record of the InMemorySlotTier base.
CudaHbm::~CudaHbm() = default;

HbmLayout CudaHbm::layout() const { return impl_->options.layout; }
bool CudaHbm::batched_copies() const { return impl_->batched.load(); }

void* CudaHbm::LayerBase(int layer) const {
  if (layer < 0 || layer >= impl_->geometry.num_layers()) return nullptr;
  return impl_->Piece(SlotId(0), layer);
}

std::optional<DevicePoolView> CudaHbm::device_pool() const {
  return internal::MakeDevicePoolView(
      impl_->geometry, impl_->options.layout,
      [this](int l) -> void* { return impl_->Piece(SlotId(0), l); }, /*host_accessible=*/false);
}

Completion CudaHbm::WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                               const BlockIoOptions& options) {
  Impl* impl = impl_.get();
  if (absl::Status s = internal::CheckBlockIoNow(info(), slot, src.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  BeginSlotWrite(slot);
  cudaSetDevice(impl->options.device);
  // Even when queueing fails part-way, earlier pieces may be in flight: the Completion fires only
  // once the stream has passed them, so the caller never reuses the buffers under a live copy.
  const cudaError_t queued =
      impl->Enqueue(slot, const_cast<std::byte*>(src.data()), true, impl->h2d);
  Completion done;
  impl->FinishAfter(
      impl->h2d, impl->h2d_completer.get(), [this, slot, key, done, queued](absl::Status s) {
        if (queued != cudaSuccess) {
          s = FromCuda(queued, absl::StrCat(info().name, ": copying into slot ", slot.value()));
        }
        if (s.ok()) EndSlotWrite(slot, key);
        done.Complete(std::move(s));
      });
  return done;
}

Completion CudaHbm::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                              const BlockIoOptions& options) {
  Impl* impl = impl_.get();
  if (absl::Status s = CheckReadNow(slot, key, dst.size(), options.deadline); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  cudaSetDevice(impl->options.device);
  const cudaError_t queued = impl->Enqueue(slot, dst.data(), false, impl->d2h);
  Completion done;
  impl->FinishAfter(
      impl->d2h, impl->d2h_completer.get(), [this, slot, done, queued](absl::Status s) {
        if (queued != cudaSuccess) {
          s = FromCuda(queued, absl::StrCat(info().name, ": copying out of slot ", slot.value()));
        }
        done.Complete(std::move(s));
      });
  return done;
}

}  // namespace kvtier
