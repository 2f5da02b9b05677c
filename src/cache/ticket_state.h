// The shared state behind a ResidencyTicket (kv_cache.h).
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

struct TicketState {
  uint64_t id = 0;
  const void* owner = nullptr;  // the cache that issued it
  SequenceId sequence;
  int64_t begin = 0;
  int64_t end = 0;
  // Written before the ticket is handed out; for kAsync, slots of blocks that fail become -1
  // (under mu) before `done` fires.
  DeviceBlockTable table;
  Completion done;

  // Guarded by the issuing cache's lock, not by `mu`.
  bool released = false;
  // A ticket made by Resume: it pins nothing and is never handed out.
  bool pins = true;
  int64_t pending = 0;  // blocks still onboarding
  // The caller's deadline (EnsureResident's); the onboards it starts give up by then.
  absl::Time deadline = absl::InfiniteFuture();

  Mutex mu;
  std::vector<BlockResidency> status ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<int64_t, absl::Status> errors ABSL_GUARDED_BY(mu);
};

}  // namespace kvtier::internal

#endif  // KVTIER_CACHE_TICKET_STATE_H_
