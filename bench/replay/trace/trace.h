// The replay harness's view of a request trace: every input format (Mooncake JSON Lines, Claude
// Code agent sessions, the embedded agentic workload) becomes one Trace, and everything
// downstream (token derivation, bounds, the KvCache replay) reads only this.
//
// Content identity: a prompt is a chain of trace blocks of `Trace::block_tokens` tokens, each
// named by a block id. As in the Mooncake trace, an id names a whole prefix (the block and every
// block before it), so two requests share exactly their common leading ids. Ids are global in a
// Trace: loaders make session-local ids unique (Claude Code) and map shared prefixes to shared
// ids. Token ids are derived from (block id, position in the block) only (DeriveTokenId), so
// equal ids give equal tokens and the cache computes its own block keys from them, at any
// tokens_per_block that divides block_tokens.
#ifndef KVTIER_BENCH_REPLAY_TRACE_TRACE_H_
#define KVTIER_BENCH_REPLAY_TRACE_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/session_hints.h"

namespace kvtier::replay {

// How the request before a pause ended (Claude Code `stop`): after kToolUse the agent comes
// back once the tool returns (seconds); after kEndTurn a human may come back after minutes, or
// never.
enum class StopReason : uint8_t {
  kUnknown = 0,
  kToolUse = 1,
  kEndTurn = 2,
};

// The cache's name for `stop` (kvtier/session_hints.h), which a release hands the policy.
inline kvtier::StopReason ToCacheStopReason(StopReason stop) {
  switch (stop) {
    case StopReason::kToolUse:
      return kvtier::StopReason::kToolUse;
    case StopReason::kEndTurn:
      return kvtier::StopReason::kEndTurn;
    case StopReason::kUnknown:
      break;
  }
  return kvtier::StopReason::kUnknown;
}

// The largest token count a loader accepts (input or output of one request): 2^24 (16,777,216),
// above the longest context windows served today (~10M tokens). A replay builds a prompt's token
// ids (4 bytes each) and decodes its output a token at a time, so a count sizes memory and work:
// at 2^31 - 1, one short line of an Azure file made the replay ask for 8 GiB at once (bad_alloc).
// Loaders reject larger counts before using them; counts fit an int32 (as token positions do
// downstream), and ceil(count / block_tokens) or a sum of counts cannot overflow int64.
inline constexpr int64_t kMaxTraceTokens = int64_t{1} << 24;

// The latest arrival a loader accepts, in seconds from the trace's time origin (and the longest
// think or service time it reads): 10^9 s, about 31.7 years. A replay's clock counts int64
// nanoseconds (2^63 ns is about 292 years), so an arrival plus the times a replay adds to it
// stays in range; a larger timestamp would overflow the conversion.
inline constexpr double kMaxTraceSeconds = 1e9;

struct TraceRequest {
  double arrival_seconds = 0;  // since the trace's start, non-decreasing over Trace::requests
  int64_t input_tokens = 0;    // prompt tokens, in [1, kMaxTraceTokens]
  int64_t output_tokens = 0;   // in [0, kMaxTraceTokens]
  // One id per trace block of the prompt: ceil(input_tokens / block_tokens) ids; the last block
  // may be partial.
  std::vector<uint64_t> block_ids;
  // The session (agent conversation) the request belongs to; 0 for traces without sessions.
  // Sub-agents are sessions of their own.
  uint64_t session = 0;
  // How this request ended (kUnknown where the trace does not say).
  StopReason stop = StopReason::kUnknown;
  // The client knows at release that its session sends no further request (Claude Code: a
  // sub-agent's end_turn). False where the trace does not say.
  bool last_turn = false;
  // The client's pause before this request, seconds (Claude Code `think_time`; 0 if none). It
  // follows the previous request of the same session, whose `stop` says what kind it was.
  double think_seconds = 0;
};

struct Trace {
  std::string name;                    // for reports, e.g. "mooncake/conversation_trace.jsonl"
  int block_tokens = 0;                // tokens per trace block: 512 (Mooncake), 64 (Claude Code)
  std::vector<TraceRequest> requests;  // by arrival time
};

// The token id at `position` (in [0, block_tokens)) of the block named `block_id`: a fixed hash
// (splitmix64 of both), in [0, 2^31 - 1). Deterministic across runs, machines and builds.
int32_t DeriveTokenId(uint64_t block_id, int position);

// The prompt's token ids: for each block, DeriveTokenId of each position, input_tokens in all.
std::vector<int32_t> PromptTokens(const TraceRequest& request, int block_tokens);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_TRACE_H_
