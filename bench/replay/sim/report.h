// How kvtier-replay prints what it measured: the table for a terminal, the JSON for --json, and
// the capacity syntax of its flags.
//
// JSON keys of one report (docs/replay.md): name, trace, model, tokens_per_block, payload,
// capacity_blocks {hbm, dram, nvme, remote} (-1 absent), requests, prompt_tokens, hit_tokens,
// hit_tokens_by_tier {hbm, dram, nvme, remote}, recomputed_tokens, hit_ratio, bytes_moved
// {"dram->hbm": bytes, ...} (every pair that moved bytes), modeled_ttft_ms {p50, p90, p99},
// modeled_prefill_seconds_saved, restore_vs_recompute {restored_blocks,
// restored_blocks_below_hbm, recomputed_although_cached {last_token, cost_model, not_resident}},
// corrupt_blocks, failed_loads, failed_requests, evictions, demotions, policy_shadow_seconds,
// policy_leader_changes, policy_shadow_accesses (the learned policy's miniature simulations),
// value_drops (victims dropped rather than demoted: not worth restoring), wall_seconds.
//
// Thread-safety: pure functions.
#ifndef KVTIER_BENCH_REPLAY_SIM_REPORT_H_
#define KVTIER_BENCH_REPLAY_SIM_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/replay/sim/replay.h"

namespace kvtier::replay {

// One report as a JSON object (text).
std::string ReportJson(const ReplayReport& report);
// Several reports (--compare): {"trace": ..., "runs": [report, ...]}.
std::string CompareJson(const std::vector<ReplayReport>& reports);
// A capacity sweep: {"trace": ..., "tier": "hbm", "points": [{"capacity_blocks": n, "runs":
// [...]}, ...]}; `points[i]` holds the runs at capacities[i].
std::string SweepJson(const std::string& tier, const std::vector<int64_t>& capacities,
                      const std::vector<std::vector<ReplayReport>>& points);

// A fixed-width table, one row per report: hit ratio, hits by tier, TTFT percentiles, prefill
// saved, bytes moved, corrupt blocks, wall time.
std::string ReportTable(const std::vector<ReplayReport>& reports);

// A tier size from a flag: "unlimited"; "0" or "none" (the tier is absent); a byte count with an
// optional binary or decimal unit ("80GiB", "1TiB", "512MB", "1e12"); or blocks ("5000blocks").
// Bytes become floor(bytes / block_bytes) blocks (at least one block must fit).
// Errors: kInvalidArgument naming the text.
absl::StatusOr<TierCapacity> ParseTierSize(const std::string& text, int64_t block_bytes);

// Whether a report can be written to `path` later, without creating it: its folder exists and
// is writable, and the file, if present, is writable. Errors: kInvalidArgument naming the path
// and why.
absl::Status CheckWritablePath(const std::string& path);

// "1.5 TiB", "320 KiB", "12 B".
std::string FormatBytes(double bytes);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SIM_REPORT_H_
