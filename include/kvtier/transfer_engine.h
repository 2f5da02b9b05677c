// TransferEngine: moves blocks between tiers asynchronously, and owns the slot bookkeeping of
// every tier while it does.
//
// Paths: a host-addressable source (DRAM) is written into the destination straight from its
// slot; a host-addressable destination is read into straight from the source (HBM -> DRAM, NVMe
// -> DRAM); anything else (NVMe <-> HBM) is staged through one of the engine's own bounce
// buffers in host memory. A copy between two tiers with kCapInlineIo (MetadataTier) that can
// start at once runs inside Copy on the caller's thread: its Completion has fired when Copy
// returns (callbacks registered later run at once, on the registering thread).
//
// Slot lifetime (DESIGN section 5; cases LT-1, LT-2, LT-3):
//   * The engine allocates the destination slot itself (kFree -> kInFlight), so nothing else can
//     be handed that slot while the copy may still write it.
//   * It pins the source (Acquire) for the duration, so the source cannot be evicted mid-copy.
//     A source that is itself the destination of a pending transfer is waited for, then pinned.
//   * A copy waits for `source_ready` (the compute completion of the tokens it stores) before
//     reading the source, so an offload stores the final bytes.
//   * Success: destination kInFlight -> kCached (or pinned kSealed with pin_destination).
//     Failure before the copy started, or a source read that failed (nothing reached the
//     destination): kInFlight -> kFree. A deadline that passes while the copy runs: the caller's
//     Completion fires kDeadlineExceeded at once and the destination goes kQuarantined; when the
//     copy is later known complete (or failed), it goes kFree. Nothing stays quarantined forever.
//     With deadline_bounds_start, a deadline ends only a copy that has not started; one running
//     is left to its backends, which have the same deadline (see TransferOptions).
//
// Counters per tier pair: bytes, blocks, operations, failures, and an exponentially weighted
// moving average (weight 1/8) of per-transfer bandwidth, bytes / (end - start of data movement).
//
// Thread-safety: thread-safe. The engine holds one lock over its state and every tier's
// BlockAllocator; callers touch allocators only through WithAllocator. Backend calls and
// callbacks never run under that lock. Ownership: the TierBackends must outlive the engine; the
// destructor cancels transfers still waiting to start, waits for those in flight and for the
// callbacks their Completions run as they fire, and must not run inside a Completion callback
// of the engine's own transfers.
#ifndef KVTIER_TRANSFER_ENGINE_H_
#define KVTIER_TRANSFER_ENGINE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/block_allocator.h"
#include "kvtier/block_key.h"
#include "kvtier/completion.h"
#include "kvtier/ids.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

struct TransferEngineOptions {
  // The backend of each tier (index TierIndex), nullptr where the tier is absent. All present
  // tiers must have the same block_bytes.
  std::array<TierBackend*, kNumTiers> tiers{};
  int bounce_buffers = 4;  // host buffers for staged copies (NVMe <-> HBM), >= 1
};

struct TransferOptions {
  // When the caller stops waiting: the Completion fires kDeadlineExceeded (see above).
  absl::Time deadline = absl::InfiniteFuture();
  // The source bytes are valid only once this fires (e.g. the attention kernel's completion for
  // the tokens of the block). Unset: the source is valid now. If it fails, so does the copy.
  std::optional<Completion> source_ready;
  // On success leave the destination kSealed with one reference for the caller (it must
  // Release it), instead of kCached, so it cannot be evicted before the caller adopts it.
  bool pin_destination = false;
  // The deadline gives up a copy that has not started by then (kDeadlineExceeded; its slots
  // untouched) but does not cut one that is running: its backends get the same deadline (a
  // backend that would wait, e.g. on a store, gives up then) and the Completion fires when they
  // are done, so the source is unpinned and the bounce buffer free by the time it fires. For a
  // caller that keeps its own deadlines and must know when the source is settled (KvCache).
  // (A copy between two inline tiers that starts at once has finished when Copy returns: no
  // deadline applies to it either way.)
  bool deadline_bounds_start = false;
  // Queue the copy without starting it: it starts at the next StartDeferred() (or sooner, when
  // the engine next starts waiting copies for another reason). Copies a caller makes in one go
  // (a request's onboarding) then start together, and the source reads of one tier and `batch`
  // reach that tier as one ReadBlocks (one transport batch for a remote tier, one submission for
  // NVMe), whose backend deadline is the latest of theirs. How many start together is bounded by
  // the free bounce buffers for staged copies (neither end host-addressable: a remote or NVMe tier
  // into HBM), unbounded otherwise. The caller must call
  // StartDeferred() after its last such Copy; until then the copy only ages toward its
  // deadline. (A copy between two inline tiers that can start at once runs in Copy anyway.)
  bool defer_start = false;
  // An opaque id of the caller's batch (a request's copies: KvCache gives each call its own);
  // callers sharing an engine must not reuse each other's ids. Copies that start in one pass
  // (deferred or not) share a backend call (the ReadBlocks above, and the layer-major WriteBlocks
  // of layer-wise copies) and that call's deadline only with copies of the same batch, so no
  // request's copies are bounded by another's deadline. Separate calls to one tier still queue
  // in order behind each other (one copy stream), as do bounce buffers. 0: the batch of every
  // copy that names none.
  uint64_t batch = 0;
  // Handed to the destination's WriteBlock (BlockIoOptions::layers): a kCapLayerwise
  // destination announces each layer of the block as it lands (layer-wise onboarding). Other
  // destinations ignore it. May be null.
  std::shared_ptr<const LayerProgress> layers;
};

struct Transfer {
  SlotId destination;     // allocated by the engine in the destination tier, kInFlight until done
  Completion completion;  // OK when the block is in the destination
};

struct TransferStats {
  int64_t bytes = 0;       // bytes of blocks that arrived
  int64_t blocks = 0;      // blocks that arrived
  int64_t operations = 0;  // transfers started by Copy
  int64_t failures = 0;    // transfers that did not deliver (errors and deadlines)
  double bandwidth_bytes_per_second = 0;  // EWMA over delivered transfers; 0 before the first
};

class TransferEngine {
 public:
  // Errors: kInvalidArgument if no tier is given, tiers disagree on block_bytes, a backend sits
  // at the wrong index, or bounce_buffers < 1; kResourceExhausted if the bounce buffers cannot
  // be allocated.
  static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(
      const TransferEngineOptions& options);
  ~TransferEngine();

  // Copies block `key` from `source` in `from` to a new slot of `to`.
  // Errors returned at once (nothing started, nothing allocated): kInvalidArgument for an absent
  // tier, from == to, or a source slot outside its tier; kResourceExhausted if `to` has no free
  // slot (evict and retry); kFailedPrecondition if the source is neither kSealed, kCached nor
  // the destination of a pending transfer. Errors in the Completion: the backends' (kNotFound,
  // kDataLoss, kUnavailable, ...), a failed source_ready's, or kDeadlineExceeded.
  absl::StatusOr<Transfer> Copy(const BlockKey& key, Tier from, SlotId source, Tier to,
                                const TransferOptions& options = {});

  // Starts the copies queued with TransferOptions::defer_start (those whose conditions hold),
  // on the engine's own thread; returns at once. Thread-safe.
  void StartDeferred();

  // Runs `fn` on the allocator of `tier` under the engine's lock.
  // Errors: kInvalidArgument for an absent tier; otherwise whatever `fn` returns.
  absl::Status WithAllocator(Tier tier, absl::FunctionRef<absl::Status(BlockAllocator&)> fn);
  // Runs `fn` on every tier's allocator (nullptr where a tier is absent; index TierIndex) under
  // one acquisition of the engine's lock: for callers that touch many slots at once. `fn` must
  // not call back into the engine. Returns what `fn` returns.
  absl::Status WithAllocators(
      absl::FunctionRef<absl::Status(const std::array<BlockAllocator*, kNumTiers>&)> fn);

  TransferStats stats(Tier from, Tier to) const;
  // Transfers accepted by Copy that have not finished their data movement.
  int64_t in_flight() const;

 private:
  struct Impl;
  explicit TransferEngine(std::shared_ptr<Impl> impl);
  // Shared with callbacks that may outlive a call (they hold weak references).
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_TRANSFER_ENGINE_H_
