// A TierBackend decorator for the HBM tier that holds layer-wise writes at a gate: each layer a
// kCapLayerwise write reports landed (LayerProgress::landed) is passed on only once the test has
// opened the gate that far (OpenLayers), so a test sees a block with some layers in HBM and the
// rest in transfer. Optionally it plays a GPU tier: at WriteBlock it announces every layer's
// copy as queued (LayerProgress::issued) with a RecordingFence, and logs the streams made to
// wait on each (what ResidencyTicket::EnqueueStreamWait does on CudaHbm).
//
// A held layer blocks the wrapped tier's copy thread, as a slow copy engine would; a gate left
// closed opens by itself after 10 s so a failing test cannot hang.
#ifndef KVTIER_TESTS_TESTING_LAYER_GATE_TIER_H_
#define KVTIER_TESTS_TESTING_LAYER_GATE_TIER_H_

#include <chrono>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "internal/mutex.h"
#include "kvtier/device_fence.h"
#include "kvtier/tier_backend.h"

namespace kvtier::testing {

class LayerGateTier final : public TierBackend {
 public:
  struct StreamWait {
    void* stream = nullptr;
    int layer = 0;
  };

  LayerGateTier(std::unique_ptr<TierBackend> inner, bool fences)
      : state_(std::make_shared<State>()), inner_(std::move(inner)), fences_(fences) {}
  ~LayerGateTier() override { OpenLayers(1 << 20); }

  // Lets layers [0, n) of every write (held now or later) land.
  void OpenLayers(int n) {
    internal::MutexLock lock(&state_->mu);
    state_->open = n;
    state_->cv.SignalAll();
  }
  // Every EnqueueWait on a fence this tier handed out, in order.
  std::vector<StreamWait> stream_waits() const {
    internal::MutexLock lock(&state_->mu);
    return state_->waits;
  }
  // Layer-wise writes seen (those given LayerProgress).
  int layered_writes() const {
    internal::MutexLock lock(&state_->mu);
    return state_->layered_writes;
  }

  const TierInfo& info() const override { return inner_->info(); }
  BlockAllocator& allocator() override { return inner_->allocator(); }
  void BeginDeviceWrite(SlotId slot) override { inner_->BeginDeviceWrite(slot); }
  void EndDeviceWrite(SlotId slot, const BlockKey& key) override {
    inner_->EndDeviceWrite(slot, key);
  }
  std::optional<DevicePoolView> device_pool() const override { return inner_->device_pool(); }
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override {
    return inner_->ReadBlock(slot, key, dst, options);
  }

  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override {
    if (options.layers == nullptr) return inner_->WriteBlock(slot, key, src, options);
    const BlockWrite one{slot, key, src, options.layers};
    return WriteBlocks({&one, 1}, options)[0];
  }
  std::vector<Completion> WriteBlocks(absl::Span<const BlockWrite> writes,
                                      const BlockIoOptions& options = {}) override {
    std::vector<BlockWrite> gated(writes.begin(), writes.end());
    for (BlockWrite& w : gated) {
      std::shared_ptr<const LayerProgress> outer = w.layers ? w.layers : options.layers;
      if (outer != nullptr) w.layers = Gate(std::move(outer));
    }
    BlockIoOptions inner_options = options;
    inner_options.layers = nullptr;
    return inner_->WriteBlocks(gated, inner_options);
  }

 private:
  // Progress that holds each layer at the gate before passing it to `outer`, and (fences_)
  // announces every layer's copy as queued at once, as a GPU tier queues a batch.
  std::shared_ptr<const LayerProgress> Gate(std::shared_ptr<const LayerProgress> outer) {
    std::shared_ptr<State> state = state_;
    {
      internal::MutexLock lock(&state->mu);
      ++state->layered_writes;
    }
    if (fences_ && outer->issued) {
      const int layers = static_cast<int>(inner_->device_pool()->k_base.size());
      for (int l = 0; l < layers; ++l) {
        outer->issued(l, std::make_shared<RecordingFence>(state, l));
      }
    }
    auto gated = std::make_shared<LayerProgress>();
    gated->landed = [state, outer](int n) {
      {
        internal::MutexLock lock(&state->mu);
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (state->open < n) {
          if (!state->cv.WaitUntil(&state->mu, give_up)) break;
        }
      }
      if (outer->landed) outer->landed(n);
    };
    return gated;
  }

  struct State {
    mutable internal::Mutex mu;
    internal::CondVar cv;
    int open ABSL_GUARDED_BY(mu) = 0;
    int layered_writes ABSL_GUARDED_BY(mu) = 0;
    std::vector<StreamWait> waits ABSL_GUARDED_BY(mu);
  };

  class RecordingFence final : public DeviceFence {
   public:
    RecordingFence(std::shared_ptr<State> state, int layer)
        : state_(std::move(state)), layer_(layer) {}
    absl::Status EnqueueWait(void* stream) const override {
      internal::MutexLock lock(&state_->mu);
      state_->waits.push_back({stream, layer_});
      return absl::OkStatus();
    }

   private:
    std::shared_ptr<State> state_;
    int layer_;
  };

  std::shared_ptr<State> state_;
  std::unique_ptr<TierBackend> inner_;
  const bool fences_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_LAYER_GATE_TIER_H_
