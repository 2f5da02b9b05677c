// Loads the Azure LLM inference trace (Azure 2023: Patel et al., "Splitwise", ISCA 2024;
// shared/traces/azure2023/AzureLLMInferenceTrace_{conv,code}.csv) into a Trace.
//
// The file is CSV, a header and one request per line:
//   TIMESTAMP,ContextTokens,GeneratedTokens
//   2023-11-16 18:15:46.6805900,374,44
// TIMESTAMP is "YYYY-MM-DD HH:MM:SS" ("T" may stand for the space) with an optional fraction of
// 1 to 9 digits (the released 2023 files have 7: 100 ns) and an optional UTC offset, "+HH:MM",
// "-HH:MM" or "Z" (the 2024 files end in "+00:00"). Blank lines are skipped, CRLF line ends and a
// UTF-8 byte order mark before the header are accepted, fields may be double-quoted (csv.h).
//
// What the Trace gets:
// - arrival_seconds = the row's TIMESTAMP minus the first row's, taken exactly in integer
//   nanoseconds, then divided by 1e9 as doubles (the nearest double to the exact difference for
//   spans under 104 days; the released files span an hour). Timestamps without an offset are
//   parsed by hand as UTC civil time (no locale, no DST), and one with an offset is moved to UTC
//   by it; only the differences matter.
// - input_tokens = ContextTokens, output_tokens = GeneratedTokens, session 0, stop kUnknown,
//   think_seconds 0 (the trace has no sessions or stop reasons).
// - block_ids: ceil(ContextTokens / block_tokens) fresh ids per request, numbered 0, 1, 2, ...
//   in row order, never shared between requests. The trace has token counts only, no content
//   and no prefix hashes, so it says nothing about reuse, and the loader assumes none: a cache
//   replayed on it hits nothing. Use it for arrival processes, prompt and output lengths and
//   capacity pressure, not for hit ratios.
// - block_tokens = `block_tokens`; name = TraceNameOf(path), e.g.
//   "azure2023/AzureLLMInferenceTrace_conv.csv".
//
// Thread-safety: a free function with no shared state.
#ifndef KVTIER_BENCH_REPLAY_TRACE_AZURE_TRACE_H_
#define KVTIER_BENCH_REPLAY_TRACE_AZURE_TRACE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "bench/replay/trace/trace.h"

namespace kvtier::replay {

inline constexpr int kAzureDefaultBlockTokens = 64;
// The most block ids one load makes (1 GiB of ids). The ids are made from counts, not read, so
// a short hostile row could otherwise ask for gigabytes (2^24 tokens at block_tokens 1, a row after
// row); the released conv trace needs 359,180 at 64 tokens a block, 20M at 1.
inline constexpr int64_t kMaxAzureBlockIds = int64_t{1} << 27;

// The whole trace, or the first error; never a partial Trace. Errors:
// - kInvalidArgument naming block_tokens: block_tokens < 1 or > 2^20.
// - kNotFound: `path` does not exist (other I/O failures: the errno's code, see
//   ForEachTraceLine in trace_file.h).
// - kInvalidArgument, the message "<path>:<line>: column <n> (<name>) ..." naming the path, the
//   1-based line and the 1-based column with the value (cut to 40 characters, escaped):
//   - the header (the first non-blank line) is not the one above: "<path>:1: column 2 header
//     must be "ContextTokens", got ...", or "<path>:1: header has 2 columns, expected 3";
//   - a row without exactly 3 columns ("<path>:<line>: has 4 columns, expected 3");
//   - a TIMESTAMP not in the format above or not a real date and time (2023-02-30, 24:00:00,
//     a leap second);
//   - ContextTokens not a decimal integer in [1, kMaxTraceTokens] (2^24, trace.h), or
//     GeneratedTokens not one in [0, kMaxTraceTokens] (digits only: no sign, space or point);
//   - a TIMESTAMP more than kMaxTraceSeconds (10^9 s, trace.h) after the first row's;
//   - a TIMESTAMP earlier than the row before it (equal ones are fine): the released files are
//     in arrival order, and sorting would hide a shuffled or concatenated file;
//   - more than max_block_ids block ids in all, at the row that passes it;
//   - a line over kMaxTraceLineBytes (trace_file.h; the file is read line by line).
// - kInvalidArgument "<path>: ...": an empty file (no header), or a header and no rows.
// - kInvalidArgument naming max_block_ids: max_block_ids < 1 or > kMaxAzureBlockIds.
// `max_block_ids` bounds the ids the whole trace may make (tests lower it).
absl::StatusOr<Trace> LoadAzureTrace(const std::string& path,
                                     int block_tokens = kAzureDefaultBlockTokens,
                                     int64_t max_block_ids = kMaxAzureBlockIds);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_AZURE_TRACE_H_
