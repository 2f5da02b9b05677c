// A TierBackend decorator for the HBM tier that holds layer-wise writes at a gate: each layer a
// kCapLayerwise write reports landed (LayerProgress::landed) is passed on only once the test has
// opened the gate that far (OpenLayers), so a test sees a block with some layers in HBM and the
// rest in transfer. Optionally it plays a GPU tier: at WriteBlock it announces every layer's
// copy as queued (LayerProgress::issued) with a RecordingFence, and logs the streams made to
// wait on each (what ResidencyTicket::EnqueueStreamWait does on CudaHbm).
//
// The gate never blocks the wrapped tier's copy thread: a layer the tier reports landed past the
// gate is remembered and passed on, by the gate's own thread, when the gate opens that far, and
// the write's Completion fires only after every layer it landed was passed on. So the
// layers of writes the tier got as separate calls land as the gate says, whatever order the
// tier's single copy thread runs them in (a gate that held that thread made a later call's
// layer 0 wait behind an earlier call's held layer 1).
#ifndef KVTIER_TESTS_TESTING_LAYER_GATE_TIER_H_
#define KVTIER_TESTS_TESTING_LAYER_GATE_TIER_H_

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>
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
      : state_(std::make_shared<State>()), inner_(std::move(inner)), fences_(fences) {
    pump_ = std::thread([state = state_] { Pump(*state); });
  }
  // Lets everything land, drains the wrapped tier (whose copies may still report layers), then
  // stops the gate's thread once it has passed everything on.
  ~LayerGateTier() override {
    OpenLayers(1 << 20);
    inner_.reset();
    {
      internal::MutexLock lock(&state_->mu);
      state_->stop = true;
      state_->cv.SignalAll();
    }
    pump_.join();
  }

  // Lets layers [0, n) of every write (held now or later) land. The gate's thread passes them
  // on shortly after: wait on the cache's completions, not on this call.
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
    std::vector<std::shared_ptr<HeldWrite>> held(writes.size());
    for (size_t i = 0; i < gated.size(); ++i) {
      std::shared_ptr<const LayerProgress> outer =
          gated[i].layers ? gated[i].layers : options.layers;
      if (outer == nullptr) continue;
      held[i] = std::make_shared<HeldWrite>();
      gated[i].layers = Gate(std::move(outer), held[i]);
    }
    BlockIoOptions inner_options = options;
    inner_options.layers = nullptr;
    std::vector<Completion> inner = inner_->WriteBlocks(gated, inner_options);
    for (size_t i = 0; i < inner.size(); ++i) {
      if (held[i] == nullptr) continue;
      std::shared_ptr<State> state = state_;
      std::shared_ptr<HeldWrite> write = held[i];
      inner[i].OnDone([state, write](const absl::Status& s) {
        internal::MutexLock lock(&state->mu);
        write->inner_status = s;
        write->inner_done = true;
        state->cv.SignalAll();
      });
      inner[i] = write->done;
    }
    return inner;
  }

 private:
  struct State;

  // One layer-wise write in flight: how far the wrapped tier has landed it and how far that was
  // passed on. Guarded by State::mu.
  struct HeldWrite {
    std::shared_ptr<const LayerProgress> outer;
    int inner_landed = 0;
    int forwarded = 0;
    bool inner_done = false;
    absl::Status inner_status;
    Completion done;  // what the caller holds
  };

  // Progress that records each layer the wrapped tier lands, and (fences_) announces every
  // layer's copy as queued at once, as a GPU tier queues a batch.
  std::shared_ptr<const LayerProgress> Gate(std::shared_ptr<const LayerProgress> outer,
                                            const std::shared_ptr<HeldWrite>& write) {
    std::shared_ptr<State> state = state_;
    {
      internal::MutexLock lock(&state->mu);
      ++state->layered_writes;
      write->outer = outer;
      state->held.push_back(write);
    }
    if (fences_ && outer->issued) {
      const int layers = static_cast<int>(inner_->device_pool()->k_base.size());
      for (int l = 0; l < layers; ++l) {
        outer->issued(l, std::make_shared<RecordingFence>(state, l));
      }
    }
    auto gated = std::make_shared<LayerProgress>();
    gated->landed = [state, write](int n) {
      internal::MutexLock lock(&state->mu);
      write->inner_landed = n;
      state->cv.SignalAll();
    };
    return gated;
  }

  // The gate's thread: passes on what the gate lets through, each held write's landed layers up
  // to the gate in order, then its Completion once the wrapped tier is done and nothing landed
  // is held (a failure at once). The callbacks run outside the lock, and never on a thread of
  // the cache's (it may hold its own locks when it calls WriteBlocks).
  static void Pump(State& state) {
    internal::MutexLock lock(&state.mu);
    while (true) {
      std::vector<std::pair<std::shared_ptr<const LayerProgress>, int>> lands;
      std::vector<std::pair<Completion, absl::Status>> fire;
      std::vector<std::shared_ptr<HeldWrite>> still_held;
      for (std::shared_ptr<HeldWrite>& w : state.held) {
        const int target = std::min(w->inner_landed, state.open);
        for (int n = w->forwarded + 1; n <= target; ++n) lands.emplace_back(w->outer, n);
        w->forwarded = std::max(w->forwarded, target);
        if (w->inner_done && (!w->inner_status.ok() || w->forwarded >= w->inner_landed)) {
          fire.emplace_back(w->done, w->inner_status);
        } else {
          still_held.push_back(std::move(w));
        }
      }
      state.held = std::move(still_held);
      if (lands.empty() && fire.empty()) {
        if (state.stop) return;
        state.cv.Wait(&state.mu);
        continue;
      }
      state.mu.Unlock();
      for (const auto& [outer, n] : lands) {
        if (outer->landed) outer->landed(n);
      }
      for (const auto& [done, status] : fire) done.Complete(status);
      state.mu.Lock();
    }
  }

  struct State {
    mutable internal::Mutex mu;
    int open ABSL_GUARDED_BY(mu) = 0;
    internal::CondVar cv;  // signalled on every change the gate's thread acts on
    std::vector<std::shared_ptr<HeldWrite>> held ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
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
  std::thread pump_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_LAYER_GATE_TIER_H_
