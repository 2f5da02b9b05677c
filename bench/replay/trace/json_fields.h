// Typed fields of parsed JSON trace records, with errors that say where the bad value is. The
// trace loaders' only contact with nlohmann::json.
//
// `where` names the record: "<file>:<line>" for a JSON Lines record, "<file>: requests[3]" for a
// nested one. Every error is kInvalidArgument with the message
// `<where>: field "<field>" <problem>, got <value>` (the value cut to 40 characters), so it names
// the file, the line or record, and the field.
//
// Thread-safety: free functions with no shared state.
#ifndef KVTIER_BENCH_REPLAY_TRACE_JSON_FIELDS_H_
#define KVTIER_BENCH_REPLAY_TRACE_JSON_FIELDS_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kvtier::replay {

// Parses `text` as one JSON value. kInvalidArgument "<where>: not valid JSON: <parser's
// message>" (which has the line and column, or the byte offset) on a syntax error.
absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text, absl::string_view where);

// kInvalidArgument unless `value` is a JSON object.
absl::Status ExpectObject(const nlohmann::json& value, absl::string_view where);

// A kInvalidArgument status `<where>: field "<field>" <problem>`.
absl::Status FieldError(absl::string_view where, absl::string_view field,
                        absl::string_view problem);

// `object[field]`; "is missing" when absent. `object` must be an object (ExpectObject).
absl::StatusOr<const nlohmann::json*> RequiredField(const nlohmann::json& object,
                                                    absl::string_view where,
                                                    absl::string_view field);

// Whether `object` has `field` with a value other than null: upstream writers put null in an
// optional field they have no value for (a sub-agent's "duration_ms"), and it reads as absent.
bool HasValue(const nlohmann::json& object, absl::string_view field);

// An integer field in [min, max]. A float (even 3.0 or 1e300), a string or an out-of-range value
// is an error ("must be an integer >= 1 and <= 16777216, got 16777217").
absl::StatusOr<int64_t> IntField(const nlohmann::json& object, absl::string_view where,
                                 absl::string_view field, int64_t min,
                                 int64_t max = std::numeric_limits<int64_t>::max());

// A finite number in [min, max], integer or not.
absl::StatusOr<double> NumberField(const nlohmann::json& object, absl::string_view where,
                                   absl::string_view field, double min,
                                   double max = std::numeric_limits<double>::infinity());

// A boolean, or `absent` where the field is missing; anything else is an error ("must be true or
// false, got 1").
absl::StatusOr<bool> OptionalBoolField(const nlohmann::json& object, absl::string_view where,
                                       absl::string_view field, bool absent);

// A string.
absl::StatusOr<std::string> StringField(const nlohmann::json& object, absl::string_view where,
                                        absl::string_view field);

// An array of integers in [0, 2^64); the error names the first bad element's index.
absl::StatusOr<std::vector<uint64_t>> IdArrayField(const nlohmann::json& object,
                                                   absl::string_view where,
                                                   absl::string_view field);

// Required arrays of records (Claude Code `requests`): the field, checked to be an array.
absl::StatusOr<const nlohmann::json*> ArrayField(const nlohmann::json& object,
                                                 absl::string_view where, absl::string_view field);

}  // namespace kvtier::replay

#endif  // KVTIER_BENCH_REPLAY_TRACE_JSON_FIELDS_H_
