// The release model of ../shared/policy/policy_lab_agentic.py (its run_release), so a shipped
// EvictionPolicy is checked against that script's figures on the script's own workload before
// the richer replay is trusted (../shared/policy/README.md asks this of every policy).
//
// The workload is the script's: export_release_workload.py (beside this file) imports the script
// and writes the requests it builds from the Claude Code sessions (session offsets, sub-agents,
// the shared tool+system prefix, finish = arrival + api_time) in the format below, so both sides
// see the same requests.
//
// The model. One tier of capacity_blocks blocks holding the KV of *finished* requests; a running
// request holds its blocks outside it. Events are taken in time order (UnixEpoch + seconds),
// finishes before arrivals at equal times, then by request index:
//   - arrival of request r: its hit is the longest leading run of its blocks that are cached or
//     held by a running request. A policy that observes_requests() is given the blocks and the
//     session (ObserveRequest). Each block is then held once more; a cached block no running
//     request held becomes pinned (it stops being a candidate and stops counting against the
//     capacity), with uses + 1.
//   - finish of r: each block is held once less. A policy that observes_requests() is given the
//     release (ObserveRelease: the blocks, the session, the stop reason, or kUnknown for all when
//     stop_reasons is false; no expected idle; superseded when a later request of the session
//     has arrived; the line's last_turn, false when stop_reasons is false). Every block no
//     running request holds any more is released: cached (uses 1) if it was not, unpinned if it
//     was, last use = the finish. Then, while more than
//     capacity_blocks released blocks are cached, the policy's Victim(now) is evicted.
// Candidates and traits are KvCache's, by the same code (sim_tier.h): a cached, unpinned block
// with no cached child. Hit ratio = hit blocks x block_tokens / input tokens.
//
// File format (JSON Lines). The first line is {"block_tokens": B} (B in [1, 2^20]); each further
// line one request, in arrival order:
//   {"arrival": s, "finish": s > arrival, "session": n >= 1, "stop": "tool_use" | "end_turn" |
//    "unknown", "in": input tokens >= 1, "ids": [...], "last_turn": true | false (optional,
//    false when absent: the session sends no further request, ReleaseHints::last_turn)}
// with one id per *full* block (floor(in / B) of them), each naming its whole prefix (an id is
// always at the same position after the same id), ids < 2^62. Blank lines are skipped.
//
// Thread safety: free functions with no shared state; the policy must not be used by another
// thread during a simulation.
#ifndef KVTIER_BENCH_REPLAY_OFFLINE_RELEASE_MODEL_H_
#define KVTIER_BENCH_REPLAY_OFFLINE_RELEASE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/replay/offline/bounds.h"
#include "bench/replay/offline/policy_sim.h"
#include "bench/replay/trace/trace.h"
#include "kvtier/eviction_policy.h"

namespace kvtier::replay {

// Ids at or above this are not accepted in a file: a request whose input ends in a partial block
// gets the id kReleaseTailIdBase + its index for it (never shared), so the Trace has the
// ceil(in / B) ids Trace asks for while the model reads only the full ones.
inline constexpr uint64_t kReleaseTailIdBase = uint64_t{1} << 62;

struct ReleaseModelWorkload {
  Trace trace;                         // arrival, input tokens, ids, session, stop per request
  std::vector<double> finish_seconds;  // per request, after its arrival
};

// The workload at `path`. Errors: those of ForEachTraceLine (kNotFound, ...); kInvalidArgument
// naming the line and field for a line that is not an object of the fields above, a value out of
// range, an arrival before the line before's, a finish not after the arrival (as absl::Time:
// UnixEpoch + seconds), an unknown stop, a last_turn that is not a boolean, an ids count other
// than floor(in / B), an id >= 2^62, a missing or bad header, or no requests. Ids that do not
// name prefixes are found by SimulateReleaseModel (BuildBlockChains).
absl::StatusOr<ReleaseModelWorkload> LoadReleaseModelWorkload(const std::string& path);

struct ReleaseModelOptions {
  int64_t capacity_blocks = 0;                          // >= 0
  int64_t bytes_per_token = DefaultSimBytesPerToken();  // > 0: BlockTraits::bytes per token
  // false: every release says kUnknown and no last_turn (the hint-free control)
  bool stop_reasons = true;
};

// The hits of `policy` (which should start empty) under the release model, as a BoundResult
// named after the policy (tokens_per_block = the workload's block_tokens).
//
// Errors: kInvalidArgument for capacity_blocks < 0, bytes_per_token <= 0, requests out of arrival
// order, finish_seconds not one per request or not after its arrival (as absl::Time), and those
// of BuildBlockChains; kInternal naming the request
// when the policy misbehaves (fails an Add or Remove, has no victim while over capacity, or
// names a block that is not a candidate).
absl::StatusOr<BoundResult> SimulateReleaseModel(const ReleaseModelWorkload& workload,
                                                 EvictionPolicy& policy,
                                                 const ReleaseModelOptions& options);

// The script's offline optimum in the same model ("opt", its PoolBelady): evict the released
// block whose next arrival is furthest, deeper first on ties. Every released interval is worth one
// block hit, so this maximises block hits; the script reports it as the bound. Named "optimal".
// Errors: those of SimulateReleaseModel.
absl::StatusOr<BoundResult> ReleaseModelOptimum(const ReleaseModelWorkload& workload,
                                                int64_t capacity_blocks);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_OFFLINE_RELEASE_MODEL_H_
