// How kvtier-replay --mode serve prints what it measured: a table for a terminal and JSON for
// --json. The JSON keys of one run are ServeReport's fields by name (serve.h), and in a sweep
// the point the run was at; wall_seconds is the only key that differs between two runs of the
// same inputs, so JSON written with `deterministic` leaves it out.
//
// Thread-safety: pure functions.
#ifndef KVTIER_BENCH_REPLAY_SERVE_SERVE_REPORT_H_
#define KVTIER_BENCH_REPLAY_SERVE_SERVE_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/replay/serve/serve.h"

namespace kvtier::replay {

// What one run of a sweep varied (kvtier-replay --sweep, --rate-scale); kNone outside a sweep.
struct ServeSweepPoint {
  enum class Kind : uint8_t { kNone, kTier, kRateScale };
  Kind kind = Kind::kNone;
  int tier = 0;           // kTier: the swept tier, index TierIndex
  int64_t blocks = 0;     // kTier: its blocks per instance (0: absent)
  double rate_scale = 1;  // kRateScale: the offered load's multiplier (trace/rate_scale.h)
};

// One run: a profile's report at one point of a sweep.
struct ServeRun {
  ServeReport report;
  ServeSweepPoint point;
};

// The swept value of `point` for a table or a plot's x axis: blocks, or the rate scale; 0 for
// kNone.
double SweepValue(const ServeSweepPoint& point);

// {"mode": "serve", "trace": ..., "runs": [run, ...]}, one run per profile (per point of a
// sweep, points in order). A run at a kTier point has "sweep": {"tier": "hbm", "blocks": n}; at
// a kRateScale point, "rate_scale": x.
std::string ServeJson(const std::vector<ServeRun>& runs, bool deterministic = false);

// One row per run: requests finished/failed, served hit ratio, TTFT p50/p90/p99, ITL p50/p99,
// output tokens/s, SLO attainment, preemptions, HBM held/cached means, led in a sweep by the
// point's value (the tier's blocks, or the rate scale); then a line per run with hits by tier
// and the busiest link.
std::string ServeTable(const std::vector<ServeRun>& runs);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_SERVE_SERVE_REPORT_H_
