// The embedded agentic workload (agentic_workload.h): a fixed-seed trace of agent sessions.
#include "bench/replay/trace/agentic_workload.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kZ90 = 1.2815515655446004;  // the standard normal's 90th percentile
constexpr double kMaxDrawnTokens = 32768;

// std::mt19937_64 (its output sequence is fixed by the standard) with the distributions written
// out, so every standard library draws the same values.
class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}

  // [0, 1), from the top 53 bits.
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // (0, 1): never 0, so its log is finite.
  double OpenUniform() { return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1.0p-53; }

  // Box-Muller, one normal per pair of uniforms (the second of the pair is not kept, so the
  // number of engine draws per call is fixed).
  double Normal() {
    const double u1 = OpenUniform();
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  }
  double LogNormal(double median, double sigma) { return median * std::exp(sigma * Normal()); }
  double Exponential(double mean) { return -mean * std::log(OpenUniform()); }
  bool Bernoulli(double p) { return Uniform() < p; }

 private:
  std::mt19937_64 engine_;
};

double SigmaFromP90(double median, double p90) { return std::log(p90 / median) / kZ90; }

int64_t DrawTokens(Random& random, double median, double sigma) {
  const double tokens = std::round(random.LogNormal(median, sigma));
  return static_cast<int64_t>(std::clamp(tokens, 1.0, kMaxDrawnTokens));
}

// Ids: the system prefix's full blocks are 0 .. system_blocks - 1 in every session; every other
// block (a session's own, and each request's partial last block) gets the next fresh id.
class IdSource {
 public:
  explicit IdSource(uint64_t first_fresh) : next_(first_fresh) {}
  uint64_t Fresh() { return next_++; }

 private:
  uint64_t next_;
};

struct Pauses {
  double tool_sigma;
  double human_sigma;
};

// Appends one session's requests to `out`.
void GenerateSession(const AgenticOptions& o, const Pauses& pauses, uint64_t session,
                     double start_seconds, Random& random, IdSource& ids,
                     std::vector<TraceRequest>& out) {
  const int64_t system_blocks = o.system_prefix_tokens / kAgenticBlockTokens;
  // The ids of the current context's full blocks.
  std::vector<uint64_t> chain;
  for (int64_t b = 0; b < system_blocks; ++b) chain.push_back(static_cast<uint64_t>(b));
  auto extend_chain = [&](int64_t context_tokens) {
    const size_t full = static_cast<size_t>(context_tokens / kAgenticBlockTokens);
    while (chain.size() < full) chain.push_back(ids.Fresh());
  };

  int64_t context = o.system_prefix_tokens +
                    DrawTokens(random, o.first_message_median_tokens, o.first_message_sigma);
  extend_chain(context);
  double arrival = start_seconds;
  double think = 0;
  for (int i = 0; i < o.max_requests_per_session; ++i) {
    TraceRequest request;
    request.arrival_seconds = arrival;
    request.input_tokens = context;
    request.output_tokens = DrawTokens(random, o.output_median_tokens, o.output_sigma);
    request.session = session;
    request.think_seconds = think;
    request.block_ids = chain;
    if (context % kAgenticBlockTokens != 0) request.block_ids.push_back(ids.Fresh());
    const bool last = i + 1 == o.max_requests_per_session;
    const bool end_turn = last || random.Bernoulli(o.end_turn_probability);
    request.stop = end_turn ? StopReason::kEndTurn : StopReason::kToolUse;
    const int64_t output = request.output_tokens;
    out.push_back(std::move(request));
    if (last) break;

    int64_t added = 0;
    if (end_turn) {
      if (!random.Bernoulli(o.human_return_probability)) break;
      think = random.LogNormal(o.human_pause_median_seconds, pauses.human_sigma);
      added = DrawTokens(random, o.user_message_median_tokens, o.user_message_sigma);
    } else {
      think = random.LogNormal(o.tool_pause_median_seconds, pauses.tool_sigma);
      added = DrawTokens(random, o.tool_result_median_tokens, o.tool_result_sigma);
    }
    arrival +=
        o.response_base_seconds + static_cast<double>(output) / o.decode_tokens_per_second + think;
    context += output + added;
    if (context > o.max_context_tokens) {
      // Compaction: the history becomes a summary; only the system blocks stay shared.
      context = o.system_prefix_tokens + o.compacted_context_tokens + added;
      chain.resize(static_cast<size_t>(system_blocks));
    }
    extend_chain(context);
  }
}

absl::Status Bad(const char* field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("AgenticOptions.", field, " ", problem));
}

}  // namespace

absl::Status ValidateAgenticOptions(const AgenticOptions& o) {
  if (o.sessions < 0) return Bad("sessions", absl::StrCat("must be >= 0, got ", o.sessions));
  if (!(o.session_interarrival_seconds >= 0)) {
    return Bad("session_interarrival_seconds",
               absl::StrCat("must be >= 0, got ", o.session_interarrival_seconds));
  }
  if (o.max_requests_per_session < 0) {
    return Bad("max_requests_per_session",
               absl::StrCat("must be >= 0, got ", o.max_requests_per_session));
  }
  if (o.system_prefix_tokens < 1) {
    return Bad("system_prefix_tokens", absl::StrCat("must be >= 1, got ", o.system_prefix_tokens));
  }
  if (o.compacted_context_tokens < 0) {
    return Bad("compacted_context_tokens",
               absl::StrCat("must be >= 0, got ", o.compacted_context_tokens));
  }
  if (o.max_context_tokens <= o.system_prefix_tokens + o.compacted_context_tokens) {
    return Bad("max_context_tokens",
               absl::StrCat("must exceed system_prefix_tokens + compacted_context_tokens (",
                            o.system_prefix_tokens + o.compacted_context_tokens, "), got ",
                            o.max_context_tokens));
  }
  const std::pair<const char*, double> medians[] = {
      {"first_message_median_tokens", o.first_message_median_tokens},
      {"tool_result_median_tokens", o.tool_result_median_tokens},
      {"user_message_median_tokens", o.user_message_median_tokens},
      {"output_median_tokens", o.output_median_tokens},
      {"tool_pause_median_seconds", o.tool_pause_median_seconds},
      {"human_pause_median_seconds", o.human_pause_median_seconds},
      {"decode_tokens_per_second", o.decode_tokens_per_second},
  };
  for (const auto& [field, value] : medians) {
    if (!(value > 0) || !std::isfinite(value)) {
      return Bad(field, absl::StrCat("must be a finite number > 0, got ", value));
    }
  }
  const std::pair<const char*, double> non_negative[] = {
      {"first_message_sigma", o.first_message_sigma},
      {"tool_result_sigma", o.tool_result_sigma},
      {"user_message_sigma", o.user_message_sigma},
      {"output_sigma", o.output_sigma},
      {"response_base_seconds", o.response_base_seconds},
  };
  for (const auto& [field, value] : non_negative) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return Bad(field, absl::StrCat("must be a finite number >= 0, got ", value));
    }
  }
  const std::pair<const char*, double> probabilities[] = {
      {"end_turn_probability", o.end_turn_probability},
      {"human_return_probability", o.human_return_probability},
  };
  for (const auto& [field, value] : probabilities) {
    if (!(value >= 0 && value <= 1)) {
      return Bad(field, absl::StrCat("must be in [0, 1], got ", value));
    }
  }
  if (!(o.tool_pause_p90_seconds >= o.tool_pause_median_seconds) ||
      !std::isfinite(o.tool_pause_p90_seconds)) {
    return Bad("tool_pause_p90_seconds",
               absl::StrCat("must be finite and >= tool_pause_median_seconds, got ",
                            o.tool_pause_p90_seconds));
  }
  if (!(o.human_pause_p90_seconds >= o.human_pause_median_seconds) ||
      !std::isfinite(o.human_pause_p90_seconds)) {
    return Bad("human_pause_p90_seconds",
               absl::StrCat("must be finite and >= human_pause_median_seconds, got ",
                            o.human_pause_p90_seconds));
  }
  return absl::OkStatus();
}

Trace GenerateAgenticWorkload(const AgenticOptions& options) {
  Trace trace;
  trace.name = absl::StrCat("agentic(seed=", options.seed, ", sessions=", options.sessions, ")");
  trace.block_tokens = kAgenticBlockTokens;
  if (!ValidateAgenticOptions(options).ok()) return trace;
  const Pauses pauses{
      .tool_sigma = SigmaFromP90(options.tool_pause_median_seconds, options.tool_pause_p90_seconds),
      .human_sigma =
          SigmaFromP90(options.human_pause_median_seconds, options.human_pause_p90_seconds),
  };
  Random random(options.seed);
  IdSource ids(static_cast<uint64_t>(options.system_prefix_tokens / kAgenticBlockTokens));
  double start = 0;
  for (int s = 0; s < options.sessions; ++s) {
    if (s > 0) start += random.Exponential(options.session_interarrival_seconds);
    GenerateSession(options, pauses, static_cast<uint64_t>(s) + 1, start, random, ids,
                    trace.requests);
  }
  std::stable_sort(trace.requests.begin(), trace.requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) {
                     return a.arrival_seconds < b.arrival_seconds;
                   });
  return trace;
}

}  // namespace kvtier::replay
