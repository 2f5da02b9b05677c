// What an agent or a serving engine tells the cache about a session, and how the cache answers.
// The signals are the ones the engines are converging on for agents: the stop reason of the
// request that just finished (Anthropic's Messages API `stop_reason`, OpenAI's `finish_reason`)
// and an expected time to the session's next request (vLLM's KV-hint proposal "estimated resume
// time"; Continuum, arXiv 2511.02230, predicts it from the tool). KvCache takes them on Release
// and Pause (kv_cache.h) and hands them to its eviction policy (eviction_policy.h), which learns
// online how much each is worth (reuse_index) or ignores them (lru, cost_aware).
//
// A hint never makes a wrong block visible (it changes only which blocks are kept, never what a
// key names) and never fails a request: a hint the cache cannot use is answered kRejected with
// the reason, and the call it rode on still does its work.
#ifndef KVTIER_SESSION_HINTS_H_
#define KVTIER_SESSION_HINTS_H_

#include <cstdint>
#include <string>

namespace kvtier {

// How a request's generation ended. After kToolUse an agent comes back once its tool returns
// (seconds, in the Claude Code traces p50 9 s); after kEndTurn a human may come back after
// minutes, or never (p50 266 s there); kLength: cut at the token limit.
enum class StopReason : uint8_t {
  kUnknown = 0,
  kToolUse = 1,
  kEndTurn = 2,
  kLength = 3,
};
inline constexpr int kNumStopReasons = 4;

// The answer to a hint.
struct HintOutcome {
  enum class Result : uint8_t {
    kAccepted = 0,  // taken as given
    kClipped = 1,   // taken in part (reason says what was left out)
    kRejected = 2,  // not taken (reason says why); the call it came with still did its work
  };
  Result result = Result::kAccepted;
  std::string reason;  // empty when accepted
  int64_t blocks = 0;  // blocks the hint applies to
};

}  // namespace kvtier

#endif  // KVTIER_SESSION_HINTS_H_
