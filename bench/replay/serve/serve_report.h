// How kvtier-replay --mode serve prints what it measured: a table for a terminal and JSON for
// --json. The JSON keys of one run are ServeReport's fields by name (serve.h); wall_seconds is
// the only key that differs between two runs of the same inputs, so JSON written with
// `deterministic` leaves it out.
//
// Thread-safety: pure functions.
#ifndef KVTIER_BENCH_REPLAY_SERVE_SERVE_REPORT_H_
#define KVTIER_BENCH_REPLAY_SERVE_SERVE_REPORT_H_

#include <string>
#include <vector>

#include "bench/replay/serve/serve.h"

namespace kvtier::replay {

// {"mode": "serve", "trace": ..., "runs": [run, ...]}, one run per profile.
std::string ServeJson(const std::vector<ServeReport>& runs, bool deterministic = false);

// One row per run: requests finished/failed, served hit ratio, TTFT p50/p90/p99, ITL p50/p99,
// output tokens/s, SLO attainment, preemptions, HBM held/cached means; then a line per run with
// hits by tier and the busiest link.
std::string ServeTable(const std::vector<ServeReport>& runs);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SERVE_SERVE_REPORT_H_
