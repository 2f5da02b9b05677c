// The shared state behind a ResidencyTicket (kv_cache.h), and the onboard batch it is one of.
#ifndef KVTIER_CACHE_TICKET_STATE_H_
#define KVTIER_CACHE_TICKET_STATE_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "internal/mutex.h"
#include "kvtier/completion.h"
#include "kvtier/device_block_table.h"
#include "kvtier/ids.h"
#include "kvtier/kv_cache.h"

namespace kvtier::internal {

// Blocks of one sequence being brought into HBM together, and who hears when the last one is
// settled: each block's outcome, and `done` with the batch's. A ResidencyTicket's state is one
// (it also pins what lands and hands out a block table); Resume's onboards are one that pins
// nothing and that no caller holds.
struct OnboardBatch {
  OnboardBatch() = default;
  OnboardBatch(const OnboardBatch&) = delete;
  OnboardBatch& operator=(const OnboardBatch&) = delete;

  SequenceId sequence;
  int64_t first_block = 0;  // the sequence's block index of status[0] (for messages)
  Completion done;
  // The ticket this batch is, or null for a batch that is no ticket (Resume's).
  struct TicketState* ticket = nullptr;

  // Guarded by the issuing cache's lock, not by `mu`.
  int64_t pending = 0;  // blocks still onboarding
  // The caller's deadline (EnsureResident's); the onboards it starts give up by then.
  absl::Time deadline = absl::InfiniteFuture();

  Mutex mu;
  std::vector<BlockResidency> status ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<int64_t, absl::Status> errors ABSL_GUARDED_BY(mu);
};

struct LayerFanout;

struct TicketState : OnboardBatch {
  TicketState() { ticket = this; }

  uint64_t id = 0;
  const void* owner = nullptr;  // the cache that issued it
  int64_t begin = 0;
  int64_t end = 0;
  // Filled before the ticket is handed out; a kAsync ticket's onboards then change its slots
  // (ResidencyTicket::block_table).
  DeviceBlockTable table ABSL_GUARDED_BY(mu);

  // Guarded by the issuing cache's lock.
  bool released = false;

  // Layer-wise readiness (ResidencyTicket::layer_ready). num_layers and layer_ready are written
  // before the ticket is handed out, then only read; layer_ready stays empty when every block was
  // resident at issue (every layer ready: the ticket's `done`).
  int num_layers = 0;
  std::vector<Completion> layer_ready;  // per layer
  // Per block: layers [0, landed_layers[i]) are in HBM at table.slots[i].
  std::vector<int> landed_layers ABSL_GUARDED_BY(mu);
  // Per block: a kernel may already read it (a layer landed, or EnqueueStreamWait made a stream
  // wait on its copy): it is not given up at the deadline nor moved to another slot by a retry.
  std::vector<uint8_t> committed ABSL_GUARDED_BY(mu);
  // Per layer: blocks whose copy of it has not landed (a failed block stays counted, so the
  // layer never fires OK).
  std::vector<int64_t> layer_pending ABSL_GUARDED_BY(mu);
  // Per block: the layer-wise onboard it follows (for EnqueueStreamWait's fences), or null.
  std::vector<std::shared_ptr<LayerFanout>> fanouts ABSL_GUARDED_BY(mu);
};

// Both below: the caller holds t.mu (taken as the ticket's or as its OnboardBatch's, which the
// analysis cannot tell are one lock).
// Layers [0, n) of block i of `t` have landed in HBM slot `slot`: records it (and the slot in the
// table), appending to `ready` each layer completion that this makes fire OK. Does nothing for a
// block no longer pending, a ticket without layer tracking, or n at or below what had landed.
void AdvanceLayersLocked(TicketState& t, int64_t i, int n, int32_t slot,
                         std::vector<Completion>& ready);
// Block i of `t` is at `slot` in the table now (-1: none). Writes only a changed entry, so a
// reader of an unchanged slot never races a store.
inline void SetSlotLocked(TicketState& t, int64_t i, int32_t slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  int32_t& entry = t.table.slots[static_cast<size_t>(i)];
  if (entry != slot) entry = slot;
}
// Block i of `t` will not land: each layer of it not yet landed fails with `error` (appended to
// `fire` with it, for layer completions not fired before), and never fires OK afterwards.
void FailLayersLocked(TicketState& t, int64_t i, const absl::Status& error,
                      std::vector<std::pair<Completion, absl::Status>>& fire);

}  // namespace kvtier::internal

#endif  // KVTIER_CACHE_TICKET_STATE_H_
