// Reading trace files, and the short name a report gives one. Shared by the trace loaders.
//
// Limits. A trace comes from outside and may be hostile or broken (a line of a gigabyte, a
// multi-gigabyte file), so neither reader takes a file's word for how much memory it needs: a
// whole file is read only up to kMaxTraceFileBytes, checked before reading, and lines are read
// one at a time, each up to kMaxTraceLineBytes, so memory stays bounded by the limit whatever
// the file holds. The released traces are far inside both (the longest Mooncake line is 2 KB,
// the largest Claude Code session 4 MB).
//
// Thread-safety: free functions with no shared state.
#ifndef KVTIER_BENCH_REPLAY_TRACE_TRACE_FILE_H_
#define KVTIER_BENCH_REPLAY_TRACE_TRACE_FILE_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::replay {

// The most bytes ReadTraceFile reads (a Claude Code session file, parsed whole: its parsed form
// takes several times this).
inline constexpr uint64_t kMaxTraceFileBytes = uint64_t{256} << 20;  // 256 MiB
// The most bytes of one line ForEachTraceLine passes on, not counting its '\n'.
inline constexpr uint64_t kMaxTraceLineBytes = uint64_t{64} << 20;  // 64 MiB

// The bytes of the file at `path`. Errors name the path: kNotFound when it does not exist,
// kInvalidArgument when it is not a regular file (a directory) or holds more than `max_bytes`
// ("<path>: <size> bytes, over the limit of 256 MiB"; decided from its size before reading, and
// again while reading, should it grow), otherwise the code of the failing call's errno
// (kPermissionDenied, ...).
absl::StatusOr<std::string> ReadTraceFile(const std::string& path,
                                          uint64_t max_bytes = kMaxTraceFileBytes);

// Calls `visit(line_number, line)` for each line of the file at `path`, in order: line_number
// 1-based, `line` without its '\n' (a '\r' before it is kept) and valid only during the call.
// A last line without a '\n' is visited; a file ending in '\n' has no empty line after it.
// Reads in fixed-size chunks: memory is about max_line_bytes at most, however long a line is.
// Returns the first non-OK status `visit` returns, as is (the remaining lines are not read), or:
// the errors of ReadTraceFile for a missing, non-regular or unreadable file; kInvalidArgument
// "<path>:<line>: line exceeds the limit of 64 MiB (67108864 bytes)" as soon as a line is
// longer than `max_line_bytes`, before the rest of it is read.
absl::Status ForEachTraceLine(
    const std::string& path,
    absl::FunctionRef<absl::Status(int64_t line_number, absl::string_view line)> visit,
    uint64_t max_line_bytes = kMaxTraceLineBytes);

// "parent/file" for reports: "mooncake/conversation_trace.jsonl" for
// ".../traces/mooncake/conversation_trace.jsonl", or the last component alone when there is no
// parent. Trailing slashes are ignored, so a directory gets "traces/kv-cache-tester-claude-code".
std::string TraceNameOf(const std::string& path);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_TRACE_FILE_H_
