// The replay driver: runs a Trace through a real KvCache, request by request on the trace's
// clock, and reports what the cache saved (ReplayReport). kvtier-replay is its command line.
//
// Per request, in arrival order, one at a time (the cache's clock reads the request's arrival):
//   Lookup (hits by tier as the request finds them, side-effect free),
//   [a paused sequence of the same session: Resume, and wait for the onboarding it starts,
//   charged to this request's restore from the tiers Lookup found],
//   CreateSequence, AttachPrefix (restore or
//   recompute, by the cost model), Append the rest of the prompt, EnsureResident(kWait) over the
//   whole prompt (onboards the restored blocks), the "prefill kernel" writes the new blocks,
//   ReportWritten, ReleaseTicket; then Release, or with hints Pause after a kToolUse stop (the
//   next request of the session Resumes it and Releases it once it has attached its prefix).
// Only prompts are cached: decode tokens are not replayed (no trace names them again).
//
// Payload modes:
//   kNone    every tier is a MetadataTier of the model's geometry: every decision and count of
//            the cache is real, no KV byte exists.
//   kScaled  real tiers (EmulatedHbm, DramTier, an NVMe file, a RemoteTier on a directory or
//            Redis) of a reduced geometry (1 layer, 1 KV head, payload_bytes_per_token bytes a
//            token), with the same block counts as the model's capacities. The "kernel" writes
//            each new block with bytes generated from its identity (trace block id, index in it)
//            and position; every attached block is checked byte for byte once it is resident in
//            HBM: a mismatch is a corrupt block. Link bandwidths are scaled by the byte ratio, so
//            the cost model makes the same decisions as in kNone and the hit counts agree.
//
// Hits: a request's hit tokens are its longest cached prefix (AttachResult::matched_tokens),
// as the bounds (offline/bounds.h) count them; tokens of that prefix the cost model chose to
// recompute are still hits, reported under restore_vs_recompute.
//
// Modeled TTFT (docs/replay.md): requests queue in arrival order for the first free of
// `prefill_instances` prefill instances; each takes restore time (per source tier: latency +
// model bytes / link bandwidth, HBM free) plus recompute time (PrefillCostModel of the
// uncached tokens at prefill_flops_per_second). TTFT = finish - arrival.
//
// Thread-safety: RunReplay is reentrant; it owns everything it creates. The Trace is only read.
#ifndef KVTIER_BENCH_REPLAY_SIM_REPLAY_H_
#define KVTIER_BENCH_REPLAY_SIM_REPLAY_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/replay/offline/bounds.h"
#include "bench/replay/trace/trace.h"
#include "kvtier/cost_model.h"
#include "kvtier/ids.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_backend.h"

namespace kvtier::replay {

enum class PayloadMode : uint8_t { kNone = 0, kScaled = 1 };
// What the replay tells the cache when a request of a session finishes. Every mode names the
// request's session (SequenceOptions::session); they differ in the signals that come with it.
enum class HintMode : uint8_t {
  kNone = 0,        // Release, no signal
  kPause = 1,       // Pause after a kToolUse stop (expected idle 9 s, the traces' median after
                    // tool_use), Resume at the session's next request; else Release
  kStopReason = 2,  // Release with the request's stop reason (ReleaseHints::stop_reason), and
                    // last_turn where the client knows no request follows (TraceRequest)
  kOracleIdle = 3,  // Release as kStopReason and, as expected_idle, the true time to the
                    // session's next request: an ORACLE (no engine knows it), labelled so
};
// "none", "pause", "stop-reason", "oracle-idle".
const char* HintModeName(HintMode mode);

// One tier's size. A tier is present with a number of blocks, or unlimited (as many blocks as
// the trace can ever fill), or absent.
struct TierCapacity {
  enum class Kind : uint8_t { kAbsent = 0, kBlocks = 1, kUnlimited = 2 };
  Kind kind = Kind::kAbsent;
  int64_t blocks = 0;  // for kBlocks, >= 1
  static TierCapacity Absent() { return {}; }
  static TierCapacity Blocks(int64_t n) { return {Kind::kBlocks, n}; }
  static TierCapacity Unlimited() { return {Kind::kUnlimited, 0}; }
};

struct ReplayOptions {
  explicit ReplayOptions(const KvGeometry& model_geometry) : geometry(model_geometry) {}

  std::string label;  // the report's name; defaults to the policy
  std::string model_name;
  // The model's geometry; its tokens_per_block is the cache block size (must divide the
  // trace's block_tokens).
  KvGeometry geometry;
  PrefillCostOptions prefill;  // flops_per_second: one prefill instance's sustained rate
  int prefill_instances = 1;   // >= 1
  std::array<TierCapacity, kNumTiers> capacity;  // index TierIndex; HBM must be present
  // Cost of restoring into HBM from each tier (HBM ignored); also the cache's cost model links.
  std::array<TierLinkCost, kNumTiers> links;
  std::string policy = "lru";  // "lru", "cost_aware", "reuse_index" or "learned"
  PayloadMode payload = PayloadMode::kNone;
  int payload_bytes_per_token = 4;  // kScaled: multiple of 4, in [4, 65536]
  HintMode hints = HintMode::kPause;
  bool demote_by_value = true;  // KvCacheOptions::demote_by_value
  // kScaled: directory for the NVMe file and the remote directory store; empty: a fresh temporary
  // directory, removed afterwards.
  std::string work_dir;
  // kScaled: when set, the NVMe file (DIR/nvme.bin) and the directory store (DIR/remote) live in
  // this directory (created if missing) and are kept after the run, so the next run over it
  // starts with them: the NVMe tier's blocks by warm restart, the store's by discovery where the
  // cache probes the remote tier. Overrides work_dir. kInvalidArgument with kNone.
  std::string keep_state_dir;
  // kScaled remote store: empty for a directory under work_dir, else a URL RemoteTransportFromUrl
  // takes (kvtier/tier_stack.h): "redis://[[user]:password@]host:port[/db]" or
  // "redis-cluster://host:port[,host:port...]".
  std::string remote_url;
  int64_t max_requests = -1;  // replay only the first n requests; < 0: all
  // Called after every request with (done, total), from the calling thread.
  std::function<void(int64_t, int64_t)> progress;
  // Checked after every request: true stops the run with kCancelled (its scratch directory is
  // removed on the way out). kvtier-replay sets it from SIGINT and SIGTERM.
  std::function<bool()> cancelled;
  // For tests: may wrap each tier backend (e.g. in a fault injector) before the cache takes it.
  std::function<std::unique_ptr<TierBackend>(Tier, std::unique_ptr<TierBackend>)> wrap_tier;
};

struct RestoreVsRecompute {
  int64_t restored_blocks = 0;            // attached and resident when the kernel ran
  int64_t restored_blocks_below_hbm = 0;  // of those, onboarded from DRAM, NVMe or remote
  // Matched blocks recomputed anyway, by why:
  int64_t last_token = 0;    // the prompt's last token must be computed (a fully cached prompt)
  int64_t cost_model = 0;    // recomputing was faster than restoring
  int64_t not_resident = 0;  // the onboard failed or missed its deadline
};

struct ReplayReport {
  std::string name;   // "lru", "cost_aware", "unlimited", "optimal", "recompute_all", ...
  // The hint mode the run gave the cache (HintModeName); "oracle-idle" marks an oracle run.
  std::string hints;
  std::string trace;  // Trace::name
  std::string model;
  int tokens_per_block = 0;
  std::string payload;  // "none", "scaled", or "bound" for the offline bounds
  // Capacity of each tier in blocks; -1 absent, and for bounds the total used.
  std::array<int64_t, kNumTiers> capacity_blocks{-1, -1, -1, -1};
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;
  // Hit tokens by the fastest tier holding each hit block at lookup; bounds have no tiers and
  // count every hit as HBM.
  std::array<int64_t, kNumTiers> hit_tokens_by_tier{};
  int64_t recomputed_tokens = 0;  // prompt tokens the prefill computed
  double hit_ratio = 0;           // hit_tokens / prompt_tokens
  // Model bytes copied between tiers, [from][to] (index TierIndex).
  std::array<std::array<int64_t, kNumTiers>, kNumTiers> bytes_moved{};
  double ttft_p50_ms = 0;
  double ttft_p90_ms = 0;
  double ttft_p99_ms = 0;
  // Sum over requests of (prefill time of the whole prompt - restore time - recompute time).
  double prefill_seconds_saved = 0;
  RestoreVsRecompute restore_vs_recompute;
  int64_t corrupt_blocks = 0;   // attached blocks whose bytes did not match (kScaled)
  int64_t failed_loads = 0;     // copies that failed (the cache's failed_loads over all tiers)
  int64_t failed_requests = 0;  // requests the cache refused (HBM full of held blocks)
  // Copies into each tier that failed (KvTierStats::failed_stores, index TierIndex): a full
  // disk under the NVMe file or the directory store, a store refusing writes. The blocks stayed
  // where they were (or were dropped), so later requests miss them; the report warns.
  std::array<int64_t, kNumTiers> failed_stores{};
  int64_t evictions = 0;        // all tiers
  int64_t demotions = 0;
  // Remote discovery (the cache's KvCacheStats::remote_probe): probes of the store where a
  // prompt's local match ended, probes that failed or timed out, and the blocks they found and
  // indexed (0 in payload none: a MetadataTier is never probed).
  int64_t remote_probes = 0;
  int64_t remote_probe_failures = 0;
  int64_t remote_blocks_found = 0;
  int64_t remote_blocks_indexed = 0;
  double wall_seconds = 0;
  // The learned policy's miniature simulations (KvTierStats::policy_shadow_us, all tiers): wall
  // seconds inside wall_seconds, the switches of the candidate each tier followed, and the
  // prompt blocks they simulated (policy_shadow_accesses).
  double policy_shadow_seconds = 0;
  int64_t policy_leader_changes = 0;
  int64_t policy_shadow_accesses = 0;
  int64_t value_drops = 0;  // KvTierStats::value_drops, all tiers
};

// Runs `trace` through a KvCache built from `options`. Errors: kInvalidArgument for options out of
// range (no HBM, a block size that does not divide the trace's, an unknown policy, a bad remote
// URL, payload_bytes_per_token), or a trace the bounds' checks reject, and, before anything is
// written, when the NVMe file and a directory store at full capacity would not fit
// the free space of the disk under work_dir (kScaled); kCancelled when `cancelled` said so; the
// cache's errors otherwise (e.g. kResourceExhausted when a tier cannot be allocated).
absl::StatusOr<ReplayReport> RunReplay(const Trace& trace, const ReplayOptions& options);

// The report an offline bound (or recompute_all, hits all zero) gives under the same modeled
// TTFT, every hit restored from HBM at no cost. `name` names it.
absl::StatusOr<ReplayReport> BoundReport(const Trace& trace, const ReplayOptions& options,
                                         const std::string& name,
                                         const std::vector<int64_t>& hit_tokens_per_request);

// Full cache blocks (at geometry.tokens_per_block) that distinct requests' prompts name, and the
// longest prompt in blocks: what "unlimited" sizes a tier from.
struct TraceFootprint {
  int64_t distinct_full_blocks = 0;
  int64_t max_prompt_blocks = 0;
  int64_t sessions = 0;
};
absl::StatusOr<TraceFootprint> MeasureFootprint(const Trace& trace, int tokens_per_block);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SIM_REPLAY_H_
