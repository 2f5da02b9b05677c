#include "bench/replay/trace/rate_scale.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::replay {
namespace {

// Two sessions: session 1 opens at 10 s and comes back 3 s and 1 s after its previous requests
// finished; session 2 opens at 12 s; a request without a session arrives at 26 s.
Trace TwoSessions() {
  Trace t;
  t.name = "two_sessions";
  t.block_tokens = 4;
  t.requests = {
      {.arrival_seconds = 10,
       .input_tokens = 8,
       .output_tokens = 2,
       .block_ids = {1, 2},
       .session = 1,
       .stop = StopReason::kToolUse},
      {.arrival_seconds = 12,
       .input_tokens = 4,
       .output_tokens = 1,
       .block_ids = {7},
       .session = 2},
      {.arrival_seconds = 16,
       .input_tokens = 12,
       .output_tokens = 3,
       .block_ids = {1, 2, 3},
       .session = 1,
       .stop = StopReason::kEndTurn,
       .think_seconds = 3},
      {.arrival_seconds = 20,
       .input_tokens = 16,
       .output_tokens = 4,
       .block_ids = {1, 2, 3, 4},
       .session = 1,
       .think_seconds = 1},
      {.arrival_seconds = 26, .input_tokens = 4, .output_tokens = 5, .block_ids = {9}},
  };
  return t;
}

std::vector<double> Arrivals(const Trace& t) {
  std::vector<double> v;
  for (const TraceRequest& r : t.requests) v.push_back(r.arrival_seconds);
  return v;
}

std::vector<double> Thinks(const Trace& t) {
  std::vector<double> v;
  for (const TraceRequest& r : t.requests) v.push_back(r.think_seconds);
  return v;
}

TEST(ScaleRateTest, DoublingTheLoadHalvesOffsetsFromTheFirstArrival) {
  auto s = ScaleRate(TwoSessions(), 2);
  ASSERT_TRUE(s.ok()) << s.status();
  // 10 + (12 - 10) / 2 = 11, 10 + 6 / 2 = 13, 10 + 10 / 2 = 15, 10 + 16 / 2 = 18.
  EXPECT_EQ(Arrivals(*s), (std::vector<double>{10, 11, 13, 15, 18}));
  EXPECT_EQ(Thinks(*s), (std::vector<double>{0, 0, 1.5, 0.5, 0}));
}

TEST(ScaleRateTest, HalvingTheLoadDoublesThem) {
  auto s = ScaleRate(TwoSessions(), 0.5);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Arrivals(*s), (std::vector<double>{10, 14, 22, 30, 42}));
  EXPECT_EQ(Thinks(*s), (std::vector<double>{0, 0, 6, 2, 0}));
}

TEST(ScaleRateTest, ANonPowerOfTwoScale) {
  auto s = ScaleRate(TwoSessions(), 3);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<double> want = {10, 10 + 2.0 / 3, 12, 10 + 10.0 / 3, 10 + 16.0 / 3};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_DOUBLE_EQ(s->requests[i].arrival_seconds, want[i]) << i;
  }
  EXPECT_DOUBLE_EQ(s->requests[2].think_seconds, 1);
  EXPECT_DOUBLE_EQ(s->requests[3].think_seconds, 1.0 / 3);
}

TEST(ScaleRateTest, KeepsEverythingButTime) {
  const Trace in = TwoSessions();
  auto s = ScaleRate(in, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "two_sessions");
  EXPECT_EQ(s->block_tokens, 4);
  ASSERT_EQ(s->requests.size(), in.requests.size());
  for (size_t i = 0; i < in.requests.size(); ++i) {
    EXPECT_EQ(s->requests[i].input_tokens, in.requests[i].input_tokens) << i;
    EXPECT_EQ(s->requests[i].output_tokens, in.requests[i].output_tokens) << i;
    EXPECT_EQ(s->requests[i].block_ids, in.requests[i].block_ids) << i;
    EXPECT_EQ(s->requests[i].session, in.requests[i].session) << i;
    EXPECT_EQ(s->requests[i].stop, in.requests[i].stop) << i;
  }
  // The input is untouched.
  EXPECT_EQ(Arrivals(in), (std::vector<double>{10, 12, 16, 20, 26}));
}

TEST(ScaleRateTest, OneIsTheIdentityAndAnEmptyTraceStaysEmpty) {
  auto s = ScaleRate(TwoSessions(), 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Arrivals(*s), (std::vector<double>{10, 12, 16, 20, 26}));
  EXPECT_EQ(Thinks(*s), (std::vector<double>{0, 0, 3, 1, 0}));
  auto empty = ScaleRate(Trace{.name = "empty", .block_tokens = 4}, 8);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->requests.empty());
}

TEST(ScaleRateTest, ArrivalsStayInOrderUnderRounding) {
  Trace t;
  t.block_tokens = 1;
  for (int i = 0; i < 1000; ++i) {
    t.requests.push_back({.arrival_seconds = 1e6 + i * 1e-3, .input_tokens = 1, .block_ids = {1}});
  }
  for (double x : {0.3, 7.0, 1e3}) {
    auto s = ScaleRate(t, x);
    ASSERT_TRUE(s.ok()) << s.status();
    for (size_t i = 1; i < s->requests.size(); ++i) {
      ASSERT_LE(s->requests[i - 1].arrival_seconds, s->requests[i].arrival_seconds)
          << x << " " << i;
    }
  }
}

TEST(ScaleRateTest, RefusesScalesThatAreNotPositiveAndFinite) {
  for (double x : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()}) {
    auto s = ScaleRate(TwoSessions(), x);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << x;
  }
}

// A tiny scale stretches the 16 s trace past kMaxTraceSeconds, where the replay's nanosecond
// clock would overflow: refused, naming the limit. Inside it, accepted.
TEST(ScaleRateTest, RefusesAStretchPastTheReplaysClock) {
  auto s = ScaleRate(TwoSessions(), 1e-9);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("kMaxTraceSeconds"), std::string::npos) << s.status();
  auto ok = ScaleRate(TwoSessions(), 32.0 / kMaxTraceSeconds);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_DOUBLE_EQ(ok->requests.back().arrival_seconds, 10 + kMaxTraceSeconds / 2);
}

}  // namespace
}  // namespace kvtier::replay
