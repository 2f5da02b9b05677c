// Loads Claude Code agent sessions (callanjfox/kv-cache-tester; format in
// shared/traces/README.md) into one Trace: a file is one session, a directory every *.json in
// it, in sorted file-name order, all sessions starting together at time 0 of the Trace and
// running concurrently.
//
// A file is {"id", "models", "block_size": 64, "hash_id_scope": "local", "tool_tokens",
// "system_tokens", "requests": [...], "totals"}. A request is {"t": s since the session's start,
// "type", "in", "out", "hash_ids", "stop", "api_time", "think_time"}; an entry of type
// "subagent" is a sub-agent {"t", "duration_ms", "tool_tokens", "requests": [...], ...} whose
// own requests' "t" count from the sub-agent's start.
//
// Optional fields, each of which reads the same absent or null (upstream writers put null where
// they have no value): "block_size" (then kClaudeDefaultBlockTokens, 64), "hash_id_scope" (then
// "local"), "tool_tokens" of a file or sub-agent (then 0: nothing to share), "duration_ms" (see
// below), "stop", "api_time" and "think_time" of a request.
//
// Sub-agent timing: the entry's "t" is when the sub-agent *finished* (its result entered the
// parent's transcript), so it started at t - duration_ms / 1000 (clamped at 0) in the enclosing
// session's time. Without "duration_ms" it started at t minus the span of its own requests
// (their latest "t" + "api_time"). The released files bear this out: sub-agents launched together
// by one parent request (three in trace_0254 at entry t 137.0, 143.8 and 149.5 s) all come out
// starting at the same instant (53.02 s), after that parent request and before the next, and the
// parent's next request always follows the entry's t; read as a start, the same entries would
// overlap the parent's next requests. In every released file a sub-agent's last request also ends
// (start + its t + api_time) before the entry's t.
//
// What the Trace gets:
// - block_tokens = block_size (every file must agree). Each request's ids are its hash_ids,
//   made global as below. The released files list one id per *full* block
//   (len(hash_ids) == floor(in / 64)); the partial last block then gets a fresh id of its own
//   (kClaudeTailIdBase + n, never shared), so the Trace has its ceil(in / block_tokens) ids. A
//   file that lists the partial block's id too (ceil) keeps it.
// - session: file k (1-based, in load order) is session k; sub-agents are sessions of their own,
//   numbered after the last file's, in load order (a file's sub-agents in entry order).
//   arrival_seconds = the request's "t" plus the start of every enclosing sub-agent.
// - stop: "tool_use" -> kToolUse, "end_turn" -> kEndTurn, anything else or absent -> kUnknown.
//   last_turn: a sub-agent's kEndTurn (its loop ends there; no released file has a sub-agent
//   request after one).
//   think_seconds = "think_time"; when absent, the gap from the end of the session's previous
//   request: t - (its t + its "api_time", 0 if absent), at least 0; 0 for a session's first.
// - requests of all sessions merged by arrival (a stable sort: ties keep load order).
//
// Ids. The files' ids are local to one file (its sub-agents share the file's id space; the
// released files never reuse a parent id in a sub-agent). A local id becomes
// (k << kClaudeLocalIdBits) | id for file k. Files with "hash_id_scope": "global" share one id
// space instead (the id itself, file index 0): an id names the same block in each of them, as
// the scope says. The exception is the tool-definition prefix, which
// every session sends first and which the files give only as a length, "tool_tokens": block j <
// floor(tool_tokens / block_size) of a request gets the shared id kClaudeSharedToolIdBase + j
// (with kSameToolTokens also tool_tokens << 24), so sessions hit each other's tool blocks as
// they would in a serving system. A block counts as tool prefix only while the request's ids up
// to it follow the session's *canonical* tool prefix (the path through the first
// floor(tool_tokens / block_size) positions that most of its requests take): in the released
// files 7 sessions change their tool list mid-session (an MCP server connected, say) and one
// (trace_0462) has a first request of another prefix, and a changed block must not look shared.
//
// Limits of the shared tool prefix, and why kAllSessions is the default: the files do not say
// what the tools are. Sessions of one Claude Code version send byte-identical tool definitions
// (the built-in tools in a fixed order, which lead the list), and the released sessions'
// tool_tokens cluster by model (the 20 Opus 4.5 files all lie in 11.9k-13.1k tokens, 14 of
// them sharing one of 5 exact values), so most of their leading blocks are likely the same. But
// sessions whose tool lists differ (another version, MCP tools, a sub-agent's reduced set)
// share their leading blocks here only approximately: up to the shorter prefix, where the real
// definitions may diverge earlier. With an unlimited cache the effect is small (each session's
// first request hits ~190 tool blocks: about 6,500 of the 3.6M block reads of the 34 released
// files; block hit ratio 0.9575 with kAllSessions, 0.9557 with kNone); it is larger for a cache
// that evicts, where the shared blocks stay hot while a session's own blocks age out. kAllSessions
// therefore overstates cross-session sharing somewhat (an upper bound), kSameToolTokens shares only
// between sessions with exactly equal tool_tokens (nearly exact, a lower bound), kNone shares
// nothing across sessions. The system prompt ("system_tokens") is never shared: it embeds the
// session's working directory, date and project instructions.
//
// Thread-safety: free functions with no shared state.
#ifndef KVTIER_BENCH_REPLAY_TRACE_CLAUDE_CODE_TRACE_H_
#define KVTIER_BENCH_REPLAY_TRACE_CLAUDE_CODE_TRACE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {

// The global id layout (bit 63 set: shared tool block; bit 62: a partial last block; else a
// session's block, file index above bit 40).
inline constexpr uint64_t kClaudeSharedToolIdBase = uint64_t{1} << 63;
inline constexpr uint64_t kClaudeTailIdBase = uint64_t{1} << 62;
inline constexpr int kClaudeLocalIdBits = 40;

// A file's block size when it has no "block_size" (every released file says 64).
inline constexpr int kClaudeDefaultBlockTokens = 64;

// How deep sub-agents may nest (a sub-agent of the session is depth 1). The released files nest
// one deep (Claude Code gives sub-agents no sub-agents of their own); the limit keeps a hostile
// file from exhausting the stack, as the parser descends one level per sub-agent.
inline constexpr int kMaxClaudeSubagentDepth = 32;

// Which sessions share the tool-definition prefix blocks (see above).
enum class ToolPrefixSharing : uint8_t {
  kAllSessions = 0,     // every session: block j of the tool prefix is one id everywhere
  kSameToolTokens = 1,  // only sessions (and sub-agents) with equal tool_tokens
  kNone = 2,            // none: ids stay per file
};

struct ClaudeCodeOptions {
  ToolPrefixSharing tool_prefix = ToolPrefixSharing::kAllSessions;
};

// The sessions of `file_or_directory`, or the first error; never a partial Trace. Errors:
// - kNotFound: the path does not exist, or a directory has no *.json file.
// - kInvalidArgument, the message naming the file, the request by its index path
//   ("requests[12].requests[3]", a sub-agent's requests nested in its entry) and the field: not
//   valid JSON (with the parser's line and column); not an object; a missing field ("type", "t",
//   "in", "out", "hash_ids"; "requests" of a file; "t", "requests" of a sub-agent); a field of
//   the wrong type; t < 0, in < 1, out < 0, in or out > kMaxTraceTokens (2^24, trace.h),
//   think_time < 0, duration_ms < 0, t, think_time or api_time over kMaxTraceSeconds (10^9 s,
//   trace.h; duration_ms over 1000 times it), an arrival (a sub-agent's start plus t) past it, an
//   id < 0 or >= 2^40; len(hash_ids) neither floor nor ceil of in / block_size; hash_id_scope other
//   than "local" or "global"; block_size differing between files; no requests at all; sub-agents
//   nested deeper than kMaxClaudeSubagentDepth.
// - kInvalidArgument "<file>: <n> bytes, over the limit of 256 MiB ...": a file larger than
//   kMaxTraceFileBytes (trace_file.h), refused from its size before any of it is read. A file is
//   parsed whole, and its parsed form takes several times its size, so this bounds memory (the
//   released files are at most 4 MB). The limit is per file; a directory may hold many.
// - another code when reading fails (see ReadTraceFile).
// Requests out of time order within a session are accepted and sorted.
absl::StatusOr<Trace> LoadClaudeCodeTraces(const std::string& file_or_directory,
                                           const ClaudeCodeOptions& options);
absl::StatusOr<Trace> LoadClaudeCodeTraces(const std::string& file_or_directory);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_CLAUDE_CODE_TRACE_H_
