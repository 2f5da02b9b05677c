// LayerFanout (layer_fanout.h) and the layer-wise readiness of a ticket (ticket_state.h).
#include "cache/layer_fanout.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvtier::internal {

void AdvanceLayersLocked(TicketState& t, int64_t i, int n, int32_t slot,
                         std::vector<Completion>& ready) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const auto b = static_cast<size_t>(i);
  if (t.layer_ready.empty() || b >= t.landed_layers.size() ||
      t.status[b] != BlockResidency::kPending) {
    return;
  }
  n = std::min(n, t.num_layers);
  const int from = t.landed_layers[b];
  if (n <= from) return;
  t.landed_layers[b] = n;
  t.committed[b] = 1;
  SetSlotLocked(t, i, slot);
  for (int l = from; l < n; ++l) {
    if (--t.layer_pending[static_cast<size_t>(l)] == 0) {
      ready.push_back(t.layer_ready[static_cast<size_t>(l)]);
    }
  }
}

void FailLayersLocked(TicketState& t, int64_t i, const absl::Status& error,
                      std::vector<std::pair<Completion, absl::Status>>& fire)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const auto b = static_cast<size_t>(i);
  if (t.layer_ready.empty() || b >= t.landed_layers.size()) return;
  const int from = t.landed_layers[b];
  // Marked settled so nothing advances it again, but not taken off layer_pending: these layers
  // never count down to zero, so no later landing of another block fires them OK (their failure
  // is fired by the caller after the locks are released, and would lose that race).
  t.landed_layers[b] = t.num_layers;
  for (int l = from; l < t.num_layers; ++l) {
    const Completion& c = t.layer_ready[static_cast<size_t>(l)];
    if (!c.done()) {
      fire.emplace_back(c, absl::UnavailableError(absl::StrCat(
                               "layer ", l, " of block ", t.first_block + i, " of sequence ",
                               t.sequence.value(), " is not resident: ", error.ToString())));
    }
  }
}

std::shared_ptr<const LayerProgress> LayerFanout::MakeProgress() {
  auto progress = std::make_shared<LayerProgress>();
  std::shared_ptr<LayerFanout> self = shared_from_this();
  progress->landed = [self](int n) { self->OnLanded(n); };
  progress->issued = [self](int layer, std::shared_ptr<const DeviceFence> fence) {
    self->OnIssued(layer, std::move(fence));
  };
  return progress;
}

void LayerFanout::SetDestination(SlotId slot) {
  MutexLock lock(&mu_);
  dst_ = static_cast<int32_t>(slot.value());
}

void LayerFanout::AddReader(const std::shared_ptr<OnboardBatch>& batch, int64_t index,
                            std::vector<Completion>& ready) {
  if (batch == nullptr || batch->ticket == nullptr) return;
  TicketState& t = *batch->ticket;
  MutexLock lock(&mu_);
  readers_.push_back(Reader{batch, index});
  MutexLock tl(&t.mu);
  const auto b = static_cast<size_t>(index);
  if (b < t.fanouts.size() && t.status[b] == BlockResidency::kPending) {
    t.fanouts[b] = shared_from_this();
    // The block's slot from now on: a kernel may be queued on it before its layers land
    // (EnqueueStreamWait), reading each layer once it is ready.
    SetSlotLocked(t, index, dst_);
  }
  if (landed_ > 0) AdvanceLayersLocked(t, index, landed_, dst_, ready);
}

void LayerFanout::OnLanded(int n) {
  std::vector<Completion> ready;
  {
    MutexLock lock(&mu_);
    if (closed_) return;  // a late report after the write ended changes nothing
    landed_ = std::max(landed_, n);
    for (const Reader& r : readers_) {
      std::shared_ptr<OnboardBatch> batch = r.batch.lock();
      if (batch == nullptr) continue;
      MutexLock tl(&batch->ticket->mu);
      AdvanceLayersLocked(*batch->ticket, r.index, landed_, dst_, ready);
    }
    cv_.SignalAll();
  }
  for (const Completion& c : ready) c.Complete(absl::OkStatus());
}

void LayerFanout::OnIssued(int layer, std::shared_ptr<const DeviceFence> fence) {
  MutexLock lock(&mu_);
  if (layer < 0 || layer >= num_layers) return;
  if (fences_.size() <= static_cast<size_t>(layer)) fences_.resize(static_cast<size_t>(layer) + 1);
  fences_[static_cast<size_t>(layer)] = std::move(fence);
  cv_.SignalAll();
}

void LayerFanout::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  fences_.clear();  // the fences' events are done with; WaitForLayer reports `closed_` now
  cv_.SignalAll();
}

LayerFanout::LayerWait LayerFanout::WaitForLayer(int layer, absl::Time deadline) {
  const auto until = absl::ToChronoTime(deadline);
  MutexLock lock(&mu_);
  for (;;) {
    if (landed_ > layer) return {nullptr, true};
    if (static_cast<size_t>(layer) < fences_.size() && fences_[static_cast<size_t>(layer)]) {
      return {fences_[static_cast<size_t>(layer)], false};
    }
    if (closed_ || absl::Now() >= deadline) return {};
    if (deadline == absl::InfiniteFuture()) {
      cv_.Wait(&mu_);
    } else {
      cv_.WaitUntil(&mu_, until);
    }
  }
}

}  // namespace kvtier::internal
