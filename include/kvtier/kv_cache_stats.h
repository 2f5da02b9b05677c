// KvCache's counters and events: what a dashboard scrapes and what a KV-aware router follows.
//
// Counters are cumulative since the cache was created; gauges are the state at the moment of the
// snapshot. Events tell a consumer (e.g. a router that tracks which worker holds which prefix,
// as Dynamo's KV events and vLLM's KVEventBatch do) that a block copy became readable in a tier
// (kStored) or stopped being readable there (kRemoved). Every event carries a sequence number
// that grows by exactly one per event, so a consumer that sees a jump knows it missed events
// (the cache keeps the last KvCacheOptions::event_buffer of them) and should resynchronize.
// Consumers read them by polling (KvCache::PollEvents) or by a callback (KvCache::SubscribeEvents).
//
// Thread-safety: plain values. A CacheEvent's string views point into strings its cache keeps
// (see CacheEvent): copy the strings to keep an event past the cache's destruction.
#ifndef KVTIER_KV_CACHE_STATS_H_
#define KVTIER_KV_CACHE_STATS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/ids.h"

namespace kvtier {

struct KvTierStats {
  bool present = false;  // the tier is configured; every other field is 0 if not
  // Gauges, in blocks. free + locked + held + droppable + in_flight + quarantined == capacity.
  int64_t capacity_blocks = 0;
  int64_t free_blocks = 0;
  // HBM: pinned by a residency ticket (the kernel reads them), or written by a kernel whose
  // ReportWritten `ready` has not fired and that no index entry keeps (the partial last block;
  // every block of a sequence with caching off).
  int64_t locked_blocks = 0;
  int64_t held_blocks = 0;       // referenced by a sequence (or a transfer reading it), no ticket
  int64_t droppable_blocks = 0;  // cached, referenced by nobody: evictable
  int64_t in_flight_blocks = 0;  // destinations of transfers still running
  int64_t quarantined_blocks = 0;
  // Counters.
  // Lookups cascade from HBM down, as a request's blocks are looked for tier by tier:
  // Attached blocks the attach chose to restore from this tier: the ready copy behind the
  // cheapest link (for HBM: resident). A load that then fails still counts here (and in
  // failed_loads); a retry from another tier is not a second hit.
  int64_t hits = 0;
  int64_t misses = 0;     // full blocks of attach queries matched neither here nor in a faster tier
  int64_t bytes_in = 0;   // bytes of blocks copied into this tier
  int64_t bytes_out = 0;  // bytes of blocks copied out of this tier
  int64_t stored = 0;     // block copies that became readable here
  int64_t evictions = 0;  // block copies dropped from this tier to make room
  int64_t demotions = 0;  // evictions that first copied the block one tier down
  int64_t failed_loads = 0;   // copies out of this tier that failed (the block was a miss)
  int64_t corrupt_reads = 0;  // of those, reads that found wrong or damaged bytes (kDataLoss)
  // Of those, reads of a copy the tier no longer had (kNotFound: a remote store evicted or
  // expired it, or another worker deleted it). Like a corrupt read, it leaves the index at once.
  int64_t missing_reads = 0;
  int64_t failed_stores = 0;  // copies into this tier that failed (the block stayed above)
  // Of the evictions, victims dropped although a tier below could take them: not worth restoring
  // later (KvCacheOptions::demote_by_value).
  int64_t value_drops = 0;
  // The "learned" policy (follow_best, eviction_policy.h): wall microseconds spent in its shadow
  // caches, and how often the tier switched the candidate it follows. 0 for other policies.
  int64_t policy_shadow_us = 0;
  int64_t policy_leader_changes = 0;
  // "learned": prompt blocks (AttachPrefix's, readmissions excepted) whose key fell in its
  // shadows' sample, one per block named; how much of the traffic the shadows simulate.
  int64_t policy_shadow_accesses = 0;
};

// Remote discovery (KvCacheOptions::remote_probe_*): existence probes of the store where a
// prompt's local match ended, by AttachPrefix and Lookup.
struct RemoteProbeStats {
  int64_t probes = 0;            // probes made (each one batched store call, or one refused)
  int64_t failures = 0;          // of those, failed: bypassed, timed out, store unavailable
  int64_t keys_probed = 0;       // block keys asked about
  int64_t blocks_found = 0;      // leading blocks found in the store (they extended a match)
  int64_t blocks_indexed = 0;    // of those, indexed as remote copies by AttachPrefix
  int64_t latency_us_total = 0;  // wall time of the probes, microseconds
  int64_t latency_us_max = 0;
};

struct KvCacheStats {
  std::array<KvTierStats, kNumTiers> tiers{};  // index TierIndex
  int64_t live_sequences = 0;
  int64_t open_tickets = 0;
  int64_t attach_queries = 0;
  int64_t query_tokens = 0;                  // prompt tokens of attach queries
  int64_t matched_tokens = 0;                // of those, in the longest cached prefix
  int64_t attached_tokens = 0;               // of those, restored (the rest is recomputed)
  int64_t cached_but_recomputed_blocks = 0;  // matched blocks the cost model chose to recompute
  int64_t indexed_blocks = 0;                // blocks with a copy in some tier (gauge)
  // Releases with ReleaseHints::preempted and pauses with PauseHints::preempted (each call: a
  // request swapped out again after its swap-in failed counts again).
  int64_t preemptions = 0;
  int64_t readmitted_blocks = 0;  // blocks attached by readmissions (not counted as hits)
  // Block copies that arrived, by source and destination tier: blocks_moved[from][to] (index
  // TierIndex; the diagonal is 0). Onboards are [t][kHbm], demotions and write-through [t][t+k].
  std::array<std::array<int64_t, kNumTiers>, kNumTiers> blocks_moved{};
  uint64_t last_event_sequence = 0;  // 0 before the first event
  RemoteProbeStats remote_probe;
};

// Renders `stats` in the Prometheus text exposition format (version 0.0.4): one `# HELP` and
// `# TYPE` line per metric family, metric names prefixed `kvtier_`, a `tier` label per tier.
// Source: https://prometheus.io/docs/instrumenting/exposition_formats/.
std::string RenderPrometheus(const KvCacheStats& stats);

enum class CacheEventKind : uint8_t {
  kStored = 0,   // a ready copy of `key` exists in `tier` from now on (vLLM's BlockStored)
  kRemoved = 1,  // the copy of `key` in `tier` is gone (vLLM's BlockRemoved)
  // KvCache::ResetPrefixCache cleared `tier` (key: kRootBlockKey): every droppable copy there is
  // gone (each also had its kRemoved); copies held then stay (vLLM's AllBlocksCleared).
  kAllCleared = 2,
};

// One change of one block copy. The fields a KV-aware router needs follow vLLM's KV events
// (vllm/distributed/kv_events.py, consumed by llm-d's and Dynamo's routers): BlockStored's
// block_hashes (here one `key` per event), parent_block_hash (`parent_key`), block_size and
// len(token_ids) (`num_tokens`), lora_name (`adapter_id`) and medium (`tier`); and the worker
// (`worker_id`) that a router otherwise learns from the ZMQ topic or the publisher. The token ids
// themselves are not kept by the cache (a block key is their chained hash): a router that
// indexes by key needs only the count. kRemoved carries the same fields as the kStored of that
// copy did (vLLM's BlockRemoved has only the hashes and medium: the rest is extra).
//
// Memory: 80 bytes, no allocation (the ring of KvCacheOptions::event_buffer events is 5 MiB at
// the default 65536). The two strings are views of the cache's interned copies: one per distinct
// adapter id or worker id (a few bytes each), valid while the cache lives (and, for an event a
// subscription's callback receives, during that call); copy them to keep an event longer. Each
// is NUL-terminated (data()[size()] == 0 when not empty), which the C ABI relies on.
struct CacheEvent {
  uint64_t sequence = 0;  // 1 for the first event; +1 per event
  CacheEventKind kind = CacheEventKind::kStored;
  Tier tier = Tier::kHbm;
  // Whether the block has a parent in the prefix chain (parent_key is then its key): false for
  // a sequence's first block, for kAllCleared, and for a block a warm restart found again on a
  // persistent tier (its slot header keeps only its own key, so its parent is unknown).
  bool has_parent = false;
  // Tokens in the block: the geometry's tokens_per_block (only full blocks are keyed and
  // cached); 0 for kAllCleared.
  int32_t num_tokens = 0;
  BlockKey key;
  BlockKey parent_key = kRootBlockKey;  // the previous block's key; kRootBlockKey without one
  // The id (AdapterIdentity::id; not its load_generation) of the adapter the block was computed
  // under (SequenceOptions::adapter); empty for the base model, for kAllCleared, and for a block
  // whose adapter the cache cannot know (found again by a warm restart). Blocks of different
  // adapters never share a key, so a router may index by key alone.
  std::string_view adapter_id;
  // KvCacheOptions::worker_id of the cache that made the event (empty if unset).
  std::string_view worker_id;
};

}  // namespace kvtier

#endif  // KVTIER_KV_CACHE_STATS_H_
