// The Mooncake trace loader (mooncake_trace.h): JSON Lines requests into one Trace.
#include "bench/replay/trace/mooncake_trace.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bench/replay/trace/json_fields.h"
#include "bench/replay/trace/trace.h"
#include "bench/replay/trace/trace_file.h"

namespace kvtier::replay {
namespace {

bool IsBlank(absl::string_view line) {
  for (const char c : line) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

struct Line {
  TraceRequest request;
  double timestamp_ms = 0;  // as written: arrival_seconds * 1000 need not round-trip exactly
};

// One line's request; `previous_timestamp_ms` is the line before's, or < 0 for the first.
absl::StatusOr<Line> ParseLine(absl::string_view line, const std::string& where,
                               double previous_timestamp_ms, int64_t previous_line_number) {
  absl::StatusOr<nlohmann::json> parsed = ParseJson(line, where);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& record = *parsed;
  if (absl::Status s = ExpectObject(record, where); !s.ok()) return s;

  absl::StatusOr<double> timestamp_ms =
      NumberField(record, where, "timestamp", 0, kMaxTraceSeconds * 1000);
  if (!timestamp_ms.ok()) return timestamp_ms.status();
  if (*timestamp_ms < previous_timestamp_ms) {
    return FieldError(
        where, "timestamp",
        absl::StrCat("is ", *timestamp_ms, " ms, before line ", previous_line_number, "'s ",
                     previous_timestamp_ms, " ms: a Mooncake trace must be in arrival order"));
  }
  absl::StatusOr<int64_t> input = IntField(record, where, "input_length", 1, kMaxTraceTokens);
  if (!input.ok()) return input.status();
  absl::StatusOr<int64_t> output = IntField(record, where, "output_length", 0, kMaxTraceTokens);
  if (!output.ok()) return output.status();
  absl::StatusOr<std::vector<uint64_t>> ids = IdArrayField(record, where, "hash_ids");
  if (!ids.ok()) return ids.status();
  const int64_t expected = (*input + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens;
  if (static_cast<int64_t>(ids->size()) != expected) {
    return FieldError(
        where, "hash_ids",
        absl::StrCat("has ", ids->size(), " ids, but input_length ", *input, " needs ceil(", *input,
                     " / ", kMooncakeBlockTokens, ") = ", expected));
  }
  Line parsed_line;
  parsed_line.timestamp_ms = *timestamp_ms;
  parsed_line.request.arrival_seconds = *timestamp_ms / 1000.0;
  parsed_line.request.input_tokens = *input;
  parsed_line.request.output_tokens = *output;
  parsed_line.request.block_ids = *std::move(ids);
  return parsed_line;
}

}  // namespace

absl::StatusOr<Trace> LoadMooncakeTrace(const std::string& path) {
  Trace trace;
  trace.name = TraceNameOf(path);
  trace.block_tokens = kMooncakeBlockTokens;
  double previous_timestamp_ms = -1;
  int64_t previous_line_number = 0;
  // Line by line, so a hostile line costs at most kMaxTraceLineBytes (trace_file.h).
  const absl::Status read =
      ForEachTraceLine(path, [&](int64_t line_number, absl::string_view line) -> absl::Status {
        if (IsBlank(line)) return absl::OkStatus();
        absl::StatusOr<Line> parsed = ParseLine(line, absl::StrCat(path, ":", line_number),
                                                previous_timestamp_ms, previous_line_number);
        if (!parsed.ok()) return parsed.status();
        previous_timestamp_ms = parsed->timestamp_ms;
        previous_line_number = line_number;
        trace.requests.push_back(std::move(parsed->request));
        return absl::OkStatus();
      });
  if (!read.ok()) return read;
  if (trace.requests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no requests (an empty trace)"));
  }
  return trace;
}

}  // namespace kvtier::replay
