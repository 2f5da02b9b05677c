// Loads the Mooncake conversation trace (Qin et al., FAST 2025; format in
// shared/traces/README.md) into a Trace.
//
// The file is JSON Lines, one request per line:
//   {"timestamp": ms since the trace's start, "input_length": tokens, "output_length": tokens,
//    "hash_ids": [id, ...]}
// with one id per 512-token block, ceil(input_length / 512) of them, each naming its whole
// prefix. The Trace keeps the ids as given (block_tokens 512), arrival_seconds = timestamp /
// 1000, session 0 and stop kUnknown (the trace has neither). Other fields are ignored, and so are
// blank lines.
//
// Thread-safety: a free function with no shared state.
#ifndef KVTIER_BENCH_REPLAY_TRACE_MOONCAKE_TRACE_H_
#define KVTIER_BENCH_REPLAY_TRACE_MOONCAKE_TRACE_H_

#include <string>

#include "absl/status/statusor.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {

inline constexpr int kMooncakeBlockTokens = 512;

// The whole trace, or the first error; never a partial Trace. Errors:
// - kNotFound: `path` does not exist (other I/O failures: the errno's code, see ForEachTraceLine).
// - kInvalidArgument, the message naming the path, the 1-based line and the field: a line that
//   is not valid JSON or not an object; a missing field; a field of the wrong type (timestamp a
//   number, lengths and ids integers); timestamp < 0 or > 1000 * kMaxTraceSeconds (ms; 10^9 s,
//   trace.h), input_length < 1, output_length < 0, a length > kMaxTraceTokens (2^24, trace.h),
//   an id < 0; len(hash_ids) !=
//   ceil(input_length / 512); a timestamp earlier than the line before it (see below); a file
//   with no requests.
// - kInvalidArgument "<path>:<line>: line exceeds the limit of 64 MiB ...": a line longer than
//   kMaxTraceLineBytes (trace_file.h). The file is read line by line, so memory is bounded by
//   that limit (plus the Trace) whatever a line holds; the released lines are at most 2 KB.
//
// Out-of-order timestamps are an error, not sorted away: the released trace is in arrival
// order, and its ids are numbered in order of first appearance, so a line out of order means a
// shuffled or concatenated file whose sharing no longer means what the trace measured.
absl::StatusOr<Trace> LoadMooncakeTrace(const std::string& path);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_MOONCAKE_TRACE_H_
