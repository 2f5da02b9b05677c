// One line of a CSV table (RFC 4180 fields: double-quoted fields may hold commas, "" is a quote
// inside them), as the replay's model table and the tests reading shared/ tables split it.
// Header-only, so a test includes it without linking the replay.
//
// Thread-safety: a pure function.
#ifndef KVTIER_BENCH_REPLAY_TRACE_CSV_H_
#define KVTIER_BENCH_REPLAY_TRACE_CSV_H_

#include <string>
#include <vector>

namespace kvtier::replay {

// The fields of `line` (no line break of its own; a '\r' outside quotes, as a CRLF file leaves at
// the end, is dropped), in order, unquoted: at least one (an empty line is one empty field), and
// one more than the commas outside quotes. A quote opens or closes quoting wherever it stands; an
// unclosed quote runs to the end of the line. Never fails.
inline std::vector<std::string> SplitCsvLine(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else if (c != '\r') {
      fields.back() += c;
    }
  }
  return fields;
}

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_CSV_H_
