// The load sweep's trace transform (rate_scale.h).
#include "bench/replay/trace/rate_scale.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier::replay {

absl::StatusOr<Trace> ScaleRate(const Trace& trace, double rate_scale) {
  if (!std::isfinite(rate_scale) || rate_scale <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate scale ", rate_scale, ": must be a finite number > 0"));
  }
  Trace out = trace;
  if (rate_scale == 1 || out.requests.empty()) return out;
  const double first = trace.requests.front().arrival_seconds;
  for (TraceRequest& r : out.requests) {
    // Division by a positive number and adding `first` are both monotone in IEEE arithmetic, so
    // the order of arrivals survives rounding.
    r.arrival_seconds = first + (r.arrival_seconds - first) / rate_scale;
    r.think_seconds /= rate_scale;
  }
  // A small scale stretches the trace: past kMaxTraceSeconds the replay's clock would overflow.
  if (const double span = out.requests.back().arrival_seconds - first; span > kMaxTraceSeconds) {
    return absl::InvalidArgumentError(absl::StrCat("rate scale ", rate_scale,
                                                   ": stretches the trace to ", span, " s, past ",
                                                   kMaxTraceSeconds, " s (kMaxTraceSeconds)"));
  }
  return out;
}

}  // namespace kvtier::replay
