// CudaHbm with the CUDA runtime (host code; compiled by the C++ compiler against cudart).
#include "kvtier/cuda_hbm.h"

#include <cuda_runtime.h>

#include <algorithm>
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

// Makes `device` current on the calling thread for the scope and restores the caller's device
// after: the tier's entry points run on the engine's threads, whose current device is theirs.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
    previous_ = current;  // -1 when the thread had none we could read: nothing to restore
    cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

// A CUDA event shared by whoever still needs it (the completer, fences handed out); destroyed
// with the last of them (cudaEventDestroy of an event a stream still waits on is deferred by the
// runtime until it completes).
using SharedEvent = std::shared_ptr<CUevent_st>;

absl::StatusOr<SharedEvent> RecordEvent(cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      err != cudaSuccess) {
    return FromCuda(err, "cudaEventCreate");
  }
  SharedEvent shared(event, [](cudaEvent_t e) { cudaEventDestroy(e); });
  if (cudaError_t err = cudaEventRecord(event, stream); err != cudaSuccess) {
    return FromCuda(err, "cudaEventRecord");
  }
  return shared;
}

// DeviceFence over an event of the tier's copy stream.
class CudaFence final : public DeviceFence {
 public:
  explicit CudaFence(SharedEvent event) : event_(std::move(event)) {}
  absl::Status EnqueueWait(void* stream) const override {
    const cudaError_t err =
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_.get(), 0);
    return err == cudaSuccess ? absl::OkStatus() : FromCuda(err, "cudaStreamWaitEvent");
  }

 private:
  SharedEvent event_;
};

}  // namespace

struct CudaHbm::Impl {
  Impl(const KvGeometry& g, const CudaHbmOptions& o) : geometry(g), options(o) {}
  ~Impl() {
    if (h2d != nullptr) cudaStreamSynchronize(h2d);
    if (d2h != nullptr) cudaStreamSynchronize(d2h);
    if (marker != nullptr) cudaStreamSynchronize(marker);
    // The completers wait on events of these streams: stop them before the streams go.
    h2d_completer.reset();
    d2h_completer.reset();
    event_completer.reset();
    if (h2d != nullptr) cudaStreamDestroy(h2d);
    if (d2h != nullptr) cudaStreamDestroy(d2h);
    if (marker != nullptr) cudaStreamDestroy(marker);
    if (owned_pool != nullptr) cudaFree(owned_pool);
  }

  // Slot 0's first byte of layer `l` (LayerPieces' layer base).
  char* LayerStart(int l) const {
    if (options.layout == HbmLayout::kBlockFirst) {
      return static_cast<char*>(layer_bases[0]) + l * geometry.bytes_per_block_per_layer();
    }
    return static_cast<char*>(layer_bases[l]);
  }

  // Appends the device and host ends of layer `l`'s pieces of `slot` to dsts/srcs/sizes.
  void AddLayerCopies(SlotId slot, int l, void* host, bool to_device, std::vector<void*>& dsts,
                      std::vector<void*>& srcs, std::vector<size_t>& sizes) const {
    internal::PoolPiece pieces[2];
    const int n = internal::LayerPieces(geometry, options.layout, options.capacity_blocks,
                                        slot.value(), l, pieces);
    for (int i = 0; i < n; ++i) {
      void* dev = LayerStart(l) + pieces[i].pool_offset;
      void* h = static_cast<char*>(host) + pieces[i].host_offset;
      dsts.push_back(to_device ? dev : h);
      srcs.push_back(to_device ? h : dev);
      sizes.push_back(static_cast<size_t>(pieces[i].bytes));
    }
  }

  // Queues `dsts[i] <- srcs[i]` on `stream`: one batched call where the runtime has it.
  cudaError_t EnqueueCopies(std::vector<void*>& dsts, std::vector<void*>& srcs,
                            std::vector<size_t>& sizes, bool to_device, cudaStream_t stream) {
    const cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
#if CUDART_VERSION >= 13000
    if (dsts.size() > 1 && batched.load()) {
      cudaMemcpyAttributes attr = {};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_index = 0;
      const cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                                   dsts.size(), &attr, &attr_index, 1, stream);
      if (err == cudaSuccess) return err;
      cudaGetLastError();  // not supported here: clear it and use single copies from now on
      batched.store(false);
    }
#endif
    for (size_t i = 0; i < dsts.size(); ++i) {
      if (cudaError_t err = cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], kind, stream);
          err != cudaSuccess) {
        return err;
      }
    }
    return cudaSuccess;
  }

  // Queues the copies of layers [first, last) of one block between `host` and `slot`.
  cudaError_t Enqueue(SlotId slot, void* host, bool to_device, cudaStream_t stream, int first,
                      int last) {
    std::vector<void*> dsts, srcs;
    std::vector<size_t> sizes;
    if (options.layout == HbmLayout::kBlockFirst && first == 0 &&
        last == geometry.num_layers()) {
      internal::PoolPiece pieces[2];
      internal::LayerPieces(geometry, options.layout, options.capacity_blocks, slot.value(), 0,
                            pieces);
      void* dev = LayerStart(0) + pieces[0].pool_offset;  // the whole block is one run
      dsts.push_back(to_device ? dev : host);
      srcs.push_back(to_device ? host : dev);
      sizes.push_back(static_cast<size_t>(geometry.bytes_per_block()));
    } else {
      for (int l = first; l < last; ++l) AddLayerCopies(slot, l, host, to_device, dsts, srcs, sizes);
    }
    return EnqueueCopies(dsts, srcs, sizes, to_device, stream);
  }
  cudaError_t Enqueue(SlotId slot, void* host, bool to_device, cudaStream_t stream) {
    return Enqueue(slot, host, to_device, stream, 0, geometry.num_layers());
  }

  // Records an event after the queued copies; `finish(status)` runs on `completer` once the
  // event is reached (or with the CUDA error that stopped it).
  void FinishAfter(cudaStream_t stream, internal::StreamWorker* completer,
                   std::function<void(absl::Status)> finish) {
    ScopedDevice on(options.device);  // the event must belong to the stream's device
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
  // Carries a copy of each caller's event (CompletionOfDeviceEvent), so the caller may record
  // its own event again at once.
  cudaStream_t marker = nullptr;
  std::atomic<bool> batched{CUDART_VERSION >= 13000};
  std::unique_ptr<internal::StreamWorker> h2d_completer = std::make_unique<internal::StreamWorker>();
  std::unique_ptr<internal::StreamWorker> d2h_completer = std::make_unique<internal::StreamWorker>();
  std::unique_ptr<internal::StreamWorker> event_completer =
      std::make_unique<internal::StreamWorker>();
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
  const size_t want_pointers = options.layout == HbmLayout::kBlockFirst
                                   ? size_t{1}
                                   : static_cast<size_t>(geometry.num_layers());
  if (!options.external_pool.empty() && options.external_pool.size() != want_pointers) {
    return absl::InvalidArgumentError(absl::StrCat("CudaHbm: external_pool has ",
                                                   options.external_pool.size(),
                                                   " pointers; the layout needs ", want_pointers));
  }
  ScopedDevice on(options.device);  // the pool and streams are made on the tier's device
  if (cudaError_t err = cudaSetDevice(options.device); err != cudaSuccess) {
    return FromCuda(err, "CudaHbm: cudaSetDevice");
  }
  auto impl = std::make_unique<Impl>(geometry, options);
  TierInfo info =
      MakeInfo(Tier::kHbm, absl::StrCat("cuda_hbm(", HbmLayoutName(options.layout), ")"),
               options.capacity_blocks, geometry.bytes_per_block(),
               kCapDeviceMemory | kCapLayerwise);
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
  if (cudaError_t err = cudaStreamCreateWithFlags(&impl->marker, cudaStreamNonBlocking);
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
  return impl_->LayerStart(layer);
}

std::optional<DevicePoolView> CudaHbm::device_pool() const {
  return internal::MakeDevicePoolView(
      impl_->geometry, impl_->options.layout, impl_->options.capacity_blocks,
      [this](int l) -> void* { return impl_->LayerStart(l); }, /*host_accessible=*/false);
}

absl::StatusOr<Completion> CudaHbm::CompletionOfDeviceEvent(void* cuda_event) {
  if (cuda_event == nullptr) {
    return absl::InvalidArgumentError("CudaHbm: CompletionOfDeviceEvent of a null event");
  }
  Impl* impl = impl_.get();
  ScopedDevice on(impl->options.device);
  // One marker stream and one completer serve every call: completions fire in the order the
  // calls were made (a later event that is reached first waits behind an earlier one), which is
  // the order a scheduler reports kernels in.
  // The marker stream waits for the caller's event as recorded now, and our own event marks
  // that point: the caller may record its event again without moving ours.
  if (cudaError_t err =
          cudaStreamWaitEvent(impl->marker, static_cast<cudaEvent_t>(cuda_event), 0);
      err != cudaSuccess) {
    return FromCuda(err, "CudaHbm: cudaStreamWaitEvent on the caller's event");
  }
  KVTIER_ASSIGN_OR_RETURN(SharedEvent ours, RecordEvent(impl->marker));
  Completion done;
  const int device = impl->options.device;
  impl->event_completer->Enqueue([ours, done, device] {
    cudaSetDevice(device);
    const cudaError_t e = cudaEventSynchronize(ours.get());
    done.Complete(e == cudaSuccess ? absl::OkStatus()
                                   : FromCuda(e, "the kernel's event (cudaEventSynchronize)"));
  });
  return done;
}

Completion CudaHbm::WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                               const BlockIoOptions& options) {
  Impl* impl = impl_.get();
  if (absl::Status s = internal::CheckBlockIoNow(info(), slot, src.size(), options.deadline);
      !s.ok()) {
    return Completion::Done(std::move(s));
  }
  BeginSlotWrite(slot);
  ScopedDevice on(impl->options.device);
  if (options.layers != nullptr) {
    const BlockWrite one{slot, key, src, options.layers};
    return WriteBlocks({&one, 1}, options)[0];
  }
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

// Layer-major when any block reports layers (kCapLayerwise): every block's layer-l copies, then
// one event for layer l, handed to each block as its fence; the completer announces layer l of
// every block when that event is reached.
std::vector<Completion> CudaHbm::WriteBlocks(absl::Span<const BlockWrite> writes,
                                             const BlockIoOptions& options) {
  const bool layered =
      options.layers != nullptr || std::any_of(writes.begin(), writes.end(), [](const auto& w) {
        return w.layers != nullptr;
      });
  if (!layered) return TierBackend::WriteBlocks(writes, options);
  Impl* impl = impl_.get();
  std::vector<Completion> out(writes.size());
  struct Job {
    BlockWrite write;
    Completion done;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (absl::Status s = internal::CheckBlockIoNow(info(), writes[i].slot, writes[i].src.size(),
                                                   options.deadline);
        !s.ok()) {
      out[i] = Completion::Done(std::move(s));
      continue;
    }
    jobs.push_back({writes[i], out[i]});
    if (jobs.back().write.layers == nullptr) jobs.back().write.layers = options.layers;
    BeginSlotWrite(jobs.back().write.slot);
  }
  if (jobs.empty()) return out;
  ScopedDevice on(impl->options.device);
  const int num_layers = impl->geometry.num_layers();
  std::vector<SharedEvent> events;
  events.reserve(static_cast<size_t>(num_layers));
  absl::Status queued;
  for (int l = 0; l < num_layers && queued.ok(); ++l) {
    std::vector<void*> dsts, srcs;
    std::vector<size_t> sizes;
    for (const Job& j : jobs) {
      impl->AddLayerCopies(j.write.slot, l, const_cast<std::byte*>(j.write.src.data()), true,
                           dsts, srcs, sizes);
    }
    if (cudaError_t err = impl->EnqueueCopies(dsts, srcs, sizes, true, impl->h2d);
        err != cudaSuccess) {
      queued = FromCuda(err, absl::StrCat(info().name, ": copying layer ", l, " of ",
                                          jobs.size(), " blocks"));
      break;
    }
    absl::StatusOr<SharedEvent> event = RecordEvent(impl->h2d);
    if (!event.ok()) {
      queued = event.status();
      break;
    }
    events.push_back(*event);
    auto fence = std::make_shared<CudaFence>(*event);
    for (const Job& j : jobs) {
      if (j.write.layers != nullptr && j.write.layers->issued) j.write.layers->issued(l, fence);
    }
  }
  const int device = impl->options.device;
  cudaStream_t stream = impl->h2d;
  impl->h2d_completer->Enqueue([this, jobs = std::move(jobs), queued, events = std::move(events),
                                device, stream, num_layers] {
    cudaSetDevice(device);
    absl::Status s = queued;
    for (size_t l = 0; l < events.size(); ++l) {
      if (cudaError_t e = cudaEventSynchronize(events[l].get()); e != cudaSuccess) {
        s = FromCuda(e, "cudaEventSynchronize");
        break;
      }
      if (!s.ok()) break;
      for (const Job& j : jobs) {
        if (j.write.layers != nullptr && j.write.layers->landed) {
          j.write.layers->landed(static_cast<int>(l) + 1);
        }
      }
    }
    // Pieces queued after the last recorded event (a failure part-way): let the stream pass
    // them before the callers may reuse their buffers.
    if (static_cast<int>(events.size()) < num_layers) cudaStreamSynchronize(stream);
    for (const Job& j : jobs) {
      if (s.ok()) EndSlotWrite(j.write.slot, j.write.key);
      j.done.Complete(s);
    }
  });
  return out;
}

Completion CudaHbm::ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                              const BlockIoOptions& options) {
  Impl* impl = impl_.get();
  if (absl::Status s = CheckReadNow(slot, key, dst.size(), options.deadline); !s.ok()) {
    return Completion::Done(std::move(s));
  }
  ScopedDevice on(impl->options.device);
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
