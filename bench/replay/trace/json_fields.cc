// JSON field readers (json_fields.h): typed fields, errors naming file, line and field.
#include "bench/replay/trace/json_fields.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvtier::replay {
namespace {

using ::nlohmann::json;

constexpr size_t kMaxShownValue = 40;

std::string Shown(const json& value) {
  // A container is named, not dumped: dump() recurses once per level, and a deeply nested
  // value in a bad field would overflow the stack while its error is being written.
  if (value.is_object() || value.is_array()) {
    return absl::StrCat("an ", value.type_name(), " of ", value.size(), " elements");
  }
  std::string text = value.dump();
  if (text.size() > kMaxShownValue) {
    text.resize(kMaxShownValue);
    text += "...";
  }
  return text;
}

absl::Status BadValue(absl::string_view where, absl::string_view field, absl::string_view problem,
                      const json& value) {
  return FieldError(where, field, absl::StrCat(problem, ", got ", Shown(value)));
}

}  // namespace

absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view where) {
  try {
    return json::parse(text.data(), text.data() + text.size());
  } catch (const json::exception& e) {
    // Every parse failure, not only parse_error: a number too large for a double (1e400) is an
    // out_of_range (406). what() is "[json.exception.parse_error.101] parse error at line 1,
    // column 7: ...": keep the part after the bracketed id, which says where and what.
    absl::string_view message = e.what();
    if (const size_t close = message.find("] "); close != absl::string_view::npos) {
      message.remove_prefix(close + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON: ", message));
  }
}

absl::Status ExpectObject(const json& value, absl::string_view where) {
  if (value.is_object()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": must be a JSON object, got ", value.type_name()));
}

absl::Status FieldError(absl::string_view where, absl::string_view field,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": field \"", field, "\" ", problem));
}

absl::StatusOr<const json*> RequiredField(const json& object, absl::string_view where,
                                          absl::string_view field) {
  const auto it = object.find(std::string_view(field.data(), field.size()));
  if (it == object.end()) return FieldError(where, field, "is missing");
  return &*it;
}

bool HasValue(const json& object, absl::string_view field) {
  const auto it = object.find(std::string_view(field.data(), field.size()));
  return it != object.end() && !it->is_null();
}

absl::StatusOr<int64_t> IntField(const json& object, absl::string_view where,
                                 absl::string_view field, int64_t min, int64_t max) {
  absl::StatusOr<const json*> value = RequiredField(object, where, field);
  if (!value.ok()) return value.status();
  const json& v = **value;
  std::string problem = absl::StrCat("must be an integer >= ", min);
  if (max != std::numeric_limits<int64_t>::max()) absl::StrAppend(&problem, " and <= ", max);
  int64_t n = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) {
      if (max == std::numeric_limits<int64_t>::max()) problem += " that fits in 64 bits";
      return BadValue(where, field, problem, v);
    }
    n = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else {
    return BadValue(where, field, problem, v);
  }
  if (n < min || n > max) return BadValue(where, field, problem, v);
  return n;
}

absl::StatusOr<double> NumberField(const json& object, absl::string_view where,
                                   absl::string_view field, double min, double max) {
  absl::StatusOr<const json*> value = RequiredField(object, where, field);
  if (!value.ok()) return value.status();
  const json& v = **value;
  const std::string problem = std::isfinite(max)
                                  ? absl::StrCat("must be a number >= ", min, " and <= ", max)
                                  : absl::StrCat("must be a number >= ", min);
  if (!v.is_number()) return BadValue(where, field, problem, v);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < min || d > max) return BadValue(where, field, problem, v);
  return d;
}

absl::StatusOr<bool> OptionalBoolField(const json& object, absl::string_view where,
                                       absl::string_view field, bool absent) {
  const auto it = object.find(std::string_view(field.data(), field.size()));
  if (it == object.end()) return absent;
  if (!it->is_boolean()) return BadValue(where, field, "must be true or false", *it);
  return it->get<bool>();
}

absl::StatusOr<std::string> StringField(const json& object, absl::string_view where,
                                        absl::string_view field) {
  absl::StatusOr<const json*> value = RequiredField(object, where, field);
  if (!value.ok()) return value.status();
  if (!(*value)->is_string()) return BadValue(where, field, "must be a string", **value);
  return (*value)->get<std::string>();
}

absl::StatusOr<std::vector<uint64_t>> IdArrayField(const json& object, absl::string_view where,
                                                   absl::string_view field) {
  absl::StatusOr<const json*> value = RequiredField(object, where, field);
  if (!value.ok()) return value.status();
  const json& v = **value;
  if (!v.is_array()) return BadValue(where, field, "must be an array of integers >= 0", v);
  std::vector<uint64_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& id = v[i];
    // nlohmann stores every non-negative integer literal as unsigned.
    if (!id.is_number_unsigned()) {
      return BadValue(where, field, absl::StrCat("element ", i, " must be an integer >= 0"), id);
    }
    ids.push_back(id.get<uint64_t>());
  }
  return ids;
}

absl::StatusOr<const json*> ArrayField(const json& object, absl::string_view where,
                                       absl::string_view field) {
  absl::StatusOr<const json*> value = RequiredField(object, where, field);
  if (!value.ok()) return value.status();
  if (!(*value)->is_array()) return BadValue(where, field, "must be an array", **value);
  return *value;
}

}  // namespace kvtier::replay
