#include "bench/replay/trace/azure_trace.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

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

constexpr char kHeader[] = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
constexpr char kRow1[] = "2023-11-16 18:15:46.6805900,374,44";

std::string Write(const kvtier::testing::TempDir& dir, const std::string& name,
                  const std::string& content) {
  const std::string path = dir.File(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::vector<uint64_t> Ids(uint64_t first, uint64_t count) {
  std::vector<uint64_t> ids(count);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

TEST(AzureTraceTest, LoadsAGoodFile) {
  kvtier::testing::TempDir dir;
  // An equal timestamp, a row without a fraction, one across midnight; no final newline.
  const std::string path = Write(dir, "a.csv",
                                 absl::StrCat(kHeader, kRow1, "\n",
                                              "2023-11-16 18:15:50.9951690,396,109\n"
                                              "2023-11-16 18:15:50.9951690,64,0\n"
                                              "2023-11-17 00:00:00,1,7"));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadAzureTrace(path));
  EXPECT_EQ(trace.block_tokens, 64);
  EXPECT_THAT(trace.name, HasSubstr("a.csv"));
  ASSERT_EQ(trace.requests.size(), 4u);
  const TraceRequest& first = trace.requests[0];
  EXPECT_EQ(first.arrival_seconds, 0);
  EXPECT_EQ(first.input_tokens, 374);
  EXPECT_EQ(first.output_tokens, 44);
  EXPECT_EQ(first.session, 0u);
  EXPECT_EQ(first.stop, StopReason::kUnknown);
  EXPECT_EQ(first.think_seconds, 0);
  // ceil(374 / 64) = 6 ids, then ceil(396 / 64) = 7, 1, 1: fresh ids, shared with no one.
  EXPECT_EQ(first.block_ids, Ids(0, 6));
  EXPECT_EQ(trace.requests[1].block_ids, Ids(6, 7));
  EXPECT_EQ(trace.requests[2].block_ids, Ids(13, 1));
  EXPECT_EQ(trace.requests[3].block_ids, Ids(14, 1));
  // 50.9951690 - 46.6805900 s; 24:00:00 - 18:15:46.68059 = 5 h 44 min 13.31941 s. Exact: the
  // difference is taken in integer nanoseconds and rounded once.
  EXPECT_EQ(trace.requests[1].arrival_seconds, 4.314579);
  EXPECT_EQ(trace.requests[2].arrival_seconds, 4.314579);
  EXPECT_EQ(trace.requests[3].arrival_seconds, 20653.31941);
  EXPECT_EQ(trace.requests[2].output_tokens, 0);
}

TEST(AzureTraceTest, TimestampsAreExactToTheNanosecond) {
  kvtier::testing::TempDir dir;
  // Across a year's end, 200 ns apart; a leap day; 1 and 9 fractional digits.
  const std::string path = Write(dir, "t.csv",
                                 absl::StrCat(kHeader,
                                              "2023-12-31 23:59:59.9999999,1,1\n"
                                              "2024-01-01 00:00:00.0000001,1,1\n"
                                              "2024-02-29 12:00:00.5,1,1\n"
                                              "2024-02-29 12:00:00.500000001,1,1\n"));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadAzureTrace(path));
  ASSERT_EQ(trace.requests.size(), 4u);
  EXPECT_EQ(trace.requests[1].arrival_seconds, 2e-7);
  // 59 days and 12 h after 2024-01-01 00:00:00, plus 0.5000001 s.
  EXPECT_EQ(trace.requests[2].arrival_seconds, 5140800.5000001);
  EXPECT_EQ(trace.requests[3].arrival_seconds, 5140800.500000101);
}

// Found in review: the Azure 2024 traces write their timestamps with a UTC offset
// ("2024-05-10 00:00:00.009930+00:00"), and the reader refused every row of them. An offset
// ("+HH:MM", "-HH:MM", "Z") and an ISO "T" are read now, and the offset is applied.
TEST(AzureTraceTest, ReadsUtcOffsets) {
  kvtier::testing::TempDir dir;
  const std::string path = Write(dir, "t.csv",
                                 absl::StrCat(kHeader,
                                              "2024-05-10 00:00:00.009930+00:00,1,1\n"
                                              "2024-05-10T00:00:01Z,1,1\n"
                                              "2024-05-10 02:00:02+02:00,1,1\n"
                                              "2024-05-09 23:30:03.5-00:30,1,1\n"));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadAzureTrace(path));
  ASSERT_EQ(trace.requests.size(), 4u);
  EXPECT_EQ(trace.requests[1].arrival_seconds, 0.99007);
  EXPECT_EQ(trace.requests[2].arrival_seconds, 1.99007);
  EXPECT_EQ(trace.requests[3].arrival_seconds, 3.49007);
}

TEST(AzureTraceTest, BlockTokensSetsTheIdsPerRequest) {
  kvtier::testing::TempDir dir;
  const std::string path =
      Write(dir, "a.csv", absl::StrCat(kHeader, kRow1, "\n2023-11-16 18:15:47,400,1\n"));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadAzureTrace(path, 100));
  EXPECT_EQ(trace.block_tokens, 100);
  EXPECT_EQ(trace.requests[0].block_ids, Ids(0, 4));  // ceil(374 / 100)
  EXPECT_EQ(trace.requests[1].block_ids, Ids(4, 4));  // exactly 4 blocks
  for (const int bad : {0, -64, (1 << 20) + 1}) {
    EXPECT_THAT(LoadAzureTrace(path, bad), IsError(StatusCode::kInvalidArgument, "block_tokens"))
        << bad;
  }
}

TEST(AzureTraceTest, AcceptsCrlfQuotesBlankLinesAndAByteOrderMark) {
  kvtier::testing::TempDir dir;
  const std::string path =
      Write(dir, "a.csv",
            absl::StrCat("\xEF\xBB\xBF", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n", kRow1,
                         "\r\n\r\n", R"("2023-11-16 18:15:47","65",0)", "\r\n"));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadAzureTrace(path));
  ASSERT_EQ(trace.requests.size(), 2u);
  EXPECT_EQ(trace.requests[1].input_tokens, 65);
  EXPECT_EQ(trace.requests[1].block_ids, Ids(6, 2));
}

struct BadCase {
  const char* name;
  const char* row;     // line 3; line 2 is kRow1
  const char* where;   // after "<path>:3: "
  const char* detail;  // also in the message
};

class AzureMalformedTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(AzureMalformedTest, NamesFileLineAndColumn) {
  const BadCase& c = GetParam();
  kvtier::testing::TempDir dir;
  const std::string path = Write(
      dir, "bad.csv", absl::StrCat(kHeader, kRow1, "\n", c.row, "\n2023-11-17 00:00:00,1,1\n"));
  const absl::StatusOr<Trace> trace = LoadAzureTrace(path);
  EXPECT_THAT(trace, IsError(StatusCode::kInvalidArgument, absl::StrCat(path, ":3: ", c.where)));
  ASSERT_FALSE(trace.ok());
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr(c.detail));
}

constexpr char kTimestamp[] = "column 1 (TIMESTAMP) must be";
constexpr char kContext[] = "column 2 (ContextTokens) must be an integer >= 1 and <= 16777216";
constexpr char kGenerated[] = "column 3 (GeneratedTokens) must be an integer >= 0 and <= 16777216";

INSTANTIATE_TEST_SUITE_P(
    Cases, AzureMalformedTest,
    ::testing::Values(
        BadCase{"TwoColumns", "2023-11-16 18:15:51,10", "has 2 columns, expected 3", ""},
        BadCase{"FourColumns", "2023-11-16 18:15:51,10,1,5", "has 4 columns, expected 3", ""},
        BadCase{"EmptyLineOfCommas", ",,", kTimestamp, R"(got "")"},
        BadCase{"SlashDate", "2023/11/16 18:15:51,10,1", kTimestamp, "2023/11/16"},
        BadCase{"IsoLowerT", "2023-11-16t18:15:51,10,1", kTimestamp, "t18"},
        BadCase{"LeadingSpace", " 2023-11-16 18:15:51,10,1", kTimestamp, R"(" 2023)"},
        BadCase{"ShortYear", "23-11-16 18:15:51,10,1", kTimestamp, "23-11-16"},
        BadCase{"NoSeconds", "2023-11-16 18:15,10,1", kTimestamp, "18:15"},
        BadCase{"February30", "2023-02-30 00:00:00,10,1", kTimestamp, "2023-02-30"},
        BadCase{"Month13", "2023-13-01 00:00:00,10,1", kTimestamp, "2023-13-01"},
        BadCase{"Hour24", "2023-11-16 24:00:00,10,1", kTimestamp, "24:00:00"},
        BadCase{"LeapSecond", "2023-11-16 23:59:60,10,1", kTimestamp, "23:59:60"},
        BadCase{"EmptyFraction", "2023-11-16 18:15:51.,10,1", kTimestamp, "18:15:51."},
        BadCase{"TenDigitFraction", "2023-11-16 18:15:51.1234567890,10,1", kTimestamp,
                "1234567890"},
        BadCase{"ZoneHour25", "2023-11-16 18:15:51.1+25:00,10,1", kTimestamp, "+25:00"},
        BadCase{"ZoneWithoutColon", "2023-11-16 18:15:51.1+0000,10,1", kTimestamp, "+0000"},
        BadCase{"ZoneName", "2023-11-16 18:15:51 UTC,10,1", kTimestamp, " UTC"},
        // 37 years after line 2: past kMaxTraceSeconds (10^9 s), which the replay's
        // nanosecond clock needs.
        BadCase{"PastTheClock", "2060-11-16 18:15:51,10,1", "column 1 (TIMESTAMP) 2060-11-16",
                "kMaxTraceSeconds"},
        BadCase{"Backwards", "2023-11-16 18:15:46.6805899,10,1",
                "column 1 (TIMESTAMP) 2023-11-16 18:15:46.6805899 is before line 2's "
                "2023-11-16 18:15:46.6805900",
                "arrival order"},
        BadCase{"ContextEmpty", "2023-11-16 18:15:51,,1", kContext, R"(got "")"},
        BadCase{"ContextText", "2023-11-16 18:15:51,abc,1", kContext, R"(got "abc")"},
        BadCase{"ContextZero", "2023-11-16 18:15:51,0,1", kContext, R"(got "0")"},
        BadCase{"ContextNegative", "2023-11-16 18:15:51,-5,1", kContext, R"(got "-5")"},
        BadCase{"ContextPlus", "2023-11-16 18:15:51,+5,1", kContext, R"(got "+5")"},
        BadCase{"ContextSpace", "2023-11-16 18:15:51, 5,1", kContext, R"(got " 5")"},
        BadCase{"ContextFraction", "2023-11-16 18:15:51,1.5,1", kContext, R"(got "1.5")"},
        BadCase{"ContextExponent", "2023-11-16 18:15:51,1e3,1", kContext, R"(got "1e3")"},
        BadCase{"Context2Pow31", "2023-11-16 18:15:51,2147483648,1", kContext, "2147483648"},
        // Found in review: at the old limit (2^31 - 1) this row loaded, and the replay's
        // prompt of 2^31 - 1 token ids (8 GiB) ended it with bad_alloc.
        BadCase{"Context2Pow24Plus1", "2023-11-16 18:15:51,16777217,1", kContext, "16777217"},
        BadCase{"ContextInt64Max", "2023-11-16 18:15:51,9223372036854775807,1", kContext,
                "9223372036854775807"},
        BadCase{"ContextHuge", "2023-11-16 18:15:51,99999999999999999999999999,1", kContext,
                "99999999999999999999999999"},
        BadCase{"GeneratedEmpty", "2023-11-16 18:15:51,10,", kGenerated, R"(got "")"},
        BadCase{"GeneratedNegative", "2023-11-16 18:15:51,10,-1", kGenerated, R"(got "-1")"},
        BadCase{"Generated2Pow31", "2023-11-16 18:15:51,10,2147483648", kGenerated, "2147483648"}),
    [](const ::testing::TestParamInfo<BadCase>& param) { return param.param.name; });

TEST(AzureTraceTest, AShownValueIsCut) {
  kvtier::testing::TempDir dir;
  const std::string path = Write(
      dir, "a.csv", absl::StrCat(kHeader, "2023-11-16 18:15:51,", std::string(1000, '7'), ",1\n"));
  const absl::StatusOr<Trace> trace = LoadAzureTrace(path);
  ASSERT_FALSE(trace.ok());
  EXPECT_THAT(std::string(trace.status().message()),
              AllOf(HasSubstr(absl::StrCat(path, ":2: column 2 (ContextTokens)")),
                    HasSubstr(absl::StrCat(std::string(40, '7'), "...")),
                    ::testing::Not(HasSubstr(std::string(41, '7')))));
}

TEST(AzureTraceTest, TheHeaderMustBeTheAzureOne) {
  kvtier::testing::TempDir dir;
  const std::string body = absl::StrCat(kRow1, "\n");
  const std::string two = Write(dir, "two.csv", absl::StrCat("TIMESTAMP,ContextTokens\n", body));
  EXPECT_THAT(LoadAzureTrace(two),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(two, ":1: header has 2 columns, expected 3")));
  const std::string renamed =
      Write(dir, "renamed.csv", absl::StrCat("TIMESTAMP,Context,GeneratedTokens\n", body));
  EXPECT_THAT(LoadAzureTrace(renamed),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(renamed, R"(:1: column 2 header must be "ContextTokens", )",
                                   R"(got "Context")")));
  // A file without its header: the first row is read as one, and named.
  const std::string headless = Write(dir, "headless.csv", body);
  EXPECT_THAT(LoadAzureTrace(headless),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(headless, R"(:1: column 1 header must be "TIMESTAMP", )",
                                   R"(got "2023-11-16 18:15:46.6805900")")));
}

TEST(AzureTraceTest, EmptyMissingAndHeaderOnlyFiles) {
  kvtier::testing::TempDir dir;
  const std::string empty = Write(dir, "empty.csv", "");
  EXPECT_THAT(LoadAzureTrace(empty),
              IsError(StatusCode::kInvalidArgument, absl::StrCat(empty, ": empty file")));
  const std::string blank = Write(dir, "blank.csv", "\n\r\n");
  EXPECT_THAT(LoadAzureTrace(blank), IsError(StatusCode::kInvalidArgument, "empty file"));
  const std::string header = Write(dir, "header.csv", kHeader);
  EXPECT_THAT(LoadAzureTrace(header),
              IsError(StatusCode::kInvalidArgument, absl::StrCat(header, ": no requests")));
  EXPECT_THAT(LoadAzureTrace(dir.File("absent.csv")),
              IsError(StatusCode::kNotFound, dir.File("absent.csv")));
  EXPECT_THAT(LoadAzureTrace(dir.path()), IsError(StatusCode::kInvalidArgument, dir.path()));
}

// The ids are made from counts, so one short row could ask for 2^31 ids (16 GiB) at
// block_tokens 1: refused before allocating.
TEST(AzureTraceTest, RefusesMoreBlockIdsThanTheLimit) {
  kvtier::testing::TempDir dir;
  // A short row asking for 2^31 - 1 tokens (16 GiB of ids at block_tokens 1) is refused by the
  // token limit before any id is made.
  const std::string huge =
      Write(dir, "a.csv", absl::StrCat(kHeader, kRow1, "\n2023-11-16 18:15:47,2147483647,1\n"));
  const uint64_t peak_before = kvtier::testing::PeakRssBytes();
  EXPECT_THAT(LoadAzureTrace(huge, 1),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(huge, ":3: column 2 (ContextTokens) must be an integer")));
  EXPECT_LT(kvtier::testing::PeakRssBytes() - peak_before, uint64_t{64} << 20);
  // The ids of all rows are bounded too: with room for 500, row 3 passes it (374 + 200).
  const std::string path =
      Write(dir, "b.csv", absl::StrCat(kHeader, kRow1, "\n2023-11-16 18:15:47,200,1\n"));
  EXPECT_THAT(LoadAzureTrace(path, 1, 500),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(path,
                                   ":3: column 2 (ContextTokens) 200 needs 200 block ids "
                                   "at block_tokens 1, more than the 126 left of the 500")));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadAzureTrace(path, 1, 574));
  EXPECT_EQ(trace.requests[1].block_ids.size(), 200u);
  EXPECT_THAT(LoadAzureTrace(path, 1, 0), IsError(StatusCode::kInvalidArgument, "max_block_ids"));
}

TEST(AzureTraceTest, RefusesALineOverTheLimit) {
  kvtier::testing::TempDir dir;
  const std::string path = dir.File("long.csv");
  ASSERT_TRUE(kvtier::testing::WriteRepeated(path,
                                             absl::StrCat(kHeader, "2023-11-16 18:15:46.6805900,"),
                                             "1", uint64_t{65} << 20, ",1\n"));
  EXPECT_THAT(LoadAzureTrace(path),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(path, ":2: line exceeds the limit of 64 MiB")));
}

// The released files have no final newline: 19,367 lines with the header (`wc -l` counts
// 19,366 newlines), 19,366 requests.
TEST(AzureTraceTest, LoadsTheReleasedTraces) {
  const auto conv = kvtier::testing::SharedFile("traces/azure2023/AzureLLMInferenceTrace_conv.csv");
  const auto code = kvtier::testing::SharedFile("traces/azure2023/AzureLLMInferenceTrace_code.csv");
  if (conv.empty() || code.empty()) {
    GTEST_SKIP() << "traces/azure2023/AzureLLMInferenceTrace_{conv,code}.csv not found under "
                 << kvtier::testing::SharedDir() << " (set KVTIER_SHARED_DIR)";
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadAzureTrace(conv.string()));
  EXPECT_EQ(trace.name, "azure2023/AzureLLMInferenceTrace_conv.csv");
  EXPECT_EQ(trace.block_tokens, 64);
  ASSERT_EQ(trace.requests.size(), 19366u);
  // First row 2023-11-16 18:15:46.6805900,374,44; last 2023-11-16 19:14:08.4025270,197,183.
  EXPECT_EQ(trace.requests.front().arrival_seconds, 0);
  EXPECT_EQ(trace.requests.front().input_tokens, 374);
  EXPECT_EQ(trace.requests.front().output_tokens, 44);
  EXPECT_EQ(trace.requests.front().block_ids, Ids(0, 6));
  EXPECT_EQ(trace.requests.back().arrival_seconds, 3501.721937);
  EXPECT_EQ(trace.requests.back().input_tokens, 197);
  EXPECT_EQ(trace.requests.back().output_tokens, 183);
  // Every block its own id: 359,180 in all (sum of ceil(ContextTokens / 64)).
  EXPECT_EQ(trace.requests.back().block_ids.back(), 359179u);
  int64_t max_input = 0;
  for (const TraceRequest& r : trace.requests) max_input = std::max(max_input, r.input_tokens);
  EXPECT_EQ(max_input, 14050);

  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace code_trace, LoadAzureTrace(code.string()));
  ASSERT_EQ(code_trace.requests.size(), 8819u);
  EXPECT_EQ(code_trace.requests.back().arrival_seconds, 3435.948056);
}

}  // namespace
}  // namespace kvtier::replay
