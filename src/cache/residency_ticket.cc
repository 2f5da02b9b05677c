// ResidencyTicket's accessors (kv_cache.h): read-only views of the shared ticket state, and the
// waits a kernel's stream makes on it (layer by layer).
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/layer_fanout.h"
#include "cache/ticket_state.h"
#include "kvtier/kv_cache.h"

namespace kvtier {
namespace {

absl::Status NotResident(const internal::TicketState& t, size_t i)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
  auto e = t.errors.find(static_cast<int64_t>(i));
  return absl::UnavailableError(absl::StrCat(
      "EnqueueStreamWait: block ", t.first_block + static_cast<int64_t>(i), " is not resident: ",
      e != t.errors.end() ? e->second.ToString() : "unknown"));
}

}  // namespace

uint64_t ResidencyTicket::id() const { return state_ ? state_->id : 0; }
SequenceId ResidencyTicket::sequence() const { return state_ ? state_->sequence : SequenceId(); }
int64_t ResidencyTicket::begin_token() const { return state_ ? state_->begin : 0; }
int64_t ResidencyTicket::end_token() const { return state_ ? state_->end : 0; }

DeviceBlockTable ResidencyTicket::block_table() const {
  if (!state_) return {};
  internal::MutexLock lock(&state_->mu);  // onboards of a kAsync ticket write its slots
  return state_->table;
}

Completion ResidencyTicket::completion() const {
  return state_ ? state_->done
                : Completion::Done(absl::InvalidArgumentError("an invalid residency ticket"));
}

int ResidencyTicket::num_layers() const { return state_ ? state_->num_layers : 0; }

Completion ResidencyTicket::layer_ready(int layer) const {
  if (!state_) return Completion::Done(absl::InvalidArgumentError("an invalid residency ticket"));
  if (layer < 0 || layer >= state_->num_layers) {
    return Completion::Done(absl::OutOfRangeError(absl::StrCat(
        "layer ", layer, " is outside [0, ", state_->num_layers, ")")));
  }
  // Empty: every block was resident at issue, and `done` has fired OK.
  return state_->layer_ready.empty() ? state_->done
                                     : state_->layer_ready[static_cast<size_t>(layer)];
}

absl::Status ResidencyTicket::EnqueueStreamWait(void* cuda_stream, int layer,
                                                absl::Time deadline) const {
  if (!state_) return absl::InvalidArgumentError("an invalid residency ticket");
  internal::TicketState& t = *state_;
  if (layer != kAllLayers && (layer < 0 || layer >= t.num_layers)) {
    return absl::OutOfRangeError(
        absl::StrCat("EnqueueStreamWait: layer ", layer, " is outside [0, ", t.num_layers, ")"));
  }
  if (t.layer_ready.empty()) return absl::OkStatus();  // all resident at issue
  const int target = layer == kAllLayers ? t.num_layers - 1 : layer;
  const Completion& ready = t.layer_ready[static_cast<size_t>(target)];
  // Blocks whose target layer has not landed, with the onboard each follows.
  std::vector<std::pair<size_t, std::shared_ptr<internal::LayerFanout>>> follow;
  bool unfollowed = false;
  {
    internal::MutexLock lock(&t.mu);
    for (size_t i = 0; i < t.status.size(); ++i) {
      if (t.status[i] == BlockResidency::kNotResident) return NotResident(t, i);
      if (t.landed_layers[i] > target) continue;
      if (t.fanouts[i] != nullptr) {
        follow.emplace_back(i, t.fanouts[i]);
      } else {
        unfollowed = true;
      }
    }
  }
  // A block that follows no layer-wise onboard (one started without layers, or not started
  // yet): only its landing tells, on the host.
  if (unfollowed) return ready.WaitUntil(deadline);
  struct Queued {
    size_t block;
    const internal::LayerFanout* fanout;
    std::shared_ptr<const DeviceFence> fence;
  };
  std::vector<Queued> fences;
  bool landed_on_host = false;
  for (const auto& [i, fanout] : follow) {
    internal::LayerFanout::LayerWait w = fanout->WaitForLayer(target, deadline);
    if (w.landed) {
      landed_on_host = true;
      continue;
    }
    if (w.fence != nullptr) {
      fences.push_back(Queued{i, fanout.get(), std::move(w.fence)});
      continue;
    }
    // The copy ended without the layer (it failed: a retry, or the failure, settles it) or the
    // deadline passed: the layer's own completion tells.
    return ready.WaitUntil(deadline);
  }
  // A layer the fanout saw land has its completion fired just after (outside the fanout's
  // lock): wait for that too, so layer_ready(layer) has fired when this returns OK without
  // fences.
  if (landed_on_host && fences.empty()) return ready.WaitUntil(deadline);
  bool switched = false;
  {
    // Commit the blocks to their slots before the stream may read them: from here on they are
    // neither given up at the deadline nor moved by a retry (ExpireTicket, OnMoveDone).
    // A block that stopped following the copy its fence came from (the copy failed and a
    // retry may land it elsewhere) is left to its layer completion, on the host.
    internal::MutexLock lock(&t.mu);
    for (const Queued& q : fences) {
      if (t.status[q.block] == BlockResidency::kNotResident) return NotResident(t, q.block);
      if (t.status[q.block] == BlockResidency::kPending && t.fanouts[q.block].get() != q.fanout) {
        switched = true;
      }
    }
    if (!switched) {
      for (const Queued& q : fences) t.committed[q.block] = 1;
    }
  }
  if (switched) return ready.WaitUntil(deadline);
  for (const Queued& q : fences) {
    if (absl::Status s = q.fence->EnqueueWait(cuda_stream); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<BlockResidency> ResidencyTicket::block_status() const {
  if (!state_) return {};
  internal::MutexLock lock(&state_->mu);
  return state_->status;
}

absl::Status ResidencyTicket::block_error(int64_t index) const {
  if (!state_) return absl::InvalidArgumentError("an invalid residency ticket");
  internal::MutexLock lock(&state_->mu);
  if (index < 0 || index >= static_cast<int64_t>(state_->status.size())) {
    return absl::OutOfRangeError("block index outside the ticket");
  }
  if (state_->status[static_cast<size_t>(index)] == BlockResidency::kResident) {
    return absl::OkStatus();
  }
  auto it = state_->errors.find(index);
  if (it != state_->errors.end()) return it->second;
  return absl::UnavailableError("the block is still being onboarded");
}

int64_t ResidencyTicket::resident_tokens() const {
  if (!state_) return 0;
  internal::MutexLock lock(&state_->mu);
  const int64_t b = state_->table.tokens_per_block;
  int64_t leading = 0;
  while (leading < static_cast<int64_t>(state_->status.size()) &&
         state_->status[static_cast<size_t>(leading)] == BlockResidency::kResident) {
    ++leading;
  }
  const int64_t covered_end = (state_->table.first_block + leading) * b;
  return std::max<int64_t>(0, std::min(covered_end, state_->end) - state_->begin);
}

}  // namespace kvtier
