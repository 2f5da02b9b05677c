// KvCache: the API an inference server links. It keeps every sequence's KV as blocks on the
// memory hierarchy (HBM, DRAM, NVMe, remote), shares identical prefixes by their chained block
// keys, moves blocks between tiers, and before an attention kernel runs makes the blocks it reads
// resident in HBM (EnsureResident), handing back a device block table.
//
// The serving loop, per request:
//   CreateSequence(id, {adapter, salt, retention})      once per request
//   AttachPrefix(id, prompt)  -> attached_tokens          reuse the cached prefix (two phases:
//                                                         pin every matched block, then plan)
//   Append(id, prompt[attached:])                          slots for the tokens to prefill
//   EnsureResident(id, 0, n, {deadline, mode}) -> ticket   attached blocks onboarded into HBM
//   ... kernel reads ticket.block_table(), writes the new tokens' KV ...
//   ReportWritten(id, n, kernel_done)                      the new full blocks become shareable
//   ReleaseTicket(ticket)
//   Append(id, {token}) ... per decode step, EnsureResident / ReportWritten as above
//   Pause(id, expected_idle) / Resume(id)                  an agent waiting on a tool
//   Pause(id, PauseHints{.preempted = true}) / Resume(id)  a scheduler swapping a request out
//   Release(id)                                            blocks stay cached for the next turn
//
// Residency of a block in HBM (DESIGN section 8): locked (a ticket pins it: the kernel may be
// reading it), held (a sequence references it; kept, but a Pause may move the sequence's
// reference to a lower tier), droppable (nobody references it: an eviction candidate).
//
// Policy (DESIGN section 7):
//   * New blocks are written by the kernel into HBM. Write-back (default): a block reaches a
//     lower tier when it is evicted from the tier above (demotion) or its sequence is paused.
//     Write-through: every block is copied one tier down as soon as its tokens are written.
//   * Inclusive tiers (default) keep a lower copy when a block is onboarded; exclusive tiers drop
//     it, so each block is stored once.
//   * Admission: a tier below HBM takes a block only once the block has been used at least
//     admit_after_uses times (2 = "on NVMe only when seen twice").
//   * Eviction is leaf-first: a block with a copy of one of its children in the same tier is not
//     a candidate (that child could never be hit without it). Candidates are ranked by the
//     eviction policy (eviction_policy.h: lru, cost_aware, reuse_index or learned). Blocks held by
//     sequences, pinned by tickets or read by transfers are never candidates. An evicted block is
//     demoted to the next tier that admits it and lacks it, or dropped (counted in evictions);
//     a block the policy says is not worth restoring later is dropped (demote_by_value). A
//     tier whose store just failed is no demotion target for a back-off (100 ms, doubling to 10 s
//     while its stores keep failing, reset by one that lands): a dead store is bypassed, not
//     re-tried.
//   * Restore versus recompute: AttachPrefix restores the leading matched blocks the cost model
//     (cost_model.h: restore = latency + bytes / bandwidth per tier, measured online; recompute
//     = prefill FLOPs / FLOP rate) says are cheaper to restore, and the caller recomputes the rest.
//
// Errors at the API (DESIGN section 10): kNotFound for an unknown sequence or ticket;
// kFailedPrecondition for a released sequence, a double release, or a call in the wrong state
// (the cache remembers the 65,536 ids released last; an id released before them reads as
// unknown, kNotFound, and may be created again);
// kOutOfRange for a token range past the end; kInvalidArgument for malformed arguments;
// kDeadlineExceeded for a deadline already past; kAlreadyExists for a sequence id in use;
// kResourceExhausted when HBM is full of locked and held blocks. On error nothing changes.
// Faults below (I/O errors, a dead remote store, corrupt bytes, deadlines) never fail a call:
// the blocks concerned are reported not resident, counted, and the caller recomputes them.
//
// Thread-safety: every method is thread-safe. Calls that may block are marked; all others
// return without waiting on I/O. Callbacks are never run under the cache's lock.
// Ownership: the cache owns its tiers (moved in with the options); the destructor waits for every
// transfer in flight and must not run inside a Completion callback of the cache's own transfers.
#ifndef KVTIER_KV_CACHE_H_
#define KVTIER_KV_CACHE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/block_key.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/completion.h"
#include "kvtier/cost_model.h"
#include "kvtier/device_block_table.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/ids.h"
#include "kvtier/kv_cache_stats.h"
#include "kvtier/prefix_hasher.h"
#include "kvtier/session_hints.h"
#include "kvtier/tier_backend.h"

namespace kvtier {

enum class WritePolicy : uint8_t {
  kWriteBack = 0,     // copy down only on eviction or Pause
  kWriteThrough = 1,  // copy each written block one tier down at once
};

enum class TierInclusion : uint8_t {
  kInclusive = 0,  // onboarding keeps the lower copy
  kExclusive = 1,  // onboarding drops the lower copy (once no sequence references it)
};

struct KvCacheOptions {
  // The tier backends, index TierIndex; HBM is required (EmulatedHbm or CudaHbm, or any backend
  // with kCapDeviceMemory and a device_pool()), the others optional. All must be built for the
  // namespace's geometry. The cache takes ownership.
  std::array<std::unique_ptr<TierBackend>, kNumTiers> tiers;
  HashAlgorithm hash = HashAlgorithm::kXxh3_128;
  // "lru", "cost_aware", "reuse_index" or "learned" (follow_best of lru and reuse_index: never
  // run by the learned ranking where its shadow loses to LRU; a tier's shadows model a cache of
  // the capacity of the stack down to it, HBM's of HBM, DRAM's of HBM + DRAM, ..., the most
  // distinct blocks those tiers hold), one instance per tier. reuse_index and learned are given
  // each AttachPrefix's prompt blocks, each release's and pause's session signals and each tool
  // wait's Resume (EvictionPolicy::ObserveRequest, ObserveRelease) in every tier.
  std::string eviction_policy = "lru";
  // A policy of the caller's own, in place of `eviction_policy` (not read then) when set. Called
  // during Create only, once per configured tier, top down, with the tier and the blocks of the
  // configured tiers down to it (the most distinct blocks they hold together, what a learned
  // policy's shadows model; 0 where those tiers report no capacity). A null result or an error
  // fails Create (kInvalidArgument, naming the tier, with the error's message). The cache owns what
  // it returns and calls it under the cache's lock, one call at a time (eviction_policy.h's
  // contract).
  std::function<absl::StatusOr<std::unique_ptr<EvictionPolicy>>(Tier tier, int64_t stack_blocks)>
      make_eviction_policy;
  CostAwareOptions cost_aware;    // for "cost_aware"
  ReuseIndexOptions reuse_index;  // for "reuse_index"
  WritePolicy write_policy = WritePolicy::kWriteBack;
  TierInclusion inclusion = TierInclusion::kInclusive;  // kExclusive needs kWriteBack
  // Admission per tier below HBM: uses (attach hits + the first write) a block needs before it
  // is stored there, >= 1. The HBM entry must be 1 (every computed block starts in HBM).
  std::array<int, kNumTiers> admit_after_uses = {1, 1, 1, 1};
  // Demote an evicted block to the next admitting tier instead of dropping it.
  bool demote_on_evict = true;
  // Tier-aware value: demote a victim only if it is worth restoring later. Keeping a copy below
  // is worth p x (recompute - restore), p the policy's chance that the block is used again
  // (EvictionPolicy::ReuseChance), recompute the prefill time of one block (the cost model's,
  // for the first block of a prompt: a lower bound) and restore the time to bring it back from
  // that tier (latency + bytes / bandwidth, the attach's link costs); the demotion's own copy
  // costs bytes / bandwidth. A victim whose value is below that cost is dropped (counted in
  // KvTierStats::value_drops). Without a cost model, only a victim with p = 0 is (a session that
  // moved on, or a class that never came back at that age). A policy without an estimate (lru,
  // cost_aware, learned while it follows lru) demotes as before. The copy is charged because,
  // with write-back, the request that needs the slot waits for it. The test is per block: a
  // shallow block's worth as the way to its descendants' copies below is not counted, so with
  // deep prefixes over slow tiers it may drop too much (docs/performance.md, "Tier-aware value":
  // Mooncake with NVMe, where false did better in the cache replay and worse in the serving
  // simulation, which models link contention and an onboard deadline).
  bool demote_by_value = true;
  // Also copy each written block straight from HBM to the remote tier at once (when it admits
  // it: admit_after_uses[remote]), whatever write_policy does with the tiers between: for a
  // store shared by a fleet (RemoteTier or a MetadataTier over a shared MetadataStore), where a
  // block is worth having there for the other workers' discovery long before this worker would
  // demote it that far. Costs a network copy of every written block. No-op without a remote tier.
  bool publish_to_remote = false;
  // The prefill cost model. Unset: KnownModelCost(namespace model id) at
  // prefill_flops_per_second if the model is known; otherwise no model, and AttachPrefix
  // restores every matched block (except what the last prompt token needs computed).
  std::optional<PrefillCostOptions> prefill_cost;
  double prefill_flops_per_second = 4e14;  // H200 bf16 dense peak (989 TFLOP/s) at ~40% MFU
  // Cost of restoring from each tier into HBM before a measurement exists; index TierIndex, HBM
  // ignored. Defaults: an H200 server (PCIe Gen5 x16 pinned copies, one NVMe Gen4 drive, a
  // 100 Gb/s network).
  std::array<TierLinkCost, kNumTiers> links = {
      TierLinkCost{}, TierLinkCost{absl::Microseconds(10), 50e9},
      TierLinkCost{absl::Microseconds(100), 6e9}, TierLinkCost{absl::Microseconds(500), 12.5e9}};
  // Replace a link's bandwidth with the transfer engine's moving average once it has one.
  bool measure_bandwidth = true;
  // The cache's clock for recency, retention and policy ages; absl::Now when empty. A replay
  // sets the trace's clock. Must be monotonic and thread-safe.
  std::function<absl::Time()> clock;
  int64_t event_buffer = 65536;  // events kept for PollEvents, >= 1
  // This worker's name in the fleet ("host3:gpu1", a data-parallel rank), copied into every
  // event (CacheEvent::worker_id) so a router that merges the events of many workers knows
  // whose cache changed. Any string, at most 256 bytes; empty (the default): none. Interned
  // once at Create (kept by the cache).
  std::string worker_id;
  // How long Append and onboarding wait for demotions to free HBM; at its end droppable blocks
  // are dropped instead, and only HBM full of locked and held blocks is kResourceExhausted.
  // Demotions started to make room must land within it. It also bounds (at least 1 s) every
  // transfer the cache starts with no caller deadline (Resume, Prefetch, Pause, write-through,
  // kAsync without a deadline): a store that never answers holds no staging buffer for ever.
  absl::Duration room_wait = absl::Seconds(10);
  // The transfer engine's staging buffers (block_bytes each, host memory), >= 1. A copy into HBM
  // from a tier that is not host-addressable (NVMe, remote) holds one while it runs, so this
  // also bounds how many of a request's blocks one batched read of such a tier carries.
  int bounce_buffers = 4;
  // Remote discovery: when the local match of a prompt ends before its last full block and the
  // remote tier can probe its store (kCapProbe: RemoteTier), AttachPrefix and Lookup ask the
  // store whether it holds the next remote_probe_window_blocks blocks of the prompt's chain, in
  // one batched existence probe (one round trip) that waits at most remote_probe_timeout. The
  // leading run of blocks found extends the match (AttachPrefix indexes them as remote copies,
  // onboarded like any other tier's; Lookup only reports them). A probe that fails or times
  // out ends the match there and never fails the call. 0 turns discovery off; at most 4096.
  // Without a probe-capable remote tier (none, or a MetadataTier) nothing is probed.
  int remote_probe_window_blocks = 32;
  absl::Duration remote_probe_timeout = absl::Milliseconds(20);  // > 0 and finite
};

struct SequenceOptions {
  // Identity extras: blocks computed under other extras never match (prefix_hasher.h).
  std::optional<AdapterIdentity> adapter;
  std::optional<std::string> tenant_salt;
  std::vector<MultimodalItem> multimodal;  // absolute token positions of the whole sequence
  // Retention: while it lasts, the blocks this sequence released count as retention_priority
  // more valuable (eviction_policy.h). It lasts `retention` from the release.
  double retention_priority = 0;  // >= 0
  absl::Duration retention = absl::ZeroDuration();
  // The agent session (conversation) this request belongs to; 0: none. Not part of the blocks'
  // identity (two sessions share their common prefix): it tells the eviction policy whose
  // return a released block waits for (session_hints.h, eviction_policy.h reuse_index).
  uint64_t session = 0;
  // false: prefix caching is off for this sequence (vLLM's per-request caching off): its blocks
  // are never indexed, so no other request shares them and they are freed when it lets them go;
  // AttachPrefix attaches nothing to it; it cannot be paused (its blocks could not move down).
  bool enable_caching = true;
  // true: this request re-admits one the scheduler preempted (ReleaseHints::preempted): what it
  // attaches is its own KV coming back, counted as KvCacheStats::readmitted_blocks, not as hits,
  // and not told to the policy as a reuse: no request is observed and no lower copy touched
  // (cost_aware, which counts a Remove not after Victim as a reuse, still counts the HBM copies
  // the attach takes out of candidacy as one).
  bool readmission = false;
};

// How a call that needs free HBM slots (Append, Fork, Truncate) behaves while HBM is short.
enum class RoomWait : uint8_t {
  // Evict, and wait up to KvCacheOptions::room_wait for demotions to land.
  kWait = 0,
  // Never block: evict what frees a slot at once and start the demotions that will free the
  // rest, without waiting for them; kResourceExhausted (nothing of the sequence changed) while
  // the slots are not free yet, so a scheduler tries again at a later step (as vLLM's
  // allocate_slots answers "no"). CheckRoom tells in advance.
  kNever = 1,
};

// Whether HBM has room for a request now (KvCache::CheckRoom): read from counters, without
// evicting, moving or waiting. All counts are HBM slots (blocks).
struct RoomCheck {
  int64_t needed_slots = 0;  // new slots the request takes beyond what its sequence holds
  int64_t free_slots = 0;    // free now
  // Cached blocks nobody holds: eviction frees them (dropped, or once their demotion lands).
  // Less those a ticket locks and those a transfer is reading now.
  int64_t evictable_slots = 0;
  int64_t demotions_in_flight = 0;  // out of HBM: each frees its slot when it lands
  // needed <= free: an Append with RoomWait::kNever succeeds now.
  bool fits_now = false;
  // needed <= free + evictable + demotions in flight + slots only a running kernel's write holds
  // (a released sequence's partial block, or any block of a released sequence with caching off,
  // until its ReportWritten `ready` fires): it fits once evictions land and those kernels
  // complete. Append does not wait for the kernels (the caller may be the one to fire `ready`):
  // until they complete it may answer kResourceExhausted, naming them.
  bool fits_after_evictions = false;
  // Slots neither eviction nor a running kernel's completion frees: what running sequences or
  // tickets must let go first (preemption).
  int64_t missing_slots = 0;
};

// What is known, when a request finishes, about its session's next request (session_hints.h).
struct ReleaseHints {
  StopReason stop_reason = StopReason::kUnknown;
  // About how long until the session's next request (a tool's expected run time), if known;
  // >= 0 and finite.
  std::optional<absl::Duration> expected_idle;
  // The scheduler preempted the request (it will come back as a readmission): counted in
  // KvCacheStats::preemptions, whatever the HintOutcome. Not the session letting go: reuse_index
  // learns nothing of the session's return from it (eviction_policy.h ReleaseObservation).
  bool preempted = false;
  // The session sends no further request: an agent framework knows this when a sub-agent's
  // turn ends (kEndTurn: its result goes back to the parent agent) or a conversation is closed.
  // reuse_index ranks the released blocks first to go, as those of a session that moved on, and
  // gives them no reuse chance (so demote_by_value drops them rather than demote them); blocks
  // another sequence holds or reads stay, as does one a request reads after (any session's), a
  // block another session released before (a shared prefix) keeps that session's rank, and a
  // later request of the session is served as any. Not used for a preempted request, nor while
  // a later request of the session is live or after one let go (a superseded release).
  // lru and cost_aware ignore it. With an expected_idle too, the estimate is not used.
  bool last_turn = false;
};

// What is known when a sequence pauses (KvCache::Pause).
struct PauseHints {
  // About how long the sequence will be idle (a tool's expected run time), if known; >= 0 and
  // finite.
  std::optional<absl::Duration> expected_idle;
  // The scheduler swapped the request out to make room (vLLM's swap preemption): it resumes when
  // there is room again, not when the session's next request comes. Counted in
  // KvCacheStats::preemptions, whatever the HintOutcome. reuse_index learns nothing of the
  // session's return from the pause or from its Resume (a readmission); the blocks wait for the
  // Resume, as a preempted release's do (ReleaseObservation::preempted). Not preempted: an agent
  // waiting on a tool (stop reason kToolUse), whose Resume is the session's next request.
  bool preempted = false;
};

// A prompt with the keys of its full blocks, hashed once (KvCache::HashPrompt) for the calls that
// need them: LookupHashed and AttachHashedPrefix. A server that looks a prompt up before attaching
// it (admission, routing over several caches) pays for the hashing once. It holds a copy of the
// tokens and one 16-byte BlockKey per full block, and remembers what the keys were computed
// under: the namespace digest, the hash algorithm and the identity extras (adapter, tenant salt,
// multimodal items). A cache whose namespace or algorithm differs rejects it, and AttachPrefix
// rejects it for a sequence of another identity: its keys would name other blocks.
// Thread-safety: immutable once made; copyable.
class HashedPrompt {
 public:
  HashedPrompt() = default;  // an empty prompt, which every call taking one rejects
  absl::Span<const int32_t> tokens() const { return tokens_; }
  // keys()[i] is the key of block i (tokens [i * B, (i + 1) * B)); floor(tokens / B) of them.
  absl::Span<const BlockKey> keys() const { return keys_; }

 private:
  friend class KvCache;
  std::vector<int32_t> tokens_;
  std::vector<BlockKey> keys_;
  std::array<uint8_t, 16> namespace_digest_{};
  HashAlgorithm algorithm_ = HashAlgorithm::kXxh3_128;
  BlockExtras extras_;
};

// Side-effect-free answer to "how much of this prompt is cached, where".
struct PrefixLookup {
  int64_t matched_tokens = 0;  // longest cached prefix, whole blocks, clamped to the query
  // Matched blocks by the fastest tier holding a ready copy (index TierIndex). Blocks remote
  // discovery found in the store count as remote blocks.
  std::array<int64_t, kNumTiers> blocks_by_tier{};
  // Of the matched blocks, those remote discovery found in the store (not in the index).
  int64_t discovered_blocks = 0;
};

struct AttachResult {
  int64_t matched_tokens = 0;   // longest cached prefix of the prompt
  int64_t attached_tokens = 0;  // tokens now in the sequence: prefill starts here
  // Attached blocks by the tier they were in at attach time (index TierIndex). Those not in
  // HBM are onboarded by EnsureResident (or Resume).
  std::array<int64_t, kNumTiers> attached_blocks_by_tier{};
  RestorePlan plan;  // the cost model's plan; plan.restore_blocks * B == attached_tokens
};

struct KvAppendResult {
  int64_t first_sealed_block = 0;  // blocks that became full: keyed, shareable once written
  int64_t num_sealed_blocks = 0;
  int64_t num_new_slots = 0;  // HBM slots allocated
};

enum class ResidencyMode : uint8_t {
  kWait = 0,        // onboard, and block until every block is resident or the deadline passes
  kBestEffort = 1,  // never wait or move bytes: report what is resident now, the rest not
  kAsync = 2,       // onboard, return at once; the ticket's completion fires when done
};

struct EnsureResidentOptions {
  absl::Time deadline = absl::InfiniteFuture();
  ResidencyMode mode = ResidencyMode::kWait;
};

enum class BlockResidency : uint8_t {
  kResident = 0,  // in HBM, pinned by the ticket
  // Being onboarded: kAsync before the completion fires, or a block of which some layer had
  // landed, or that a stream waited on, at the deadline (EnsureResident); its slot holds only
  // the layers ready.
  kPending = 1,
  kNotResident = 2,  // could not be made resident: recompute it
};

namespace internal {
struct TicketState;
class EventHub;
}  // namespace internal

// The outcome of EnsureResident. A cheap copyable handle; copies share one ticket. The ticket's
// blocks stay pinned in HBM until KvCache::ReleaseTicket or until its last copy is destroyed,
// whichever comes first (RAII: a dropped ticket never pins HBM for good). A ticket may outlive
// its cache; its accessors then still answer, and its destruction does nothing.
// Thread-safety: every method is thread-safe. For kAsync, block_table() and the statuses are
// final only once completion() has fired (a block that fails then shows slot -1).
class ResidencyTicket {
 public:
  ResidencyTicket() = default;  // an invalid ticket (valid() false)

  bool valid() const { return state_ != nullptr; }
  uint64_t id() const;
  SequenceId sequence() const;
  int64_t begin_token() const;
  int64_t end_token() const;
  // The device block table of blocks [begin_token / B, ceil(end_token / B)), as it stands now
  // (a copy, taken under the ticket's lock: a kAsync ticket's onboards change it). A block
  // being onboarded has its destination slot from the moment its copy into HBM is planned on a
  // layer-wise HBM tier (kCapLayerwise), else from when it lands; -1 while it has none, and for
  // good once it is reported kNotResident. A slot may be read only for the layers that are
  // ready (layer_ready, EnqueueStreamWait): once layer_ready(l) has fired OK, the table is the
  // one layer l's kernel reads.
  DeviceBlockTable block_table() const;
  // Fires OK when every block of the range is resident; kUnavailable naming the first block
  // that is not otherwise (its cause in block_error).
  Completion completion() const;

  // Layer-wise readiness (the model of LMCache's and vLLM's layer-wise KV connectors): the
  // number of layers of the cache's geometry, and a Completion that fires OK once layer `layer`
  // of every block of the range is in HBM, so the attention kernel of that layer can run while
  // later layers are still in transfer. Layers land in order within a block, so layer_ready(l)
  // OK implies every layer below l is ready. It fires kUnavailable (naming the block and the
  // cause) as soon as some block's layer cannot be made resident. Every layer_ready has fired by
  // the time completion() fires. Where the HBM tier cannot report layers (no kCapLayerwise: a
  // metadata tier) or a block joined an onboard started without it, that block's layers all land
  // together when the block does. A layer outside [0, num_layers()): a Completion that has
  // fired kOutOfRange. An invalid ticket: kInvalidArgument.
  int num_layers() const;
  Completion layer_ready(int layer) const;

  // Makes the CUDA stream `cuda_stream` (a cudaStream_t; nullptr is the legacy default stream)
  // wait, on the device, until layer `layer` (kAllLayers: every layer) of every block of the
  // range is in HBM, so a kernel queued on it after this call reads landed KV with no host wait
  // for the copies (cudaStreamWaitEvent on the HBM tier's per-layer events, LayerProgress). The
  // host waits only for what the GPU cannot be told to wait for yet: a block whose copy has not
  // been queued on the HBM tier's copy stream (still being read from NVMe or a store), until
  // its copy is queued or it lands, at most until `deadline`. On a tier without device fences
  // (EmulatedHbm) the host waits until the layer has landed, and the stream is not touched.
  // Thread-safe. Errors: kInvalidArgument for an invalid ticket; kOutOfRange for a layer outside
  // [0, num_layers()) other than kAllLayers; kUnavailable naming the block when a block of the
  // range cannot be made resident (the caller recomputes it; ordering for the others may be
  // partly enqueued); kDeadlineExceeded when the deadline passes first; the CUDA error as
  // kUnavailable if the runtime refuses the wait.
  static constexpr int kAllLayers = -1;
  absl::Status EnqueueStreamWait(void* cuda_stream, int layer = kAllLayers,
                                 absl::Time deadline = absl::InfiniteFuture()) const;
  std::vector<BlockResidency> block_status() const;
  // OK for a resident block; the cause for the others (kDeadlineExceeded, kDataLoss, ...).
  absl::Status block_error(int64_t index) const;
  // Tokens of the range covered by its leading resident blocks, in [0, end - begin].
  int64_t resident_tokens() const;

 private:
  friend class KvCache;
  explicit ResidencyTicket(std::shared_ptr<internal::TicketState> state)
      : state_(std::move(state)) {}
  std::shared_ptr<internal::TicketState> state_;
};

// What Fork returns when the fork point is inside a block (copy-on-write, case TR-2): the caller
// must copy the KV of the first `num_tokens` token positions of HBM slot `src` (the parent's
// block) into HBM slot `dst` (the child's own, private block), all layers, before the attention
// kernel reads `dst`, and must issue it before anything that could free `src`: a Release or Pause
// of the parent, after which the cache may free or evict that block (the engine enqueues the copy
// on its copy stream at once; stream order then protects `src`, as with vLLM's copy-on-write
// pairs). Slot ids are HBM slot indices, as in a ResidencyTicket's device block table.
struct BlockCopy {
  SlotId src;
  SlotId dst;
  int num_tokens = 0;  // in [1, tokens_per_block)
};

// A snapshot of one sequence.
struct SequenceInfo {
  int64_t num_tokens = 0;
  int64_t written_tokens = 0;  // reported by ReportWritten (or attached)
  int64_t num_blocks = 0;
  // Where the sequence's references are, blocks per tier (index TierIndex).
  std::array<int64_t, kNumTiers> blocks_by_tier{};
  bool paused = false;
};

// A subscription to a cache's events (KvCache::SubscribeEvents). RAII: destroying it (or
// Unsubscribe, or assigning over it) ends the subscription: no call of its callback starts
// afterwards, and a call running on another thread has returned by then. From inside its own
// callback it ends without waiting. It may outlive its cache (it then only lets go).
// State machine: active (from SubscribeEvents) -> inactive (unsubscribed, moved from, or
// default-constructed); movable, not copyable.
// Thread-safety: not thread-safe itself (one owner); its callback runs on cache threads.
class EventSubscription {
 public:
  EventSubscription() = default;  // inactive
  EventSubscription(EventSubscription&& other) noexcept;
  EventSubscription& operator=(EventSubscription&& other) noexcept;
  EventSubscription(const EventSubscription&) = delete;
  EventSubscription& operator=(const EventSubscription&) = delete;
  ~EventSubscription();

  bool active() const { return hub_ != nullptr; }
  // The sequence number of the first event delivered to it: every event numbered from it on
  // goes to the callback, none before. PollEvents(first_sequence() - 1) returns the same events
  // (while the ring still holds them).
  uint64_t first_sequence() const { return first_sequence_; }
  // Ends the subscription (see the class comment); nothing if inactive.
  void Unsubscribe();

 private:
  friend class KvCache;
  EventSubscription(std::shared_ptr<internal::EventHub> hub, uint64_t id, uint64_t first_sequence);
  std::shared_ptr<internal::EventHub> hub_;
  uint64_t id_ = 0;
  uint64_t first_sequence_ = 0;
};

// Receives a batch of events: consecutive sequence numbers, oldest first. The span is valid only
// during the call (copy the events to keep them).
using CacheEventCallback = std::function<void(absl::Span<const CacheEvent>)>;

class KvCache {
 public:
  // Errors: kInvalidArgument for a missing HBM tier, a tier at the wrong index or built for
  // another block size, an HBM tier without a device pool or whose pool (if it has addresses) is
  // not shaped as ns's geometry in ns's hbm_layout (layers, block, token and head strides: a
  // stack built for another namespace), an unknown eviction policy or bad
  // cost_aware or reuse_index options, kExclusive with kWriteThrough, admit_after_uses < 1 (or != 1
  // for HBM), a prefill_cost or link that is not positive and finite, event_buffer < 1, a worker_id
  // over 256 bytes, room_wait < 0, bounce_buffers < 1; PrefixHasher's errors; kResourceExhausted if
  // the bounce buffers cannot be allocated; remote_probe_window_blocks outside [0, 4096] or a
  // remote_probe_timeout that is not positive and finite (with a window > 0).
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const CacheNamespace& ns,
                                                         KvCacheOptions options);
  ~KvCache();

  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // ---- Sequences

  // A new, empty sequence. Errors: kInvalidArgument for an invalid id, bad extras (see
  // PrefixHasher::AppendBlockKeys) or a negative retention priority or duration;
  // kAlreadyExists if `id` is live.
  absl::Status CreateSequence(SequenceId id, const SequenceOptions& options = {});

  // Phase 1 pins every block of the prompt's longest cached prefix (in whichever tier holds it;
  // a pinned block cannot be evicted, so evictions caused by this request never take its own
  // hits); phase 2 plans restore versus recompute and keeps the leading blocks worth restoring,
  // unpinning the rest. The sequence then holds those blocks' tokens; the caller Appends the
  // remaining prompt tokens and computes them. At least the prompt's last token is left to
  // compute. Blocks below HBM are onboarded by EnsureResident. Counts the query in the stats (a
  // sequence with caching off attaches nothing and is not counted).
  // Where the local match ends early, remote discovery (KvCacheOptions::remote_probe_*) first
  // asks the store for the next blocks, the cache lock released meanwhile: blocks found are
  // indexed as ready remote copies (each taking a free remote slot, or one the remote tier's
  // eviction frees, else discovery stops) and attached like any other. May block up to
  // remote_probe_timeout for that probe; its failure only ends the match.
  // Errors: kNotFound for an unknown sequence; kFailedPrecondition if released or not empty
  // (also if it was released, or created again, during the probe);
  // kInvalidArgument if the prompt is empty or its extras do not fit it.
  absl::StatusOr<AttachResult> AttachPrefix(SequenceId id, absl::Span<const int32_t> prompt);
  // AttachPrefix with the keys hashed before (HashPrompt), remote discovery included: nothing is
  // hashed again. Errors as
  // AttachPrefix's, and kInvalidArgument if `prompt` was hashed under another namespace,
  // algorithm or identity than the sequence's.
  absl::StatusOr<AttachResult> AttachHashedPrefix(SequenceId id, const HashedPrompt& prompt);

  // Appends tokens: fills the partial last block, takes HBM slots for the rest (evicting and
  // demoting droppable blocks as needed), seals every block that becomes full and keys it.
  // All or nothing. May block up to room_wait while demotions free HBM (or copies down, e.g.
  // write-through, whose blocks are droppable once they land).
  // Errors: kNotFound / kFailedPrecondition for an unknown / released sequence; kInvalidArgument
  // for an empty span or bad extras; kResourceExhausted if HBM has no room (every slot locked or
  // held).
  // `wait`: RoomWait::kNever never blocks (kResourceExhausted while HBM is short).
  absl::StatusOr<KvAppendResult> Append(SequenceId id, absl::Span<const int32_t> tokens,
                                        RoomWait wait = RoomWait::kWait);

  // The KV of tokens [0, num_tokens) is in HBM once `ready` fires (the kernel's completion; LT-3:
  // nothing reads those blocks before). Full blocks inside that range become readable: indexed
  // in HBM (matchable by other requests), and with write-through copied down. A `ready` that
  // fails leaves them unindexed. Until `ready` fires, the slots it writes stay allocated even if
  // the ticket and the sequence are let go at once (the loop above): full blocks as pending
  // copies, the partial last block (every block, with caching off) locked.
  // Errors: kNotFound / kFailedPrecondition as above; kOutOfRange if
  // num_tokens > the sequence's tokens; kInvalidArgument if it is below what was reported before.
  absl::Status ReportWritten(SequenceId id, int64_t num_tokens,
                             Completion ready = Completion::Done(absl::OkStatus()));
  // The kernel's CUDA event (a cudaEvent_t recorded on its stream after it wrote the KV) as a
  // Completion for ReportWritten: it fires once the GPU reaches the event as recorded now (the
  // caller may record or destroy its event again at once), with kUnavailable and the CUDA error
  // text if the device reports one. No host thread of the caller waits. Thread-safe.
  // Errors: kInvalidArgument for a null event; kUnimplemented when the HBM tier's copies run on
  // no GPU stream (EmulatedHbm, a metadata tier: use a Completion the caller fires instead);
  // kUnavailable when the CUDA runtime refuses the event.
  absl::StatusOr<Completion> CompletionOfCudaEvent(void* cuda_event);

  // A new sequence `child` with `parent`'s first num_tokens tokens and its options. Full blocks
  // are shared; a partial last block gets a fresh HBM slot and the returned BlockCopy, which the
  // caller performs before a kernel reads the child's last block (copy-on-write, case TR-2).
  // A copy from a full block of the parent: the child keeps that block referenced until its
  // next Append, ReportWritten, Truncate or Release, so `src` cannot be freed before the copy is
  // issued even if the parent lets it go; a copy from the parent's partial last block needs the
  // parent to keep it (not Release or Truncate it) until then. Shared blocks are the parent's as
  // they are: ones the parent reported written whose `ready` has not fired are already resident
  // for the child (same slots; ordering the child's kernels after that write is the caller's).
  // Errors: kNotFound / kFailedPrecondition for the parent; kAlreadyExists if `child` is live;
  // kInvalidArgument for an invalid child id; kOutOfRange if num_tokens < 0 or past the parent's
  // end; kFailedPrecondition if the block to copy is not in HBM (make it resident first);
  // kResourceExhausted if HBM has no slot for the copy (at once with RoomWait::kNever).
  absl::StatusOr<std::optional<BlockCopy>> Fork(SequenceId parent, SequenceId child,
                                                int64_t num_tokens,
                                                RoomWait wait = RoomWait::kWait);

  // Cuts the sequence back to its first num_tokens tokens (rejected speculative tokens, a beam
  // pruned): references to blocks wholly past the cut are let go (cached blocks stay cached for
  // others, private ones are freed), written tokens are clipped to it. A cut inside a full
  // block gives the sequence a fresh HBM slot for its new partial last block and returns the
  // BlockCopy of the block's first num_tokens % B positions, which the caller performs before a
  // kernel reads the slot (as Fork's); the cut block stays referenced by the sequence until its
  // next Append, ReportWritten, Truncate or Release, so `src` cannot be freed before the copy
  // is issued. A cut inside the partial last block, or at a block boundary, moves nothing.
  // Errors: kNotFound / kFailedPrecondition for an unknown / released sequence; kOutOfRange if
  // num_tokens < 0 or past the sequence's end; kFailedPrecondition if the cut block is not in
  // HBM (make it resident first); kResourceExhausted if HBM has no slot for the copy.
  absl::StatusOr<std::optional<BlockCopy>> Truncate(SequenceId id, int64_t num_tokens,
                                                    RoomWait wait = RoomWait::kWait);

  // Whether `num_new_tokens` more tokens of sequence `id` fit in HBM now (RoomCheck), or, for
  // a request not yet created, `num_slots` new blocks. Never blocks on transfers; takes the
  // cache lock briefly (O(HBM slots) while a residency ticket is open, else O(copies in flight)).
  // Errors: kNotFound / kFailedPrecondition as Append; kInvalidArgument for a negative count.
  absl::StatusOr<RoomCheck> CheckRoom(SequenceId id, int64_t num_new_tokens) const;
  absl::StatusOr<RoomCheck> CheckRoom(int64_t num_slots) const;

  // Drops the sequence. Its written full blocks stay cached (droppable) in their tiers; the
  // partial block and blocks never written are freed. Its tickets stay valid until released.
  // Errors: kNotFound for an unknown id; kFailedPrecondition for a second release.
  absl::Status Release(SequenceId id);
  // Release, with what is known of the session's next request: the policy ranks the released
  // blocks by when the session is expected back (reuse_index learns what each stop reason and
  // idle estimate is worth; lru and cost_aware ignore both). The release itself happens whatever
  // the hints are. Outcome: kAccepted; kRejected for a sequence without a session (nothing to
  // tie the hint to) or with caching off (SequenceOptions::enable_caching: its blocks are shared
  // with nobody, so no hint is taken and the session remembers nothing of it), for an
  // expected_idle that is negative or infinite, or for a stop_reason that is no StopReason (a
  // newer caller's: released as kUnknown, and no policy sees the value) (the other hints are
  // then still taken, as the next rule allows); kClipped for last_turn given with preempted (the
  // request comes back) or while a later request of the session is live or after one let go
  // (created or forked after this one: the session goes on), where last_turn is not used and an
  // expected_idle is, and otherwise for an expected_idle given with last_turn (the estimate is not
  // used; last_turn is). Where a rejection and a clip apply, the answer is kRejected. blocks = the
  // written full blocks released. Errors: as Release.
  absl::StatusOr<HintOutcome> Release(SequenceId id, const ReleaseHints& hints);

  // ---- Hints

  // The sequence will be idle for about `expected_idle` (an agent waiting on a tool: stop reason
  // kToolUse). The policy ranks its HBM copies, droppable from now on, by it as by a Release's
  // hints (for a sequence with a session). Its
  // written full blocks get a copy one tier down (started now, if missing; further down where
  // that tier has no room now, as when its own victims are still being demoted), and the
  // sequence's references move there, so its HBM copies become droppable: kept while HBM has
  // room, evicted without loss when it does not. A block no lower tier has room for now stays
  // held in HBM until Resume. A Pause while its Resume still onboards leaves the references
  // where they are (the landing onboards do not move them back to HBM). Errors: as Release;
  // kInvalidArgument for a negative duration; kFailedPrecondition if already paused.
  // kFailedPrecondition too for a sequence with enable_caching false. The same as
  // Pause(id, PauseHints{.expected_idle = expected_idle}) but for the negative estimate (an error
  // here, a rejected hint there); an infinite one is taken as no estimate.
  absl::Status Pause(SequenceId id, absl::Duration expected_idle);
  // Pause, with what is known of the pause: a tool wait or the scheduler's swap preemption
  // (PauseHints::preempted). The pause itself
  // happens whatever the hints are. Outcome: kAccepted; kRejected for a sequence without a
  // session (nothing to tie the hint to; a preemption is still counted), or for an expected_idle
  // that is negative or infinite (the pause happens without it). blocks = the written full
  // blocks paused. Errors: kNotFound for an unknown id; kFailedPrecondition if already paused or
  // for a sequence with enable_caching false.
  absl::StatusOr<HintOutcome> Pause(SequenceId id, const PauseHints& hints);
  // Ends a pause and starts onboarding the sequence's blocks into HBM. The Completion fires when
  // they are resident (OK) or not all could be (kUnavailable naming the first: e.g. HBM was full
  // of held blocks); the caller may ignore it and EnsureResident later. May block up to
  // room_wait while demotions free HBM; never waits for the onboarding itself. After a tool
  // wait (not PauseHints::preempted), the policy hears the session is back
  // (RequestObservation::resumed): the return reuse_index learns the stop reason's idle time from;
  // not when a later request of the session is live or has let go (that request was the return).
  // Errors: as Release; kFailedPrecondition if not paused.
  absl::StatusOr<Completion> Resume(SequenceId id);
  // Starts onboarding the cached prefix of a future request (found as AttachPrefix would) into
  // HBM as droppable blocks. Returns the number of blocks whose onboarding started.
  // Errors: kInvalidArgument for bad extras.
  absl::StatusOr<int64_t> Prefetch(absl::Span<const int32_t> tokens,
                                   const SequenceOptions& identity = {});
  // Retain (vLLM's KV-hint "retain"; SGLang keeping hinted prompts): the cached leading blocks of
  // `tokens` (hashed under `identity`, matched as AttachPrefix would, and also through blocks a
  // kernel is still writing, ReportWritten before its `ready` fired: retained as they land; the
  // outcome counts them as cached) count as retention
  // priority `priority` more valuable for `ttl` from now (eviction_policy.h: lru keeps them as if
  // used priority x 30 min later, cost_aware scales its rank by 1 + priority, reuse_index ranks
  // them above every block without retention whose index is below the priority, even where it
  // infers their session moved on, and demotes them rather than drop them).
  // It orders eviction only: a retained block is still evicted when nothing else can go. A later
  // release of a sequence with its own retention overrides it. Outcome: kAccepted, blocks = the
  // prompt's full blocks; kClipped when only the first `blocks` of them are cached; kRejected for
  // priority < 0 or not finite, or ttl <= 0 (nothing changes). Errors: kInvalidArgument for bad
  // extras (HashPrompt's).
  absl::StatusOr<HintOutcome> RetainPrefix(absl::Span<const int32_t> tokens, double priority,
                                           absl::Duration ttl,
                                           const SequenceOptions& identity = {});
  // Invalidate (a context compaction: these blocks will not be read again): the blocks of
  // `tokens` from block floor(from_token / B) on are dropped from every tier now, deepest first,
  // where nobody holds or reads them and no cached child outside them needs them (a child with a
  // copy in any tier keeps its parent's last copy); the blocks before stay (a shared system
  // prompt, the kept part of the context). A copy in a shared remote store that this cache has
  // indexed is deleted too; one another worker published that this cache never found stays
  // there (a later remote probe may find it again).
  // Outcome: kAccepted, blocks = the blocks dropped from every tier;
  // kClipped when some kept a copy (reason: how many, and why); kRejected for from_token < 0.
  // Errors: kInvalidArgument for bad extras.
  absl::StatusOr<HintOutcome> InvalidatePrefix(absl::Span<const int32_t> tokens, int64_t from_token,
                                               const SequenceOptions& identity = {});
  // The same two hints for a session (SequenceOptions::session) instead of a token range: they
  // act on the blocks its latest released or paused request had written (the cache remembers
  // them at Release and Pause, for up to kRememberedSessions sessions and
  // kRememberedSessionBlocks blocks over all, forgetting the oldest first). A release (or Pause)
  // made while a later request of the session is live, or after one let go (superseded: that
  // request holds the session's context now) changes nothing remembered; the later one is
  // remembered when it lets go. RetainSession: as RetainPrefix over those blocks (kClipped when
  // only the first `blocks` are cached). InvalidateSession: as InvalidatePrefix from the first
  // block, then forgets the session; the leading blocks another remembered session's prompt starts
  // with stay (a shared system prompt, a conversation forked from this one), as do blocks held,
  // read, or with a child copy (kClipped). A prompt of no session, or of one forgotten, is not
  // known to share them. Outcome kRejected, nothing changed, for session 0, a session with no
  // remembered request, or (RetainSession) bad priority or ttl. Never fails a request and never
  // makes a block visible. Errors: none today (the StatusOr is for the API's future). Thread-safe.
  static constexpr int64_t kRememberedSessions = 65536;
  static constexpr int64_t kRememberedSessionBlocks = int64_t{1} << 22;  // 64 MiB of keys
  absl::StatusOr<HintOutcome> RetainSession(uint64_t session, double priority, absl::Duration ttl);
  absl::StatusOr<HintOutcome> InvalidateSession(uint64_t session);

  // ---- ensure-resident

  // Makes blocks [begin_token / B, ceil(end_token / B)) of the sequence resident in HBM and pins
  // them until ReleaseTicket (begin_token == end_token: no block, an empty table). Blocks not
  // resident by the deadline (or failing to load) are reported kNotResident with their cause
  // (kDeadlineExceeded, the load's error) and slot -1, never silently missing; an onboard still
  // running at the deadline goes on, and its block lands for the sequence (a later call finds it
  // resident) but is not pinned by this ticket; one not yet started by then (waiting for a staging
  // buffer) gives up. A store read waits at most until the deadline (room_wait's bound without
  // one). A block whose HBM copy another sequence's kernel is still writing (ReportWritten before
  // its `ready` fired) waits for that write and then shares its slot; if the write fails, it is
  // onboarded from its own copy below. kWait blocks until done or the deadline; a kAsync ticket
  // completes by its deadline, except that a block of which some layer has landed by then is not
  // given up: its copy into HBM has started and is not cut, and a kernel may already read its
  // landed layers, so it stays kPending until it lands (pinned then) or fails; the same for a block
  // a stream waits on (EnqueueStreamWait). A kWait call returns at the deadline even then, with
  // such a block still kPending (its completion fires when it lands). Layer by layer:
  // ResidencyTicket::layer_ready. Errors: kNotFound / kFailedPrecondition for the sequence;
  // kInvalidArgument if begin_token > end_token or begin_token < 0; kOutOfRange if end_token is
  // past the sequence's tokens; kDeadlineExceeded if the deadline has already passed.
  absl::StatusOr<ResidencyTicket> EnsureResident(SequenceId id, int64_t begin_token,
                                                 int64_t end_token,
                                                 const EnsureResidentOptions& options = {});
  // Unpins the ticket's blocks (those still onboarding are unpinned when they land), before its
  // last copy goes (which would release it too).
  // Errors: kInvalidArgument for an invalid ticket; kNotFound for a ticket of another cache;
  // kFailedPrecondition for a second release.
  absl::Status ReleaseTicket(const ResidencyTicket& ticket);

  // ---- Lookups, stats, events (no side effects)

  // Hashes `tokens` under `identity` (its extras; retention fields are ignored) into the keys
  // LookupHashed and AttachHashedPrefix use. Costs what AttachPrefix's hashing costs (chained
  // XXH3-128 or SHA-256 per full block, prefix_hasher.h); takes no lock.
  // Errors: kInvalidArgument for bad extras or too many tokens (PrefixHasher::BlockKeys).
  absl::StatusOr<HashedPrompt> HashPrompt(absl::Span<const int32_t> tokens,
                                          const SequenceOptions& identity = {}) const;

  // Remote discovery (KvCacheOptions::remote_probe_*) probes the store where the local match
  // ends, as AttachPrefix does, and reports the leading blocks found as remote blocks
  // (discovered_blocks) without indexing them: Lookup changes nothing but the probe counters.
  // May block up to remote_probe_timeout. Errors: kInvalidArgument for bad extras.
  absl::StatusOr<PrefixLookup> Lookup(absl::Span<const int32_t> tokens,
                                      const SequenceOptions& identity = {}) const;
  // Lookup of a prompt hashed before (probing as Lookup does). Errors: kInvalidArgument if it
  // was hashed under another namespace or algorithm.
  absl::StatusOr<PrefixLookup> LookupHashed(const HashedPrompt& prompt) const;
  // Errors: kNotFound / kFailedPrecondition for an unknown / released sequence.
  absl::StatusOr<SequenceInfo> GetSequence(SequenceId id) const;
  KvCacheStats stats() const;
  // Drops every droppable cached copy of `tier`, or of every tier (nullopt): no sequence holds
  // it, no ticket locks it, no transfer reads it and no demotion is taking it away (vLLM's
  // reset_prefix_cache). Held and busy copies stay. A dropped remote copy is deleted from the
  // store too (other workers lose it). Emits kRemoved per copy, then one kAllCleared per tier
  // cleared. Returns how many copies were dropped. Errors: kInvalidArgument for a tier the cache
  // does not have.
  absl::StatusOr<int64_t> ResetPrefixCache(std::optional<Tier> tier = std::nullopt);
  // Events with sequence number > after_sequence, oldest first, at most max_events. If the
  // first has a number above after_sequence + 1, events were dropped (see kv_cache_stats.h).
  std::vector<CacheEvent> PollEvents(uint64_t after_sequence, size_t max_events = 4096) const;
  // Calls `callback` with every event made from now on (numbered from the returned
  // subscription's first_sequence(), each exactly once, in order; the events PollEvents returns,
  // but never dropped by the ring), until the subscription ends. PollEvents keeps working
  // alongside.
  //
  // When and where: outside the cache's lock, one call per lock hold that made changes (usually
  // one per cache call: an Append's evictions, a ReportWritten's stored blocks), on the thread
  // that made them: the caller's thread for a cache call, before that call returns; the thread
  // running a transfer's completion (an engine or backend thread) for a copy that lands later (a
  // demotion, an onboard, write-through) or a kernel `ready` that fires later. One thread
  // delivers at a time: while another delivers, a call waits for it (its events then come on
  // that thread, still before the call returns). So a slow callback slows every cache call that
  // changes blocks; keep it short (copy the events into a queue).
  //
  // What a callback may do: call PollEvents, stats(), GetSequence, CheckRoom, HashPrompt,
  // CheckInvariants, SubscribeEvents and end any subscription (its own too) of this cache or
  // another; these do not deadlock. It must not call methods that change blocks or wait
  // (AttachPrefix, Append, ReportWritten, Release, EnsureResident, WaitIdle, ...), destroy the
  // cache, block on a lock the application holds around its cache calls, or throw.
  // Errors: kInvalidArgument for an empty `callback`.
  absl::StatusOr<EventSubscription> SubscribeEvents(CacheEventCallback callback);

  // Blocks until no transfer started by the cache is in flight, or the deadline passes
  // (kDeadlineExceeded). For tests, benchmarks and orderly shutdown.
  absl::Status WaitIdle(absl::Time deadline = absl::InfiniteFuture()) const;
  // Checks every internal invariant: per tier free + used + quarantined == capacity; every
  // reference the cache's sequences and tickets hold matches the slot reference counts; the
  // index agrees with the tiers; eviction candidates are exactly the droppable leaves. kInternal
  // naming the first violation. O(blocks); for tests and fuzzing.
  absl::Status CheckInvariants() const;

  const CacheNamespace& cache_namespace() const;
  const PrefixHasher& hasher() const;

 private:
  struct Impl;
  explicit KvCache(std::unique_ptr<Impl> impl);
  // kInvalidArgument naming `call` if `prompt` was hashed under another namespace or algorithm.
  absl::Status CheckHashedHere(const HashedPrompt& prompt, const char* call) const;
  // Lookup's body once the keys are hashed: the index's match, extended by remote discovery.
  absl::StatusOr<PrefixLookup> LookupKeys(absl::Span<const BlockKey> keys,
                                          int64_t num_tokens) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_KV_CACHE_H_
