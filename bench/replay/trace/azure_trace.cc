// The Azure LLM inference trace loader (azure_trace.h): CSV rows into one Trace.
#include "bench/replay/trace/azure_trace.h"

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "bench/replay/trace/csv.h"
#include "bench/replay/trace/trace.h"
#include "bench/replay/trace/trace_file.h"

namespace kvtier::replay {
namespace {

constexpr absl::string_view kColumns[] = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"};
constexpr size_t kColumnCount = std::size(kColumns);
constexpr int kMaxBlockTokens = 1 << 20;
constexpr size_t kMaxShownValue = 40;
constexpr absl::string_view kByteOrderMark = "\xEF\xBB\xBF";

bool IsBlank(absl::string_view line) {
  for (const char c : line) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

// The value quoted and escaped, cut to kMaxShownValue characters: a line may be 64 MiB.
std::string Shown(absl::string_view value) {
  if (value.size() <= kMaxShownValue) return absl::StrCat("\"", absl::CHexEscape(value), "\"");
  return absl::StrCat("\"", absl::CHexEscape(value.substr(0, kMaxShownValue)), "...\"");
}

absl::Status ColumnError(absl::string_view where, size_t column, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": column ", column + 1, " (", kColumns[column], ") ", problem));
}

// text[pos, pos + n) as a decimal number, or -1 unless it is all digits.
int64_t Digits(absl::string_view text, size_t pos, size_t n) {
  int64_t value = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (text[i] < '0' || text[i] > '9') return -1;
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

// The UTC offset a timestamp ends with, removed from `text`: "Z", or "+HH:MM" / "-HH:MM" (the
// 2024 traces write "+00:00"). Zero when there is none; nullopt when it is malformed.
std::optional<absl::Duration> TakeUtcOffset(absl::string_view& text) {
  constexpr size_t kWholeSeconds = 19;
  if (text.size() > kWholeSeconds && text.back() == 'Z') {
    text.remove_suffix(1);
    return absl::ZeroDuration();
  }
  constexpr size_t kOffset = 6;  // "+00:00"
  if (text.size() < kWholeSeconds + kOffset) return absl::ZeroDuration();
  const absl::string_view offset = text.substr(text.size() - kOffset);
  if (offset[0] != '+' && offset[0] != '-') return absl::ZeroDuration();
  const int64_t hours = Digits(offset, 1, 2);
  const int64_t minutes = Digits(offset, 4, 2);
  if (offset[3] != ':' || hours < 0 || hours > 23 || minutes < 0 || minutes > 59) {
    return std::nullopt;
  }
  text.remove_suffix(kOffset);
  const absl::Duration east = absl::Hours(hours) + absl::Minutes(minutes);
  return offset[0] == '+' ? east : -east;
}

// "YYYY-MM-DD HH:MM:SS" ("T" may stand for the space) with an optional "." and 1 to 9
// fractional digits, then an optional UTC offset ("Z", "+00:00"), read as UTC; nullopt unless it
// is that, and a real date and time.
std::optional<absl::Time> ParseTimestamp(absl::string_view text) {
  constexpr size_t kWholeSeconds = 19;  // "2023-11-16 18:15:46"
  const std::optional<absl::Duration> utc_offset = TakeUtcOffset(text);
  if (!utc_offset.has_value()) return std::nullopt;
  if (text.size() < kWholeSeconds || text[4] != '-' || text[7] != '-' ||
      (text[10] != ' ' && text[10] != 'T') || text[13] != ':' || text[16] != ':') {
    return std::nullopt;
  }
  const int64_t year = Digits(text, 0, 4);
  const int64_t month = Digits(text, 5, 2);
  const int64_t day = Digits(text, 8, 2);
  const int64_t hour = Digits(text, 11, 2);
  const int64_t minute = Digits(text, 14, 2);
  const int64_t second = Digits(text, 17, 2);
  if (year < 0 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0 ||
      minute > 59 || second < 0 || second > 59) {
    return std::nullopt;
  }
  // CivilSecond normalizes (February 30 becomes March 2): a real date comes back unchanged.
  const absl::CivilSecond civil(year, static_cast<int>(month), static_cast<int>(day),
                                static_cast<int>(hour), static_cast<int>(minute),
                                static_cast<int>(second));
  if (civil.month() != month || civil.day() != day) return std::nullopt;
  int64_t nanoseconds = 0;
  if (text.size() > kWholeSeconds) {
    const size_t digits = text.size() - kWholeSeconds - 1;
    if (text[kWholeSeconds] != '.' || digits < 1 || digits > 9) return std::nullopt;
    nanoseconds = Digits(text, kWholeSeconds + 1, digits);
    if (nanoseconds < 0) return std::nullopt;
    for (size_t i = digits; i < 9; ++i) nanoseconds *= 10;
  }
  return absl::FromCivil(civil, absl::UTCTimeZone()) + absl::Nanoseconds(nanoseconds) - *utc_offset;
}

// Digits only, in [min, kMaxTraceTokens]; nullopt otherwise.
std::optional<int64_t> ParseTokens(absl::string_view text, int64_t min) {
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
    if (value > kMaxTraceTokens) return std::nullopt;  // before int64 could overflow
  }
  if (value < min) return std::nullopt;
  return value;
}

// Seconds from `from` to `to`: integer nanoseconds converted once (exact to the nearest double
// for spans under 2^53 ns, 104 days), or absl's conversion past int64 nanoseconds.
double SecondsBetween(absl::Time from, absl::Time to) {
  const absl::Duration d = to - from;
  if (d < absl::Nanoseconds(std::numeric_limits<int64_t>::max())) {
    return static_cast<double>(absl::ToInt64Nanoseconds(d)) / 1e9;
  }
  return absl::ToDoubleSeconds(d);
}

absl::Status CheckHeader(const std::vector<std::string>& fields, absl::string_view where) {
  if (fields.size() != kColumnCount) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": header has ", fields.size(),
                                                   " columns, expected ", kColumnCount, " (",
                                                   absl::StrJoin(kColumns, ","), ")"));
  }
  for (size_t i = 0; i < kColumnCount; ++i) {
    if (fields[i] != kColumns[i]) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": column ", i + 1,
                                                     " header must be \"", kColumns[i], "\", got ",
                                                     Shown(fields[i])));
    }
  }
  return absl::OkStatus();
}

// The loader's state between lines.
struct Loader {
  std::string path;
  int block_tokens = 0;
  bool seen_header = false;
  absl::Time first_time;
  absl::Time previous_time;
  std::string previous_timestamp;  // as written, for the out-of-order message
  int64_t previous_line = 0;
  int64_t next_id = 0;
  int64_t max_block_ids = kMaxAzureBlockIds;
  Trace trace;

  absl::Status Line(int64_t line_number, absl::string_view line) {
    if (line_number == 1 && absl::StartsWith(line, kByteOrderMark)) {
      line.remove_prefix(kByteOrderMark.size());
    }
    if (IsBlank(line)) return absl::OkStatus();
    const std::string where = absl::StrCat(path, ":", line_number);
    const std::vector<std::string> fields = SplitCsvLine(std::string(line));
    if (!seen_header) {
      seen_header = true;
      return CheckHeader(fields, where);
    }
    if (fields.size() != kColumnCount) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": has ", fields.size(),
                                                     " columns, expected ", kColumnCount, " (",
                                                     absl::StrJoin(kColumns, ","), ")"));
    }
    const std::optional<absl::Time> time = ParseTimestamp(fields[0]);
    if (!time.has_value()) {
      return ColumnError(where, 0,
                         absl::StrCat("must be \"YYYY-MM-DD HH:MM:SS\" with an optional fraction "
                                      "of 1 to 9 digits and UTC offset (\"+00:00\", \"Z\"), a "
                                      "real date and time, got ",
                                      Shown(fields[0])));
    }
    const bool first = trace.requests.empty();
    if (!first && *time < previous_time) {
      return ColumnError(
          where, 0,
          absl::StrCat(fields[0], " is before line ", previous_line, "'s ", previous_timestamp,
                       ": an Azure trace must be in arrival order"));
    }
    const std::optional<int64_t> input = ParseTokens(fields[1], 1);
    if (!input.has_value()) {
      return ColumnError(where, 1,
                         absl::StrCat("must be an integer >= 1 and <= ", kMaxTraceTokens, ", got ",
                                      Shown(fields[1])));
    }
    const std::optional<int64_t> output = ParseTokens(fields[2], 0);
    if (!output.has_value()) {
      return ColumnError(where, 2,
                         absl::StrCat("must be an integer >= 0 and <= ", kMaxTraceTokens, ", got ",
                                      Shown(fields[2])));
    }
    const int64_t blocks = (*input + block_tokens - 1) / block_tokens;
    // Checked before allocating: the ids come from a count, not from the file's bytes.
    if (blocks > max_block_ids - next_id) {
      return ColumnError(
          where, 1,
          absl::StrCat(*input, " needs ", blocks, " block ids at block_tokens ", block_tokens,
                       ", more than the ", max_block_ids - next_id, " left of the ", max_block_ids,
                       " one trace may have (max_block_ids)"));
    }
    if (first) first_time = *time;
    TraceRequest request;
    request.arrival_seconds = SecondsBetween(first_time, *time);
    if (request.arrival_seconds > kMaxTraceSeconds) {
      return ColumnError(
          where, 0,
          absl::StrCat(fields[0], " is ", request.arrival_seconds, " s after the first row, past ",
                       kMaxTraceSeconds, " s (kMaxTraceSeconds)"));
    }
    request.input_tokens = *input;
    request.output_tokens = *output;
    request.block_ids.resize(static_cast<size_t>(blocks));
    for (uint64_t& id : request.block_ids) id = static_cast<uint64_t>(next_id++);
    trace.requests.push_back(std::move(request));
    previous_time = *time;
    previous_timestamp = fields[0];
    previous_line = line_number;
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<Trace> LoadAzureTrace(const std::string& path, int block_tokens,
                                     int64_t max_block_ids) {
  if (block_tokens < 1 || block_tokens > kMaxBlockTokens) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": block_tokens must be in [1, ",
                                                   kMaxBlockTokens, "], got ", block_tokens));
  }
  if (max_block_ids < 1 || max_block_ids > kMaxAzureBlockIds) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": max_block_ids must be in [1, ",
                                                   kMaxAzureBlockIds, "], got ", max_block_ids));
  }
  Loader loader;
  loader.path = path;
  loader.block_tokens = block_tokens;
  loader.max_block_ids = max_block_ids;
  loader.trace.name = TraceNameOf(path);
  loader.trace.block_tokens = block_tokens;
  // Line by line, so a hostile line costs at most kMaxTraceLineBytes (trace_file.h).
  const absl::Status read =
      ForEachTraceLine(path, [&loader](int64_t line_number, absl::string_view line) {
        return loader.Line(line_number, line);
      });
  if (!read.ok()) return read;
  if (!loader.seen_header) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": empty file: no header (", absl::StrJoin(kColumns, ","), ")"));
  }
  if (loader.trace.requests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no requests (only the header)"));
  }
  return std::move(loader.trace);
}

}  // namespace kvtier::replay
