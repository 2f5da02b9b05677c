// Splits one CSV line, honouring double-quoted fields with commas and "" escapes (RFC 4180), for
// tests reading shared/ tables.
#ifndef KVTIER_TESTS_TESTING_CSV_H_
#define KVTIER_TESTS_TESTING_CSV_H_

#include <string>
#include <vector>

namespace kvtier::testing {

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

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_CSV_H_
