#include "bench/replay/trace/agentic_workload.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::replay {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

bool SameRequest(const TraceRequest& a, const TraceRequest& b) {
  return a.arrival_seconds == b.arrival_seconds && a.input_tokens == b.input_tokens &&
         a.output_tokens == b.output_tokens && a.block_ids == b.block_ids &&
         a.session == b.session && a.stop == b.stop && a.think_seconds == b.think_seconds;
}

// Each session's requests, in order.
std::map<uint64_t, std::vector<const TraceRequest*>> BySession(const Trace& trace) {
  std::map<uint64_t, std::vector<const TraceRequest*>> sessions;
  for (const TraceRequest& r : trace.requests) sessions[r.session].push_back(&r);
  return sessions;
}

double Quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * static_cast<double>(values.size() - 1))];
}

TEST(AgenticWorkloadTest, ASeedGivesOneTrace) {
  const Trace a = GenerateAgenticWorkload({});
  const Trace b = GenerateAgenticWorkload({});
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    ASSERT_TRUE(SameRequest(a.requests[i], b.requests[i])) << i;
  }
  const Trace c = GenerateAgenticWorkload({.seed = 2});
  bool differs = a.requests.size() != c.requests.size();
  for (size_t i = 0; !differs && i < a.requests.size(); ++i) {
    differs = !SameRequest(a.requests[i], c.requests[i]);
  }
  EXPECT_TRUE(differs);
}

TEST(AgenticWorkloadTest, DefaultsAreASmallAgentWorkload) {
  const Trace trace = GenerateAgenticWorkload({});
  EXPECT_EQ(trace.block_tokens, 64);
  // Pinned: a change here changes every result recorded with the default workload.
  EXPECT_EQ(trace.requests.size(), 1360u);
  const auto sessions = BySession(trace);
  EXPECT_EQ(sessions.size(), 64u);
  int64_t max_input = 0;
  int end_turns = 0;
  double previous = 0;
  for (const TraceRequest& r : trace.requests) {
    EXPECT_GE(r.arrival_seconds, previous);
    previous = r.arrival_seconds;
    EXPECT_GE(r.input_tokens, 12000);
    EXPECT_EQ(static_cast<int64_t>(r.block_ids.size()), (r.input_tokens + 63) / 64);
    max_input = std::max(max_input, r.input_tokens);
    end_turns += r.stop == StopReason::kEndTurn ? 1 : 0;
    EXPECT_NE(r.stop, StopReason::kUnknown);
  }
  EXPECT_LE(max_input, 60000);
  EXPECT_GT(max_input, 40000);
  // Mostly tool calls: about 1 in 8 requests, plus each session's last, ends the turn.
  EXPECT_GT(end_turns, static_cast<int>(trace.requests.size()) / 12);
  EXPECT_LT(end_turns, static_cast<int>(trace.requests.size()) / 5);
  for (const auto& [session, requests] : sessions) {
    EXPECT_EQ(requests.back()->stop, StopReason::kEndTurn) << session;
    EXPECT_EQ(requests.front()->think_seconds, 0) << session;
  }
}

TEST(AgenticWorkloadTest, ContextsGrowAndShareTheirPreviousFullBlocks) {
  const Trace trace = GenerateAgenticWorkload({});
  const int64_t system_blocks = 12000 / 64;
  int compactions = 0;
  int grown = 0;
  for (const auto& [session, requests] : BySession(trace)) {
    for (size_t i = 1; i < requests.size(); ++i) {
      const TraceRequest& prev = *requests[i - 1];
      const TraceRequest& next = *requests[i];
      EXPECT_GT(next.arrival_seconds, prev.arrival_seconds);
      if (next.input_tokens > prev.input_tokens + prev.output_tokens) {
        // Grown: every full block of the previous prompt is shared, the partial one is not.
        ++grown;
        const size_t full = static_cast<size_t>(prev.input_tokens / 64);
        ASSERT_TRUE(std::equal(prev.block_ids.begin(), prev.block_ids.begin() + full,
                               next.block_ids.begin()))
            << "session " << session << " request " << i;
        if (full < prev.block_ids.size()) {
          EXPECT_NE(prev.block_ids[full], next.block_ids[full]);
        }
      } else {
        // Compacted: only the system prefix is left in common.
        ++compactions;
        EXPECT_TRUE(std::equal(prev.block_ids.begin(), prev.block_ids.begin() + system_blocks,
                               next.block_ids.begin()));
        EXPECT_NE(prev.block_ids[system_blocks], next.block_ids[system_blocks]);
      }
    }
  }
  EXPECT_GT(grown, 1000);
  EXPECT_GT(compactions, 0);
}

TEST(AgenticWorkloadTest, SessionsShareOnlyTheSystemPrefix) {
  const Trace trace = GenerateAgenticWorkload({});
  const size_t system_blocks = 12000 / 64;
  std::map<uint64_t, uint64_t> owner;  // block id -> the session that first used it
  for (const TraceRequest& r : trace.requests) {
    for (size_t k = 0; k < r.block_ids.size(); ++k) {
      if (k < system_blocks) {
        ASSERT_EQ(r.block_ids[k], k);
        continue;
      }
      const auto [it, inserted] = owner.emplace(r.block_ids[k], r.session);
      ASSERT_EQ(it->second, r.session) << "block " << r.block_ids[k] << " shared across sessions";
    }
  }
}

TEST(AgenticWorkloadTest, PausesFollowThePublishedDistributions) {
  // Many small sessions: short contexts keep the sample cheap without changing the pauses.
  const Trace trace = GenerateAgenticWorkload({.sessions = 4000,
                                               .system_prefix_tokens = 64,
                                               .max_context_tokens = 1024,
                                               .compacted_context_tokens = 128});
  std::vector<double> tool;
  std::vector<double> human;
  for (const auto& [session, requests] : BySession(trace)) {
    for (size_t i = 1; i < requests.size(); ++i) {
      (requests[i - 1]->stop == StopReason::kToolUse ? tool : human)
          .push_back(requests[i]->think_seconds);
    }
  }
  ASSERT_GT(tool.size(), 20000u);
  ASSERT_GT(human.size(), 2000u);
  EXPECT_NEAR(Quantile(tool, 0.5), 9, 0.9);
  EXPECT_NEAR(Quantile(tool, 0.9), 71, 71 * 0.15);
  EXPECT_NEAR(Quantile(human, 0.5), 210, 21);
  EXPECT_NEAR(Quantile(human, 0.9), 1800, 1800 * 0.2);
}

TEST(AgenticWorkloadTest, RejectsBadOptions) {
  EXPECT_TRUE(ValidateAgenticOptions({}).ok());
  EXPECT_THAT(ValidateAgenticOptions({.sessions = -1}),
              IsError(StatusCode::kInvalidArgument, "sessions"));
  EXPECT_THAT(ValidateAgenticOptions({.max_context_tokens = 16000}),
              IsError(StatusCode::kInvalidArgument, "max_context_tokens"));
  EXPECT_THAT(ValidateAgenticOptions({.tool_pause_p90_seconds = 5}),
              IsError(StatusCode::kInvalidArgument, "tool_pause_p90_seconds"));
  EXPECT_THAT(ValidateAgenticOptions({.end_turn_probability = 1.5}),
              IsError(StatusCode::kInvalidArgument, "end_turn_probability"));
  EXPECT_THAT(ValidateAgenticOptions({.decode_tokens_per_second = 0}),
              IsError(StatusCode::kInvalidArgument, "decode_tokens_per_second"));
  EXPECT_TRUE(GenerateAgenticWorkload({.sessions = -1}).requests.empty());
  EXPECT_TRUE(GenerateAgenticWorkload({.sessions = 0}).requests.empty());
}

}  // namespace
}  // namespace kvtier::replay
