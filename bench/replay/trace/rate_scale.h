// A load sweep's transform of a trace (kvtier-replay --rate-scale): the same requests, offered
// `rate_scale` times as fast. Open-loop arrivals move toward the first arrival (their offsets
// from it are divided by rate_scale); a closed-loop session's start is such an arrival, and its
// think times are divided too, so a session's later requests also come rate_scale times as
// soon after the previous one finished. Everything else (tokens, block ids, sessions, stop
// reasons, order) is unchanged, and the serving simulation reads the result as any trace.
//
// Thread-safety: a pure function; the input is only read.
#ifndef KVTIER_BENCH_REPLAY_TRACE_RATE_SCALE_H_
#define KVTIER_BENCH_REPLAY_TRACE_RATE_SCALE_H_

#include "absl/status/statusor.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {

// `trace` with every request's arrival_seconds replaced by
// first + (arrival_seconds - first) / rate_scale (first: requests[0]'s arrival, so the first
// request keeps its time and arrivals stay non-decreasing) and think_seconds by
// think_seconds / rate_scale. The name stays (reports carry the scale beside it).
// Errors: kInvalidArgument when rate_scale is not a finite number > 0.
absl::StatusOr<Trace> ScaleRate(const Trace& trace, double rate_scale);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_RATE_SCALE_H_
