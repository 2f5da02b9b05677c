// The Claude Code session loader (claude_code_trace.h): session files into one Trace.
#include "bench/replay/trace/claude_code_trace.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/replay/trace/json_fields.h"
#include "bench/replay/trace/trace.h"
#include "bench/replay/trace/trace_file.h"

namespace kvtier::replay {
namespace {

using ::nlohmann::json;

constexpr uint64_t kMaxLocalId = uint64_t{1} << kClaudeLocalIdBits;
// The id space of files with "hash_id_scope": "global"; files number from 1.
constexpr uint64_t kGlobalIdSpace = 0;
// File indices stay below bit 62 (the tail ids' bit): (k << 40) < 2^62.
constexpr uint64_t kMaxFiles = (uint64_t{1} << (62 - kClaudeLocalIdBits)) - 1;
// Shared tool ids: kClaudeSharedToolIdBase | (tool_tokens << 24) | block index.
constexpr int kToolGroupShift = 24;
constexpr int64_t kMaxToolBlocks = int64_t{1} << kToolGroupShift;
constexpr int64_t kMaxToolTokensGroup = int64_t{1} << (63 - kToolGroupShift);

// A request as the file has it, before its ids are made global.
struct RawRequest {
  double arrival_seconds = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  std::vector<uint64_t> local_ids;
  StopReason stop = StopReason::kUnknown;
  double think_seconds = 0;
  bool think_given = false;  // "think_time" was present
  double api_seconds = 0;    // "api_time" (0 when absent): how long the request ran
};

// A main session or a sub-agent.
struct RawSession {
  uint64_t session = 0;
  uint64_t id_space = 0;  // the file's index: sub-agents share their file's ids
  int64_t tool_tokens = 0;
  bool subagent = false;
  std::vector<RawRequest> requests;
};

// Parsing state for one load.
struct Loader {
  int block_tokens = 0;  // 0 until the first file sets it
  std::string block_tokens_file;
  uint64_t next_subagent_session = 0;
  std::vector<RawSession> sessions;  // in load order: a file's main session, then its sub-agents
};

StopReason ParseStop(const std::string& stop) {
  if (stop == "tool_use") return StopReason::kToolUse;
  if (stop == "end_turn") return StopReason::kEndTurn;
  return StopReason::kUnknown;
}

absl::StatusOr<RawRequest> ParseRequest(const json& entry, const std::string& where,
                                        double start_seconds, int block_tokens) {
  RawRequest request;
  absl::StatusOr<double> t = NumberField(entry, where, "t", 0, kMaxTraceSeconds);
  if (!t.ok()) return t.status();
  request.arrival_seconds = start_seconds + *t;
  if (request.arrival_seconds > kMaxTraceSeconds) {  // a sub-agent's start plus its own t
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"t\" ", *t, " after the session's start at ", start_seconds,
                     " s arrives past ", kMaxTraceSeconds, " s (kMaxTraceSeconds)"));
  }
  absl::StatusOr<int64_t> input = IntField(entry, where, "in", 1, kMaxTraceTokens);
  if (!input.ok()) return input.status();
  request.input_tokens = *input;
  absl::StatusOr<int64_t> output = IntField(entry, where, "out", 0, kMaxTraceTokens);
  if (!output.ok()) return output.status();
  request.output_tokens = *output;
  absl::StatusOr<std::vector<uint64_t>> ids = IdArrayField(entry, where, "hash_ids");
  if (!ids.ok()) return ids.status();
  const int64_t full = *input / block_tokens;
  const int64_t all = (*input + block_tokens - 1) / block_tokens;
  const int64_t count = static_cast<int64_t>(ids->size());
  if (count != full && count != all) {
    return FieldError(
        where, "hash_ids",
        absl::StrCat("has ", count, " ids, but in ", *input, " needs floor(", *input, " / ",
                     block_tokens, ") = ", full, " (full blocks only) or ceil = ", all));
  }
  for (size_t i = 0; i < ids->size(); ++i) {
    if ((*ids)[i] >= kMaxLocalId) {
      return FieldError(where, "hash_ids",
                        absl::StrCat("element ", i, " must be < 2^", kClaudeLocalIdBits,
                                     " (a session-local id), got ", (*ids)[i]));
    }
  }
  request.local_ids = *std::move(ids);
  if (HasValue(entry, "stop")) {
    absl::StatusOr<std::string> stop = StringField(entry, where, "stop");
    if (!stop.ok()) return stop.status();
    request.stop = ParseStop(*stop);
  }
  if (HasValue(entry, "think_time")) {
    absl::StatusOr<double> think = NumberField(entry, where, "think_time", 0, kMaxTraceSeconds);
    if (!think.ok()) return think.status();
    request.think_seconds = *think;
    request.think_given = true;
  }
  if (HasValue(entry, "api_time")) {
    absl::StatusOr<double> api = NumberField(entry, where, "api_time", 0, kMaxTraceSeconds);
    if (!api.ok()) return api.status();
    request.api_seconds = *api;
  }
  return request;
}

// "tool_tokens", 0 when absent or null (no tool prefix to share).
absl::StatusOr<int64_t> ToolTokensField(const json& object, const std::string& where,
                                        int block_tokens) {
  if (!HasValue(object, "tool_tokens")) return 0;
  absl::StatusOr<int64_t> tool_tokens = IntField(object, where, "tool_tokens", 0);
  if (!tool_tokens.ok()) return tool_tokens.status();
  if (*tool_tokens / block_tokens >= kMaxToolBlocks || *tool_tokens >= kMaxToolTokensGroup) {
    return FieldError(where, "tool_tokens",
                      absl::StrCat("must be < 2^", kToolGroupShift, " blocks, got ", *tool_tokens));
  }
  return *tool_tokens;
}

// How long a sub-agent's own requests ran: the latest "t" + "api_time" among its entries (0 when
// none has a number there). The start of a sub-agent whose "duration_ms" is absent or null.
// Values of the wrong type are skipped here; parsing the requests reports them.
double OwnSpanSeconds(const json& requests) {
  double span = 0;
  if (!requests.is_array()) return span;
  for (const json& entry : requests) {
    if (!entry.is_object()) continue;
    const auto t = entry.find("t");
    if (t == entry.end() || !t->is_number()) continue;
    double end = t->get<double>();
    const auto api = entry.find("api_time");
    if (api != entry.end() && api->is_number() && api->get<double>() > 0) end += api->get<double>();
    if (std::isfinite(end)) span = std::max(span, end);
  }
  return span;
}

// Parses the array `requests` (at `path` `where_array`, e.g. "requests[3].requests") into
// `session`, appending sub-agents to `loader.sessions` after it. `session_index` is the
// session's position in loader.sessions (which may grow while it is being filled); `depth` is
// the session's sub-agent depth (0 for a file's main session), which bounds the recursion.
absl::Status ParseSessionRequests(const json& requests, const std::string& path,
                                  const std::string& where_array, double start_seconds,
                                  size_t session_index, int depth, Loader& loader) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string index_path = absl::StrCat(where_array, "[", i, "]");
    const std::string where = absl::StrCat(path, ": ", index_path);
    const json& entry = requests[i];
    if (absl::Status s = ExpectObject(entry, where); !s.ok()) return s;
    absl::StatusOr<std::string> type = StringField(entry, where, "type");
    if (!type.ok()) return type.status();
    if (*type != "subagent") {
      absl::StatusOr<RawRequest> request =
          ParseRequest(entry, where, start_seconds, loader.block_tokens);
      if (!request.ok()) return request.status();
      std::vector<RawRequest>& earlier = loader.sessions[session_index].requests;
      if (!request->think_given && !earlier.empty()) {
        // Files without think_time (older kv-cache-tester ones): the pause is the gap between
        // the previous request's end (its t plus api_time) and this one's t. Without it the
        // closed loop would send the session's requests back to back.
        const RawRequest& previous = earlier.back();
        request->think_seconds = std::max(
            0.0, request->arrival_seconds - previous.arrival_seconds - previous.api_seconds);
      }
      earlier.push_back(*std::move(request));
      continue;
    }
    if (depth >= kMaxClaudeSubagentDepth) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a sub-agent nested deeper than ",
                                                     kMaxClaudeSubagentDepth, " levels"));
    }
    // The entry's "t" is when the sub-agent finished (its result entered the parent's
    // transcript); it started duration_ms before. See the header.
    absl::StatusOr<double> t = NumberField(entry, where, "t", 0, kMaxTraceSeconds);
    if (!t.ok()) return t.status();
    double duration_seconds = 0;
    if (HasValue(entry, "duration_ms")) {
      absl::StatusOr<double> duration_ms =
          NumberField(entry, where, "duration_ms", 0, kMaxTraceSeconds * 1000);
      if (!duration_ms.ok()) return duration_ms.status();
      duration_seconds = *duration_ms / 1000.0;
    } else if (const auto nested = entry.find("requests"); nested != entry.end()) {
      duration_seconds = OwnSpanSeconds(*nested);
    }
    const double subagent_start = std::max(0.0, *t - duration_seconds);
    absl::StatusOr<int64_t> tool_tokens = ToolTokensField(entry, where, loader.block_tokens);
    if (!tool_tokens.ok()) return tool_tokens.status();
    absl::StatusOr<const json*> nested = ArrayField(entry, where, "requests");
    if (!nested.ok()) return nested.status();
    RawSession subagent;
    subagent.session = loader.next_subagent_session++;
    subagent.subagent = true;
    subagent.id_space = loader.sessions[session_index].id_space;
    subagent.tool_tokens = *tool_tokens;
    loader.sessions.push_back(std::move(subagent));
    if (absl::Status s = ParseSessionRequests(**nested, path, absl::StrCat(index_path, ".requests"),
                                              start_seconds + subagent_start,
                                              loader.sessions.size() - 1, depth + 1, loader);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseFile(const std::string& path, uint64_t file_index, Loader& loader) {
  absl::StatusOr<std::string> bytes = ReadTraceFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<json> parsed = ParseJson(*bytes, path);
  if (!parsed.ok()) return parsed.status();
  const json& root = *parsed;
  if (absl::Status s = ExpectObject(root, path); !s.ok()) return s;

  absl::StatusOr<int64_t> block_size = kClaudeDefaultBlockTokens;
  if (HasValue(root, "block_size")) {
    block_size = IntField(root, path, "block_size", 1);
    if (!block_size.ok()) return block_size.status();
    if (*block_size > (int64_t{1} << 20)) {
      return FieldError(path, "block_size", absl::StrCat("must be <= 2^20, got ", *block_size));
    }
  }
  if (loader.block_tokens == 0) {
    loader.block_tokens = static_cast<int>(*block_size);
    loader.block_tokens_file = path;
  } else if (*block_size != loader.block_tokens) {
    return FieldError(path, "block_size",
                      absl::StrCat("is ", *block_size, ", but ", loader.block_tokens_file, " has ",
                                   loader.block_tokens, ": one trace has one block size"));
  }
  uint64_t id_space = file_index;
  if (HasValue(root, "hash_id_scope")) {
    absl::StatusOr<std::string> scope = StringField(root, path, "hash_id_scope");
    if (!scope.ok()) return scope.status();
    if (*scope == "global") {
      id_space = kGlobalIdSpace;
    } else if (*scope != "local") {
      return FieldError(path, "hash_id_scope",
                        absl::StrCat("must be \"local\" (ids local to the file) or \"global\" "
                                     "(ids shared by every global file), got \"",
                                     *scope, "\""));
    }
  }
  absl::StatusOr<int64_t> tool_tokens = ToolTokensField(root, path, loader.block_tokens);
  if (!tool_tokens.ok()) return tool_tokens.status();
  absl::StatusOr<const json*> requests = ArrayField(root, path, "requests");
  if (!requests.ok()) return requests.status();

  RawSession main_session;
  main_session.session = file_index;
  main_session.id_space = id_space;
  main_session.tool_tokens = *tool_tokens;
  loader.sessions.push_back(std::move(main_session));
  return ParseSessionRequests(**requests, path, "requests", /*start_seconds=*/0,
                              loader.sessions.size() - 1, /*depth=*/0, loader);
}

// The session's canonical tool prefix: position by position through the first `blocks`
// positions, the local id most of the requests still on the path have there (the smallest
// such id on a tie).
std::vector<uint64_t> CanonicalToolPrefix(const RawSession& session, int64_t blocks) {
  std::vector<const RawRequest*> on_path;
  for (const RawRequest& r : session.requests) on_path.push_back(&r);
  std::vector<uint64_t> prefix;
  for (int64_t k = 0; k < blocks; ++k) {
    const size_t position = static_cast<size_t>(k);
    std::map<uint64_t, int64_t> counts;
    for (const RawRequest* r : on_path) {
      if (r->local_ids.size() > position) ++counts[r->local_ids[position]];
    }
    if (counts.empty()) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    prefix.push_back(best->first);
    std::erase_if(on_path, [&](const RawRequest* r) {
      return r->local_ids.size() <= position || r->local_ids[position] != best->first;
    });
  }
  return prefix;
}

uint64_t SharedToolId(ToolPrefixSharing sharing, int64_t tool_tokens, int64_t block) {
  uint64_t id = kClaudeSharedToolIdBase | static_cast<uint64_t>(block);
  if (sharing == ToolPrefixSharing::kSameToolTokens) {
    id |= static_cast<uint64_t>(tool_tokens) << kToolGroupShift;
  }
  return id;
}

// Appends the session's requests to `out` with global ids.
void EmitSession(const RawSession& session, int block_tokens, const ClaudeCodeOptions& options,
                 uint64_t& next_tail, std::vector<TraceRequest>& out) {
  const int64_t tool_blocks =
      options.tool_prefix == ToolPrefixSharing::kNone ? 0 : session.tool_tokens / block_tokens;
  const std::vector<uint64_t> canonical = CanonicalToolPrefix(session, tool_blocks);
  for (const RawRequest& raw : session.requests) {
    TraceRequest request;
    request.arrival_seconds = raw.arrival_seconds;
    request.input_tokens = raw.input_tokens;
    request.output_tokens = raw.output_tokens;
    request.session = session.session;
    request.stop = raw.stop;
    // A sub-agent's loop ends when its model stops without a tool call: its framework hands the
    // result to the parent, so the client knows at release that no request follows.
    request.last_turn = session.subagent && raw.stop == StopReason::kEndTurn;
    request.think_seconds = raw.think_seconds;
    request.block_ids.reserve(raw.local_ids.size() + 1);
    size_t shared = 0;
    while (shared < raw.local_ids.size() && shared < canonical.size() &&
           raw.local_ids[shared] == canonical[shared]) {
      ++shared;
    }
    for (size_t k = 0; k < raw.local_ids.size(); ++k) {
      request.block_ids.push_back(
          k < shared
              ? SharedToolId(options.tool_prefix, session.tool_tokens, static_cast<int64_t>(k))
              : (session.id_space << kClaudeLocalIdBits) | raw.local_ids[k]);
    }
    const int64_t all = (raw.input_tokens + block_tokens - 1) / block_tokens;
    if (static_cast<int64_t>(request.block_ids.size()) < all) {
      request.block_ids.push_back(kClaudeTailIdBase | next_tail++);
    }
    out.push_back(std::move(request));
  }
}

// The *.json files of a directory in file-name order, or the file itself.
absl::StatusOr<std::vector<std::string>> InputFiles(const std::string& file_or_directory) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(file_or_directory, ec);
  if (!std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat(file_or_directory, ": no such file or directory"));
  }
  if (!std::filesystem::is_directory(status)) return std::vector<std::string>{file_or_directory};
  std::vector<std::string> files;
  for (std::filesystem::directory_iterator it(file_or_directory, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->path().extension() == ".json" && it->is_regular_file(ec)) {
      files.push_back(it->path().string());
    }
  }
  if (ec) {
    return absl::ErrnoToStatus(ec.value(),
                               absl::StrCat(file_or_directory, ": cannot list: ", ec.message()));
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(file_or_directory, ": no *.json files"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

absl::StatusOr<Trace> LoadClaudeCodeTraces(const std::string& file_or_directory) {
  return LoadClaudeCodeTraces(file_or_directory, ClaudeCodeOptions{});
}

absl::StatusOr<Trace> LoadClaudeCodeTraces(const std::string& file_or_directory,
                                           const ClaudeCodeOptions& options) {
  absl::StatusOr<std::vector<std::string>> files = InputFiles(file_or_directory);
  if (!files.ok()) return files.status();
  if (files->size() > kMaxFiles) {
    return absl::InvalidArgumentError(absl::StrCat(file_or_directory, ": ", files->size(),
                                                   " files, more than the ", kMaxFiles,
                                                   " sessions the id layout has room for"));
  }
  Loader loader;
  loader.next_subagent_session = files->size() + 1;
  for (size_t i = 0; i < files->size(); ++i) {
    if (absl::Status s = ParseFile((*files)[i], i + 1, loader); !s.ok()) return s;
  }

  Trace trace;
  trace.name = TraceNameOf(file_or_directory);
  trace.block_tokens = loader.block_tokens;
  uint64_t next_tail = 0;
  for (const RawSession& session : loader.sessions) {
    EmitSession(session, loader.block_tokens, options, next_tail, trace.requests);
  }
  if (trace.requests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(file_or_directory, ": no requests"));
  }
  std::stable_sort(trace.requests.begin(), trace.requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) {
                     return a.arrival_seconds < b.arrival_seconds;
                   });
  return trace;
}

}  // namespace kvtier::replay
