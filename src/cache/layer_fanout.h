// LayerFanout: the layer-wise progress of one onboard into HBM (a Move to kHbm on a tier with
// kCapLayerwise), handed to the tickets whose blocks wait for it. The HBM backend reports each
// layer as it lands (LayerProgress::landed) and, on a GPU, a fence per layer as its copy is
// queued (LayerProgress::issued); the fanout records both and advances every registered ticket
// block (TicketState::landed_layers), so ResidencyTicket::layer_ready(l) fires while later layers
// are still in transfer.
//
// Thread-safety: thread-safe. Lock order: the cache's lock, then `mu`, then a ticket's mu; no
// ticket lock is held while taking `mu`. Completions are fired with no lock held.
#ifndef KVTIER_CACHE_LAYER_FANOUT_H_
#define KVTIER_CACHE_LAYER_FANOUT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "cache/ticket_state.h"
#include "internal/mutex.h"
#include "kvtier/completion.h"
#include "kvtier/device_fence.h"
#include "kvtier/ids.h"
#include "kvtier/tier_backend.h"

namespace kvtier::internal {

struct LayerFanout : std::enable_shared_from_this<LayerFanout> {
  explicit LayerFanout(int layers) : num_layers(layers) {}
  LayerFanout(const LayerFanout&) = delete;
  LayerFanout& operator=(const LayerFanout&) = delete;

  // The callbacks to hand the HBM backend's WriteBlock (TransferOptions::layers).
  std::shared_ptr<const LayerProgress> MakeProgress();
  // The destination slot, once the transfer engine has chosen it (before the write can start).
  void SetDestination(SlotId slot);

  // Block `index` of `batch` (a ticket's) now waits for this onboard: it gets what has landed
  // so far, and later layers as they land. Completions that become ready are appended to
  // `ready` (the caller fires them with no lock held). A batch that is no ticket is ignored.
  void AddReader(const std::shared_ptr<OnboardBatch>& batch, int64_t index,
                 std::vector<Completion>& ready);
  // The write ended (landed or failed): waiters in WaitForLayer stop waiting.
  void Close();

  // How WaitForLayer ended.
  struct LayerWait {
    std::shared_ptr<const DeviceFence> fence;  // the layer's copy is queued: wait on this
    bool landed = false;                       // the layer is in HBM already
  };
  // Waits until layer `layer`'s copy is queued (a fence), has landed, the write ends, or
  // `deadline` passes; returns which (neither set: ended without it, or timed out).
  LayerWait WaitForLayer(int layer, absl::Time deadline);

  const int num_layers;

 private:
  void OnLanded(int n);
  void OnIssued(int layer, std::shared_ptr<const DeviceFence> fence);

  struct Reader {
    std::weak_ptr<OnboardBatch> batch;
    int64_t index = 0;
  };
  Mutex mu_;
  CondVar cv_;
  int32_t dst_ ABSL_GUARDED_BY(mu_) = -1;
  int landed_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<const DeviceFence>> fences_ ABSL_GUARDED_BY(mu_);
  std::vector<Reader> readers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::internal

#endif  // KVTIER_CACHE_LAYER_FANOUT_H_
