// The serving simulation (kvtier-replay --mode serve, docs/replay.md): a trace served by one or
// more inference instances, each a continuous-batching scheduler over its own real KvCache, on
// the trace's simulated clock. Every placement, eviction, restore and prefix match is the
// cache's own decision; the simulation supplies time: step durations from a roofline
// (hardware.h) and transfer durations from links shared by the transfers in flight (link.h).
//
// Per instance, per step (as vLLM V1 and SGLang schedule):
//   1. every decoding request takes one token: a slot for it (Append); when HBM is full of
//      held blocks the most recently admitted request is preempted (its KV released, cached
//      blocks stay cached; it re-enters the queue's head as a readmission and recomputes or
//      re-attaches its prompt and the tokens it had produced);
//   2. requests in prefill take chunks of the remaining token budget (chunked prefill);
//   3. queued requests are admitted in arrival order while budget and running slots remain:
//      CreateSequence, AttachPrefix (the cached prefix), Append (slots for the rest of the
//      prompt). A request whose HBM room is missing waits at the head of the queue; one whose
//      prompt cannot fit an empty HBM fails ("prompt_exceeds_hbm"). Attached blocks below HBM
//      are onboarded (EnsureResident): the request waits for its transfers on the links while
//      others keep running, at most onboard_deadline_seconds after admission; what has not
//      landed by then is recomputed (counted as late, not as a hit).
//   The step lasts Roofline::StepSeconds of its batch. A request's first token comes at the
//   end of the step that finishes its prefill (TTFT = that - arrival); each later step gives
//   one token (inter-token latency = the time between consecutive tokens).
// Copies the cache makes on its own (demotions, write-through, pauses) load the links too.
// Sessions (traces with session ids) run closed-loop when closed_loop: a session's next
// request arrives its think time after the previous one finished, so slower service delays the
// session as it does a real agent; requests without a session arrive at their trace time.
//
// Profiles, one cache configuration each (docs/replay.md says what of each peer is modeled):
//   recompute  no prefix cache (caching off on every sequence)
//   hbm_lru    prefix cache in HBM only, LRU (vLLM automatic prefix caching)
//   dram_lru   HBM + DRAM, every computed block written through to DRAM, LRU, load on hit
//              (LMCache, vLLM CPU offloading)
//   hicache    HBM + DRAM + remote, write-through, LRU (SGLang HiCache with an L3)
//   kvtier     every configured tier, write-back, the learned policy, the restore-versus-
//              recompute cost model, stop-reason hints on release, prefetch of a queued
//              request's prefix at its arrival
// Where a profile has a tier the options give no capacity for, it runs without it.
//
// Determinism: no thread timing enters the results: every cache call completes its copies
// (KvCache::WaitIdle) before the simulation goes on, and time is the simulated clock. Equal
// inputs give equal reports.
//
// The remote tier: with shared_remote (the default), one store for the whole fleet, as SGLang
// HiCache's L3 or LMCache's shared backends are: every instance's remote tier writes there and
// discovers (KvCache's remote discovery) what the others wrote, so a session that moves to
// another instance finds its prefix. Each instance's remote capacity is its own budget of the
// store, as RemoteTier's slots are. Off: each instance's remote tier is its own.
//
// Preemption (SchedulerOptions::swap): by recompute (above), or by swap as vLLM's swap mode:
// the victim's KV goes one tier down (KvCache::Pause: its full blocks get a lower copy over the
// d2h link, its HBM copies become droppable) and the request waits at the queue's head; swapped
// in (KvCache::Resume) it waits for its blocks on the links, as an onboarding with its deadline,
// then decodes on from where it was. Only decoding requests are swapped, and only where the
// profile has a tier below HBM; other victims are recomputed. The partial last block stays in
// HBM (Pause keeps what is not yet a full written block).
//
// Not modeled yet (docs/replay.md): the probe's network round trip (discovery answers at once on
// the simulated clock); layer-wise onboarding's per-layer timing beyond "the last layer's KV
// lands, then the last layer computes" (ServeOptions::layerwise_onboard).
//
// Thread-safety: RunServe is reentrant; it owns everything it creates. The Trace is only read.
#ifndef KVTIER_BENCH_REPLAY_SERVE_SERVE_H_
#define KVTIER_BENCH_REPLAY_SERVE_SERVE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/replay/serve/hardware.h"
#include "bench/replay/trace/trace.h"
#include "kvtier/cost_model.h"
#include "kvtier/ids.h"
#include "kvtier/kv_geometry.h"

namespace kvtier::replay {

enum class ServeProfile : uint8_t { kRecompute, kHbmLru, kDramLru, kHicache, kKvtier };
inline constexpr ServeProfile kAllServeProfiles[] = {ServeProfile::kRecompute,
                                                     ServeProfile::kHbmLru, ServeProfile::kDramLru,
                                                     ServeProfile::kHicache, ServeProfile::kKvtier};
// "recompute", "hbm_lru", "dram_lru", "hicache", "kvtier".
const char* ServeProfileName(ServeProfile profile);
// Errors: kInvalidArgument listing the names.
absl::StatusOr<ServeProfile> ParseServeProfile(std::string_view name);

// Which instance a request goes to.
enum class RouterKind : uint8_t {
  kRoundRobin,   // in turn
  kLeastLoaded,  // fewest queued and running requests (lowest index on a tie)
  kSession,      // a session stays where its first request went (least loaded); none: least
                 // loaded
  kKvAware,      // least estimated work: the prompt tokens the instance's cache does not hold
                 // (KvCache::Lookup) plus the prompt tokens queued there (llm-d, Dynamo)
};
const char* RouterName(RouterKind router);  // "round_robin", "least_loaded", "session", "kv_aware"
absl::StatusOr<RouterKind> ParseRouter(std::string_view name);

struct SchedulerOptions {
  int64_t max_batched_tokens = 8192;  // token budget per step (vLLM max_num_batched_tokens)
  int max_running = 256;              // running requests (vLLM max_num_seqs)
  bool swap = false;  // preempt decoding requests by swapping their KV down (see above)
};

// What the kvtier profile tells its cache when a request of a session finishes (the cache-mode
// replay's --hints, less pause): nothing, the stop reason (with last_turn where the trace says
// the client knows it), or those and the true time to the session's next arrival as
// expected_idle (an ORACLE: from the trace, labelled so).
enum class ServeHints : uint8_t { kNone = 0, kStopReason = 1, kOracleIdle = 2 };
// "none", "stop-reason", "oracle-idle" (the --hints names), and back. Errors: kInvalidArgument
// naming the choices (pause is the cache replay's alone).
const char* ServeHintsName(ServeHints hints);
absl::StatusOr<ServeHints> ParseServeHints(std::string_view name);

struct ServeOptions {
  explicit ServeOptions(const KvGeometry& model_geometry) : geometry(model_geometry) {}

  std::string model_name;
  KvGeometry geometry;       // tokens_per_block divides the trace's block size
  PrefillCostOptions cost;   // params, layers, d_model (flops_per_second from the roofline)
  RooflineOptions roofline;  // GPU kind, tensor parallelism, efficiencies
  HostLinks links;           // per instance
  SchedulerOptions scheduler;
  ServeProfile profile = ServeProfile::kKvtier;
  // The kvtier profile's eviction policy (MakeEvictionPolicy's names, or "learned"), hints and
  // KvCacheOptions::demote_by_value; the other profiles run lru and give none. A run off these
  // defaults is reported as "kvtier(policy, hints)", or "kvtier(policy, hints, demote all)"
  // without demote_by_value; an oracle's name ends in "+oracle".
  std::string kvtier_policy = "learned";
  ServeHints kvtier_hints = ServeHints::kStopReason;
  bool kvtier_demote_by_value = true;
  int instances = 1;  // in [1, 64]
  RouterKind router = RouterKind::kRoundRobin;
  // Blocks per instance, index TierIndex. HBM: 0 sizes it from the roofline's KV pool
  // (Roofline::KvPoolBytes / bytes per block); others: 0 absent.
  std::array<int64_t, kNumTiers> capacity_blocks{0, 0, 0, 0};
  // With a remote tier and several instances: one fleet-wide store (see above), or one each.
  bool shared_remote = true;
  double onboard_deadline_seconds = 1.0;  // > 0
  // Layer-wise onboarding (LMCache's and vLLM's layer-wise connectors): a request whose
  // transfers are expected to land by the deadline (at the links' current sharing) starts
  // computing at once; each step it is in ends no sooner than its last transfer lands plus one
  // layer's share of the step (layer i+1 lands while layer i computes). Off: it waits for all.
  bool layerwise_onboard = false;
  bool closed_loop = true;
  double slo_ttft_seconds = 2.0;  // a request meets the SLO when its TTFT <= this
  double slo_itl_seconds = 0.1;   // and its mean inter-token time (TPOT) <= this
  int64_t max_requests = -1;      // serve only the first n requests; < 0: all
  // Called now and then with (requests finished or failed, total), from the calling thread.
  std::function<void(int64_t, int64_t)> progress;
};

struct LinkReport {
  std::string name;  // "i0.pcie_h2d", "i0.pcie_d2h", "i0.nvme", "i0.network"
  double bytes = 0;
  // Busy seconds / (first arrival to the end of the last copy, which may drain after the
  // last request finished).
  double utilization = 0;
};

struct ServeReport {
  std::string profile;
  std::string trace;
  std::string model;
  std::string gpu;
  int tensor_parallel = 1;
  int instances = 1;
  std::string router;
  std::array<int64_t, kNumTiers> capacity_blocks{-1, -1, -1, -1};  // per instance; -1 absent
  bool shared_remote = false;  // the instances' remote tiers share one store
  // Blocks an instance found in the remote store by discovery (KvCache's remote probe) that it
  // had not indexed itself, summed over instances: what another instance (or an evicted copy of
  // its own) left there. With a shared store, the cross-instance reuse.
  int64_t remote_discovered_blocks = 0;
  int64_t requests = 0;                                            // requests that arrived
  int64_t finished = 0;
  int64_t failed = 0;  // every request finishes or fails with a reason:
  // The request (its prompt, or after a preemption its prompt and the tokens it had produced)
  // does not fit an empty HBM, or a request running alone outgrew it while decoding; tokens a
  // failed request had produced are not in output_tokens.
  int64_t failed_prompt_exceeds_hbm = 0;
  // Tokens of admitted requests (a failed request that was never admitted counts in none):
  // prompt_tokens = served_hit_tokens + prefilled_tokens - recomputed_after_preemption_tokens
  // for runs without preemption (a request preempted while onboarding or in prefill loses
  // part of its first pass; its readmissions' prefill is recomputed_after_preemption_tokens,
  // part of prefilled_tokens). Hits are counted at a request's first admission.
  int64_t prompt_tokens = 0;
  int64_t matched_tokens = 0;     // the caches' longest cached prefixes at admission
  int64_t served_hit_tokens = 0;  // of those, served from cache (resident, or landed in time)
  std::array<int64_t, kNumTiers> served_hit_tokens_by_tier{};  // by the tier they came from
  int64_t late_tokens = 0;                   // matched and attached, not landed by the deadline
  int64_t cost_model_recomputed_tokens = 0;  // matched, recomputed by the cost model's choice
  int64_t prefilled_tokens = 0;
  int64_t recomputed_after_preemption_tokens = 0;
  int64_t output_tokens = 0;
  int64_t preemptions = 0;
  int64_t swap_preemptions = 0;  // of which by swap (SchedulerOptions::swap); the rest recompute
  // Releases told the time to the session's next request (--hints oracle-idle), closed loop or
  // open.
  int64_t oracle_idle_releases = 0;
  double ttft_p50_ms = 0, ttft_p90_ms = 0, ttft_p99_ms = 0;
  // The TTFT distribution of the finished requests in 101 points, ms: element k is the k-th
  // percentile (the ceil(k n / 100)-th fastest of n, element 0 the fastest, 100 the slowest),
  // so the report stays this size however long the trace; empty when none finished.
  std::vector<double> ttft_percentiles_ms;
  double itl_p50_ms = 0, itl_p99_ms = 0;
  double e2e_p50_s = 0, e2e_p99_s = 0;
  double simulated_seconds = 0;         // first arrival to last finish
  double output_tokens_per_second = 0;  // output_tokens / simulated_seconds
  int64_t slo_met = 0;                  // finished requests meeting both SLOs
  double slo_attainment = 0;            // slo_met / requests
  // HBM blocks from the first arrival to the last finish, summed over instances: held by
  // running requests, and cached (droppable); time-weighted means and the maximum of held.
  double hbm_running_blocks_mean = 0;
  double hbm_cached_blocks_mean = 0;
  int64_t hbm_running_blocks_max = 0;
  // The same over time, summed over instances: (simulated seconds since the first arrival,
  // blocks held, blocks cached), each the state just before that instant's changes; at most 4096
  // points (the period starts at 1 s and doubles, every other point dropped, whenever the list
  // would outgrow that).
  struct OccupancyPoint {
    double seconds = 0;
    int64_t running = 0;
    int64_t cached = 0;
  };
  std::vector<OccupancyPoint> hbm_occupancy;
  std::vector<LinkReport> links;
  int64_t steps = 0;
  double wall_seconds = 0;
};

// Serves `trace` under `options`. Errors: kInvalidArgument for options out of range (a block
// size that does not divide the trace's, instances, deadlines, SLOs, scheduler limits, a
// roofline the model does not fit, HBM of no block), naming the option; the cache's errors
// otherwise.
absl::StatusOr<ServeReport> RunServe(const Trace& trace, const ServeOptions& options);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SERVE_SERVE_H_
