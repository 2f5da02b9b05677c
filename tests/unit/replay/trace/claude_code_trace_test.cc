#include "bench/replay/trace/claude_code_trace.h"

#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/replay/trace/csv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/shared_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/unit/replay/trace/big_files.h"

namespace kvtier::replay {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;
using ::nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kShared = kClaudeSharedToolIdBase;
constexpr uint64_t kTail = kClaudeTailIdBase;

uint64_t Local(uint64_t file, uint64_t id) { return (file << kClaudeLocalIdBits) | id; }

json Request(double t, int64_t in, std::vector<uint64_t> ids, const char* stop = "tool_use") {
  return json{{"t", t},    {"type", "n"},     {"model", "m"}, {"in", in},
              {"out", 10}, {"hash_ids", ids}, {"stop", stop}, {"api_time", 1.5}};
}

json Session(int64_t tool_tokens, json requests) {
  return json{{"id", "trace"},
              {"models", {"m"}},
              {"block_size", 64},
              {"hash_id_scope", "local"},
              {"tool_tokens", tool_tokens},
              {"system_tokens", 100},
              {"requests", std::move(requests)}};
}

std::string Write(const kvtier::testing::TempDir& dir, const std::string& name,
                  const std::string& content) {
  const std::string path = dir.File(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(ClaudeCodeTraceTest, LoadsASessionWithASubagent) {
  json think = Request(10, 256, {1, 2, 3, 4}, "end_turn");
  think["think_time"] = 5.0;
  json sub_second = Request(3, 64, {10}, "");
  sub_second["think_time"] = 1.0;
  // The entry's t is the sub-agent's end: it ran from 9 - 5 = 4 s.
  json subagent{{"t", 9.0},
                {"type", "subagent"},
                {"duration_ms", 5000},
                {"agent_id", "agent_001"},
                {"tool_tokens", 64},
                {"system_tokens", 10},
                {"requests", {Request(0, 100, {10}), sub_second}}};
  // 128 tool tokens: the first 2 blocks of each main request are the shared tool prefix.
  const json doc = Session(128, {Request(0, 200, {1, 2, 3}), think, subagent});
  kvtier::testing::TempDir dir;
  const std::string path = Write(dir, "s.json", doc.dump());

  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadClaudeCodeTraces(path));
  EXPECT_EQ(trace.block_tokens, 64);
  ASSERT_EQ(trace.requests.size(), 4u);
  const TraceRequest& r0 = trace.requests[0];
  const TraceRequest& s0 = trace.requests[1];
  const TraceRequest& s1 = trace.requests[2];
  const TraceRequest& r1 = trace.requests[3];

  EXPECT_EQ(r0.arrival_seconds, 0);
  EXPECT_EQ(r0.session, 1u);
  EXPECT_EQ(r0.input_tokens, 200);
  EXPECT_EQ(r0.output_tokens, 10);
  EXPECT_EQ(r0.stop, StopReason::kToolUse);
  EXPECT_EQ(r0.think_seconds, 0);  // absent
  // 200 tokens: 3 full blocks listed, the partial fourth gets a tail id.
  EXPECT_THAT(r0.block_ids, ElementsAre(kShared | 0, kShared | 1, Local(1, 3), kTail | 0));

  EXPECT_EQ(r1.arrival_seconds, 10);
  EXPECT_EQ(r1.stop, StopReason::kEndTurn);
  EXPECT_EQ(r1.think_seconds, 5);
  EXPECT_THAT(r1.block_ids, ElementsAre(kShared | 0, kShared | 1, Local(1, 3), Local(1, 4)));

  // The sub-agent is session 2, its times offset by its start; its one tool block is the
  // shared tool block 0, its ids otherwise in its file's id space.
  EXPECT_EQ(s0.session, 2u);
  EXPECT_EQ(s0.arrival_seconds, 4);
  EXPECT_THAT(s0.block_ids, ElementsAre(kShared | 0, kTail | 1));
  EXPECT_EQ(s1.session, 2u);
  EXPECT_EQ(s1.arrival_seconds, 7);
  EXPECT_EQ(s1.stop, StopReason::kUnknown);
  EXPECT_EQ(s1.think_seconds, 1);
  EXPECT_THAT(s1.block_ids, ElementsAre(kShared | 0));
  // last_turn is a sub-agent's end_turn only: a main session's end_turn waits for its human.
  EXPECT_FALSE(r0.last_turn);
  EXPECT_FALSE(r1.last_turn);
  EXPECT_FALSE(s0.last_turn);
  EXPECT_FALSE(s1.last_turn);
}

// Found in review: a file without think_time (older kv-cache-tester ones) gave every request a
// pause of 0, so the closed-loop serving simulation ran each session back to back. The pause is
// now the gap from the previous request's end (t + api_time, 1.5 s in Request()).
TEST(ClaudeCodeTraceTest, WithoutThinkTimeThePauseIsTheGapAfterThePreviousRequest) {
  json third = Request(12, 64, {1});
  third.erase("api_time");
  json fourth = Request(13, 64, {1});
  const json doc = Session(0, {Request(0, 64, {1}), Request(10, 64, {1}), third, fourth});
  kvtier::testing::TempDir dir;
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace,
                              LoadClaudeCodeTraces(Write(dir, "s.json", doc.dump())));
  ASSERT_EQ(trace.requests.size(), 4u);
  EXPECT_EQ(trace.requests[0].think_seconds, 0);    // the first
  EXPECT_EQ(trace.requests[1].think_seconds, 8.5);  // 10 - (0 + 1.5)
  EXPECT_EQ(trace.requests[2].think_seconds, 0.5);  // 12 - (10 + 1.5)
  EXPECT_EQ(trace.requests[3].think_seconds, 1);    // 13 - 12: the third gave no api_time
}

// A sub-agent's end_turn ends it (its result goes back to the parent): last_turn.
TEST(ClaudeCodeTraceTest, ASubagentsEndTurnIsItsLastTurn) {
  json subagent{{"t", 9.0},
                {"type", "subagent"},
                {"duration_ms", 5000},
                {"tool_tokens", 64},
                {"requests", {Request(0, 100, {10}), Request(3, 100, {10, 11}, "end_turn")}}};
  const json doc = Session(
      128, {Request(0, 200, {1, 2, 3}), subagent, Request(10, 256, {1, 2, 3, 4}, "end_turn")});
  kvtier::testing::TempDir dir;
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace,
                              LoadClaudeCodeTraces(Write(dir, "s.json", doc.dump())));
  ASSERT_EQ(trace.requests.size(), 4u);
  std::vector<std::pair<uint64_t, bool>> got;
  for (const TraceRequest& r : trace.requests) got.emplace_back(r.session, r.last_turn);
  EXPECT_THAT(got, ElementsAre(std::pair<uint64_t, bool>{1, false},
                               std::pair<uint64_t, bool>{2, false},
                               std::pair<uint64_t, bool>{2, true},
                               std::pair<uint64_t, bool>{1, false}));
}

TEST(ClaudeCodeTraceTest, ADirectoryRunsItsSessionsConcurrently) {
  kvtier::testing::TempDir dir;
  // Written out of order: files load in name order, so a.json is session 1.
  Write(dir, "b.json", Session(128, {Request(1, 192, {1, 2, 7})}).dump());
  Write(dir, "a.json", Session(128, {Request(0, 192, {1, 2, 7}), Request(2, 64, {1})}).dump());
  Write(dir, "INDEX.csv", "not,a,session\n");
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadClaudeCodeTraces(dir.path()));
  ASSERT_EQ(trace.requests.size(), 3u);
  EXPECT_EQ(trace.requests[0].session, 1u);
  EXPECT_EQ(trace.requests[1].session, 2u);
  EXPECT_EQ(trace.requests[2].session, 1u);
  // Equal local ids: the tool blocks are shared, the session's own block is not.
  EXPECT_THAT(trace.requests[0].block_ids, ElementsAre(kShared | 0, kShared | 1, Local(1, 7)));
  EXPECT_THAT(trace.requests[1].block_ids, ElementsAre(kShared | 0, kShared | 1, Local(2, 7)));
}

TEST(ClaudeCodeTraceTest, ToolPrefixSharingModes) {
  kvtier::testing::TempDir dir;
  Write(dir, "a.json", Session(128, {Request(0, 128, {1, 2})}).dump());
  Write(dir, "b.json", Session(128, {Request(0, 128, {1, 2})}).dump());
  Write(dir, "c.json", Session(192, {Request(0, 128, {1, 2})}).dump());
  auto ids = [&](ToolPrefixSharing mode) {
    std::map<uint64_t, std::vector<uint64_t>> by_session;
    absl::StatusOr<Trace> trace = LoadClaudeCodeTraces(dir.path(), {.tool_prefix = mode});
    EXPECT_TRUE(trace.ok()) << trace.status();
    if (trace.ok()) {
      for (const TraceRequest& r : trace->requests) by_session[r.session] = r.block_ids;
    }
    return by_session;
  };
  auto all = ids(ToolPrefixSharing::kAllSessions);
  EXPECT_EQ(all[1], all[2]);
  EXPECT_EQ(all[1], all[3]);
  auto same = ids(ToolPrefixSharing::kSameToolTokens);
  EXPECT_EQ(same[1], same[2]);
  EXPECT_NE(same[1][0], same[3][0]);
  EXPECT_GE(same[3][0], kShared);
  auto none = ids(ToolPrefixSharing::kNone);
  EXPECT_THAT(none[1], ElementsAre(Local(1, 1), Local(1, 2)));
  EXPECT_THAT(none[2], ElementsAre(Local(2, 1), Local(2, 2)));
}

TEST(ClaudeCodeTraceTest, AChangedToolListIsNotShared) {
  // The most common path through the tool blocks is [1, 2]; a request whose block 1 differs (a
  // tool added mid-session) shares block 0 only, and one with another first block none.
  kvtier::testing::TempDir dir;
  const std::string path = Write(dir, "s.json",
                                 Session(128, {Request(0, 128, {5, 6}), Request(1, 128, {1, 2}),
                                               Request(2, 192, {1, 2, 3}), Request(3, 128, {1, 9})})
                                     .dump());
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadClaudeCodeTraces(path));
  ASSERT_EQ(trace.requests.size(), 4u);
  EXPECT_THAT(trace.requests[0].block_ids, ElementsAre(Local(1, 5), Local(1, 6)));
  EXPECT_THAT(trace.requests[1].block_ids, ElementsAre(kShared | 0, kShared | 1));
  EXPECT_THAT(trace.requests[2].block_ids, ElementsAre(kShared | 0, kShared | 1, Local(1, 3)));
  EXPECT_THAT(trace.requests[3].block_ids, ElementsAre(kShared | 0, Local(1, 9)));
}

TEST(ClaudeCodeTraceTest, SortsRequestsOutOfTimeOrder) {
  kvtier::testing::TempDir dir;
  const std::string path =
      Write(dir, "s.json", Session(0, {Request(10, 64, {1}), Request(5, 128, {1, 2})}).dump());
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadClaudeCodeTraces(path));
  ASSERT_EQ(trace.requests.size(), 2u);
  EXPECT_EQ(trace.requests[0].arrival_seconds, 5);
  EXPECT_EQ(trace.requests[1].arrival_seconds, 10);
}

// Found in review: the reader refused files upstream tools accept. Writers of this format put
// null in optional fields they have no value for (a sub-agent's "duration_ms"), and a file
// without "block_size", "tool_tokens" or "hash_id_scope" failed the whole trace. They now read
// as absent: block_size 64, no tool prefix, local ids, no stop reason, the think-time fallback.
TEST(ClaudeCodeTraceTest, OptionalFieldsMayBeAbsentOrNull) {
  json first = Request(0, 130, {1, 2});
  first["stop"] = nullptr;
  first["api_time"] = nullptr;
  json second = Request(10, 130, {1, 2});
  second["think_time"] = nullptr;
  json doc{{"requests", {first, second}}, {"tool_tokens", nullptr}, {"hash_id_scope", nullptr}};
  kvtier::testing::TempDir dir;
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace,
                              LoadClaudeCodeTraces(Write(dir, "s.json", doc.dump())));
  EXPECT_EQ(trace.block_tokens, kClaudeDefaultBlockTokens);
  ASSERT_EQ(trace.requests.size(), 2u);
  EXPECT_EQ(trace.requests[0].stop, StopReason::kUnknown);
  // No tool prefix: the ids stay the file's; 130 tokens at 64 have a partial third block.
  EXPECT_THAT(trace.requests[0].block_ids, ElementsAre(Local(1, 1), Local(1, 2), kTail | 0));
  EXPECT_EQ(trace.requests[1].think_seconds, 10);  // 10 - (0 + no api_time)
}

// A sub-agent without "duration_ms" (null upstream when unknown) started its own requests' span
// before its entry's t: the latest t + api_time of them, here 3 + 1.5 s.
TEST(ClaudeCodeTraceTest, ASubagentWithoutDurationStartsItsOwnSpanBeforeItsEnd) {
  json subagent{{"t", 20.0},
                {"type", "subagent"},
                {"duration_ms", nullptr},
                {"requests", {Request(0, 64, {10}), Request(3, 64, {10})}}};
  json absent = subagent;
  absent.erase("duration_ms");
  absent["t"] = 30.0;
  const json doc = Session(0, {Request(0, 64, {1}), subagent, absent});
  kvtier::testing::TempDir dir;
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace,
                              LoadClaudeCodeTraces(Write(dir, "s.json", doc.dump())));
  std::vector<double> sub_arrivals;
  for (const TraceRequest& r : trace.requests) {
    if (r.session != 1) sub_arrivals.push_back(r.arrival_seconds);
  }
  EXPECT_THAT(sub_arrivals, ElementsAre(15.5, 18.5, 25.5, 28.5));
}

// "hash_id_scope": "global" says one id names one block in every such file: two global files
// share their blocks, a local file with the same ids does not.
TEST(ClaudeCodeTraceTest, GlobalScopeFilesShareTheirIds) {
  json global = Session(0, {Request(0, 128, {7, 8})});
  global["hash_id_scope"] = "global";
  kvtier::testing::TempDir dir;
  Write(dir, "a.json", global.dump());
  Write(dir, "b.json", global.dump());
  Write(dir, "c.json", Session(0, {Request(0, 128, {7, 8})}).dump());
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadClaudeCodeTraces(dir.path()));
  std::map<uint64_t, std::vector<uint64_t>> by_session;
  for (const TraceRequest& r : trace.requests) by_session[r.session] = r.block_ids;
  EXPECT_THAT(by_session[1], ElementsAre(Local(0, 7), Local(0, 8)));
  EXPECT_EQ(by_session[2], by_session[1]);
  EXPECT_THAT(by_session[3], ElementsAre(Local(3, 7), Local(3, 8)));
}

struct BadCase {
  const char* name;
  std::string document;
  const char* where;  // the index path ("" for the file's own fields)
  const char* field;
  const char* detail;
};

json Edited(const std::function<void(json&)>& edit) {
  json subagent{{"t", 4.0},
                {"type", "subagent"},
                {"duration_ms", 1000},
                {"tool_tokens", 0},
                {"requests", {Request(0, 64, {10})}}};
  json doc = Session(128, {Request(0, 128, {1, 2}), Request(1, 200, {1, 2, 3}), subagent});
  edit(doc);
  return doc;
}

std::string EditedText(const std::function<void(json&)>& edit) { return Edited(edit).dump(); }

class ClaudeCodeMalformedTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ClaudeCodeMalformedTest, NamesFileRequestAndField) {
  const BadCase& c = GetParam();
  kvtier::testing::TempDir dir;
  const std::string path = Write(dir, "bad.json", c.document);
  const absl::StatusOr<Trace> trace = LoadClaudeCodeTraces(path);
  ASSERT_FALSE(trace.ok());
  EXPECT_EQ(trace.status().code(), StatusCode::kInvalidArgument) << trace.status();
  EXPECT_THAT(
      std::string(trace.status().message()),
      AllOf(HasSubstr(absl::StrCat(path, ": ", c.where)), HasSubstr(c.field), HasSubstr(c.detail)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ClaudeCodeMalformedTest,
    ::testing::Values(
        BadCase{"BadJson", EditedText([](json&) {}).substr(0, 100), "", "not valid JSON",
                "line 1, column"},
        BadCase{"NotAnObject", "[1]", "", "JSON object", "array"},
        BadCase{"ZeroBlockSize", EditedText([](json& d) { d["block_size"] = 0; }), "",
                "\"block_size\"", ">= 1"},
        BadCase{"StringToolTokens", EditedText([](json& d) { d["tool_tokens"] = "x"; }), "",
                "\"tool_tokens\"", "integer"},
        BadCase{"MissingRequests", EditedText([](json& d) { d.erase("requests"); }), "",
                "\"requests\"", "missing"},
        BadCase{"RequestsNotArray", EditedText([](json& d) { d["requests"] = 3; }), "",
                "\"requests\"", "array"},
        BadCase{"UnknownScope", EditedText([](json& d) { d["hash_id_scope"] = "session"; }), "",
                "\"hash_id_scope\"", "\"local\" (ids local to the file) or \"global\""},
        BadCase{"RequestNotObject", EditedText([](json& d) { d["requests"][1] = 7; }),
                "requests[1]", "JSON object", "number"},
        BadCase{"MissingType", EditedText([](json& d) { d["requests"][1].erase("type"); }),
                "requests[1]", "\"type\"", "missing"},
        BadCase{"MissingT", EditedText([](json& d) { d["requests"][1].erase("t"); }), "requests[1]",
                "\"t\"", "missing"},
        BadCase{"MissingIn", EditedText([](json& d) { d["requests"][1].erase("in"); }),
                "requests[1]", "\"in\"", "missing"},
        BadCase{"MissingOut", EditedText([](json& d) { d["requests"][1].erase("out"); }),
                "requests[1]", "\"out\"", "missing"},
        BadCase{"MissingHashIds", EditedText([](json& d) { d["requests"][1].erase("hash_ids"); }),
                "requests[1]", "\"hash_ids\"", "missing"},
        BadCase{"NegativeIn", EditedText([](json& d) { d["requests"][1]["in"] = -200; }),
                "requests[1]", "\"in\"", "-200"},
        BadCase{"StringIn", EditedText([](json& d) { d["requests"][1]["in"] = "200"; }),
                "requests[1]", "\"in\"", "integer"},
        BadCase{"NegativeOut", EditedText([](json& d) { d["requests"][1]["out"] = -1; }),
                "requests[1]", "\"out\"", "-1"},
        // Token counts past kMaxTraceTokens (2^24) are refused before ceil(in / 64) is
        // computed, so it cannot overflow.
        BadCase{"In2Pow24Plus1",
                EditedText([](json& d) { d["requests"][1]["in"] = (int64_t{1} << 24) + 1; }),
                "requests[1]", "\"in\"", "<= 16777216, got 16777217"},
        BadCase{"In2Pow31", EditedText([](json& d) { d["requests"][1]["in"] = int64_t{1} << 31; }),
                "requests[1]", "\"in\"", "<= 16777216"},
        BadCase{"InMaxWithoutItsIds",
                EditedText([](json& d) { d["requests"][1]["in"] = int64_t{1} << 24; }),
                "requests[1]", "\"hash_ids\"", "floor(16777216 / 64) = 262144"},
        BadCase{"InInt64Max", EditedText([](json& d) {
                  d["requests"][1]["in"] = std::numeric_limits<int64_t>::max();
                }),
                "requests[1]", "\"in\"", "<= 16777216"},
        BadCase{"InHugeFloat", EditedText([](json& d) { d["requests"][1]["in"] = 1e300; }),
                "requests[1]", "\"in\"", "1e+300"},
        BadCase{"InFraction", EditedText([](json& d) { d["requests"][1]["in"] = 1.5; }),
                "requests[1]", "\"in\"", "1.5"},
        BadCase{"Out2Pow31",
                EditedText([](json& d) { d["requests"][1]["out"] = int64_t{1} << 31; }),
                "requests[1]", "\"out\"", "<= 16777216"},
        BadCase{"NegativeT", EditedText([](json& d) { d["requests"][1]["t"] = -1; }), "requests[1]",
                "\"t\"", "-1"},
        // Times past kMaxTraceSeconds (10^9 s) would overflow the replay's nanosecond clock.
        BadCase{"TPastTheClock", EditedText([](json& d) { d["requests"][1]["t"] = 1e300; }),
                "requests[1]", "\"t\"", "<= 1e+09"},
        BadCase{"ThinkTimePastTheClock",
                EditedText([](json& d) { d["requests"][1]["think_time"] = 2e9; }), "requests[1]",
                "\"think_time\"", "<= 1e+09"},
        BadCase{"NegativeThinkTime",
                EditedText([](json& d) { d["requests"][1]["think_time"] = -2.5; }), "requests[1]",
                "\"think_time\"", "-2.5"},
        BadCase{"StopNotString", EditedText([](json& d) { d["requests"][1]["stop"] = 1; }),
                "requests[1]", "\"stop\"", "string"},
        BadCase{"TooFewIds", EditedText([](json& d) {
                  d["requests"][1]["hash_ids"] = {1, 2};
                }),
                "requests[1]", "\"hash_ids\"", "floor(200 / 64) = 3"},
        BadCase{"TooManyIds", EditedText([](json& d) {
                  d["requests"][1]["hash_ids"] = {1, 2, 3, 4, 5};
                }),
                "requests[1]", "\"hash_ids\"", "has 5 ids"},
        BadCase{"NegativeId", EditedText([](json& d) { d["requests"][1]["hash_ids"][2] = -3; }),
                "requests[1]", "\"hash_ids\"", "element 2"},
        BadCase{"IdTooLarge",
                EditedText([](json& d) { d["requests"][1]["hash_ids"][2] = uint64_t{1} << 40; }),
                "requests[1]", "\"hash_ids\"", "2^40"},
        BadCase{"SubagentMissingT", EditedText([](json& d) { d["requests"][2].erase("t"); }),
                "requests[2]", "\"t\"", "missing"},
        BadCase{"SubagentStringDuration",
                EditedText([](json& d) { d["requests"][2]["duration_ms"] = "1s"; }), "requests[2]",
                "\"duration_ms\"", "number"},
        BadCase{"SubagentNegativeDuration",
                EditedText([](json& d) { d["requests"][2]["duration_ms"] = -5; }), "requests[2]",
                "\"duration_ms\"", "-5"},
        BadCase{"SubagentMissingRequests",
                EditedText([](json& d) { d["requests"][2].erase("requests"); }), "requests[2]",
                "\"requests\"", "missing"},
        BadCase{"SubagentRequestBad",
                EditedText([](json& d) { d["requests"][2]["requests"][0]["in"] = -64; }),
                "requests[2].requests[0]", "\"in\"", "-64"}),
    [](const ::testing::TestParamInfo<BadCase>& param) { return param.param.name; });

TEST(ClaudeCodeTraceTest, FilesMustAgreeOnTheBlockSize) {
  kvtier::testing::TempDir dir;
  Write(dir, "a.json", Session(0, {Request(0, 64, {1})}).dump());
  json other = Session(0, {Request(0, 64, {1, 2})});
  other["block_size"] = 32;
  const std::string b = Write(dir, "b.json", other.dump());
  EXPECT_THAT(LoadClaudeCodeTraces(dir.path()),
              IsError(StatusCode::kInvalidArgument, absl::StrCat(b, ": field \"block_size\"")));
}

TEST(ClaudeCodeTraceTest, MissingInputsAreNotFound) {
  kvtier::testing::TempDir dir;
  EXPECT_THAT(LoadClaudeCodeTraces(dir.File("absent")),
              IsError(StatusCode::kNotFound, dir.File("absent")));
  EXPECT_THAT(LoadClaudeCodeTraces(dir.path()), IsError(StatusCode::kNotFound, "no *.json"));
  Write(dir, "INDEX.csv", "x\n");
  EXPECT_THAT(LoadClaudeCodeTraces(dir.path()), IsError(StatusCode::kNotFound, "no *.json"));
}

// A session file is parsed whole, so one past kMaxTraceFileBytes (256 MiB) is refused before
// any of it is read: a 2 GiB sparse file costs neither disk nor memory.
TEST(ClaudeCodeTraceTest, RefusesAFileOverTheSizeLimitBeforeReadingIt) {
  kvtier::testing::TempDir dir;
  const std::string path = dir.File("huge.json");
  ASSERT_TRUE(
      kvtier::testing::WriteSparse(path, R"({"block_size": 64, "requests": [)", uint64_t{2} << 30));
  const uint64_t peak_before = kvtier::testing::PeakRssBytes();
  EXPECT_THAT(LoadClaudeCodeTraces(path),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(path, ": 2147483648 bytes, over the limit of 256 MiB")));
  EXPECT_LT(kvtier::testing::PeakRssBytes() - peak_before, uint64_t{64} << 20);
}

// A session whose sub-agents nest `depth` deep, each level with one request of its own. Written
// as text: nlohmann would serialize (and a gtest failure print) a deep document recursively.
std::string NestedSubagents(int depth) {
  const std::string request = R"({"type": "n", "t": 0, "in": 64, "out": 1, "hash_ids": [1]})";
  std::string text = absl::StrCat(R"({"block_size": 64, "tool_tokens": 0, "requests": [)", request);
  for (int i = 0; i < depth; ++i) {
    absl::StrAppend(&text, R"(, {"type": "subagent", "t": 0, "duration_ms": 0, )",
                    R"("tool_tokens": 0, "requests": [)", request);
  }
  for (int i = 0; i < depth; ++i) text += "]}";
  return text + "]}";
}

// Sub-agents are parsed level by level; a hostile file nesting them 20,000 deep (10,000 was enough)
// overflowed the stack (SIGSEGV) before the depth was limited to kMaxClaudeSubagentDepth.
TEST(ClaudeCodeTraceTest, DeeplyNestedSubagentsAreAnErrorNotACrash) {
  kvtier::testing::TempDir dir;
  const std::string deepest = Write(dir, "deepest.json", NestedSubagents(kMaxClaudeSubagentDepth));
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadClaudeCodeTraces(deepest));
  EXPECT_EQ(trace.requests.size(), static_cast<size_t>(kMaxClaudeSubagentDepth) + 1);

  const std::string deeper =
      Write(dir, "deeper.json", NestedSubagents(kMaxClaudeSubagentDepth + 1));
  std::string where = "requests[1]";
  for (int i = 1; i < kMaxClaudeSubagentDepth + 1; ++i) where += ".requests[1]";
  EXPECT_THAT(LoadClaudeCodeTraces(deeper),
              IsError(StatusCode::kInvalidArgument,
                      absl::StrCat(deeper, ": ", where, ": a sub-agent nested deeper than ",
                                   kMaxClaudeSubagentDepth)));

  const std::string hostile = Write(dir, "hostile.json", NestedSubagents(20000));
  EXPECT_THAT(LoadClaudeCodeTraces(hostile),
              IsError(StatusCode::kInvalidArgument, "a sub-agent nested deeper than"));
}

TEST(ClaudeCodeTraceTest, NoRequestsIsAnError) {
  kvtier::testing::TempDir dir;
  const std::string path = Write(dir, "s.json", Session(0, json::array()).dump());
  EXPECT_THAT(LoadClaudeCodeTraces(path), IsError(StatusCode::kInvalidArgument, "no requests"));
}

TEST(ClaudeCodeTraceTest, LoadsTheReleasedSessions) {
  const auto dir = kvtier::testing::SharedFile("traces/kv-cache-tester-claude-code");
  const auto index = kvtier::testing::SharedFile("traces/kv-cache-tester-claude-code/INDEX.csv");
  if (dir.empty() || index.empty()) {
    GTEST_SKIP() << "traces/kv-cache-tester-claude-code/INDEX.csv not found under "
                 << kvtier::testing::SharedDir() << " (set KVTIER_SHARED_DIR)";
  }
  // INDEX.csv: trace_id,main_requests,subagents,subagent_requests,...
  std::ifstream csv(index);
  std::string line;
  std::getline(csv, line);
  const std::vector<std::string> header = SplitCsvLine(line);
  ASSERT_GE(header.size(), 4u);
  ASSERT_EQ(header[1], "main_requests");
  ASSERT_EQ(header[3], "subagent_requests");
  std::vector<int64_t> main_requests;
  int64_t subagents = 0;
  int64_t subagent_requests = 0;
  while (std::getline(csv, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> row = SplitCsvLine(line);
    main_requests.push_back(std::stoll(row[1]));
    subagents += std::stoll(row[2]);
    subagent_requests += std::stoll(row[3]);
  }

  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadClaudeCodeTraces(dir.string()));
  EXPECT_EQ(trace.block_tokens, 64);
  const uint64_t files = main_requests.size();
  std::map<uint64_t, int64_t> per_session;
  double previous = 0;
  for (const TraceRequest& r : trace.requests) {
    ++per_session[r.session];
    EXPECT_GE(r.arrival_seconds, previous);
    previous = r.arrival_seconds;
    ASSERT_EQ(static_cast<int64_t>(r.block_ids.size()), (r.input_tokens + 63) / 64);
  }
  int64_t total_main = 0;
  for (uint64_t k = 1; k <= files; ++k) {
    EXPECT_EQ(per_session[k], main_requests[k - 1]) << "session " << k;
    total_main += main_requests[k - 1];
  }
  int64_t loaded_subagent_requests = 0;
  for (const auto& [session, count] : per_session) {
    if (session > files) loaded_subagent_requests += count;
  }
  EXPECT_EQ(static_cast<int64_t>(per_session.size()), static_cast<int64_t>(files) + subagents);
  EXPECT_EQ(loaded_subagent_requests, subagent_requests);
  EXPECT_EQ(static_cast<int64_t>(trace.requests.size()), total_main + subagent_requests);
}

TEST(ClaudeCodeTraceTest, SubagentsLaunchedTogetherStartTogether) {
  // trace_0254's first three sub-agents were launched by one parent request (t = 30 s): read
  // from their end times and durations they all start at 53.02 s, before the parent's next
  // request (t = 164 s).
  const auto path =
      kvtier::testing::SharedFile("traces/kv-cache-tester-claude-code/trace_0254.json");
  if (path.empty()) {
    GTEST_SKIP() << "traces/kv-cache-tester-claude-code/trace_0254.json not found under "
                 << kvtier::testing::SharedDir() << " (set KVTIER_SHARED_DIR)";
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(const Trace trace, LoadClaudeCodeTraces(path.string()));
  std::map<uint64_t, double> first_arrival;
  for (const TraceRequest& r : trace.requests) first_arrival.emplace(r.session, r.arrival_seconds);
  ASSERT_EQ(first_arrival.size(), 6u);  // the main session and 5 sub-agents
  for (uint64_t session : {2, 3, 4}) EXPECT_NEAR(first_arrival[session], 53.02, 1e-6) << session;
}

}  // namespace
}  // namespace kvtier::replay
