// The release model (release_model.h): a hand-computed workload under LRU and the optimum (every
// hit, victim and release written out below), what the policy is told (sessions, stop reasons,
// superseded releases), the loader's round trip and its errors, and the argument checks.
#include "bench/replay/offline/release_model.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/eviction_policy.h"
#include "tests/testing/logging_lru.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::replay {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;
using ::kvtier::testing::LoggingLru;
using ::testing::ElementsAre;

TraceRequest Request(double at, uint64_t session, std::vector<uint64_t> ids, int64_t input_tokens,
                     StopReason stop = StopReason::kToolUse) {
  TraceRequest request;
  request.arrival_seconds = at;
  request.session = session;
  request.stop = stop;
  request.input_tokens = input_tokens;
  request.block_ids = std::move(ids);
  return request;
}

// Blocks of 4 tokens; ids 10 -> 11 -> 13 and 10 -> 12 name prefixes; dense keys by first sight:
// 10 -> 0, 11 -> 1, 12 -> 2, 13 -> 3.
//   R0 session 1 [0, 1]:   10 11      miss (nothing cached or held)
//   R1 session 2 [0.5, 3]: 10 12      hits 10, held by R0
//   R2 session 1 [2, 4]:   10 11 13   hits 10 (held by R1) and 11 (released by R0 at 1)
//   R3 session 2 [5, 6]:   10 12      hits what the finish of R2 left cached
ReleaseModelWorkload HandWorkload() {
  ReleaseModelWorkload w;
  w.trace.name = "hand";
  w.trace.block_tokens = 4;
  w.trace.requests = {Request(0, 1, {10, 11}, 8), Request(0.5, 2, {10, 12}, 8),
                      Request(2, 1, {10, 11, 13}, 12, StopReason::kEndTurn),
                      Request(5, 2, {10, 12}, 8)};
  w.finish_seconds = {1, 3, 4, 6};
  return w;
}

TEST(ReleaseModelTest, HandComputedLru) {
  LoggingLru policy(/*observes=*/true);
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult result,
                              SimulateReleaseModel(HandWorkload(), policy, {.capacity_blocks = 2}));
  EXPECT_EQ(result.name, "logging_lru");
  EXPECT_EQ(result.tokens_per_block, 4);
  EXPECT_EQ(result.prompt_tokens, 36);
  // At 4 the finish of R2 releases 13, 11, 10 beside 12 (released at 3): 4 cached, 2 evicted.
  // LRU takes the leaf released longest ago, 12, then 13 (10 still has 11 below it).
  EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 4, 8, 4));
  EXPECT_EQ(result.hit_blocks, 4);
  EXPECT_DOUBLE_EQ(result.hit_ratio, 16.0 / 36.0);
  EXPECT_THAT(policy.log, ElementsAre("request 1 blocks 2", "request 2 blocks 2",
                                      // R0 ends: 11 is released (10 is still R1's); a leaf.
                                      "release 1 stop 1", "add 1@1",
                                      // R2 pins 11.
                                      "request 1 blocks 3", "remove 1",
                                      // R1 ends: 12 is released (10 is R2's).
                                      "release 2 stop 1", "add 2@3",
                                      // R2 ends: 13 and 11, 10 released; 13 is the new leaf.
                                      "release 1 stop 2", "add 3@4", "victim 2", "remove 2",
                                      "victim 3", "remove 3", "add 1@4",
                                      // R3 pins 10 (12 is gone) and ends: 12 and 10 released, 3
                                      // cached, so 11 (released at 4) goes.
                                      "request 2 blocks 2", "release 2 stop 1", "add 2@6",
                                      "victim 1", "remove 1"));
}

TEST(ReleaseModelTest, OptimumKeepsWhatIsReadNext) {
  // At 4 the optimum evicts the blocks nobody reads again, 13 then 11 (deeper first), and
  // keeps 10 and 12, which R3 reads: R3 hits both.
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult optimal, ReleaseModelOptimum(HandWorkload(), 2));
  EXPECT_EQ(optimal.name, "optimal");
  EXPECT_THAT(optimal.hit_tokens_per_request, ElementsAre(0, 4, 8, 8));
  EXPECT_DOUBLE_EQ(optimal.hit_ratio, 20.0 / 36.0);
  // With room for everything, LRU and the optimum agree; with none, only held blocks hit.
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult roomy, ReleaseModelOptimum(HandWorkload(), 100));
  EXPECT_THAT(roomy.hit_tokens_per_request, ElementsAre(0, 4, 8, 8));
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult none, ReleaseModelOptimum(HandWorkload(), 0));
  EXPECT_THAT(none.hit_tokens_per_request, ElementsAre(0, 4, 4, 0));
}

TEST(ReleaseModelTest, StopReasonsCanBeWithheld) {
  LoggingLru policy(/*observes=*/true);
  KVTIER_ASSERT_OK(
      SimulateReleaseModel(HandWorkload(), policy, {.capacity_blocks = 2, .stop_reasons = false})
          .status());
  int releases = 0;
  for (const std::string& line : policy.log) {
    if (line.rfind("release", 0) != 0) continue;
    ++releases;
    EXPECT_THAT(line, ::testing::EndsWith("stop 0")) << "kUnknown for every release";
  }
  EXPECT_EQ(releases, 4);
}

TEST(ReleaseModelTest, AReleaseAfterTheSessionsNextArrivalIsSuperseded) {
  ReleaseModelWorkload w;
  w.trace.block_tokens = 4;
  w.trace.requests = {Request(0, 7, {1}, 4), Request(1, 7, {1, 2}, 8)};
  w.finish_seconds = {2, 3};  // R0 ends after R1 of its session arrived
  LoggingLru policy(/*observes=*/true);
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult result,
                              SimulateReleaseModel(w, policy, {.capacity_blocks = 4}));
  EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 4));
  EXPECT_THAT(policy.log,
              ElementsAre("request 7 blocks 1", "request 7 blocks 2", "release 7 stop 1 superseded",
                          "release 7 stop 1", "add 1@3"));
}

TEST(ReleaseModelTest, ALastTurnIsPassedOnWithTheStopReasons) {
  ReleaseModelWorkload w = HandWorkload();
  w.trace.requests[2].last_turn = true;  // R2, session 1's end_turn: nothing of session 1 follows
  for (const bool stop_reasons : {true, false}) {
    LoggingLru policy(/*observes=*/true);
    KVTIER_ASSERT_OK(
        SimulateReleaseModel(w, policy, {.capacity_blocks = 2, .stop_reasons = stop_reasons})
            .status());
    std::vector<std::string> releases;
    for (const std::string& line : policy.log) {
      if (line.rfind("release", 0) == 0) releases.push_back(line);
    }
    // Withheld with the stop reasons: the hint-free control hears neither.
    if (stop_reasons) {
      EXPECT_THAT(releases, ElementsAre("release 1 stop 1", "release 2 stop 1",
                                        "release 1 stop 2 last_turn", "release 2 stop 1"));
    } else {
      EXPECT_THAT(releases, ElementsAre("release 1 stop 0", "release 2 stop 0", "release 1 stop 0",
                                        "release 2 stop 0"));
    }
  }
}

TEST(ReleaseModelTest, ShippedPoliciesRunTheModel) {
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult optimal, ReleaseModelOptimum(HandWorkload(), 2));
  for (const char* name : {"lru", "cost_aware", "reuse_index", "learned"}) {
    const std::string n = name;
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy =
        n == "reuse_index" ? MakeReuseIndexPolicy()
        : n == "learned"   ? MakeLearnedPolicy(2)
                           : MakeEvictionPolicy(n);
    KVTIER_ASSERT_OK(policy.status());
    KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult r, SimulateReleaseModel(HandWorkload(), **policy,
                                                                          {.capacity_blocks = 2}));
    EXPECT_EQ(r.hit_tokens_per_request[1], 4) << name << ": a held block always hits";
    EXPECT_EQ(r.hit_tokens_per_request[2], 8) << name << ": nothing was evicted before R2";
    EXPECT_LE(r.hit_tokens, optimal.hit_tokens) << name;
  }
}

// At equal times a finish comes before an arrival: R1 arrives as R0 finishes, so R0's block is
// released (and, with no room, evicted) before R1 looks it up.
TEST(ReleaseModelTest, AFinishComesBeforeAnArrivalAtTheSameTime) {
  ReleaseModelWorkload w;
  w.trace.block_tokens = 4;
  w.trace.requests = {Request(0, 1, {1}, 4), Request(1, 2, {1}, 4)};
  w.finish_seconds = {1, 2};
  LoggingLru none(/*observes=*/true), one(/*observes=*/true);
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult r0,
                              SimulateReleaseModel(w, none, {.capacity_blocks = 0}));
  EXPECT_THAT(r0.hit_tokens_per_request, ElementsAre(0, 0));
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult r1,
                              SimulateReleaseModel(w, one, {.capacity_blocks = 1}));
  EXPECT_THAT(r1.hit_tokens_per_request, ElementsAre(0, 4));
}

// Ids 1 -> 3 -> 4 and 1 -> 2. At 2 the cache holds 1, 3, 4 and 2 and must drop two: the optimum
// drops 4 (read again at 9.5; its sibling branch's leaf 2 is read at 9), then 3 (a leaf now, also
// 9.5), keeping 1 and 2: R2 hits both, R3 only 1, held by R2.
TEST(ReleaseModelTest, OptimumDropsTheBlockReadLast) {
  ReleaseModelWorkload w;
  w.trace.block_tokens = 4;
  w.trace.requests = {Request(0, 1, {1, 3, 4}, 12), Request(0.5, 2, {1, 2}, 8),
                      Request(9, 3, {1, 2}, 8), Request(9.5, 4, {1, 3, 4}, 12)};
  w.finish_seconds = {1, 2, 10, 11};
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult optimal, ReleaseModelOptimum(w, 2));
  EXPECT_THAT(optimal.hit_tokens_per_request, ElementsAre(0, 4, 8, 4));
  // With room for three, only 4 goes (read last): R3 hits 1 and 3.
  KVTIER_ASSERT_OK_AND_ASSIGN(const BoundResult three, ReleaseModelOptimum(w, 3));
  EXPECT_THAT(three.hit_tokens_per_request, ElementsAre(0, 4, 8, 8));
}

TEST(ReleaseModelTest, RejectsBadArguments) {
  LoggingLru policy(/*observes=*/true);
  EXPECT_THAT(SimulateReleaseModel(HandWorkload(), policy, {.capacity_blocks = -1}),
              IsError(StatusCode::kInvalidArgument, "negative"));
  EXPECT_THAT(
      SimulateReleaseModel(HandWorkload(), policy, {.capacity_blocks = 1, .bytes_per_token = 0}),
      IsError(StatusCode::kInvalidArgument, "bytes_per_token"));
  ReleaseModelWorkload early = HandWorkload();
  early.finish_seconds[2] = 1.5;
  EXPECT_THAT(
      SimulateReleaseModel(early, policy, {.capacity_blocks = 1}),
      IsError(StatusCode::kInvalidArgument, "request 2: finish 1.5 s is not after arrival"));
  ReleaseModelWorkload instant = HandWorkload();
  instant.finish_seconds[1] = 0.5;  // finishes as it arrives: it would release before it holds
  EXPECT_THAT(SimulateReleaseModel(instant, policy, {.capacity_blocks = 1}),
              IsError(StatusCode::kInvalidArgument, "request 1: finish 0.5 s is not after"));
  ReleaseModelWorkload unordered = HandWorkload();
  std::swap(unordered.trace.requests[1], unordered.trace.requests[2]);
  std::swap(unordered.finish_seconds[1], unordered.finish_seconds[2]);
  EXPECT_THAT(ReleaseModelOptimum(unordered, 1),
              IsError(StatusCode::kInvalidArgument, "arrival order"));
  ReleaseModelWorkload short_finish = HandWorkload();
  short_finish.finish_seconds.pop_back();
  EXPECT_THAT(ReleaseModelOptimum(short_finish, 1),
              IsError(StatusCode::kInvalidArgument, "finish_seconds has 3 entries for 4"));
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(ReleaseModelTest, LoadsTheExportedFormat) {
  const std::string path = WriteFile(
      "release_ok.jsonl",
      "{\"block_tokens\": 4}\n"
      "{\"arrival\": 0, \"finish\": 1.5, \"session\": 3, \"stop\": \"tool_use\", \"in\": 9, "
      "\"ids\": [5, 6]}\n"
      "\n"
      "{\"arrival\": 2, \"finish\": 2.25, \"session\": 4, \"stop\": \"end_turn\", \"in\": 4, "
      "\"ids\": [5], \"last_turn\": true}\n"
      "{\"arrival\": 3, \"finish\": 4, \"session\": 3, \"stop\": \"unknown\", \"in\": 4, "
      "\"ids\": [5], \"last_turn\": false}\n");
  KVTIER_ASSERT_OK_AND_ASSIGN(const ReleaseModelWorkload w, LoadReleaseModelWorkload(path));
  EXPECT_EQ(w.trace.block_tokens, 4);
  ASSERT_EQ(w.trace.requests.size(), 3u);
  EXPECT_THAT(w.finish_seconds, ElementsAre(1.5, 2.25, 4));
  const TraceRequest& first = w.trace.requests[0];
  EXPECT_EQ(first.session, 3u);
  EXPECT_EQ(first.stop, StopReason::kToolUse);
  EXPECT_EQ(first.input_tokens, 9);
  // 9 tokens: two full blocks and a partial one, which gets an id of its own.
  EXPECT_THAT(first.block_ids, ElementsAre(5, 6, kReleaseTailIdBase + 0));
  EXPECT_FALSE(first.last_turn) << "absent: false";
  EXPECT_EQ(w.trace.requests[1].stop, StopReason::kEndTurn);
  EXPECT_TRUE(w.trace.requests[1].last_turn);
  EXPECT_EQ(w.trace.requests[2].stop, StopReason::kUnknown);
  EXPECT_FALSE(w.trace.requests[2].last_turn);
  EXPECT_THAT(w.trace.requests[1].block_ids, ElementsAre(5));
}

TEST(ReleaseModelTest, RejectsBadFiles) {
  const std::string header = "{\"block_tokens\": 4}\n";
  const std::string ok_line =
      "{\"arrival\": 1, \"finish\": 2, \"session\": 1, \"stop\": \"end_turn\", \"in\": 8, "
      "\"ids\": [1, 2]}\n";
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"", "no requests"},
      {"{\"block_tokens\": 0}\n" + ok_line, "block_tokens"},
      {"[1]\n" + ok_line, "must be a JSON object"},
      {header, "no requests"},
      {header + "{\"arrival\": 1, \"finish\": 0.5, \"session\": 1, \"stop\": \"end_turn\", "
                "\"in\": 8, \"ids\": [1, 2]}\n",
       "finish"},
      {header + "{\"arrival\": 1, \"finish\": 1, \"session\": 1, \"stop\": \"end_turn\", "
                "\"in\": 8, \"ids\": [1, 2]}\n",
       "finish 1 s is not after arrival 1 s"},
      {ok_line, "\"block_tokens\" is missing"},
      {header + "{\"arrival\": 1, \"finish\": 2, \"session\": 0, \"stop\": \"end_turn\", "
                "\"in\": 8, \"ids\": [1, 2]}\n",
       "session"},
      {header + "{\"arrival\": 1, \"finish\": 2, \"session\": 1, \"stop\": \"max_tokens\", "
                "\"in\": 8, \"ids\": [1, 2]}\n",
       "expected tool_use, end_turn or unknown"},
      {header + "{\"arrival\": 1, \"finish\": 2, \"session\": 1, \"stop\": \"end_turn\", "
                "\"in\": 8, \"ids\": [1]}\n",
       "needs floor(8 / 4) = 2"},
      {header + "{\"arrival\": 1, \"finish\": 2, \"session\": 1, \"stop\": \"end_turn\", "
                "\"in\": 4, \"ids\": [4611686018427387904]}\n",
       "not below 2^62"},
      {header + ok_line +
           "{\"arrival\": 0.5, \"finish\": 2, \"session\": 1, "
           "\"stop\": \"end_turn\", \"in\": 4, \"ids\": [1]}\n",
       "arrival order"},
      {header + "{\"arrival\": 1, \"finish\": 2, \"session\": 1, \"stop\": \"end_turn\", "
                "\"in\": 8}\n",
       "\"ids\" is missing"},
      {header + "{\"arrival\": 1, \"finish\": 2, \"session\": 1, \"stop\": \"end_turn\", "
                "\"in\": 8, \"ids\": [1, 2], \"last_turn\": 1}\n",
       "\"last_turn\" must be true or false, got 1"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = WriteFile(absl::StrCat("release_bad_", i, ".jsonl"), cases[i].text);
    EXPECT_THAT(LoadReleaseModelWorkload(path),
                IsError(StatusCode::kInvalidArgument, cases[i].message))
        << "case " << i << ": " << cases[i].text;
  }
  EXPECT_THAT(LoadReleaseModelWorkload(::testing::TempDir() + "/absent.jsonl"),
              IsError(StatusCode::kNotFound, "absent"));
}

}  // namespace
}  // namespace kvtier::replay
