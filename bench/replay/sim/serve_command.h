// kvtier-replay --mode serve: the flags of the serving simulation (serve/serve.h) and the run
// they ask for. replay_main.cc parses them beside the cache mode's flags; this file validates
// them, runs each profile (all five with --compare), at each point of a sweep (--sweep over a
// tier's size, or --rate-scale over the offered load), and prints the table, the JSON and the
// plot.
//
// Thread-safety: single-threaded; it prints to stdout and stderr.
#ifndef KVTIER_BENCH_REPLAY_SIM_SERVE_COMMAND_H_
#define KVTIER_BENCH_REPLAY_SIM_SERVE_COMMAND_H_

#include <array>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "bench/replay/serve/serve.h"
#include "bench/replay/sim/model_table.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {

struct ServeFlags {
  std::string gpu = "H100";
  int tensor_parallel = 1;
  int instances = 1;
  std::string router = "session";
  bool shared_remote = true;  // one remote store for the fleet (ServeOptions::shared_remote)
  std::string profile = "kvtier";
  std::string policy = "learned";     // the kvtier profile's (ServeOptions::kvtier_policy)
  std::string hints = "stop-reason";  // none, stop-reason or oracle-idle (kvtier_hints)
  bool demote_by_value = true;        // the kvtier profile's (kvtier_demote_by_value)
  bool compare = false;
  // Per instance: "auto" (HBM only: the KV pool the roofline leaves), a byte size, Nblocks, or 0.
  std::array<std::string, kNumTiers> size = {"auto", "256GiB", "2TiB", "8TiB"};
  double onboard_deadline_ms = 1000;
  bool layerwise_onboard = false;  // ServeOptions::layerwise_onboard
  bool open_loop = false;
  double slo_ttft_ms = 2000;
  double slo_itl_ms = 100;
  int64_t max_batched_tokens = 8192;
  int max_running = 256;
  std::string preemption = "recompute";  // or "swap" (SchedulerOptions::swap)
  double mfu = 0.5;
  double pcie_bandwidth = 50e9;
  double nvme_bandwidth = 6e9;
  double network_bandwidth = 12.5e9;
  // "TIER=SIZE,SIZE,..." (TIER hbm, dram, nvme or remote; each SIZE as in `size`): the runs
  // again at each size of that tier, the others as `size` says. Empty: no sweep.
  std::string sweep;
  // "X,Y,...", each a finite number > 0: the runs again with the offered load multiplied by each
  // (ScaleRate, trace/rate_scale.h). Empty: the trace's own load. Not with `sweep`.
  std::string rate_scale;
  // A PNG for gnuplot: the TTFT CDF of each profile, or in a sweep TTFT p50, p90 and output
  // tokens/s against the swept value, a line per profile. Empty: none.
  std::string plot;
  std::string json;
  bool quiet = false;
};

// What went wrong: kInvalidArgument is the user's input (exit code 2), anything else exit 1.
// `progress` (may be empty) is called as the runs go, with (label, done, total).
absl::Status RunServeCommand(
    const ServeFlags& flags, const ModelSpec& model, int tokens_per_block, const Trace& trace,
    int64_t max_requests,
    const std::function<std::function<void(int64_t, int64_t)>(const std::string&)>& progress);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SIM_SERVE_COMMAND_H_
