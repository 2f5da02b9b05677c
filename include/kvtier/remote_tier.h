// RemoteTier: a fleet-wide store (Redis, a shared directory, ...) as a tier, over a Transport.
// Each block is stored under RemoteBlockKey(prefix, namespace digest, block key) in a value frame
// (value_frame.h: namespace, key, codec, lengths, XXH3-128 or HMAC-SHA256), so a value written by
// another model or tenant, or damaged in the store, reads as a miss counted in corrupt_reads(),
// never as a block (case RM-2). Against a party that can write the store on purpose only the
// HMAC helps (XXH3 is public): set hmac_secret for any store shared beyond one trust domain.
// Frames are not encrypted.
//
// Health: a circuit breaker watches the store. After breaker_failures consecutive failed requests
// (a request is one call, batched or not; it failed when no block of it got an answer:
// kUnavailable or kDeadlineExceeded for all) the tier is bypassed: reads and
// writes fail at once with kUnavailable, so lookups miss without waiting on a dead store. After
// a backoff (doubling from breaker_backoff_min to _max) one request probes the store; an answer
// closes the breaker. A request's kDeadlineExceeded counts only if it was given at least 4 times
// the store's recent answer time (an average of answered requests' durations): a caller's own
// short deadline, such as a discovery probe's, does not make a slow but live store look dead;
// once the store has answered nothing for breaker_backoff_max, every timeout counts again.
//
// Slots are this worker's budget of blocks in the store (capacity_blocks); the store itself may
// hold far more, written by other workers of the same namespace.
//
// Discovery (kCapProbe): store keys depend only on the prefix, the namespace digest and the block
// key, so a block another process (or this one before a restart) wrote is found by key.
// ProbeBlocks asks which of a window of keys the store holds in one Transport::Exists call (one
// pipelined round trip on Redis), through the breaker (an open breaker answers kUnavailable at
// once, without a store call; a probe that gets no answer counts as a failed request), and
// AdoptStoredBlock lets a free slot stand for a block found so, so ReadBlock fetches it (and
// verifies its frame like any other: a value replaced by a foreign or torn one is a miss).
//
// Thread-safety: as TierBackend. Ownership: the tier shares ownership of its Transport; callbacks
// the transport fires hold no reference to it, so the transport is destroyed on the thread that
// drops its last owner. Do not drop the last owner of the tier (or of a shared transport) inside
// a completion callback: the transport's destructor joins the thread that runs it.
#ifndef KVTIER_REMOTE_TIER_H_
#define KVTIER_REMOTE_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/codec.h"
#include "kvtier/tier_backend.h"
#include "kvtier/transport.h"

namespace kvtier {

struct RemoteTierOptions {
  std::shared_ptr<Transport> transport;  // shared: one store connection may serve many tiers
  int64_t capacity_blocks = 0;           // >= 1
  std::string key_prefix = "kvtier:";
  // The codec this tier writes with. kFp8E4m3 is lossy (codec.h) and needs bf16 KV. Reads
  // accept every lossless codec; a lossy frame only if this codec is lossy too: a lossless
  // worker reads another worker's fp8 frame as kDataLoss (a corrupt read, which its next write
  // of the block replaces), never as a block.
  Codec codec = Codec::kNone;
  // A per-deployment secret: frames carry HMAC-SHA256 instead of XXH3-128. Empty: no MAC.
  std::string hmac_secret;
  // Consecutive store failures that open the circuit breaker; 0 never opens it.
  int breaker_failures = 5;
  // Delete the store's value of a block when the cache evicts it from this tier (DiscardBlock),
  // if this tier stored that value itself (not one it found by discovery or whose write it
  // skipped because the store had it: another worker's), so a store this worker alone writes
  // holds at most about capacity_blocks of its blocks. Set false where the store's own policy
  // owns its capacity (Redis maxmemory with allkeys-lru, a TTL) and other workers may still
  // read a block this one stored and let go.
  bool delete_freed = true;
  // Write a block only if the store does not hold its key yet (TransportPut::if_absent: Redis
  // `SET ... NX`): keys are content-addressed, so a value already there is this block, written
  // by another worker or an earlier run; the write completes OK and is counted in
  // writes_skipped(). A value there that is damaged reads as corrupt (a miss), and the block's
  // next write replaces it. False: every write replaces.
  bool write_if_absent = true;
  absl::Duration breaker_backoff_min = absl::Milliseconds(100);
  absl::Duration breaker_backoff_max = absl::Seconds(10);
  // How long a write of a block waits for the store's answer to this tier's delete of the same
  // block (DiscardBlock), >= 0 and finite: on the transfer engine's thread, so short. A store
  // answers in a round trip; one that has not by then fails the write (kUnavailable).
  absl::Duration delete_wait = absl::Milliseconds(100);
};

enum class RemoteHealth : uint8_t {
  kHealthy = 0,   // breaker closed
  kBypassed = 1,  // breaker open: requests fail at once until the next probe
  kProbing = 2,   // one request is testing the store
};

class RemoteTier final : public TierBackend {
 public:
  // Errors: kInvalidArgument for a null transport, capacity_blocks < 1 or so large that its bytes
  // overflow int64, a key prefix longer than 64 bytes or with characters other than letters,
  // digits and . _ : - (every transport can store those), codec fp8_e4m3 on KV that is not bf16,
  // breaker_failures < 0, a backoff with min <= 0 or max < min, or a delete_wait that is
  // negative or infinite.
  static absl::StatusOr<std::unique_ptr<RemoteTier>> Create(const CacheNamespace& ns,
                                                            const RemoteTierOptions& options);
  ~RemoteTier() override;

  const TierInfo& info() const override;
  BlockAllocator& allocator() override;
  // Frames and stores the block. Errors also the transport's (kUnavailable, kResourceExhausted,
  // kDeadlineExceeded); the slot then reads as not-written.
  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override;
  // Fetches and verifies the block. Errors also: kNotFound if the store no longer has it (TTL,
  // eviction by the store); kDataLoss for a corrupt or foreign value (counted).
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override;
  // Batched forms: one transport call (one pipeline on Redis) for the whole batch.
  std::vector<Completion> WriteBlocks(absl::Span<const BlockWrite> writes,
                                      const BlockIoOptions& options = {}) override;
  std::vector<Completion> ReadBlocks(absl::Span<const BlockRead> reads,
                                     const BlockIoOptions& options = {}) override;
  // With delete_freed: deletes the block's store value (one Transport::Delete, not waited for,
  // bounded by 1 s; skipped unless the breaker is closed; a failed delete is ignored: the value
  // is then left to the store's own eviction). Only if `slot` holds `key` here and this tier's
  // write stored it (see delete_freed). Until the store answers that delete, ProbeBlocks reads
  // the block as absent, and a later write of the same block waits for the answer (any answer;
  // at most delete_wait and the write's deadline, else the write fails with kUnavailable), in a
  // batch of its own, so a delete the store answered cannot land after the write: a Redis store
  // may otherwise run them in either order. A delete the transport gave up on (its 1 s passed)
  // may still land later; the block then reads as missing (kNotFound) and leaves the cache's
  // index. Thread-safe; the cache calls it under its lock, and every transport here returns
  // from Delete at once (DirectoryTransport unlinks on its own workers).
  void DiscardBlock(SlotId slot, const BlockKey& key) override;
  // Store deletes DiscardBlock issued.
  int64_t deleted_keys() const;
  // Frame bytes of writes the store took, and writes skipped because it had the block.
  int64_t bytes_written() const;
  int64_t writes_skipped() const;

  // One Transport::Exists over StoreKey of each key; see TierBackend::ProbeBlocks. Waits at most
  // until `deadline` whatever the transport does. A block whose delete (DiscardBlock) the store
  // has not answered yet reads as absent.
  absl::StatusOr<std::vector<bool>> ProbeBlocks(absl::Span<const BlockKey> keys,
                                                absl::Time deadline) override;
  absl::Status AdoptStoredBlock(SlotId slot, const BlockKey& key) override;

  // The store key of `key` in this tier's namespace.
  std::string StoreKey(const BlockKey& key) const;
  int64_t corrupt_reads() const;

  // Circuit-breaker state and counters.
  RemoteHealth health() const;
  int64_t breaker_opened() const;     // times it opened
  int64_t bypassed_requests() const;  // blocks refused at once while open

  // Discovery counters, since creation: ProbeBlocks calls that reached the store (one transport
  // call each), the calls that failed (bypassed by the breaker, past their deadline, or no key
  // answered), and keys the store said it holds.
  int64_t probes() const;
  int64_t probe_failures() const;
  int64_t probe_hits() const;

 private:
  struct Impl;
  RemoteTier(std::shared_ptr<Impl> impl, std::shared_ptr<Transport> transport);
  std::shared_ptr<Impl> impl_;            // shared with completion callbacks
  std::shared_ptr<Transport> transport_;  // never with callbacks: see remote_tier.cc
};

}  // namespace kvtier

#endif  // KVTIER_REMOTE_TIER_H_
