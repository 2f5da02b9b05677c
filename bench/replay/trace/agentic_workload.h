// The embedded default workload (`kvtier-replay --workload agentic`): agent sessions generated
// from a fixed seed, so it needs no file and gives the same Trace on every run.
//
// Each session is an agent loop like Claude Code's:
// - Sessions start as a Poisson process (exponential gaps of mean session_interarrival_seconds;
//   the first at time 0), session k (1-based) in start order.
// - Every prompt begins with the system prefix (tools and system prompt, system_prefix_tokens),
//   the same in every session: its full blocks have the same ids (0, 1, ...) everywhere.
// - The context grows: a request's prompt is the previous prompt, the previous response
//   (output_tokens) and the new input: a tool result after kToolUse, a user message after
//   kEndTurn. Consecutive requests of a session therefore share the previous prompt's full
//   blocks; every new or completed block gets a fresh id (ids name whole prefixes, as in the
//   Mooncake trace), and so does the partial last block, which no later request reuses.
// - Stop reasons: a request ends in kEndTurn with probability end_turn_probability (1 in 8
//   by default), else kToolUse; a session's last request always ends in kEndTurn.
// - Pauses (think_seconds of the next request) are lognormal: after kToolUse the tool runs for a
//   median of 9 s with p90 71 s (the published Claude Code figures; sigma = ln(71 / 9) / z90 =
//   1.61); after kEndTurn the human comes back with probability human_return_probability after a
//   median of 210 s (published) with p90 1800 s (not published: 30 minutes, sigma 1.68, about the
//   tool pauses' spread, so ~42% of returns come after a 5-minute provider cache TTL and ~5%
//   after an hour), or never, which ends the session. The next request arrives after the
//   response (response_base_seconds + output_tokens / decode_tokens_per_second) and the pause.
// - When a prompt would exceed max_context_tokens the session compacts, as Claude Code does:
//   the history is replaced by a summary of compacted_context_tokens after the system prefix
//   (fresh ids: only the system blocks are shared with the request before).
// - A session ends after max_requests_per_session requests at most.
// Token sizes are lognormal (median, sigma) and clamped to [1, 32768] (our choices, not
// published figures: they give prompts from ~13k tokens growing by ~1k per request, so the
// defaults' contexts reach the 60k cap in long sessions). block_tokens is 64, as in Claude Code.
//
// The defaults give 64 sessions over ~4.6 hours of trace time, 1,360 requests (21 per session),
// 37M prompt tokens, prompts up to the 60k cap, an unlimited-cache block hit ratio of 0.956
// (the released Claude Code sessions: 0.957); generated in milliseconds, replayed in metadata
// mode in seconds on 2 cores. Sample pauses at seed 1 (2,000 sessions): tool median 8.9 s, p90
// 71 s; human median 216 s, p90 1,824 s.
//
// Determinism: the only randomness is one std::mt19937_64 seeded with `seed` (its output is
// fixed by the C++ standard); the distributions are written out here (uniform from the top 53
// bits, Box-Muller normals, inverse-CDF exponentials), not std::*_distribution, whose algorithms
// differ between standard libraries. The transforms use log, sqrt, cos and exp, so platforms
// agree bit for bit except where a C library rounds those differently in the last bit, which
// can move a rounded token count by one in a rare draw.
//
// Thread-safety: free functions with no shared state.
#ifndef KVTIER_BENCH_REPLAY_TRACE_AGENTIC_WORKLOAD_H_
#define KVTIER_BENCH_REPLAY_TRACE_AGENTIC_WORKLOAD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {

inline constexpr int kAgenticBlockTokens = 64;

struct AgenticOptions {
  uint64_t seed = 1;
  int sessions = 64;
  double session_interarrival_seconds = 30;  // mean gap between session starts
  int max_requests_per_session = 40;

  int64_t system_prefix_tokens = 12000;  // shared by every session
  int64_t max_context_tokens = 60000;    // a longer prompt compacts the session
  int64_t compacted_context_tokens = 4000;

  // Token sizes, lognormal: median tokens and sigma (of the natural log).
  double first_message_median_tokens = 1000;  // the user's opening request
  double first_message_sigma = 0.8;
  double tool_result_median_tokens = 400;  // added after kToolUse
  double tool_result_sigma = 1.3;
  double user_message_median_tokens = 150;  // added after kEndTurn
  double user_message_sigma = 1.0;
  double output_median_tokens = 200;
  double output_sigma = 1.0;

  double end_turn_probability = 0.125;
  double human_return_probability = 0.65;

  // Pauses, lognormal, given by median and 90th percentile (seconds).
  double tool_pause_median_seconds = 9;
  double tool_pause_p90_seconds = 71;
  double human_pause_median_seconds = 210;
  double human_pause_p90_seconds = 1800;

  // Time to produce a response: response_base_seconds + output_tokens / decode rate.
  double response_base_seconds = 1.0;
  double decode_tokens_per_second = 50;
};

// kInvalidArgument naming the field: sessions or max_requests_per_session < 0 (0 is allowed:
// an empty trace); session_interarrival_seconds < 0; system_prefix_tokens < 1;
// compacted_context_tokens < 0; max_context_tokens <= system_prefix_tokens +
// compacted_context_tokens; a median <= 0, a sigma < 0, a p90 < its median; a probability
// outside [0, 1]; response_base_seconds < 0; decode_tokens_per_second <= 0; NaN anywhere.
absl::Status ValidateAgenticOptions(const AgenticOptions& options);

// The workload for `options`, requests by arrival (a stable sort: ties in session order).
// Equal options give an equal Trace. Options that ValidateAgenticOptions rejects give a Trace
// with no requests (call it first to learn why).
Trace GenerateAgenticWorkload(const AgenticOptions& options);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_AGENTIC_WORKLOAD_H_
