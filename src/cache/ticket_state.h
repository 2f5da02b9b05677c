// The shared state behind a ResidencyTicket (kv_cache.h), and the onboard batch it is one of.
#ifndef KVTIER_CACHE_TICKET_STATE_H_
#define KVTIER_CACHE_TICKET_STATE_H_

#include <cstdint>
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

struct TicketState : OnboardBatch {
  TicketState() { ticket = this; }

  uint64_t id = 0;
  const void* owner = nullptr;  // the cache that issued it
  int64_t begin = 0;
  int64_t end = 0;
  // Written before the ticket is handed out; for kAsync, slots of blocks that fail become -1
  // (under mu) before `done` fires.
  DeviceBlockTable table;

  // Guarded by the issuing cache's lock.
  bool released = false;
};

}  // namespace kvtier::internal

#endif  // KVTIER_CACHE_TICKET_STATE_H_
