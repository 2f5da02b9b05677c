#include "bench/replay/trace/mooncake_trace.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/shared_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/unit/replay/trace/big_files.h"

namespace kvtier::replay {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string WriteFile(const kvtier::testing::TempDir& dir, const std::string& name,
                      const std::string& content) {
  const std::string path = dir.File(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

constexpr char kLine1[] = R"({"timestamp": 0, "input_length": 1000, "output_length": 5, )"
                          R"("hash_ids": [0, 1]})";
constexpr char kLine2[] = R"({"timestamp": 1500, "input_length": 512, "output_length": 0, )"
                          R"("hash_ids": [0]})";

TEST(MooncakeTraceTest, LoadsAGoodFile) {
  kvtier::testing::TempDir dir;
  // A blank line, CRLF line ends and an extra field are accepted; the last line has no newline.
  const std::string path =
      WriteFile(dir, "t.jsonl",
                absl::StrCat(kLine1, "\r\n\n", kLine2, "\n",
                             R"({"timestamp": 1500.5, "input_length": 1025, "output_length": 7, )"
                             R"("hash_ids": [0, 1, 99], "extra": "ignored"})"));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadMooncakeTrace(path));
  EXPECT_EQ(trace.block_tokens, 512);
  EXPECT_THAT(trace.name, HasSubstr("t.jsonl"));
  ASSERT_EQ(trace.requests.size(), 3u);
  const TraceRequest& first = trace.requests[0];
  EXPECT_EQ(first.arrival_seconds, 0);
  EXPECT_EQ(first.input_tokens, 1000);
  EXPECT_EQ(first.output_tokens, 5);
  EXPECT_EQ(first.block_ids, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(first.session, 0u);
  EXPECT_EQ(first.stop, StopReason::kUnknown);
  EXPECT_EQ(trace.requests[1].arrival_seconds, 1.5);
  EXPECT_EQ(trace.requests[1].output_tokens, 0);
  EXPECT_DOUBLE_EQ(trace.requests[2].arrival_seconds, 1.5005);
  EXPECT_EQ(trace.requests[2].block_ids, (std::vector<uint64_t>{0, 1, 99}));
}

TEST(MooncakeTraceTest, EqualTimestampsAreInOrder) {
  kvtier::testing::TempDir dir;
  const std::string path = WriteFile(dir, "t.jsonl", absl::StrCat(kLine2, "\n", kLine2, "\n"));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadMooncakeTrace(path));
  EXPECT_EQ(trace.requests.size(), 2u);
}

struct BadCase {
  const char* name;
  std::string line2;  // the second line; the first is kLine1
  const char* field;  // must appear in the message
  const char* detail;
};

class MooncakeMalformedTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(MooncakeMalformedTest, NamesFileLineAndField) {
  const BadCase& c = GetParam();
  kvtier::testing::TempDir dir;
  const std::string path =
      WriteFile(dir, "bad.jsonl", absl::StrCat(kLine1, "\n", c.line2, "\n", kLine2, "\n"));
  const absl::StatusOr<Trace> trace = LoadMooncakeTrace(path);
  EXPECT_THAT(trace, IsError(StatusCode::kInvalidArgument, absl::StrCat(path, ":2: ")));
  ASSERT_FALSE(trace.ok());
  EXPECT_THAT(std::string(trace.status().message()),
              AllOf(HasSubstr(c.field), HasSubstr(c.detail)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MooncakeMalformedTest,
    ::testing::Values(
        BadCase{"BadJson", R"({"timestamp": 1, "input_length": )", "not valid JSON", "column"},
        BadCase{"TruncatedLine", R"({"timestamp": 1, "input_length": 10, "hash_ids": [0)",
                "not valid JSON", ""},
        // Found in review: a number too large for a double is nlohmann's out_of_range, not a
        // parse_error, and escaped the catch (the replay aborted).
        BadCase{"NumberPastADouble",
                R"({"timestamp": 1e400, "input_length": 10, "output_length": 1, "hash_ids": [0]})",
                "not valid JSON", "1e400"},
        // Found in review: the error message dumped the bad value, recursively: a deeply nested
        // one overflowed the stack. A container is named by its type and size instead.
        BadCase{"DeeplyNestedValue",
                absl::StrCat(R"({"input_length": 10, "output_length": 1, "hash_ids": [0], )",
                             R"("timestamp": )", std::string(200000, '['), std::string(200000, ']'),
                             "}"),
                "\"timestamp\"", "an array of 1 elements"},
        BadCase{"NotAnObject", "[1, 2]", "JSON object", "array"},
        BadCase{"MissingTimestamp", R"({"input_length": 10, "output_length": 1, "hash_ids": [0]})",
                "\"timestamp\"", "missing"},
        BadCase{"MissingInputLength", R"({"timestamp": 1, "output_length": 1, "hash_ids": [0]})",
                "\"input_length\"", "missing"},
        BadCase{"MissingOutputLength", R"({"timestamp": 1, "input_length": 10, "hash_ids": [0]})",
                "\"output_length\"", "missing"},
        BadCase{"MissingHashIds", R"({"timestamp": 1, "input_length": 10, "output_length": 1})",
                "\"hash_ids\"", "missing"},
        BadCase{"StringLength",
                R"({"timestamp": 1, "input_length": "10", "output_length": 1, "hash_ids": [0]})",
                "\"input_length\"", "integer"},
        BadCase{"FractionalLength",
                R"({"timestamp": 1, "input_length": 10.5, "output_length": 1, "hash_ids": [0]})",
                "\"input_length\"", "10.5"},
        BadCase{"NegativeInputLength",
                R"({"timestamp": 1, "input_length": -10, "output_length": 1, "hash_ids": []})",
                "\"input_length\"", "-10"},
        BadCase{"ZeroInputLength",
                R"({"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []})",
                "\"input_length\"", ">= 1"},
        BadCase{"NegativeOutputLength",
                R"({"timestamp": 1, "input_length": 10, "output_length": -1, "hash_ids": [0]})",
                "\"output_length\"", "-1"},
        BadCase{"NegativeTimestamp",
                R"({"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]})",
                "\"timestamp\"", "-1"},
        BadCase{"StringTimestamp",
                R"({"timestamp": "1", "input_length": 10, "output_length": 1, "hash_ids": [0]})",
                "\"timestamp\"", "number"},
        BadCase{"IdsNotArray",
                R"({"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": 0})",
                "\"hash_ids\"", "array"},
        BadCase{"NegativeId",
                R"({"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [-3]})",
                "\"hash_ids\"", "element 0"},
        BadCase{"TooFewIds",
                R"({"timestamp": 1, "input_length": 1025, "output_length": 1, "hash_ids": [0, 1]})",
                "\"hash_ids\"", "ceil(1025 / 512) = 3"},
        BadCase{"TooManyIds",
                R"({"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [0, 1]})",
                "\"hash_ids\"", "has 2 ids"},
        // Lengths past kMaxTraceTokens (2^24) are refused before ceil(input / 512) is
        // computed, so it cannot overflow and no length sizes an allocation.
        BadCase{"InputLength2Pow31",
                R"({"timestamp": 1, "input_length": 2147483648, "output_length": 1, )"
                R"("hash_ids": []})",
                "\"input_length\"", "<= 16777216"},
        BadCase{"InputLength2Pow24Plus1",
                R"({"timestamp": 1, "input_length": 16777217, "output_length": 1, )"
                R"("hash_ids": []})",
                "\"input_length\"", "<= 16777216, got 16777217"},
        // At the limit the count is accepted, and the ids must still agree with it.
        BadCase{"InputLengthMaxWithoutItsIds",
                R"({"timestamp": 1, "input_length": 16777216, "output_length": 1, )"
                R"("hash_ids": [0]})",
                "\"hash_ids\"",
                "has 1 ids, but input_length 16777216 needs ceil(16777216 / 512) = 32768"},
        // Timestamps past kMaxTraceSeconds (10^9 s, in ms here) would overflow the replay's
        // nanosecond clock.
        BadCase{"TimestampPastTheClock",
                R"({"timestamp": 1e300, "input_length": 10, "output_length": 1, "hash_ids": [0]})",
                "\"timestamp\"", "<= 1e+12"},
        BadCase{"InputLengthInt64Max",
                R"({"timestamp": 1, "input_length": 9223372036854775807, "output_length": 1, )"
                R"("hash_ids": []})",
                "\"input_length\"", "<= 16777216"},
        BadCase{"InputLengthUint64Max",
                R"({"timestamp": 1, "input_length": 18446744073709551615, "output_length": 1, )"
                R"("hash_ids": []})",
                "\"input_length\"", "<= 16777216"},
        BadCase{"InputLengthHugeFloat",
                R"({"timestamp": 1, "input_length": 1e300, "output_length": 1, "hash_ids": []})",
                "\"input_length\"", "1e+300"},
        BadCase{"InputLengthFraction",
                R"({"timestamp": 1, "input_length": 1.5, "output_length": 1, "hash_ids": [0]})",
                "\"input_length\"", "1.5"},
        BadCase{"OutputLength2Pow31",
                R"({"timestamp": 1, "input_length": 10, "output_length": 2147483648, )"
                R"("hash_ids": [0]})",
                "\"output_length\"", "<= 16777216"}),
    [](const ::testing::TestParamInfo<BadCase>& param) { return param.param.name; });

TEST(MooncakeTraceTest, RejectsOutOfOrderTimestamps) {
  kvtier::testing::TempDir dir;
  const std::string path = WriteFile(dir, "t.jsonl", absl::StrCat(kLine2, "\n", kLine1, "\n"));
  EXPECT_THAT(LoadMooncakeTrace(path),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(path, ":2: field \"timestamp\" is 0 ms, before line 1's 1500")));
}

TEST(MooncakeTraceTest, MissingFileIsNotFound) {
  kvtier::testing::TempDir dir;
  const std::string path = dir.File("absent.jsonl");
  EXPECT_THAT(LoadMooncakeTrace(path), IsError(StatusCode::kNotFound, path));
}

TEST(MooncakeTraceTest, RejectsADirectoryAndAnEmptyFile) {
  kvtier::testing::TempDir dir;
  EXPECT_THAT(LoadMooncakeTrace(dir.path()), IsError(StatusCode::kInvalidArgument, dir.path()));
  const std::string empty = WriteFile(dir, "empty.jsonl", "\n\n");
  EXPECT_THAT(LoadMooncakeTrace(empty), IsError(StatusCode::kInvalidArgument, "no requests"));
}

// A line past kMaxTraceLineBytes (64 MiB) is refused while it is read: 65 MiB of hash_ids, or of
// one string field, in an otherwise valid line.
TEST(MooncakeTraceTest, RejectsALineOverTheLimit) {
  kvtier::testing::TempDir dir;
  const std::string ids = dir.File("ids.jsonl");
  ASSERT_TRUE(kvtier::testing::WriteRepeated(
      ids,
      absl::StrCat(kLine1, "\n",
                   R"({"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0)"),
      ", 0", uint64_t{65} << 20, absl::StrCat("]}\n", kLine2, "\n")));
  EXPECT_THAT(LoadMooncakeTrace(ids),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(ids, ":2: line exceeds the limit of 64 MiB")));

  const std::string text = dir.File("text.jsonl");
  ASSERT_TRUE(kvtier::testing::WriteRepeated(
      text, absl::StrCat(kLine1, "\n", R"({"note": ")"), "x", uint64_t{65} << 20,
      absl::StrCat(R"(", "timestamp": 1, "input_length": 10, "output_length": 1, )",
                   R"("hash_ids": [0]})", "\n")));
  EXPECT_THAT(LoadMooncakeTrace(text),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(text, ":2: line exceeds the limit of 64 MiB")));
}

// A 1.5 GiB line (a sparse file: no disk) is not read whole: the load stops at the limit, and
// the process's peak memory grows by about the limit, not by the line.
TEST(MooncakeTraceTest, AGigabyteLineIsNotReadIntoMemory) {
  kvtier::testing::TempDir dir;
  const std::string path = dir.File("huge.jsonl");
  ASSERT_TRUE(kvtier::testing::WriteSparse(path, absl::StrCat(kLine1, "\n"), uint64_t{3} << 29));
  const uint64_t peak_before = kvtier::testing::PeakRssBytes();
  EXPECT_THAT(LoadMooncakeTrace(path),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(path, ":2: line exceeds the limit of 64 MiB")));
  EXPECT_LT(kvtier::testing::PeakRssBytes() - peak_before, uint64_t{256} << 20);
}

TEST(MooncakeTraceTest, LoadsTheReleasedTrace) {
  const auto path = kvtier::testing::SharedFile("traces/mooncake/conversation_trace.jsonl");
  if (path.empty()) {
    GTEST_SKIP() << "traces/mooncake/conversation_trace.jsonl not found under "
                 << kvtier::testing::SharedDir() << " (set KVTIER_SHARED_DIR)";
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadMooncakeTrace(path.string()));
  EXPECT_EQ(trace.name, "mooncake/conversation_trace.jsonl");
  ASSERT_EQ(trace.requests.size(), 12031u);
  int64_t max_input = 0;
  for (const TraceRequest& r : trace.requests) {
    ASSERT_FALSE(r.block_ids.empty());
    EXPECT_EQ(r.block_ids[0], 0u);  // every request starts with the shared system prefix
    max_input = std::max(max_input, r.input_tokens);
  }
  EXPECT_EQ(max_input, 126195);
  EXPECT_NEAR(trace.requests.back().arrival_seconds, 3537, 1);
}

}  // namespace
}  // namespace kvtier::replay
