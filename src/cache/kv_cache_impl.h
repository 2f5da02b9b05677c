// KvCache::Impl: every piece of the cache's state, under one lock, and the declarations of the
// methods that change it, grouped by the file that holds them (kv_cache.cc is the facade that
// checks arguments and calls in here). Also the Lifeline that lets late callbacks find the cache,
// and CacheScope, the lock scope that runs deferred work once the lock is released.
//
// Thread-safety: every mutable member is guarded by `mu`; a method either requires it
// (ABSL_EXCLUSIVE_LOCKS_REQUIRED) or takes it itself (ABSL_LOCKS_EXCLUDED). Lock order: mu before
// the transfer engine's lock (taken through Alloc and the engine's calls). Backend and engine
// callbacks run outside both; they enter through the Lifeline, so a callback that fires after
// the cache is gone does nothing.
//
// Who holds what (every reference is one BlockAllocator reference, except tickets):
//   * A sequence holds one reference per block: its partial last block (kWritable, always HBM)
//     and each full block in exactly one tier (HBM, or a lower tier after a Pause or before an
//     onboard lands).
//   * A ticket pins HBM slots by a per-slot counter (ticket_refs), not by allocator references:
//     a slot with ticket_refs > 0 is never a candidate and never freed (a writable one whose
//     sequence is released waits in orphan_partials). This keeps EnsureResident on resident
//     blocks to a counter increment per block.
//   * A transfer's source is pinned by the transfer engine while it runs; the cache counts its
//     own readers per copy (ColdFields::readers) so a copy being read is never a candidate.
//   * A block's entry (`blocks`, BlockEntry::copies) lists the copies that are readable
//     (kReady) or being written (kPending). A slot some sequence holds but no entry lists (a
//     block computed twice, never written, or found corrupt) is private: freed when its last
//     holder lets go. A block
//     computed twice (a twin) is private only until settled (SettleTwins): its holders then take
//     the indexed copy, or it becomes the indexed copy if that one failed. Until its own
//     `ready` fires a twin's slot is not freed, even with no holder left (its kernel may still
//     write it).
#ifndef KVTIER_CACHE_KV_CACHE_IMPL_H_
#define KVTIER_CACHE_KV_CACHE_IMPL_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/event_hub.h"
#include "cache/spilled_counter.h"
#include "cache/ticket_state.h"
#include "internal/deadline_timer.h"
#include "internal/interned_string.h"
#include "internal/mutex.h"
#include "internal/stable_hash_map.h"
#include "kvtier/block_index.h"
#include "kvtier/eviction_candidacy.h"
#include "kvtier/kv_cache.h"
#include "kvtier/transfer_engine.h"

namespace kvtier {
namespace internal {

struct LayerFanout;

inline std::string SeqName(SequenceId id) { return absl::StrCat("sequence ", id.value()); }

// The identity fields of `options` that enter block keys.
inline BlockExtras ExtrasOf(const SequenceOptions& options) {
  return BlockExtras{options.adapter, options.tenant_salt, options.multimodal};
}

// Whether keys hashed under `a` and under `b` name the same blocks: every field compared exactly.
inline bool SameIdentity(const BlockExtras& a, const BlockExtras& b) {
  if (a.adapter.has_value() != b.adapter.has_value() || a.tenant_salt != b.tenant_salt ||
      a.multimodal.size() != b.multimodal.size()) {
    return false;
  }
  if (a.adapter.has_value() && (a.adapter->id != b.adapter->id ||
                                a.adapter->load_generation != b.adapter->load_generation)) {
    return false;
  }
  for (size_t i = 0; i < a.multimodal.size(); ++i) {
    const MultimodalItem& x = a.multimodal[i];
    const MultimodalItem& y = b.multimodal[i];
    if (x.start_token != y.start_token || x.num_tokens != y.num_tokens || x.digest != y.digest) {
      return false;
    }
  }
  return true;
}

// Lets callbacks that may outlive the cache reach it safely (see the file comment).
class Lifeline {
 public:
  template <typename T>
  void Set(T* impl) {
    MutexLock lock(&mu_);
    impl_ = impl;
  }
  // The cache, counted as entered, or nullptr once it is shutting down.
  void* Enter() {
    MutexLock lock(&mu_);
    if (impl_ != nullptr) ++active_;
    return impl_;
  }
  void Exit() {
    MutexLock lock(&mu_);
    if (--active_ == 0) cv_.SignalAll();
  }
  // After this returns no callback runs in the cache, now or later.
  void Close() {
    MutexLock lock(&mu_);
    impl_ = nullptr;
    while (active_ > 0) cv_.Wait(&mu_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  void* impl_ ABSL_GUARDED_BY(mu_) = nullptr;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace internal

struct KvCache::Impl {
  // Everything the cache knows of one block: its copies per tier (slots and states, what
  // Match walks), its place in the prefix tree, the references on its copies and its eviction
  // policy state. The one per-block record (`blocks`): an entry exists while the block has a
  // copy in some tier (copies.has_copy()), or while a child, a reader or a demotion still counts
  // on it; an entry without a copy is "not indexed" (Match stops there, as at a missing key).
  // 36 bytes, 56 with its key and the map's link (DESIGN's 64 bytes per cached block): the
  // parent is a handle into `blocks`, the counters spill into `cold` past their width
  // (SpilledCounter), and what only some blocks have for a while (readers, a demotion away,
  // children leaving, a retention priority) lives there too (ColdFields). Read and change the
  // counters through Impl's Uses, AddUse, ChildCopies and AddChildCopy, which know where they
  // are. The widths: uses spill past half a million hits (a hot system prompt after hours),
  // child copies past 2 per tier (a branch point of the prefix tree; chains have 0 or 1).
  struct BlockEntry {
    static constexpr uint32_t kNoParent = 0xFFFFFFFFu;  // a sequence's first block (kRootBlockKey)
    static constexpr uint32_t kUsesInCold = (1u << 19) - 1;  // small_uses: in ColdFields::uses
    static constexpr uint32_t kChildCopiesInCold = 3;        // 2 bits: in ColdFields::child_copies

    BlockRecord copies;  // per tier: slot, kPending/kReady (20 bytes)
    // The parent's element in `blocks` (BlockMap::handle), or kNoParent. Valid while this entry
    // has a copy (the parent's child_copies keep its element); kNoParent once it has none.
    uint32_t parent = kNoParent;
    // The policy's "last touched", in ns of the cache's clock (whole ns), as two 32-bit halves
    // so the entry needs no 8-byte alignment (last_use()).
    uint32_t last_use_lo = 0;
    uint32_t last_use_hi = 0x80000000u;  // with lo 0: kNeverUsed
    uint32_t candidate : 4 = 0;          // bit t: registered with policy[t]
    uint32_t has_cold : 1 = 0;           // `cold` has an element for this entry
    // Per tier, 2 bits each: copies of its children there (SpilledCounter::narrow).
    uint32_t small_child_copies : 8 = 0;
    // First write + attach hits (admission, cost_aware reuse) (SpilledCounter::narrow).
    uint32_t small_uses : 19 = 0;

    // Not copyable: ColdOf finds an entry's side record by its address, so a copy would read
    // as having none (a spilled counter would be lost). Built in place in `blocks`.
    BlockEntry() = default;
    BlockEntry(const BlockEntry&) = delete;
    BlockEntry& operator=(const BlockEntry&) = delete;

    static constexpr int64_t kNeverUsed = std::numeric_limits<int64_t>::min();
    int64_t last_use_ns() const {
      return static_cast<int64_t>((uint64_t{last_use_hi} << 32) | last_use_lo);
    }
    absl::Time last_use() const {
      const int64_t nanos = last_use_ns();
      return nanos == kNeverUsed ? absl::InfinitePast() : absl::FromUnixNanos(nanos);
    }
    // `t` is a time of the cache's clock: finite, in whole nanoseconds.
    void set_last_use(absl::Time when) {
      const auto nanos = static_cast<uint64_t>(absl::ToUnixNanos(when));
      last_use_lo = static_cast<uint32_t>(nanos);
      last_use_hi = static_cast<uint32_t>(nanos >> 32);
    }
    uint32_t small_child(int t) const { return (small_child_copies >> (2 * t)) & 3u; }
    void set_small_child(int t, uint32_t n) {
      small_child_copies = (small_child_copies & ~(3u << (2 * t))) | (n << (2 * t));
    }
  };
  // What few entries have at a time, and then not for long (all zero: no element).
  struct ColdFields {
    std::array<uint16_t, kNumTiers> readers{};  // this cache's transfers reading the copy
    // Bit t: the copy in t is being demoted away, dropped once the demotion lands (its reader).
    uint8_t evict_after = 0;
    // Of child_copies, the copies being demoted away (evict_after set): a parent whose children
    // are all leaving is a leaf for eviction, so a chain is evicted from its tail on.
    std::array<uint32_t, kNumTiers> leaving_children{};
    // The counters past BlockEntry's width (SpilledCounter::wide; 0 while they fit).
    uint32_t uses = 0;
    std::array<uint32_t, kNumTiers> child_copies{};
    double retention_priority = 0;
    absl::Time priority_until = absl::InfinitePast();
    bool Empty() const {
      for (int t = 0; t < kNumTiers; ++t) {
        if (readers[t] != 0 || leaving_children[t] != 0 || child_copies[t] != 0) return false;
      }
      return evict_after == 0 && uses == 0 && retention_priority == 0 &&
             priority_until == absl::InfinitePast();
    }
  };
  // The block key as four 32-bit words: the map's key, so an element (key, entry, link) packs
  // into 56 bytes without 8-byte alignment padding. Made from a BlockKey implicitly (find(key)
  // takes either); key() gives the BlockKey back. Hashes as the BlockKey does.
  struct PackedBlockKey {
    std::array<uint32_t, 4> words{};
    PackedBlockKey() = default;
    PackedBlockKey(const BlockKey& k)  // NOLINT(google-explicit-constructor): see above
        : words{static_cast<uint32_t>(k.hi >> 32), static_cast<uint32_t>(k.hi),
                static_cast<uint32_t>(k.lo >> 32), static_cast<uint32_t>(k.lo)} {}
    BlockKey key() const {
      return BlockKey{.hi = (uint64_t{words[0]} << 32) | words[1],
                      .lo = (uint64_t{words[2]} << 32) | words[3]};
    }
    // Word by word, not the defaulted (memcmp) comparison: every Match step compares keys.
    friend bool operator==(const PackedBlockKey& a, const PackedBlockKey& b) {
      return ((a.words[0] ^ b.words[0]) | (a.words[1] ^ b.words[1]) | (a.words[2] ^ b.words[2]) |
              (a.words[3] ^ b.words[3])) == 0;
    }
    template <typename H>
    friend H AbslHashValue(H h, const PackedBlockKey& k) {
      return H::combine(std::move(h), k.key());
    }
  };
  // An element stays where it is until it is erased (so the parts hand each other elements,
  // `cold` keys on their addresses and an entry names its parent by handle); StableHashMap does
  // that at 4 bytes of table and link per block, where a node map spent 8 bytes of table plus
  // a heap chunk's header per block.
  using BlockMap = internal::StableHashMap<PackedBlockKey, BlockEntry>;
  // The budget above, kept: 16 + 36 = 52 bytes of key and entry, 4-byte aligned, so a slot with
  // its link is 56 (BM_KvCache_BytesPerBlock measures the whole).
  static_assert(sizeof(BlockEntry) == 36 && alignof(BlockEntry) == 4);
  static_assert(sizeof(BlockMap::value_type) == 52);

  struct SeqBlock {
    Tier tier = Tier::kHbm;
    SlotId slot;
  };

  struct Sequence {
    SequenceId id;
    SequenceOptions options;
    BlockExtras extras;
    std::vector<int32_t> tokens;
    std::vector<BlockKey> keys;    // of the full blocks
    std::vector<SeqBlock> blocks;  // one reference each
    int64_t written = 0;
    bool paused = false;
    // Paused by a swap preemption (PauseHints::preempted): its Resume is a readmission, not the
    // session's return.
    bool pause_preempted = false;
    uint64_t generation = 0;  // unique per CreateSequence/Fork, so a re-created id is told apart
    // Blocks a Truncate cut inside, still referenced (one reference each) until the caller has
    // issued its BlockCopy: dropped at the sequence's next Append, ReportWritten, Truncate or
    // Release (DropCopySources).
    std::vector<SeqBlock> copy_sources;
    // Its adapter's index in adapter_names (0: none), given to the blocks it writes.
    uint32_t adapter = 0;
  };

  // A private HBM copy of a block some sequence reported written while the index already had
  // an HBM copy of it (two requests computed it at once): settled by SettleTwins.
  struct Twin {
    SlotId slot;
    BlockKey parent;
    int64_t first_token = 0;
    bool written = false;  // its own `ready` fired OK: its bytes are final
  };

  // One transfer started by the cache.
  struct Move {
    BlockKey key;
    Tier from = Tier::kHbm;
    SlotId src;
    Tier to = Tier::kHbm;
    SlotId dst;
    bool pin = false;           // the engine leaves dst with one reference for the cache
    bool evict_source = false;  // a demotion: drop the source once this lands
    Completion completion;
    struct Waiter {
      SequenceId sequence;  // invalid for a batch-only waiter
      int64_t block = 0;
      std::shared_ptr<internal::OnboardBatch> batch;
      int64_t batch_index = 0;
    };
    std::vector<Waiter> waiters;                                // onboards: who adopts dst
    // Onboards into a kCapLayerwise HBM tier: each layer as it lands, for the waiting tickets.
    std::shared_ptr<internal::LayerFanout> layers;
    // Onboards: the tiers (bit TierIndex) earlier attempts of this block read from and failed;
    // a retry reads from a ready copy in another (RetryOnboard).
    uint8_t tried_tiers = 0;
    // The copy's deadline (TransferOptions::deadline), and whether it retries one that ran
    // past its own deadline from the same tier (at most once: RetryOnboard).
    absl::Time deadline = absl::InfiniteFuture();
    bool deadline_retry = false;
    uint64_t batch = 0;  // the Deferred::batch it started in; a retry keeps it (RetryOnboard)
    std::vector<std::pair<SequenceId, int64_t>> pause_waiters;  // offloads: refs to move down
  };

  // Work that must run after the lock is dropped.
  struct Deferred {
    std::vector<std::shared_ptr<Move>> moves;  // register completion callbacks
    std::vector<std::pair<Completion, absl::Status>> fire;
    std::vector<std::pair<Completion, std::vector<std::pair<BlockKey, SlotId>>>> publish;
    // HBM slots a kernel still writes that no index entry keeps (PublishWritten): held (in
    // ticket_refs, counted in kernel_holds) until the Completion fires (EndKernelHolds).
    std::vector<std::pair<Completion, std::vector<SlotId>>> kernel_holds;
    // Events were handed to the hub while the lock was held (DeferredRelease): the scope
    // delivers them once it lets the lock go, even if it makes no more.
    bool events_published = false;
    // The scope's transfer batch (TransferOptions::batch), from next_batch at its first move:
    // one call's copies share backend calls only with each other. 0 until then.
    uint64_t batch = 0;
  };

  // Who a slot belongs to. While the entry of `key` lists this slot as the tier's copy, `entry`
  // is that entry's map element (valid: an entry with a copy is never erased), so the paths
  // that start from a slot (a release, a ticket's pin, a settle) reach the block without a
  // lookup; otherwise (a private copy, or a slot since freed) it is null.
  struct SlotOwner {
    BlockKey key;
    BlockMap::value_type* entry = nullptr;
    bool indexed() const { return entry != nullptr; }
  };

  enum class EvictResult : uint8_t {
    kEvicted = 0,      // dropped, or its demotion started
    kNoCandidate = 1,  // nothing in `t` can be evicted
    kWaitBelow = 2,    // (may_wait) the victim waits for a demotion below to free room
  };

  using Policies = std::array<std::unique_ptr<EvictionPolicy>, kNumTiers>;

  class CacheScope;
  class CacheLock;

  Impl(const CacheNamespace& cache_ns, PrefixHasher prefix_hasher)
      : ns(cache_ns), hasher(std::move(prefix_hasher)), geometry(ns.geometry()) {}

  // ---- Immutable after Create.
  CacheNamespace ns;
  PrefixHasher hasher;
  KvGeometry geometry;
  int block_tokens = 0;
  int64_t block_bytes = 0;
  std::array<std::unique_ptr<TierBackend>, kNumTiers> tiers;
  std::unique_ptr<TransferEngine> engine;
  WritePolicy write_policy = WritePolicy::kWriteBack;
  TierInclusion inclusion = TierInclusion::kInclusive;
  std::array<int, kNumTiers> admit_after_uses{};
  bool demote_on_evict = true;
  bool demote_by_value = true;
  bool publish_to_remote = false;
  std::optional<PrefillCostModel> cost;
  std::array<TierLinkCost, kNumTiers> links;
  bool measure_bandwidth = true;
  std::function<absl::Time()> clock;
  size_t event_buffer = 0;
  // The adapter ids and worker id events name (views into it); shared with the hub, so events
  // it delivers after the cache is gone still read valid strings.
  std::shared_ptr<internal::StringInterner> strings = std::make_shared<internal::StringInterner>();
  std::string_view worker_id;  // KvCacheOptions::worker_id, interned in `strings`
  // Delivers events to SubscribeEvents' callbacks; shared with the subscriptions.
  std::shared_ptr<internal::EventHub> hub = std::make_shared<internal::EventHub>(strings);
  absl::Duration room_wait;
  int remote_probe_window = 0;  // blocks; 0: no discovery (remote_discovery.cc)
  absl::Duration remote_probe_timeout;
  DevicePoolView pool;
  std::shared_ptr<internal::Lifeline> lifeline = std::make_shared<internal::Lifeline>();
  // Expires kAsync tickets at their deadlines (callbacks enter through the lifeline).
  std::unique_ptr<internal::DeadlineTimer> timer = std::make_unique<internal::DeadlineTimer>();

  // ---- Mutable state. The file that owns (changes) each group is named above it.
  mutable internal::Mutex mu;
  mutable internal::CondVar cv;  // a move finished (moves.cc)
  // block_records.cc: the one record per block, and who each slot belongs to.
  BlockMap blocks ABSL_GUARDED_BY(mu);
  int64_t indexed_blocks ABSL_GUARDED_BY(mu) = 0;  // entries with copies.has_copy()
  // The ColdFields of the entries with has_cold, by entry (BlockMap's elements stay put).
  absl::flat_hash_map<const BlockEntry*, ColdFields> cold ABSL_GUARDED_BY(mu);
  std::array<std::vector<SlotOwner>, kNumTiers> owner ABSL_GUARDED_BY(mu);
  std::deque<CacheEvent> events ABSL_GUARDED_BY(mu);
  uint64_t next_event ABSL_GUARDED_BY(mu) = 1;
  // Events made since the lock was last handed to the hub (only while someone subscribes):
  // PublishEvents queues them for delivery (event_hub.h).
  std::vector<CacheEvent> unpublished ABSL_GUARDED_BY(mu);
  // Adapter ids of the blocks, for their events: the interned ids (index 0: none) and, for each
  // block entry computed under an adapter, its index. Entries without one have no element, so
  // only adapter blocks pay (a 16-byte slot of the map each); a block's key hashes its adapter,
  // so one key never changes adapter and the element lives as long as the entry.
  std::vector<std::string_view> adapter_names ABSL_GUARDED_BY(mu) = {std::string_view()};
  absl::flat_hash_map<std::string_view, uint32_t> adapter_index ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<const BlockEntry*, uint32_t> adapter_of ABSL_GUARDED_BY(mu);
  // eviction_candidates.cc: the candidates per tier, the demotions out of and into each tier,
  // and the tiers skipped as demotion targets after a failed store.
  Policies policy ABSL_GUARDED_BY(mu);
  std::array<int64_t, kNumTiers> evicting ABSL_GUARDED_BY(mu){};  // demotions out of a tier
  std::array<int64_t, kNumTiers> arriving ABSL_GUARDED_BY(mu){};  // demotions into a tier
  // Per tier: skipped as a demotion target until then (wall clock) after a failed store, and
  // the back-off the next failure doubles; a store that lands resets both (NoteStore).
  std::array<absl::Time, kNumTiers> store_backoff_until ABSL_GUARDED_BY(mu) = {
      absl::InfinitePast(), absl::InfinitePast(), absl::InfinitePast(), absl::InfinitePast()};
  std::array<absl::Duration, kNumTiers> store_backoff ABSL_GUARDED_BY(mu){};
  // slot_refs.cc (and the ticket paths of residency.cc): references to HBM slots.
  std::vector<uint32_t> ticket_refs ABSL_GUARDED_BY(mu);  // per HBM slot
  // Per HBM slot: references sequences hold (= the allocator's, less transfer pins), so a
  // ticket's release knows without the engine's lock which slots nobody holds any more.
  std::vector<uint32_t> seq_refs ABSL_GUARDED_BY(mu);
  int64_t locked ABSL_GUARDED_BY(mu) = 0;  // HBM slots with ticket_refs > 0
  // Per HBM slot: the holds of kernels still writing it (Deferred::kernel_holds), also counted
  // in ticket_refs, so that such a slot is never a candidate and never freed until they end.
  absl::flat_hash_map<uint32_t, uint32_t> kernel_holds ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint32_t> orphan_partials ABSL_GUARDED_BY(mu);
  // sequence_table.cc: live sequences, their twins, and recently released ids.
  absl::flat_hash_map<SequenceId, std::unique_ptr<Sequence>> seqs ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<BlockKey, std::vector<Twin>> twins ABSL_GUARDED_BY(mu);  // not yet settled
  // Recently released ids (to tell "released" from "unknown"): id -> release serial, and the
  // order they were released in, oldest first, with the serial each entry stands for.
  absl::flat_hash_map<SequenceId, uint64_t> released_ids ABSL_GUARDED_BY(mu);
  std::deque<std::pair<SequenceId, uint64_t>> released_order ABSL_GUARDED_BY(mu);
  uint64_t next_release ABSL_GUARDED_BY(mu) = 1;
  uint64_t next_generation ABSL_GUARDED_BY(mu) = 1;
  // residency.cc: open tickets.
  absl::flat_hash_map<uint64_t, std::shared_ptr<internal::TicketState>> tickets ABSL_GUARDED_BY(mu);
  uint64_t next_ticket ABSL_GUARDED_BY(mu) = 1;
  // moves.cc: transfers in flight.
  absl::flat_hash_map<BlockKey, std::shared_ptr<Move>> onboarding ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<BlockKey, std::vector<std::shared_ptr<Move>>> offloading ABSL_GUARDED_BY(mu);
  // residency.cc: onboards of a block whose indexed HBM copy a kernel is still writing (another
  // sequence's ReportWritten before its `ready` fired): they adopt that copy once it is written,
  // or read it from below if the write fails (WakeWriteWaiters); a deadline gives up on them.
  absl::flat_hash_map<BlockKey, std::vector<Move::Waiter>> write_waiters ABSL_GUARDED_BY(mu);
  int64_t moves_in_flight ABSL_GUARDED_BY(mu) = 0;
  uint64_t next_batch ABSL_GUARDED_BY(mu) = 0;  // the last Deferred::batch handed out
  // Counted by every part; read by stats() (kv_cache_stats.cc).
  KvCacheStats counters ABSL_GUARDED_BY(mu);

  absl::Time Now() const { return clock ? clock() : absl::Now(); }
  bool Present(Tier t) const { return tiers[TierIndex(t)] != nullptr; }

  // ---- options_validation.cc: what Create checks and builds from KvCacheOptions.

  // Every check Create makes on `options` for namespace `ns`, in the order it makes them:
  // kInvalidArgument naming the first option that is wrong.
  static absl::Status ValidateOptions(const CacheNamespace& ns, const KvCacheOptions& options);
  // The prefill cost model: options.prefill_cost, else the namespace model's known cost at
  // options.prefill_flops_per_second, else none. Errors of PrefillCostModel::Create.
  static absl::StatusOr<std::optional<PrefillCostModel>> MakeCostModel(
      const CacheNamespace& ns, const KvCacheOptions& options);
  // One eviction policy per present tier.
  static absl::StatusOr<Policies> MakePolicies(const KvCacheOptions& options);

  // ---- slot_refs.cc: allocator access (under the engine's lock, nested in mu) and the
  // references sequences and tickets hold on slots.

  absl::Status Alloc(Tier t, absl::FunctionRef<absl::Status(BlockAllocator&)> fn) {
    return engine->WithAllocator(t, fn);
  }
  SlotState StateOf(Tier t, SlotId slot);
  int64_t FreeBlocks(Tier t);
  // The HBM slot's last pin or holder may be gone: settle what it becomes. `state` is the slot's
  // state when the caller has just read it under the engine's lock (saves taking it again).
  // `entry`, when given, is the map element of the block whose copy the slot may hold (the
  // caller found it already): used, without a lookup, if that block is the slot's owner.
  void SettleSlot(Tier t, SlotId slot, std::optional<SlotState> state = std::nullopt,
                  BlockMap::value_type* entry = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Drops one reference a sequence held: ReleaseRefs of it, then its settle.
  void DropRef(const SeqBlock& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // DropRef's first half for many blocks under one acquisition of the engine's lock: each
  // reference is let go (or its partial block orphaned to a ticket), and after[i] (sized
  // refs.size() by the caller) is the slot's state then, or nullopt where there is nothing to
  // settle. The caller settles each
  // (SettleSlot with that state) to finish what DropRef does.
  void ReleaseRefs(absl::Span<const SeqBlock> refs, absl::Span<std::optional<SlotState>> after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status AcquireRef(Tier t, SlotId slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void PinTicket(SlotId slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- block_records.cc: the block entries (copies and the rest) and SlotOwner, in agreement.

  // The event of the copy in `t` of the block of `element` (its key, parent, adapter); Emit
  // numbers it.
  CacheEvent BlockEvent(CacheEventKind kind, const BlockMap::value_type& element, Tier t) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Numbers `e`, stamps the worker id, keeps it in the ring and, while anyone subscribes, in
  // `unpublished`.
  void Emit(CacheEvent e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Hands `unpublished` to the hub; true if there was any. Called as the lock is let go.
  bool PublishEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The index in adapter_names of `adapter`'s id (interned on first use); 0 for none.
  uint32_t AdapterIndex(const std::optional<AdapterIdentity>& adapter)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The copies of `key` (a copy of its record), or nullopt if no tier holds one: what the
  // index's Lookup answered.
  std::optional<BlockRecord> IndexedCopies(const BlockKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = blocks.find(key);
    if (it == blocks.end() || !it->second.copies.has_copy()) return std::nullopt;
    return it->second.copies;
  }
  // The longest cached prefix of `keys` over `blocks` (BlockIndex::Match's contract).
  absl::StatusOr<PrefixMatch> MatchBlocks(absl::Span<const BlockKey> keys, int64_t query_tokens,
                                          std::vector<BlockLocation>* locations = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // The lambda runs under mu (held here); the analysis cannot see that through the call.
    const auto* map = &blocks;
    return MatchPrefix(
        keys, query_tokens, block_tokens,
        [map](const BlockKey& key) -> const BlockRecord* {
          auto it = map->find(key);
          return it == map->end() ? nullptr : &it->second.copies;
        },
        locations);
  }
  // MatchBlocks for a caller that goes on to change the matched blocks: also the map element
  // of each matched block, in order ((*entries)[i] for keys[i], i < matched_blocks), and its
  // candidacy bits then ((*candidate)[i] = BlockEntry::candidate), read while the walk has the
  // entry at hand so a caller that only acts on registered copies need not load the others
  // again. The pointers are valid until that entry is erased.
  absl::StatusOr<PrefixMatch> MatchEntries(absl::Span<const BlockKey> keys, int64_t query_tokens,
                                           std::vector<BlockLocation>* locations,
                                           std::vector<BlockMap::value_type*>* entries,
                                           std::vector<uint8_t>* candidate)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    entries->clear();
    candidate->clear();
    auto* map = &blocks;  // as in MatchBlocks
    absl::StatusOr<PrefixMatch> match = MatchPrefix(
        keys, query_tokens, block_tokens,
        [map, entries, candidate](const BlockKey& key) -> const BlockRecord* {
          auto it = map->find(key);
          if (it == map->end()) return nullptr;
          entries->push_back(&*it);
          candidate->push_back(it->second.candidate);
          return &it->second.copies;
        },
        locations);
    if (match.ok()) {
      entries->resize(static_cast<size_t>(match->matched_blocks));
      candidate->resize(static_cast<size_t>(match->matched_blocks));
    }
    return match;
  }
  // Erases the entry of `key` once nothing keeps it: no copy, child, reader or leaving child.
  void MaybeEraseMeta(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `adapter`: the index (adapter_names) of the adapter the block was computed under, 0 for
  // none or unknown (a copy of a block already indexed keeps what its entry has).
  absl::Status AddCopy(const BlockKey& key, Tier t, SlotId slot, CopyState state,
                       const BlockKey& parent, uint32_t adapter = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The entry's ColdFields, or nullptr where it has none (all zero).
  const ColdFields* ColdOf(const BlockEntry& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!m.has_cold) return nullptr;
    auto it = cold.find(&m);
    return it == cold.end() ? nullptr : &it->second;
  }
  // The counters BlockEntry keeps up to a width and ColdFields past it (SpilledCounter).
  uint32_t Uses(const BlockEntry& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return m.small_uses != BlockEntry::kUsesInCold ? m.small_uses : ColdOf(m)->uses;
  }
  void AddUse(BlockEntry& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (const uint32_t n = m.small_uses; n + 1 < BlockEntry::kUsesInCold) {  // the common case
      m.small_uses = n + 1;
      return;
    }
    m.small_uses = StepSpilled(m, m.small_uses, BlockEntry::kUsesInCold, +1,
                               [](ColdFields& c) -> uint32_t& { return c.uses; });
  }
  uint32_t ChildCopies(const BlockEntry& m, int t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint32_t n = m.small_child(t);
    return n != BlockEntry::kChildCopiesInCold ? n : ColdOf(m)->child_copies[t];
  }
  // Whether a child of the block has a copy in any tier (leaving ones included).
  bool HasChildCopy(const BlockEntry& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (int t = 0; t < kNumTiers; ++t) {
      if (ChildCopies(m, t) != 0) return true;
    }
    return false;
  }
  // Whether the block's copy in t is its only one.
  static bool IsLastCopy(const BlockEntry& m, int t) {
    const unsigned others = (m.copies.pending_tiers | m.copies.ready_tiers) & ~(1u << t);
    return others == 0;
  }
  // delta is +1 or -1 (never below zero).
  void AddChildCopy(BlockEntry& m, int t, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    m.set_small_child(t,
                      StepSpilled(m, m.small_child(t), BlockEntry::kChildCopiesInCold, delta,
                                  [t](ColdFields& c) -> uint32_t& { return c.child_copies[t]; }));
  }
  // Steps the counter whose narrow field holds `narrow` and whose wide field `wide` picks from
  // m's ColdFields; stores the wide part and returns the narrow part for the caller to store.
  template <typename Wide>
  uint32_t StepSpilled(BlockEntry& m, uint32_t narrow, uint32_t spill, int delta, Wide wide)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    internal::SpilledCounter c{narrow, 0};
    if (narrow == spill) c.wide = wide(MutableCold(m));
    c = c.Step(delta, spill);
    if (c.narrow == spill || narrow == spill) {
      wide(MutableCold(m)) = c.wide;
      TrimCold(m);
    }
    return c.narrow;
  }
  // Whether the copy in t is being demoted away (ColdFields::evict_after).
  bool EvictAfter(const BlockEntry& m, int t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const ColdFields* c = ColdOf(m);
    return c != nullptr && ((c->evict_after >> t) & 1) != 0;
  }
  // The parent's key (kRootBlockKey for none) and element (nullptr for none).
  BlockKey ParentKey(const BlockEntry& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return m.parent == BlockEntry::kNoParent ? kRootBlockKey
                                             : blocks.at_handle(m.parent).first.key();
  }
  BlockMap::value_type* Parent(const BlockEntry& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return m.parent == BlockEntry::kNoParent ? nullptr : &blocks.at_handle(m.parent);
  }
  uint16_t Readers(const BlockEntry& m, int t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const ColdFields* c = ColdOf(m);
    return c == nullptr ? 0 : c->readers[t];
  }
  uint32_t LeavingChildren(const BlockEntry& m, int t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const ColdFields* c = ColdOf(m);
    return c == nullptr ? 0 : c->leaving_children[t];
  }
  // The entry's ColdFields for a change (made if it has none); TrimCold after the change.
  ColdFields& MutableCold(BlockEntry& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    m.has_cold = true;
    return cold[&m];
  }
  // Drops the entry's ColdFields once they are all zero again.
  void TrimCold(BlockEntry& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!m.has_cold) return;
    auto it = cold.find(&m);
    if (it != cold.end() && !it->second.Empty()) return;
    if (it != cold.end()) cold.erase(it);
    m.has_cold = false;
  }
  void MarkReady(const BlockKey& key, Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Forgets the copy of `key` in `t` (the slot itself is the caller's business).
  void RemoveCopy(const BlockKey& key, Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Drops a droppable copy: frees its slot and forgets it.
  void DropCopy(const BlockKey& key, Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Exclusive tiers: drop the ready copy in `t` if nobody holds or reads it, even if it is not
  // a leaf there (its parent chain continues in HBM, where it was just onboarded).
  void DropIfDroppable(const BlockKey& key, Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- eviction_candidates.cc: candidacy with each tier's policy, and making room.

  // Tells the policies that observe requests that `seq` (of a session) lets its written full
  // blocks go at `now`, with what is known of its session's return (last_turn: none follows;
  // preempted: it comes back as a readmission). Before they are Added.
  void ObserveRelease(const Sequence& seq, StopReason stop,
                      const std::optional<absl::Duration>& expected_idle, absl::Time now,
                      bool last_turn, bool preempted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Tells the policies that observe requests that `seq`'s session is back: its paused sequence
  // resumed after a tool wait (RequestObservation::resumed).
  void ObserveResume(const Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A later request of `seq`'s session (created or forked after it) is live or has let go
  // already (the remembered one is later): `seq`'s release is superseded
  // (ReleaseObservation::superseded).
  bool Superseded(const Sequence& seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The blocks of each session's latest release or pause, for the session hints
  // (RetainSession, InvalidateSession). Bounded: the oldest sessions are forgotten first past
  // KvCache::kRememberedSessions sessions or kRememberedSessionBlocks keys in all.
  struct SessionRecord {
    std::vector<BlockKey> keys;
    uint64_t stamp = 0;       // its entry in session_order
    uint64_t generation = 0;  // of the request remembered (Sequence::generation)
  };
  absl::flat_hash_map<uint64_t, SessionRecord> session_blocks ABSL_GUARDED_BY(mu);
  std::deque<std::pair<uint64_t, uint64_t>> session_order ABSL_GUARDED_BY(mu);  // (session, stamp)
  uint64_t session_stamp ABSL_GUARDED_BY(mu) = 0;
  int64_t remembered_session_keys ABSL_GUARDED_BY(mu) = 0;
  void RememberSession(uint64_t session, absl::Span<const BlockKey> keys, uint64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void ForgetSession(uint64_t session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The bodies of RetainPrefix and InvalidatePrefix over block keys (hint_commands.cc).
  HintOutcome RetainKeys(absl::Span<const BlockKey> keys, double priority, absl::Duration ttl)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  HintOutcome InvalidateKeys(absl::Span<const BlockKey> keys, int64_t first_block)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // What ranks the block of entry `m`, and of the block of `key` (nullopt: no entry).
  CandidateFacts Facts(const BlockEntry& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::optional<CandidateFacts> FactsAt(const BlockKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What tier t's policy is told of the block (CandidateTraits, kvtier/eviction_candidacy.h).
  // run_blocks (a walk of up to 31 parents) only for a policy that reads it.
  BlockTraits Traits(const BlockEntry& m, Tier t) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Whether the copy in `t` of the block whose entry is `m` is a candidate by the leaf-first rule
  // (IsEvictionCandidate). `slot_state`: the copy's slot state when the caller knows it (read
  // under the engine's lock just before), so it is not read again.
  bool WantCandidate(const BlockEntry& m, Tier t,
                     std::optional<SlotState> slot_state = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Registers or unregisters (key, t) with the tier's policy to match WantCandidate
  // (SyncCandidacy).
  void UpdateCandidate(const BlockKey& key, Tier t,
                       std::optional<SlotState> slot_state = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The same for a block whose map element the caller holds. Inline: an interior copy (a child
  // copy there is staying) that is not registered stays so, the common case when a sequence
  // lets its chain go, answered without building the facts.
  void UpdateCandidate(BlockMap::value_type& entry, Tier t,
                       std::optional<SlotState> slot_state = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const BlockEntry& m = entry.second;
    const int ti = TierIndex(t);
    if (((m.candidate >> ti) & 1) == 0 && m.small_child(ti) != 0 &&
        (!m.has_cold || ChildCopies(m, ti) != LeavingChildren(m, ti))) {
      return;
    }
    SyncCandidate(entry, t, slot_state);
  }
  // The sequence's written full blocks: those a release or a pause lets go.
  int64_t WrittenFullBlocks(const Sequence& seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return std::min(static_cast<int64_t>(seq.keys.size()), seq.written / block_tokens);
  }
  // UpdateCandidate's general case.
  void SyncCandidate(BlockMap::value_type& entry, Tier t, std::optional<SlotState> slot_state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Unregisters (key, t) from the tier's policy, if registered: for a copy just taken out of
  // candidacy for sure (a holder acquired it), without re-deriving WantCandidate.
  void DropCandidacy(const BlockKey& key, Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Inline: called for every block an attach pins, most of which are not registered.
  // `discard`: dropped unused on the caller's word (EvictionPolicy::Discard), not Removed.
  void DropCandidacy(BlockMap::value_type& entry, Tier t, bool discard = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint8_t bit = static_cast<uint8_t>(1u << TierIndex(t));
    if ((entry.second.candidate & bit) == 0) return;
    EvictionPolicy& p = *policy[TierIndex(t)];
    (void)(discard ? p.Discard(entry.first.key()) : p.Remove(entry.first.key()));
    entry.second.candidate &= static_cast<uint8_t>(~bit);
  }
  // Marks the copy of `key` in `t` as being demoted away (or no longer), and tells its parent.
  void SetLeaving(const BlockKey& key, Tier t, bool leaving) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The block was used (a hit, or released by a sequence at `m.last_use`): its copies that are
  // candidates in other tiers are re-ranked with the new last use.
  // Inline: called for every block an attach or a release touches, most of them registered
  // nowhere (interior, or held).
  void TouchCandidates(const BlockMap::value_type& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (entry.second.candidate != 0) TouchRegistered(entry.first.key(), entry.second);
  }
  void TouchRegistered(const BlockKey& key, const BlockEntry& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The first present tier below `t`, or nullopt.
  std::optional<Tier> NextLower(Tier t) const;
  // Whether a tier below `t` and above `until` (exclusive; default: every lower tier) has a copy.
  bool HasCopyBelow(const BlockRecord& rec, Tier t, int until = kNumTiers) const;
  // Where an evicted block of tier `t` with `uses` uses (Uses) would be demoted: the first
  // lower tier that admits it and whose stores are not backing off after a failure.
  std::optional<Tier> DemotionTarget(uint32_t uses, Tier t) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A store into lower tier `t` landed (`landed`) or failed: a failure makes `t` no demotion
  // target for a back-off, doubling from 100 ms to 10 s while its stores keep failing (DESIGN
  // section 10: a dead store is bypassed, not re-tried per block); a landed store ends it.
  void NoteStore(Tier t, bool landed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Makes a slot of lower tier `t` free now if that needs no waiting: drops victims that need
  // no demotion; starts demotions of the others (which free later). True if a slot is free.
  // `window` bounds the demotions out of `t` in flight: each frees one slot when it lands, and
  // starting more than the caller will use evicts blocks for nothing (1 for a single block).
  // `may_wait` and `deadline` are passed to the victims' eviction (EvictOne).
  bool RoomBelowNow(Tier t, Deferred& d, int64_t window = 1, bool may_wait = false,
                    absl::Time deadline = absl::InfiniteFuture()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Evicts the policy's victim in `t`: drops it if a lower tier has it (or none admits it),
  // else starts its demotion. When the lower tier is full and its own demotions are under way,
  // a caller that can wait for them (`may_wait`: MakeHbmRoom before its deadline) keeps the
  // victim for later (kWaitBelow) rather than drop a block a slot will soon be free for:
  // dropping would lose every block of a burst but the few the lower tier had room for. Other
  // callers (Pause's copy-down, write-through, Prefetch) never wait: the victim is dropped.
  // A lower tier that is full with nothing under way to free a slot (say, full of blocks still
  // arriving) is skipped for the next admitting one that has room now; blocks arriving in a tier
  // are worth waiting for too, as they can be demoted further once they land.
  // A demotion started here must land by `deadline` (MakeHbmRoom's); once it has passed, no
  // demotion can help and the victim is dropped.
  // Whether victim `key` of tier `from` is worth demoting to `to` (KvCacheOptions::
  // demote_by_value).
  bool WorthDemoting(const BlockKey& key, Tier from, Tier to) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  EvictResult EvictOne(Tier t, Deferred& d, int64_t window = 1, bool may_wait = false,
                       absl::Time deadline = absl::InfiniteFuture())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Frees `need` HBM slots, waiting (lock released) up to `deadline` (wall clock, not the
  // cache's clock: it bounds real transfers) for demotions to land (or copies down whose
  // source then becomes droppable: CopiesWillFreeHbm); demotions are started with that
  // deadline, so one stuck behind a hung transfer gives up by then. Victims wait for room below
  // until the deadline; at the deadline one last pass drops droppable blocks (it no longer
  // counts on demotions in flight, nor starts any). The caller must re-validate everything it
  // looked up before: the lock may have been dropped.
  // RoomWait::kNever: one pass of evictions (demotions started count, none is waited for), then
  // kResourceExhausted if the slots are still not free.
  absl::Status MakeHbmRoom(int64_t need, absl::Time deadline, Deferred& d,
                           RoomWait wait = RoomWait::kWait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // CheckRoom's answer for `need` new HBM slots, from counters.
  RoomCheck RoomFor(int64_t need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // ResetPrefixCache of one present tier: the copies dropped.
  int64_t ResetTier(Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // True if a copy in flight out of HBM (write-through, Pause's copy-down) reads a block that
  // nobody but it and the paused sequences it moves holds: the block is droppable once it lands,
  // so making room waits for it as for a demotion. Walks the copies in flight; only called
  // where making room would otherwise give up.
  bool CopiesWillFreeHbm() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // HBM slots only a kernel's write still holds (kernel_holds; no sequence holds and no ticket
  // pins them): each is freed when that kernel's `ready` fires. CheckRoom counts them as room;
  // making room does not wait for them (the waiting thread may be the one to fire `ready`).
  int64_t KernelWritesFreeingHbm() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- moves.cc: transfers the cache starts, and the work deferred until the lock is dropped.

  // Starts copying `key` from (from, src) to a new slot of `to`, by `deadline` (its caller's) or,
  // for a caller without one, within the transfer bound (max(room_wait, 1 s)): a store that
  // never answers must not hold a bounce buffer and a slot for ever, nor queue every later
  // staged copy behind it. The deadline only bounds the start and the backends
  // (deadline_bounds_start): a ticket's deadline is kept by the cache (ExpireTicket), so the
  // engine never reports a copy that may still be running, and a source is unpinned by the time
  // its callback runs. (A copy between two inline tiers has finished when this returns.)
  // A failed onboard `failed` (its source read failed) started again from a ready copy in a tier
  // it has not tried, for the same waiters, by the latest of their batches' deadlines; null when
  // there is none, the deadline has passed, or the move cannot start.
  // Adds `w` to the onboard `m`'s waiters; a ticket's block follows its layers as they land.
  void AddWaiter(Move& m, Move::Waiter w, Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::shared_ptr<Move> RetryOnboard(const Move& failed, const absl::Status& status, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::StatusOr<std::shared_ptr<Move>> StartMove(const BlockKey& key, Tier from, SlotId src,
                                                  Tier to, bool pin, Deferred& d,
                                                  absl::Time deadline = absl::InfiniteFuture())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Registers the callbacks of moves started so far (they must exist before anyone waits on
  // them), dropping and retaking the lock. True if it did (state may have changed meanwhile).
  bool DeferredRelease(Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void RunDeferred(Deferred& d) ABSL_LOCKS_EXCLUDED(mu);
  void OnMoveDone(const std::shared_ptr<Move>& move, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu);
  void OnWritten(const std::vector<std::pair<BlockKey, SlotId>>& written,
                 const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu);
  // The kernel that wrote `slots` is done: their holds go, and a slot nobody keeps any more is
  // freed (SettleSlot).
  void EndKernelHolds(const std::vector<SlotId>& slots) ABSL_LOCKS_EXCLUDED(mu);

  // ---- sequence_table.cc: sequences, their blocks, and the memory of released ids.

  absl::StatusOr<Sequence*> FindSeq(SequenceId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // CreateSequence under the lock: kAlreadyExists if the id is live.
  absl::Status AddSequence(std::unique_ptr<Sequence> seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Makes `seq` live under its id with a fresh generation (the id is no longer "released").
  void InsertSequence(std::unique_ptr<Sequence> seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Moves block `i` of `seq` to the copy (t, slot): takes a reference there, then drops the one
  // held before. False (nothing changed) if the reference cannot be taken.
  bool RepointBlock(Sequence& seq, int64_t i, Tier t, SlotId slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The bodies of Append, ReportWritten, Fork and Release (kv_cache.h), arguments checked.
  absl::StatusOr<KvAppendResult> AppendTokens(SequenceId id, absl::Span<const int32_t> tokens,
                                              RoomWait wait, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::StatusOr<std::optional<BlockCopy>> TruncateSequence(SequenceId id, int64_t num_tokens,
                                                            RoomWait wait, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Lets go of the blocks a Truncate kept for its copy (Sequence::copy_sources).
  void DropCopySources(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status PublishWritten(SequenceId id, int64_t num_tokens, Completion ready, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::StatusOr<std::optional<BlockCopy>> ForkSequence(SequenceId parent, SequenceId child,
                                                        int64_t num_tokens, RoomWait wait,
                                                        Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `hints`: what Release(id, hints) was given (none for Release(id)).
  absl::Status ReleaseSequence(SequenceId id, const ReleaseHints& hints = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // One HBM copy per block key. Once the indexed HBM copy of `key` is no longer pending, each
  // written twin's holders take it instead (RepointBlock; the twin is freed when no ticket pins
  // it; no bytes move: same key, same bytes); with no HBM copy left, the first twin still held
  // becomes the indexed copy. A twin not yet written waits for its own `ready` (TwinWritten).
  // Called wherever the indexed HBM copy of `key` settles (written, failed, onboarded).
  void SettleTwins(const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Drops every twin entry of HBM `slot` (its slot is being freed). O(twins), usually none.
  void ForgetTwin(SlotId slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Whether HBM slot `slot` is a twin whose `ready` has not fired: its kernel may still write
  // it, so it is not freed when its holders let go (SettleSlot). O(twins), usually none.
  bool UnwrittenTwin(SlotId slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The `ready` of HBM slot `slot`, published for `key`, fired with `status`. If that slot is a
  // twin of `key` (not the indexed copy): marks it written (or, on an error, forgets it: it
  // stays private), settles the twins of `key` and returns true; otherwise false.
  bool TwinWritten(const BlockKey& key, SlotId slot, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- prefix_attach.cc: AttachPrefix's second half, once the prompt is hashed.

  std::array<TierLinkCost, kNumTiers> CurrentLinks() const;
  // Attaches the cached prefix of `prompt` (block keys `keys`) to sequence `id`, which must
  // still be the sequence of `generation` and be empty.
  // `keys`: the prompt's block keys; the attached ones become the sequence's, moved out of
  // `owned` (the vector `keys` views, which the call empties) when the caller gives it, else
  // copied.
  absl::StatusOr<AttachResult> AttachKeys(SequenceId id, uint64_t generation,
                                          absl::Span<const BlockKey> keys,
                                          absl::Span<const int32_t> prompt,
                                          std::vector<BlockKey>* owned = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- remote_discovery.cc: asking the remote store for the blocks after the local match.

  // One existence probe of the remote store, made with the lock released.
  struct RemoteProbe {
    bool attempted = false;   // a probe was made (or refused by the tier): counted
    int64_t first_block = 0;  // index in the prompt's keys of found[0]
    std::vector<bool> found;  // per probed key; empty when the probe failed
    absl::Status status;      // the probe's outcome
    absl::Duration latency;   // its wall time
    // The leading blocks found (they would extend a match ending at first_block).
    int64_t LeadingFound() const {
      int64_t n = 0;
      while (n < static_cast<int64_t>(found.size()) && found[static_cast<size_t>(n)]) ++n;
      return n;
    }
  };
  // Whether AttachPrefix and Lookup probe: a window > 0 and a remote tier with kCapProbe.
  bool Discovers() const {
    const TierBackend* remote = tiers[TierIndex(Tier::kRemote)].get();
    return remote_probe_window > 0 && remote != nullptr &&
           (remote->info().capabilities & kCapProbe) != 0;
  }
  // Takes the lock to find where the local match of `keys` ends; if that is before block
  // `limit_blocks` (the blocks the caller could use), drops it and probes the store for up to
  // remote_probe_window keys from there, by now + remote_probe_timeout. Not attempted
  // (nothing counted) when the match reaches the limit. The caller counts it (NoteProbe) and
  // re-validates everything it looks up afterwards.
  RemoteProbe ProbeAfterMatch(absl::Span<const BlockKey> keys, int64_t limit_blocks)
      ABSL_LOCKS_EXCLUDED(mu);
  // Counts an attempted probe in counters.remote_probe (blocks found: `found_blocks`).
  void NoteProbe(const RemoteProbe& probe, int64_t found_blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // AttachPrefix's half of discovery, after the probe: if sequence `id` is still the empty
  // sequence of `generation`, the leading blocks the probe found that are still not indexed
  // become ready remote copies (a free remote slot each, or one the remote tier's eviction
  // frees; discovery stops at the first block that gets none), registered for candidacy once
  // all are in (so making room for one never evicts another). Counts the probe.
  void AdoptDiscovered(SequenceId id, uint64_t generation, absl::Span<const BlockKey> keys,
                       const RemoteProbe& probe, Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- residency.cc: tickets, onboarding into HBM, and the hints that move sequences.

  // Resolves one still-pending block of a batch (false if it was resolved already: a late
  // onboard after a ticket's deadline); a ticket's block table gets the slot, or -1.
  bool ResolveOnboard(const std::shared_ptr<internal::OnboardBatch>& t, int64_t i,
                      std::optional<SlotId> slot, absl::Status error, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  static bool OnboardPending(internal::OnboardBatch& t, int64_t i);
  static absl::Status BatchOutcome(internal::OnboardBatch& t);
  // The ticket's deadline passed: every block still onboarding is reported not resident (the
  // onboard goes on and lands as a droppable block, or for the sequence), and the ticket's
  // completion fires.
  void ExpireTicket(const std::shared_ptr<internal::TicketState>& t) ABSL_LOCKS_EXCLUDED(mu);
  // Blocks [first, last) of `seq` below HBM whose block has a ready HBM copy (another request
  // onboarded it, or it was never dropped) take that copy: no bytes move, and it can no longer
  // be evicted to make room for this very request.
  void AdoptHbmCopies(Sequence& seq, int64_t first, int64_t last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Blocks of [first, last) an onboard would have to bring: below HBM, not on the way, and not
  // being written into HBM by another sequence (whose slot it will share).
  int64_t MissingBlocks(const Sequence& seq, int64_t first, int64_t last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Makes block `i` of `seq` resident for batch `t` (index `ti` in it; a ticket pins what
  // lands): adopts an HBM copy, joins an onboard in flight, or starts one.
  void Onboard(Sequence& seq, int64_t i, const std::shared_ptr<internal::OnboardBatch>& t,
               int64_t ti, Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The write of `key`'s pending HBM copy settled (OnWritten): each onboard waiting for it
  // (write_waiters) onboards again, adopting the copy if it is ready now.
  void WakeWriteWaiters(const BlockKey& key, Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The cache is going: every onboard in write_waiters is reported not resident.
  void FailWriteWaiters(Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // EnsureResident under the lock, arguments checked: fills and registers ticket `t`.
  absl::Status IssueTicket(SequenceId id, int64_t begin_token, int64_t end_token,
                           const EnsureResidentOptions& options,
                           const std::shared_ptr<internal::TicketState>& t, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // EnsureResident after the lock: a kWait ticket is waited for until the deadline, another
  // one with a deadline is expired by the timer.
  void AwaitTicket(const std::shared_ptr<internal::TicketState>& t,
                   const EnsureResidentOptions& options) ABSL_LOCKS_EXCLUDED(mu);
  // ReleaseTicket under the lock, for a ticket this cache issued.
  absl::Status CloseTicket(const std::shared_ptr<internal::TicketState>& ticket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The handle EnsureResident gives out: it points at `t`, and its copies share ownership of a
  // holder that closes the ticket when the last of them is destroyed (if ReleaseTicket has not),
  // entering through the lifeline so a ticket that outlives the cache does nothing.
  struct TicketHolder;
  std::shared_ptr<internal::TicketState> HandOut(std::shared_ptr<internal::TicketState> t);
  // The bodies of Pause, Resume and Prefetch (kv_cache.h), arguments checked.
  absl::Status PauseSequence(SequenceId id, const PauseHints& hints, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status ResumeSequence(SequenceId id, const std::shared_ptr<internal::OnboardBatch>& t,
                              Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::StatusOr<int64_t> PrefetchBlocks(const std::vector<BlockKey>& keys, int64_t num_tokens,
                                         Deferred& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- warm_restart.cc.

  // Warm restart: blocks a persistent tier found again become ready copies, matchable by key.
  // Their parents are unknown (the slot header keeps only the key), so each is its own root
  // for leaf-first eviction. Of a key's several copies, the newest whose read is not kDataLoss
  // is kept (they are read, here). Any other slot the allocator starts cached is freed.
  void AdoptRecoveredBlocks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- invariants.cc.

  absl::Status CheckInvariantsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

// Holds the cache lock for a scope and owns the work deferred until the lock is dropped. On
// destruction, on every return path, it unlocks and then runs that work: a move started under
// the lock needs its completion callback registered, or it would never be accounted for
// (WaitIdle would hang), and completions must not fire under the lock. DeferredRelease(
// deferred()) may drop and retake the lock inside the scope.
class ABSL_SCOPED_LOCKABLE KvCache::Impl::CacheScope {
 public:
  explicit CacheScope(Impl& impl) ABSL_EXCLUSIVE_LOCK_FUNCTION(impl.mu) : impl_(impl) {
    impl_.mu.Lock();
  }
  ~CacheScope() ABSL_UNLOCK_FUNCTION() {
    const bool deliver = impl_.PublishEvents() || deferred_.events_published;
    impl_.mu.Unlock();
    impl_.RunDeferred(deferred_);
    if (deliver) impl_.hub->Deliver();
  }
  CacheScope(const CacheScope&) = delete;
  CacheScope& operator=(const CacheScope&) = delete;

  Deferred& deferred() { return deferred_; }

 private:
  Impl& impl_;
  Deferred deferred_;
};

// Holds the cache lock for a scope with no deferred work (a plain MutexLock on mu otherwise):
// on destruction it hands the events made meanwhile to the hub, unlocks, and delivers them to
// the subscribers. Every scope that may change blocks takes the lock through this or CacheScope.
class ABSL_SCOPED_LOCKABLE KvCache::Impl::CacheLock {
 public:
  explicit CacheLock(Impl& impl) ABSL_EXCLUSIVE_LOCK_FUNCTION(impl.mu) : impl_(impl) {
    impl_.mu.Lock();
  }
  ~CacheLock() ABSL_UNLOCK_FUNCTION() {
    const bool deliver = impl_.PublishEvents();
    impl_.mu.Unlock();
    if (deliver) impl_.hub->Deliver();
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  Impl& impl_;
};

}  // namespace kvtier

#endif  // KVTIER_CACHE_KV_CACHE_IMPL_H_
