// Reading a trace file whole, and the short name a report gives it. Shared by the trace loaders.
//
// Thread-safety: free functions with no shared state.
#ifndef KVTIER_BENCH_REPLAY_TRACE_TRACE_FILE_H_
#define KVTIER_BENCH_REPLAY_TRACE_TRACE_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace kvtier::replay {

// The bytes of the file at `path`. Errors name the path: kNotFound when it does not exist,
// kInvalidArgument when it is not a regular file (a directory), otherwise the code of the
// failing call's errno (kPermissionDenied, ...).
absl::StatusOr<std::string> ReadTraceFile(const std::string& path);

// "parent/file" for reports: "mooncake/conversation_trace.jsonl" for
// ".../traces/mooncake/conversation_trace.jsonl", or the last component alone when there is no
// parent. Trailing slashes are ignored, so a directory gets "traces/kv-cache-tester-claude-code".
std::string TraceNameOf(const std::string& path);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_TRACE_FILE_H_
