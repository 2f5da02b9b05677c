// Edge cases of the session-hint API of KvCache (kv_cache.h: Release(id, ReleaseHints), Pause,
// Resume, Prefetch, RetainPrefix, InvalidatePrefix, RetainSession, InvalidateSession;
// session_hints.h), through the public headers only, as an outside suite would: every documented
// error and outcome, bad numbers (NaN, negative, infinite), unknown and released ids, and that a
// hint never makes a wrong block visible (KV bytes written through the device block table read
// back intact). CheckInvariants after every step, with every eviction policy, with and without a
// DRAM tier.
//
// The three "leaf-first across tiers" invalidate tests failed before InvalidateKeys kept the last
// copy of a block whose child has a copy in another tier.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "kvtier/session_hints.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::BlockPatternMismatches;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::kvtier::testing::KvCacheTestConfig;
using ::kvtier::testing::WriteBlockPattern;
using Result = HintOutcome::Result;

constexpr int kB = testing::KvCacheEnv::kTokensPerBlock;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kHbm = 0;
constexpr int kDram = 1;

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
std::vector<int32_t> Head(const std::vector<int32_t>& v, int64_t n) {
  return std::vector<int32_t>(v.begin(), v.begin() + n);
}

class SessionHintsEdgeTest : public testing::KvCacheFixture {
 protected:
  void Make(const std::string& policy = "lru", int64_t hbm_blocks = 16, int64_t dram_blocks = 0) {
    Build(KvCacheTestConfig{.hbm_blocks = hbm_blocks, .dram_blocks = dram_blocks},
          [&](KvCacheOptions& o) { o.eviction_policy = policy; });
  }

  // CheckInvariants and the stats' accounting, after a step.
  void Check(const char* step) {
    SCOPED_TRACE(step);
    KVTIER_EXPECT_OK(cache_->CheckInvariants());
    testing::ExpectTierAccounting(cache_->stats());
  }
  void Idle() { KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10))); }

  // A request of `session` with `tokens`, its KV written through the device block table (block
  // i's bytes from seed + i), reported written, not released.
  void RunWritten(uint64_t id, uint64_t session, const std::vector<int32_t>& tokens,
                  uint32_t seed = 0, SequenceOptions options = {}) {
    options.session = session;
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(id), options));
    KVTIER_ASSERT_OK(cache_->Append(SequenceId(id), tokens).status());
    const auto n = static_cast<int64_t>(tokens.size());
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(SequenceId(id), 0, n));
    const DeviceBlockTable table = t.block_table();
    for (size_t i = 0; i < table.slots.size(); ++i) {
      WriteBlockPattern(env_->geometry(), table, i, seed + static_cast<uint32_t>(i));
    }
    KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
    KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(id), n));
  }

  // RunWritten, then a plain Release: the blocks are cached and evictable.
  void WriteAndRelease(uint64_t id, uint64_t session, const std::vector<int32_t>& tokens,
                       uint32_t seed = 0) {
    RunWritten(id, session, tokens, seed);
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(id)));
  }

  // Bytes of the first `blocks` blocks of sequence `id` that differ from seed + i (made resident
  // first); -1 if a block could not be made resident.
  int64_t Mismatches(uint64_t id, int64_t blocks, uint32_t seed) {
    auto t = cache_->EnsureResident(SequenceId(id), 0, blocks * kB);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return -1;
    const DeviceBlockTable table = t->block_table();
    int64_t bad = 0;
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t m = BlockPatternMismatches(env_->geometry(), table, static_cast<size_t>(i),
                                               seed + static_cast<uint32_t>(i));
      if (m < 0) {
        bad = -1;
        break;
      }
      bad += m;
    }
    EXPECT_TRUE(cache_->ReleaseTicket(*t).ok());
    return bad;
  }

  // A new sequence attaching `cached` (plus one token to compute): the tokens attached.
  int64_t AttachNew(uint64_t id, const std::vector<int32_t>& cached, uint64_t session = 0) {
    EXPECT_TRUE(cache_->CreateSequence(SequenceId(id), {.session = session}).ok());
    auto a = cache_->AttachPrefix(SequenceId(id), Concat(cached, {-7}));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? a->attached_tokens : -1;
  }

  int64_t Cached(const std::vector<int32_t>& tokens) {
    auto l = cache_->Lookup(tokens);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? l->matched_tokens : -1;
  }
  int64_t CachedIn(const std::vector<int32_t>& tokens, int tier) {
    auto l = cache_->Lookup(tokens);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? l->blocks_by_tier[static_cast<size_t>(tier)] : -1;
  }

  HintOutcome Released(uint64_t id, const ReleaseHints& hints) {
    auto o = cache_->Release(SequenceId(id), hints);
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : HintOutcome{.result = Result::kRejected, .reason = "error", .blocks = -1};
  }
  HintOutcome Retain(const std::vector<int32_t>& tokens, double p, absl::Duration ttl) {
    auto o = cache_->RetainPrefix(tokens, p, ttl);
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : HintOutcome{.result = Result::kRejected, .reason = "error", .blocks = -1};
  }
  HintOutcome Invalidate(const std::vector<int32_t>& tokens, int64_t from) {
    auto o = cache_->InvalidatePrefix(tokens, from);
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : HintOutcome{.result = Result::kRejected, .reason = "error", .blocks = -1};
  }
  HintOutcome RetainS(uint64_t s, double p, absl::Duration ttl) {
    auto o = cache_->RetainSession(s, p, ttl);
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : HintOutcome{.result = Result::kRejected, .reason = "error", .blocks = -1};
  }
  HintOutcome InvalidateS(uint64_t s) {
    auto o = cache_->InvalidateSession(s);
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : HintOutcome{.result = Result::kRejected, .reason = "error", .blocks = -1};
  }
};

// ---- Release(id, hints) -------------------------------------------------------------------------

TEST_F(SessionHintsEdgeTest, ReleaseRejectsBadIdleButStillReleases) {
  Make();
  const std::vector<absl::Duration> bad = {absl::Seconds(-1), absl::Nanoseconds(-1),
                                           absl::InfiniteDuration(), -absl::InfiniteDuration()};
  uint64_t id = 1;
  for (absl::Duration idle : bad) {
    SCOPED_TRACE(absl::FormatDuration(idle));
    const std::vector<int32_t> p = Iota(2 * kB + 1, static_cast<int32_t>(1000 * id));
    RunWritten(id, /*session=*/3, p);
    HintOutcome o = Released(id, {.stop_reason = StopReason::kEndTurn, .expected_idle = idle});
    EXPECT_EQ(o.result, Result::kRejected);
    EXPECT_NE(o.reason.find("expected_idle"), std::string::npos) << o.reason;
    EXPECT_EQ(o.blocks, 2);
    EXPECT_THAT(cache_->Release(SequenceId(id)), IsError(StatusCode::kFailedPrecondition, ""));
    EXPECT_EQ(Cached(p), 2 * kB);
    Check("after release");
    ++id;
  }
  // 0 is >= 0 and finite: accepted.
  RunWritten(id, 3, Iota(kB, 90000));
  HintOutcome o =
      Released(id, {.stop_reason = StopReason::kToolUse, .expected_idle = absl::ZeroDuration()});
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.reason, "");
  EXPECT_EQ(o.blocks, 1);
  Check("idle 0");
}

TEST_F(SessionHintsEdgeTest, ReleaseErrorsAreTheReleaseErrors) {
  Make();
  EXPECT_THAT(cache_->Release(SequenceId(42), ReleaseHints{}).status(),
              IsError(StatusCode::kNotFound, ""));
  // Bad hints do not turn an unknown id into anything but kNotFound.
  EXPECT_THAT(cache_->Release(SequenceId(42), {.expected_idle = absl::Seconds(-5)}).status(),
              IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT(cache_->Release(SequenceId(), ReleaseHints{}).status(),
              IsError(StatusCode::kNotFound, ""));
  RunWritten(1, 5, Iota(kB, 10));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1), ReleaseHints{}).status());
  EXPECT_THAT(cache_->Release(SequenceId(1), ReleaseHints{}).status(),
              IsError(StatusCode::kFailedPrecondition, ""));
  EXPECT_THAT(cache_->Release(SequenceId(1)), IsError(StatusCode::kFailedPrecondition, ""));
  Check("double release");
  EXPECT_EQ(cache_->stats().live_sequences, 0);
}

TEST_F(SessionHintsEdgeTest, ReleaseBlocksCountsOnlyWrittenFullBlocks) {
  Make();
  // 3 full blocks appended, only 1 written.
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(1), {.session = 9}));
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(1), Iota(3 * kB + 2, 100)).status());
  KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(1), kB + 1));
  HintOutcome o = Released(1, {.stop_reason = StopReason::kLength});
  EXPECT_EQ(o.result, Result::kAccepted);
  EXPECT_EQ(o.blocks, 1);
  EXPECT_EQ(Cached(Iota(3 * kB + 2, 100)), kB);
  // A prompt shorter than one block: nothing to release but the partial block.
  RunWritten(2, 9, Iota(kB - 1, 500));
  o = Released(2, {.stop_reason = StopReason::kToolUse, .expected_idle = absl::Seconds(3)});
  EXPECT_EQ(o.result, Result::kAccepted);
  EXPECT_EQ(o.blocks, 0);
  // Nothing written at all.
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(3), {.session = 9}));
  o = Released(3, {.stop_reason = StopReason::kEndTurn});
  EXPECT_EQ(o.result, Result::kAccepted);
  EXPECT_EQ(o.blocks, 0);
  Check("end");
  testing::ExpectAllReleased(cache_->stats());
}

TEST_F(SessionHintsEdgeTest, ReleasePreemptedIsCountedWhateverTheOutcome) {
  Make();
  RunWritten(1, /*session=*/0, Iota(kB, 10));
  HintOutcome o = Released(1, {.expected_idle = absl::Seconds(-1), .preempted = true});
  EXPECT_EQ(o.result, Result::kRejected);
  RunWritten(2, 4, Iota(kB, 20));
  o = Released(2, {.preempted = true});
  EXPECT_EQ(o.result, Result::kAccepted);
  EXPECT_EQ(cache_->stats().preemptions, 2);
  Check("end");
}

TEST_F(SessionHintsEdgeTest, ReleaseWithOutOfRangeStopReasonStillReleases) {
  for (const std::string policy : {"lru", "reuse_index", "learned", "cost_aware"}) {
    SCOPED_TRACE(policy);
    Make(policy);
    RunWritten(1, 4, Iota(2 * kB, 10));
    auto o = cache_->Release(SequenceId(1), {.stop_reason = static_cast<StopReason>(200),
                                             .expected_idle = absl::Seconds(1)});
    KVTIER_ASSERT_OK(o.status());
    // Answered (found by review: it was kAccepted, and the value reached the policies).
    EXPECT_EQ(o->result, Result::kRejected);
    EXPECT_THAT(o->reason, ::testing::HasSubstr("stop_reason 200"));
    EXPECT_EQ(o->blocks, 2);
    EXPECT_EQ(Cached(Iota(2 * kB, 10)), 2 * kB);
    EXPECT_THAT(cache_->Release(SequenceId(1)), IsError(StatusCode::kFailedPrecondition, ""));
    Check("after");
  }
}

TEST_F(SessionHintsEdgeTest, ReleaseOfAPausedSequenceWithHints) {
  Make("reuse_index", 16, 32);
  RunWritten(1, 6, Iota(2 * kB, 10), 77);
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(1), absl::Seconds(2)));
  Check("paused");
  HintOutcome o = Released(1, {.stop_reason = StopReason::kEndTurn});
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  Idle();
  Check("released");
  testing::ExpectAllReleased(cache_->stats());
  EXPECT_EQ(Cached(Iota(2 * kB, 10)), 2 * kB);
  ASSERT_EQ(AttachNew(2, Iota(2 * kB, 10)), 2 * kB);
  EXPECT_EQ(Mismatches(2, 2, 77), 0);
}

// SequenceOptions retention: bad numbers are kInvalidArgument at CreateSequence, and nothing is
// created.
TEST_F(SessionHintsEdgeTest, CreateSequenceRejectsBadRetention) {
  Make();
  for (double p : {kNaN, -kNaN, -1.0, kInf, -kInf}) {
    EXPECT_THAT(cache_->CreateSequence(SequenceId(1), {.retention_priority = p}),
                IsError(StatusCode::kInvalidArgument, "retention_priority"))
        << p;
  }
  for (absl::Duration d : {absl::Seconds(-1), -absl::InfiniteDuration()}) {
    EXPECT_THAT(cache_->CreateSequence(SequenceId(1), {.retention = d}),
                IsError(StatusCode::kInvalidArgument, "retention"));
  }
  EXPECT_EQ(cache_->stats().live_sequences, 0);
  // Session ids at the extremes are fine.
  KVTIER_ASSERT_OK(cache_->CreateSequence(
      SequenceId(1),
      {.retention_priority = 0, .retention = absl::InfiniteDuration(), .session = ~uint64_t{0}}));
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(1), Iota(kB, 5)).status());
  KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(1), kB));
  HintOutcome o = Released(1, {.stop_reason = StopReason::kToolUse});
  EXPECT_EQ(o.result, Result::kAccepted);
  EXPECT_EQ(RetainS(~uint64_t{0}, 1, absl::Minutes(1)).blocks, 1);
  Check("end");
}

// ---- Pause / Resume -----------------------------------------------------------------------------

TEST_F(SessionHintsEdgeTest, PauseResumeStateMachineErrors) {
  Make("lru", 16, 32);
  EXPECT_THAT(cache_->Pause(SequenceId(9), absl::Seconds(1)), IsError(StatusCode::kNotFound, ""));
  EXPECT_THAT(cache_->Resume(SequenceId(9)).status(), IsError(StatusCode::kNotFound, ""));
  RunWritten(1, 2, Iota(2 * kB, 10));
  EXPECT_THAT(cache_->Pause(SequenceId(1), absl::Seconds(-1)),
              IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(cache_->Pause(SequenceId(1), -absl::InfiniteDuration()),
              IsError(StatusCode::kInvalidArgument, ""));
  KVTIER_ASSERT_OK_AND_ASSIGN(SequenceInfo info, cache_->GetSequence(SequenceId(1)));
  EXPECT_FALSE(info.paused) << "on error nothing changes";
  EXPECT_THAT(cache_->Resume(SequenceId(1)).status(), IsError(StatusCode::kFailedPrecondition, ""));
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(1), absl::Seconds(1)));
  EXPECT_THAT(cache_->Pause(SequenceId(1), absl::Seconds(1)),
              IsError(StatusCode::kFailedPrecondition, ""));
  KVTIER_ASSERT_OK_AND_ASSIGN(info, cache_->GetSequence(SequenceId(1)));
  EXPECT_TRUE(info.paused);
  Check("paused");
  KVTIER_ASSERT_OK_AND_ASSIGN(Completion c, cache_->Resume(SequenceId(1)));
  KVTIER_EXPECT_OK(c.Wait());
  EXPECT_THAT(cache_->Resume(SequenceId(1)).status(), IsError(StatusCode::kFailedPrecondition, ""));
  Check("resumed");
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  EXPECT_THAT(cache_->Pause(SequenceId(1), absl::Seconds(1)),
              IsError(StatusCode::kFailedPrecondition, ""));
  EXPECT_THAT(cache_->Resume(SequenceId(1)).status(), IsError(StatusCode::kFailedPrecondition, ""));
  // Caching off: cannot be paused.
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(2), {.session = 3, .enable_caching = false}));
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(2), Iota(kB, 50)).status());
  EXPECT_THAT(cache_->Pause(SequenceId(2), absl::Seconds(1)),
              IsError(StatusCode::kFailedPrecondition, ""));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  Idle();
  Check("end");
}

// Zero and infinite idle estimates are not negative: a pause takes them, and the KV comes back
// intact after the paused blocks were pushed out of HBM.
TEST_F(SessionHintsEdgeTest, PauseZeroAndInfiniteIdleKeepsKvIntact) {
  for (const std::string policy : {"lru", "reuse_index", "learned", "cost_aware"}) {
    for (absl::Duration idle : {absl::ZeroDuration(), absl::InfiniteDuration()}) {
      SCOPED_TRACE(policy + " " + absl::FormatDuration(idle));
      Make(policy, 8, 32);
      RunWritten(1, 2, Iota(3 * kB + 1, 10), 500);
      KVTIER_ASSERT_OK(cache_->Pause(SequenceId(1), idle));
      Idle();
      Check("paused");
      // 8 new blocks held: the paused sequence's HBM copies must go (its references are below).
      RunWritten(2, 3, Iota(7 * kB, 5000), 900);
      Idle();
      Check("pressure");
      KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
      KVTIER_ASSERT_OK_AND_ASSIGN(Completion c, cache_->Resume(SequenceId(1)));
      KVTIER_EXPECT_OK(c.Wait());
      Check("resumed");
      EXPECT_EQ(Mismatches(1, 3, 500), 0);
      KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
      Idle();
      Check("end");
    }
  }
}

// Without a lower tier a pause has nowhere to move the references: they stay held in HBM.
TEST_F(SessionHintsEdgeTest, PauseWithoutDramKeepsBlocksHeld) {
  Make("reuse_index", 8, 0);
  RunWritten(1, 2, Iota(2 * kB, 10), 40);
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(1), absl::Seconds(3)));
  KVTIER_ASSERT_OK_AND_ASSIGN(SequenceInfo info, cache_->GetSequence(SequenceId(1)));
  EXPECT_EQ(info.blocks_by_tier[kHbm], 2);
  EXPECT_EQ(cache_->stats().tiers[kHbm].held_blocks, 2);
  Check("paused");
  KVTIER_ASSERT_OK_AND_ASSIGN(Completion c, cache_->Resume(SequenceId(1)));
  KVTIER_EXPECT_OK(c.Wait());
  EXPECT_EQ(Mismatches(1, 2, 40), 0);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  Check("end");
}

// ---- RetainPrefix -------------------------------------------------------------------------------

TEST_F(SessionHintsEdgeTest, RetainPrefixRejectsBadPriorityAndTtl) {
  Make();
  const std::vector<int32_t> p = Iota(2 * kB, 10);
  WriteAndRelease(1, 0, p);
  const std::vector<std::pair<double, absl::Duration>> bad = {
      {kNaN, absl::Minutes(1)},    {-kNaN, absl::Minutes(1)},  {-1, absl::Minutes(1)},
      {-1e-300, absl::Minutes(1)}, {kInf, absl::Minutes(1)},   {-kInf, absl::Minutes(1)},
      {1, absl::ZeroDuration()},   {1, absl::Nanoseconds(-1)}, {1, -absl::InfiniteDuration()},
      {kNaN, absl::ZeroDuration()}};
  for (const auto& [priority, ttl] : bad) {
    SCOPED_TRACE(std::to_string(priority) + " " + absl::FormatDuration(ttl));
    HintOutcome o = Retain(p, priority, ttl);
    EXPECT_EQ(o.result, Result::kRejected);
    EXPECT_FALSE(o.reason.empty());
    Check("rejected");
  }
  // In range: 0 priority, -0.0, an infinite ttl, a huge priority.
  for (const auto& [priority, ttl] : std::vector<std::pair<double, absl::Duration>>{
           {0, absl::Minutes(1)},
           {-0.0, absl::Minutes(1)},
           {1, absl::InfiniteDuration()},
           {0, absl::InfiniteDuration()},
           {std::numeric_limits<double>::max(), absl::Hours(1e6)},
           {std::numeric_limits<double>::denorm_min(), absl::Nanoseconds(1)}}) {
    SCOPED_TRACE(std::to_string(priority) + " " + absl::FormatDuration(ttl));
    HintOutcome o = Retain(p, priority, ttl);
    EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
    EXPECT_EQ(o.reason, "");
    EXPECT_EQ(o.blocks, 2);
    Check("accepted");
  }
}

TEST_F(SessionHintsEdgeTest, RetainPrefixClipsToWhatIsCached) {
  Make();
  const std::vector<int32_t> p = Iota(2 * kB, 10);
  WriteAndRelease(1, 0, p);
  // Partial last block: not a full block of the prompt, so not part of the hint.
  HintOutcome o = Retain(Concat(p, {1, 2}), 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  // Nothing cached: clipped to 0.
  o = Retain(Iota(3 * kB, 7000), 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kClipped);
  EXPECT_EQ(o.blocks, 0);
  EXPECT_FALSE(o.reason.empty());
  // A hole: the first block differs, so nothing of the prompt's chain is cached.
  std::vector<int32_t> q = p;
  q[0] = -1;
  o = Retain(q, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kClipped);
  EXPECT_EQ(o.blocks, 0);
  // No full block: an empty prompt and one shorter than a block.
  o = Retain({}, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 0);
  o = Retain(Iota(kB - 1, 10), 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 0);
  // Under another identity the keys name other blocks: none cached.
  auto salted = cache_->RetainPrefix(p, 1, absl::Minutes(1), {.tenant_salt = "other"});
  KVTIER_ASSERT_OK(salted.status());
  EXPECT_EQ(salted->result, Result::kClipped);
  EXPECT_EQ(salted->blocks, 0);
  // Bad extras: kInvalidArgument (HashPrompt's), also with a bad priority.
  SequenceOptions bad_extras;
  bad_extras.multimodal = {MultimodalItem{.start_token = 0, .num_tokens = 0, .digest = "x"}};
  EXPECT_THAT(cache_->RetainPrefix(p, 1, absl::Minutes(1), bad_extras).status(),
              IsError(StatusCode::kInvalidArgument, ""));
  Check("end");
}

// A rejected retain changes nothing: not the earlier retention either.
TEST_F(SessionHintsEdgeTest, RejectedRetainKeepsTheEarlierRetention) {
  for (const std::string policy : {"lru", "reuse_index"}) {
    SCOPED_TRACE(policy);
    Make(policy, 8);
    const std::vector<int32_t> kept = Iota(2 * kB, 100), other = Iota(2 * kB, 200);
    WriteAndRelease(1, 1, kept);
    env_->clock().Advance(absl::Seconds(1));
    WriteAndRelease(2, 2, other);
    EXPECT_EQ(Retain(kept, 2.0, absl::Minutes(10)).result, Result::kAccepted);
    EXPECT_EQ(Retain(kept, kNaN, absl::Minutes(10)).result, Result::kRejected);
    EXPECT_EQ(Retain(kept, -1, absl::Minutes(10)).result, Result::kRejected);
    EXPECT_EQ(Retain(kept, 1, absl::ZeroDuration()).result, Result::kRejected);
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(3, 3, Iota(6 * kB, 400));
    EXPECT_EQ(Cached(kept), 2 * kB);
    EXPECT_EQ(Cached(other), 0);
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
    Check("end");
  }
}

// A retention that ran out is no retention: the retained prefix goes first again (lru: oldest).
TEST_F(SessionHintsEdgeTest, RetentionExpiresAfterTtl) {
  Make("lru", 8);
  const std::vector<int32_t> kept = Iota(2 * kB, 100), other = Iota(2 * kB, 200);
  WriteAndRelease(1, 1, kept);
  env_->clock().Advance(absl::Seconds(1));
  WriteAndRelease(2, 2, other);
  EXPECT_EQ(Retain(kept, 2.0, absl::Seconds(5)).result, Result::kAccepted);
  env_->clock().Advance(absl::Seconds(6));
  RunWritten(3, 3, Iota(6 * kB, 400));
  EXPECT_EQ(Cached(kept), 0);
  EXPECT_EQ(Cached(other), 2 * kB);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  Check("end");
}

// ---- InvalidatePrefix ---------------------------------------------------------------------------

TEST_F(SessionHintsEdgeTest, InvalidatePrefixFromTokenEdges) {
  Make();
  const std::vector<int32_t> p = Iota(4 * kB, 10);
  WriteAndRelease(1, 0, p);
  for (int64_t from : {int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    HintOutcome o = Invalidate(p, from);
    EXPECT_EQ(o.result, Result::kRejected) << from;
    EXPECT_NE(o.reason.find("from_token"), std::string::npos) << o.reason;
    EXPECT_EQ(Cached(p), 4 * kB) << "nothing changes";
  }
  // Past the end: no block from there on; nothing dropped.
  for (int64_t from : {int64_t{4 * kB}, int64_t{100 * kB}, std::numeric_limits<int64_t>::max()}) {
    HintOutcome o = Invalidate(p, from);
    EXPECT_EQ(o.result, Result::kAccepted) << from << " " << o.reason;
    EXPECT_EQ(o.blocks, 0) << from;
    EXPECT_EQ(Cached(p), 4 * kB);
  }
  // Empty and sub-block spans: no block.
  EXPECT_EQ(Invalidate({}, 0).result, Result::kAccepted);
  EXPECT_EQ(Invalidate({}, 0).blocks, 0);
  EXPECT_EQ(Invalidate(Head(p, kB - 1), 0).blocks, 0);
  EXPECT_EQ(Cached(p), 4 * kB);
  // from inside block 3 (floor): block 3 goes.
  HintOutcome o = Invalidate(p, 3 * kB + kB - 1);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 1);
  EXPECT_EQ(Cached(p), 3 * kB);
  Check("after 3");
  // Tokens with a partial last block, from inside block 1: blocks 1 and 2 go.
  o = Invalidate(Concat(Head(p, 3 * kB), {5, 6}), kB + 1);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  EXPECT_EQ(Cached(p), kB);
  // Bad extras: kInvalidArgument even with a bad from_token.
  SequenceOptions bad_extras;
  bad_extras.multimodal = {MultimodalItem{.start_token = -1, .num_tokens = 1, .digest = "x"}};
  EXPECT_THAT(cache_->InvalidatePrefix(p, 0, bad_extras).status(),
              IsError(StatusCode::kInvalidArgument, ""));
  // Another identity: names other blocks, drops nothing.
  auto salted = cache_->InvalidatePrefix(p, 0, {.tenant_salt = "x"});
  KVTIER_ASSERT_OK(salted.status());
  EXPECT_EQ(salted->blocks, 0);
  EXPECT_EQ(Cached(p), kB);
  Check("end");
}

// Invalidating blocks a running sequence holds: they keep their copy (clipped), the holder's KV
// reads back intact, another request still matches exactly what stayed, and what was dropped is
// never matched.
TEST_F(SessionHintsEdgeTest, InvalidateHeldPrefixKeepsHolderCorrect) {
  for (const std::string policy : {"lru", "reuse_index", "learned", "cost_aware"}) {
    for (int64_t dram : {0, 32}) {
      SCOPED_TRACE(policy + " dram=" + std::to_string(dram));
      Make(policy, 16, dram);
      const std::vector<int32_t> ctx = Iota(4 * kB, 100);
      RunWritten(1, 1, ctx, 10);  // writes ctx, keeps it
      // A second request extends ctx by two blocks, written and released.
      ASSERT_EQ(AttachNew(2, ctx), 4 * kB);
      KVTIER_ASSERT_OK(cache_->Append(SequenceId(2), Iota(2 * kB, 900)).status());
      KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(2), 6 * kB));
      KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
      Check("setup");
      HintOutcome o = Invalidate(ctx, 0);
      EXPECT_EQ(o.result, Result::kClipped) << o.reason;
      EXPECT_EQ(o.blocks, 0);
      EXPECT_EQ(o.reason.rfind("4 ", 0), 0u) << "reason: how many, and why: " << o.reason;
      Check("invalidated");
      EXPECT_EQ(Mismatches(1, 4, 10), 0) << "the holder's KV";
      EXPECT_EQ(Cached(ctx), 4 * kB) << "held blocks stay";
      ASSERT_EQ(AttachNew(3, ctx), 4 * kB);
      EXPECT_EQ(Mismatches(3, 4, 10), 0);
      KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
      KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
      // Nobody holds them now: all of ctx goes except what a cached child outside needs. The
      // second request's blocks (children of ctx's last block) are outside the range.
      o = Invalidate(ctx, 0);
      Check("second invalidate");
      EXPECT_EQ(Cached(ctx), 4 * kB) << "the cached child outside the range needs them";
      EXPECT_EQ(o.result, Result::kClipped) << o.reason;
      EXPECT_EQ(o.blocks, 0);
      // The whole chain: everything goes.
      const std::vector<int32_t> whole = Concat(ctx, Iota(2 * kB, 900));
      o = Invalidate(whole, 0);
      EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
      EXPECT_EQ(o.blocks, 6);
      EXPECT_EQ(Cached(whole), 0);
      Idle();
      Check("end");
      EXPECT_EQ(cache_->stats().tiers[kHbm].droppable_blocks, 0);
      if (dram > 0) {
        EXPECT_EQ(cache_->stats().tiers[kDram].droppable_blocks, 0);
      }
    }
  }
}

// Invalidate then reattach: the dropped blocks are never matched; the request recomputes them,
// and the recomputed KV (new bytes) is what the next request reads.
TEST_F(SessionHintsEdgeTest, InvalidateThenReattachReadsTheNewKv) {
  Make("reuse_index", 16, 32);
  const std::vector<int32_t> p = Iota(3 * kB, 100);
  WriteAndRelease(1, 1, p, 1000);
  HintOutcome o = Invalidate(p, kB);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  ASSERT_EQ(AttachNew(2, p), kB);
  EXPECT_EQ(Mismatches(2, 1, 1000), 0);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  WriteAndRelease(3, 1, p, 2000);  // recomputed: other bytes (a new seed) for every block
  ASSERT_EQ(AttachNew(4, p), 3 * kB);
  // Block 0 stayed cached (sequence 3 appended without attaching: its block 0 is a twin of the
  // same KV); blocks 1-2 are sequence 3's, the recomputed bytes.
  auto t = cache_->EnsureResident(SequenceId(4), 0, 3 * kB);
  KVTIER_ASSERT_OK(t.status());
  const DeviceBlockTable table = t->block_table();
  EXPECT_EQ(BlockPatternMismatches(env_->geometry(), table, 1, 2001), 0);
  EXPECT_EQ(BlockPatternMismatches(env_->geometry(), table, 2, 2002), 0);
  KVTIER_ASSERT_OK(cache_->ReleaseTicket(*t));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(4)));
  Idle();
  Check("end");
}

// Retention orders eviction only; an invalidate still drops a retained block.
TEST_F(SessionHintsEdgeTest, RetainThenInvalidateDrops) {
  for (const std::string policy : {"lru", "reuse_index", "learned", "cost_aware"}) {
    SCOPED_TRACE(policy);
    Make(policy, 16, 32);
    const std::vector<int32_t> p = Iota(3 * kB, 100);
    WriteAndRelease(1, 1, p);
    EXPECT_EQ(Retain(p, 5, absl::InfiniteDuration()).result, Result::kAccepted);
    HintOutcome o = Invalidate(p, 0);
    EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
    EXPECT_EQ(o.blocks, 3);
    EXPECT_EQ(Cached(p), 0);
    // Retain after: nothing cached.
    o = Retain(p, 5, absl::InfiniteDuration());
    EXPECT_EQ(o.result, Result::kClipped);
    EXPECT_EQ(o.blocks, 0);
    Check("end");
  }
}

// Blocks in both HBM and DRAM (evicted to DRAM, then onboarded again) are dropped from every tier.
TEST_F(SessionHintsEdgeTest, InvalidateDropsEveryTier) {
  Make("lru", 8, 32);
  const std::vector<int32_t> p = Iota(2 * kB, 100);
  WriteAndRelease(1, 1, p, 3);
  env_->clock().Advance(absl::Seconds(1));
  WriteAndRelease(2, 2, Iota(8 * kB, 5000));  // pushes p to DRAM
  Idle();
  ASSERT_EQ(CachedIn(p, kDram), 2);
  ASSERT_EQ(AttachNew(3, p), 2 * kB);
  EXPECT_EQ(Mismatches(3, 2, 3), 0);  // onboarded: now in HBM too (inclusive)
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  Idle();
  HintOutcome o = Invalidate(p, 0);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  EXPECT_EQ(Cached(p), 0);
  Check("end");
}

// A ticket of a released sequence still locks its blocks: kept, and its table reads intact.
TEST_F(SessionHintsEdgeTest, InvalidateLockedByTicketIsClipped) {
  Make("lru", 16, 32);
  const std::vector<int32_t> p = Iota(2 * kB, 100);
  RunWritten(1, 1, p, 60);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(SequenceId(1), 0, 2 * kB));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  HintOutcome o = Invalidate(p, 0);
  EXPECT_EQ(o.result, Result::kClipped) << o.reason;
  EXPECT_EQ(o.blocks, 0);
  const DeviceBlockTable table = t.block_table();
  EXPECT_EQ(BlockPatternMismatches(env_->geometry(), table, 0, 60), 0);
  EXPECT_EQ(BlockPatternMismatches(env_->geometry(), table, 1, 61), 0);
  Check("locked");
  KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
  o = Invalidate(p, 0);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  Check("end");
}

// Invalidating a paused sequence's blocks: its references are below (or moving there); whatever
// is dropped, Resume brings back its own KV.
TEST_F(SessionHintsEdgeTest, InvalidatePausedSequenceThenResume) {
  for (const std::string policy : {"lru", "reuse_index", "learned", "cost_aware"}) {
    for (bool wait_for_pause : {false, true}) {
      SCOPED_TRACE(policy + (wait_for_pause ? " idle" : " racing"));
      Make(policy, 16, 32);
      const std::vector<int32_t> p = Iota(3 * kB, 100);
      RunWritten(1, 4, p, 300);
      KVTIER_ASSERT_OK(cache_->Pause(SequenceId(1), absl::Seconds(9)));
      if (wait_for_pause) Idle();
      HintOutcome o = Invalidate(p, 0);
      EXPECT_NE(o.result, Result::kRejected) << o.reason;
      Check("invalidated");
      o = InvalidateS(4);  // remembered at the pause
      EXPECT_NE(o.result, Result::kRejected) << o.reason;
      Idle();
      Check("idle");
      KVTIER_ASSERT_OK_AND_ASSIGN(Completion c, cache_->Resume(SequenceId(1)));
      KVTIER_EXPECT_OK(c.Wait());
      EXPECT_EQ(Mismatches(1, 3, 300), 0);
      KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
      Idle();
      Check("end");
    }
  }
}

// ---- leaf-first across tiers --------------------------------------------------------------------

// kv_cache.h InvalidatePrefix: "dropped from every tier now ... where nobody holds or reads them
// and no cached child outside them needs them". A parent whose child outside the range is cached
// only in a lower tier stays (before the fix it was dropped, and the cached prefix of the longer
// prompt shrank to the part before the hole).
TEST_F(SessionHintsEdgeTest, InvalidateKeepsParentOfChildCachedInLowerTier) {
  Make("lru", 8, 32);
  const std::vector<int32_t> a = Iota(4 * kB, 100);
  WriteAndRelease(1, 1, a, 10);
  env_->clock().Advance(absl::Seconds(1));
  // 6 new slots held, 4 free: two of a's blocks go, leaf first (3, then 2), down to DRAM.
  RunWritten(2, 2, Iota(6 * kB, 5000));
  Idle();
  ASSERT_EQ(Cached(a), 4 * kB);
  ASSERT_EQ(CachedIn(a, kHbm), 2);
  ASSERT_EQ(CachedIn(a, kDram), 2);
  Check("setup");
  // Invalidate a's first two blocks from block 1: block 2 (outside, in DRAM) needs block 1.
  HintOutcome o = Invalidate(Head(a, 2 * kB), kB);
  Check("invalidated");
  EXPECT_EQ(Cached(a), 4 * kB) << "block 1 was dropped under its cached child";
  EXPECT_EQ(o.result, Result::kClipped) << o.reason;
  EXPECT_EQ(o.blocks, 0);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
}

// The same across other tiers: with exclusive tiers a child onboarded alone (EnsureResident
// of its range) is in HBM only and its parent in DRAM only; invalidating the parent's range
// must keep the parent's DRAM copy under the HBM child.
TEST_F(SessionHintsEdgeTest, InvalidateKeepsDramParentOfHbmChild) {
  Build(KvCacheTestConfig{.hbm_blocks = 8, .dram_blocks = 32},
        [](KvCacheOptions& o) { o.inclusion = TierInclusion::kExclusive; });
  const std::vector<int32_t> a = Iota(2 * kB, 100);
  WriteAndRelease(1, 1, a, 10);
  env_->clock().Advance(absl::Seconds(1));
  WriteAndRelease(2, 2, Iota(8 * kB, 5000));  // a goes down to DRAM
  Idle();
  ASSERT_EQ(CachedIn(a, kDram), 2);
  // A request attaches a's two blocks and onboards only the second.
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(3)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(SequenceId(3), Concat(a, {1})));
  ASSERT_EQ(r.attached_tokens, 2 * kB);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(SequenceId(3), kB, 2 * kB));
  EXPECT_EQ(BlockPatternMismatches(env_->geometry(), t.block_table(), 0, 11), 0);
  KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  Idle();
  ASSERT_EQ(Cached(a), 2 * kB);
  Check("setup");
  HintOutcome o = Invalidate(Head(a, kB), 0);  // block 0 only; block 1 is outside
  Check("invalidated");
  EXPECT_EQ(Cached(a), 2 * kB) << "block 0 was dropped under its cached child";
  EXPECT_EQ(o.result, Result::kClipped) << o.reason;
  EXPECT_EQ(o.blocks, 0);
}

// The same through the session form: kv_cache.h InvalidateSession "(a block shared with another
// cached prompt, or held, stays: kClipped)". Session 1 wrote a's two blocks; another prompt
// extends them with a block now only in DRAM. InvalidateSession(1) keeps a's last block (a leaf
// in HBM, the parent of the other prompt's block).
TEST_F(SessionHintsEdgeTest, InvalidateSessionKeepsBlockSharedWithPromptInLowerTier) {
  Make("lru", 8, 32);
  const std::vector<int32_t> a = Iota(2 * kB, 100);
  const std::vector<int32_t> b = Concat(a, Iota(kB, 900));
  WriteAndRelease(1, /*session=*/1, a, 10);
  // Session 2 extends a by one block, written and released.
  ASSERT_EQ(AttachNew(2, a, /*session=*/2), 2 * kB);
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(2), Iota(kB, 900)).status());
  KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(2), 3 * kB));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  env_->clock().Advance(absl::Seconds(1));
  // 6 slots held, 5 free: b's last block (the only leaf) goes down to DRAM.
  RunWritten(3, 3, Iota(6 * kB, 5000));
  Idle();
  ASSERT_EQ(Cached(b), 3 * kB);
  ASSERT_EQ(CachedIn(b, kHbm), 2);
  Check("setup");
  HintOutcome o = InvalidateS(1);
  Check("invalidated");
  EXPECT_EQ(Cached(b), 3 * kB) << "a's blocks were dropped under session 2's cached block";
  EXPECT_EQ(o.result, Result::kClipped) << o.reason;
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
}

// Write-through: every block has a DRAM copy at once; invalidate drops both copies.
TEST_F(SessionHintsEdgeTest, InvalidateWithWriteThrough) {
  Build(KvCacheTestConfig{.hbm_blocks = 16, .dram_blocks = 32},
        [](KvCacheOptions& o) { o.write_policy = WritePolicy::kWriteThrough; });
  const std::vector<int32_t> p = Iota(3 * kB, 100);
  WriteAndRelease(1, 1, p, 10);
  Idle();
  ASSERT_EQ(cache_->stats().tiers[kDram].droppable_blocks, 3);
  HintOutcome o = Invalidate(p, kB);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  EXPECT_EQ(Cached(p), kB);
  EXPECT_EQ(cache_->stats().tiers[kDram].droppable_blocks, 1);
  EXPECT_EQ(cache_->stats().tiers[kHbm].droppable_blocks, 1);
  Check("end");
}

// A remote copy is deleted from the store too: remote discovery does not find it again.
TEST_F(SessionHintsEdgeTest, InvalidateDeletesRemoteCopy) {
  Build(KvCacheTestConfig{.hbm_blocks = 16, .dram_blocks = 0, .remote_blocks = 32},
        [](KvCacheOptions& o) { o.publish_to_remote = true; });
  const std::vector<int32_t> p = Iota(2 * kB, 100);
  WriteAndRelease(1, 1, p, 10);
  Idle();
  ASSERT_EQ(cache_->stats().tiers[3].droppable_blocks, 2);
  HintOutcome o = Invalidate(p, 0);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  Idle();
  EXPECT_EQ(Cached(p), 0);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup l, cache_->Lookup(p));
  EXPECT_EQ(l.discovered_blocks, 0) << "the store still had it";
  Check("end");
}

// A retention set while the blocks are held survives a release without its own retention, and
// orders eviction after it.
TEST_F(SessionHintsEdgeTest, RetainWhileHeldSurvivesPlainRelease) {
  Make("lru", 8);
  const std::vector<int32_t> kept = Iota(2 * kB, 100), other = Iota(2 * kB, 200);
  RunWritten(1, 1, kept);
  HintOutcome o = Retain(kept, 2.0, absl::Minutes(10));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  env_->clock().Advance(absl::Seconds(1));
  WriteAndRelease(2, 2, other);
  env_->clock().Advance(absl::Seconds(1));
  RunWritten(3, 3, Iota(6 * kB, 400));
  EXPECT_EQ(Cached(kept), 2 * kB);
  EXPECT_EQ(Cached(other), 0);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  Check("end");
}

// The session is not part of a block's identity; a readmission is counted as such.
TEST_F(SessionHintsEdgeTest, SessionIsNotIdentityAndReadmissionIsCounted) {
  Make("reuse_index");
  const std::vector<int32_t> p = Iota(2 * kB, 100);
  RunWritten(1, 1, p, 10);
  HintOutcome o = Released(1, {.stop_reason = StopReason::kToolUse, .preempted = true});
  EXPECT_EQ(o.result, Result::kAccepted);
  ASSERT_EQ(AttachNew(2, p, /*session=*/2), 2 * kB);
  EXPECT_EQ(Mismatches(2, 2, 10), 0);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  const int64_t hits = cache_->stats().tiers[kHbm].hits;
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(3), {.session = 1, .readmission = true}));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(SequenceId(3), Concat(p, {1})));
  EXPECT_EQ(r.attached_tokens, 2 * kB);
  EXPECT_EQ(cache_->stats().readmitted_blocks, 2);
  EXPECT_EQ(cache_->stats().tiers[kHbm].hits, hits);
  EXPECT_EQ(cache_->stats().preemptions, 1);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  Check("end");
}

// Caching off with a session: the release hint is rejected (its blocks are shared with nobody),
// no block is indexed, and the session remembers nothing of it.
TEST_F(SessionHintsEdgeTest, ReleaseHintsWithCachingOff) {
  Make("reuse_index", 16, 32);
  const std::vector<int32_t> p = Iota(2 * kB, 100);
  RunWritten(1, 8, p, 0, {.enable_caching = false});
  HintOutcome o = Released(1, {.stop_reason = StopReason::kToolUse});
  EXPECT_EQ(o.result, Result::kRejected) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  EXPECT_EQ(Cached(p), 0);
  o = RetainS(8, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kRejected) << "nothing remembered: " << o.reason;
  EXPECT_EQ(o.blocks, 0);
  o = InvalidateS(8);
  EXPECT_EQ(o.result, Result::kRejected) << o.reason;
  EXPECT_EQ(o.blocks, 0);
  Check("end");
  testing::ExpectAllReleased(cache_->stats());
  EXPECT_EQ(cache_->stats().tiers[kHbm].free_blocks, 16);
}

// Pause of an empty sequence, of one holding a ticket, and with no room below.
TEST_F(SessionHintsEdgeTest, PauseEdgeStates) {
  Make("lru", 8, 1);  // DRAM has one slot
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(1), {.session = 1}));
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(1), absl::Seconds(1)));
  KVTIER_ASSERT_OK_AND_ASSIGN(Completion c, cache_->Resume(SequenceId(1)));
  KVTIER_EXPECT_OK(c.WaitFor(absl::Seconds(10)));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  // Three blocks, one DRAM slot; a ticket pins them meanwhile.
  const std::vector<int32_t> p = Iota(3 * kB, 100);
  RunWritten(2, 2, p, 20);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(SequenceId(2), 0, 3 * kB));
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(2), absl::Seconds(1)));
  Idle();
  Check("paused with ticket");
  HintOutcome o = Invalidate(p, 0);
  EXPECT_EQ(o.result, Result::kClipped) << o.reason;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(
        BlockPatternMismatches(env_->geometry(), t.block_table(), i, 20 + static_cast<uint32_t>(i)),
        0);
  }
  KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
  // Pressure: 8 slots asked while the paused one's blocks are wherever the pause left them.
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(3)));
  auto appended = cache_->Append(SequenceId(3), Iota(5 * kB, 7000));
  Check("pressure");
  if (appended.ok()) {
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(c, cache_->Resume(SequenceId(2)));
  (void)c.WaitFor(absl::Seconds(10));
  EXPECT_EQ(Mismatches(2, 3, 20), 0);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  if (!appended.ok()) {
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  }
  Idle();
  Check("end");
}

// A prefetch never fails a request: with HBM full of held blocks it starts nothing.
TEST_F(SessionHintsEdgeTest, PrefetchWithHbmFullStartsNothing) {
  Make("lru", 8, 32);
  const std::vector<int32_t> p = Iota(2 * kB, 100);
  WriteAndRelease(1, 1, p, 10);
  env_->clock().Advance(absl::Seconds(1));
  RunWritten(2, 2, Iota(8 * kB, 5000));  // holds every slot; p goes down
  Idle();
  ASSERT_EQ(CachedIn(p, kDram), 2);
  KVTIER_ASSERT_OK_AND_ASSIGN(int64_t n, cache_->Prefetch(p));
  EXPECT_EQ(n, 0);
  Check("prefetch");
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  Idle();
  Check("end");
}

// Hints from several threads while requests run: no crash, no deadlock, invariants hold, and
// every request reads back its own KV.
TEST_F(SessionHintsEdgeTest, ConcurrentHintsWhileRequestsRun) {
  Make("reuse_index", 16, 32);
  std::atomic<bool> stop{false};
  std::vector<std::thread> hinters;
  for (int h = 0; h < 2; ++h) {
    hinters.emplace_back([&, h] {
      int i = 0;
      while (!stop.load()) {
        const std::vector<int32_t> p = Iota(2 * kB, 1000 * (i % 7));
        switch ((i + h) % 5) {
          case 0:
            (void)cache_->RetainPrefix(p, 1, absl::Seconds(5));
            break;
          case 1:
            (void)cache_->InvalidatePrefix(p, i % 9);
            break;
          case 2:
            (void)cache_->RetainSession(static_cast<uint64_t>(i % 4), 2, absl::Seconds(1));
            break;
          case 3:
            (void)cache_->InvalidateSession(static_cast<uint64_t>(i % 4));
            break;
          default:
            (void)cache_->Prefetch(p);
            break;
        }
        ++i;
      }
    });
  }
  for (uint64_t r = 1; r <= 150; ++r) {
    const std::vector<int32_t> p = Iota(2 * kB, 1000 * static_cast<int32_t>(r % 7));
    const std::vector<int32_t> prompt = Concat(p, Iota(kB + 1, 100000 + static_cast<int32_t>(r)));
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(r), {.session = r % 4}));
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult a, cache_->AttachPrefix(SequenceId(r), prompt));
    KVTIER_ASSERT_OK(cache_
                         ->Append(SequenceId(r), absl::MakeConstSpan(prompt).subspan(
                                                     static_cast<size_t>(a.attached_tokens)))
                         .status());
    const auto n = static_cast<int64_t>(prompt.size());
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(SequenceId(r), 0, n));
    const DeviceBlockTable table = t.block_table();
    const auto seed = static_cast<uint32_t>(1000 * (r % 7));
    for (int64_t b = a.attached_tokens / kB; b < 2; ++b) {
      WriteBlockPattern(env_->geometry(), table, static_cast<size_t>(b),
                        seed + static_cast<uint32_t>(b));
    }
    for (int64_t b = 0; b < 2; ++b) {
      EXPECT_EQ(BlockPatternMismatches(env_->geometry(), table, static_cast<size_t>(b),
                                       seed + static_cast<uint32_t>(b)),
                0)
          << "request " << r << " block " << b;
    }
    KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
    KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(r), n));
    if (r % 3 == 0) {
      KVTIER_ASSERT_OK(cache_->Pause(SequenceId(r), absl::Seconds(1)));
      KVTIER_ASSERT_OK_AND_ASSIGN(Completion c, cache_->Resume(SequenceId(r)));
      (void)c.WaitFor(absl::Seconds(10));
    }
    KVTIER_ASSERT_OK(cache_
                         ->Release(SequenceId(r), {.stop_reason = StopReason::kToolUse,
                                                   .expected_idle = absl::Seconds(1)})
                         .status());
    env_->clock().Advance(absl::Milliseconds(100));
  }
  stop = true;
  for (std::thread& t : hinters) t.join();
  Idle();
  Check("end");
  testing::ExpectAllReleased(cache_->stats());
}

// ---- RetainSession / InvalidateSession
// -----------------------------------------------------------

TEST_F(SessionHintsEdgeTest, SessionHintsRejectBadInput) {
  Make();
  WriteAndRelease(1, 5, Iota(2 * kB, 10));
  struct Case {
    uint64_t session;
    double priority;
    absl::Duration ttl;
  };
  for (const Case& c : std::vector<Case>{{0, 1, absl::Minutes(1)},
                                         {6, 1, absl::Minutes(1)},
                                         {~uint64_t{0}, 1, absl::Minutes(1)},
                                         {5, kNaN, absl::Minutes(1)},
                                         {5, -1, absl::Minutes(1)},
                                         {5, kInf, absl::Minutes(1)},
                                         {5, 1, absl::ZeroDuration()},
                                         {5, 1, absl::Seconds(-3)},
                                         {5, 1, -absl::InfiniteDuration()}}) {
    SCOPED_TRACE(std::to_string(c.session) + " " + std::to_string(c.priority) + " " +
                 absl::FormatDuration(c.ttl));
    HintOutcome o = RetainS(c.session, c.priority, c.ttl);
    EXPECT_EQ(o.result, Result::kRejected);
    EXPECT_FALSE(o.reason.empty());
  }
  for (uint64_t s : {uint64_t{0}, uint64_t{6}, ~uint64_t{0}}) {
    HintOutcome o = InvalidateS(s);
    EXPECT_EQ(o.result, Result::kRejected) << s;
    EXPECT_FALSE(o.reason.empty());
  }
  EXPECT_EQ(Cached(Iota(2 * kB, 10)), 2 * kB) << "nothing changed";
  HintOutcome o = RetainS(5, 1, absl::InfiniteDuration());
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  Check("end");
}

// Remembered at a plain Release, at Release with hints, and at Pause; forgotten by
// InvalidateSession (a second one, and a RetainSession after it, are rejected).
TEST_F(SessionHintsEdgeTest, SessionRememberedAtEveryReleaseForm) {
  Make("reuse_index", 16, 32);
  WriteAndRelease(1, 11, Iota(2 * kB, 100));
  RunWritten(2, 12, Iota(3 * kB + 1, 200));
  EXPECT_EQ(Released(2, {.stop_reason = StopReason::kToolUse}).blocks, 3);
  RunWritten(3, 13, Iota(kB, 300));
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(3), absl::Seconds(2)));
  HintOutcome o = RetainS(11, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  o = RetainS(12, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 3);
  o = RetainS(13, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 1);
  Check("retained");
  o = InvalidateS(12);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 3);
  EXPECT_EQ(Cached(Iota(3 * kB, 200)), 0);
  EXPECT_EQ(InvalidateS(12).result, Result::kRejected);
  EXPECT_EQ(RetainS(12, 1, absl::Minutes(1)).result, Result::kRejected);
  // The paused request holds its blocks (below, or moving there): clipped, nothing dropped.
  Idle();
  o = InvalidateS(13);
  EXPECT_NE(o.result, Result::kRejected) << o.reason;
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  Idle();
  Check("end");
}

// The latest release replaces what the session remembered.
TEST_F(SessionHintsEdgeTest, SessionRemembersOnlyItsLatestRequest) {
  Make("lru");
  const std::vector<int32_t> first = Iota(3 * kB, 100), second = Iota(kB, 900);
  WriteAndRelease(1, 21, first);
  WriteAndRelease(2, 21, second);
  HintOutcome o = InvalidateS(21);
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 1);
  EXPECT_EQ(Cached(first), 3 * kB);
  EXPECT_EQ(Cached(second), 0);
  Check("end");
}

// After ResetPrefixCache the remembered blocks are gone: retain is clipped to 0, invalidate drops
// none; hints on a prefix likewise.
TEST_F(SessionHintsEdgeTest, HintsAfterResetPrefixCache) {
  for (int64_t dram : {0, 32}) {
    SCOPED_TRACE(dram);
    Make("reuse_index", 16, dram);
    const std::vector<int32_t> p = Iota(2 * kB, 100);
    WriteAndRelease(1, 31, p);
    KVTIER_ASSERT_OK_AND_ASSIGN(int64_t dropped, cache_->ResetPrefixCache());
    EXPECT_EQ(dropped, 2);
    Check("reset");
    HintOutcome o = RetainS(31, 1, absl::Minutes(1));
    EXPECT_EQ(o.result, Result::kClipped) << o.reason;
    EXPECT_EQ(o.blocks, 0);
    o = Retain(p, 1, absl::Minutes(1));
    EXPECT_EQ(o.result, Result::kClipped);
    EXPECT_EQ(o.blocks, 0);
    o = Invalidate(p, 0);
    EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
    EXPECT_EQ(o.blocks, 0);
    o = InvalidateS(31);
    EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
    EXPECT_EQ(o.blocks, 0);
    KVTIER_ASSERT_OK_AND_ASSIGN(int64_t n, cache_->Prefetch(p));
    EXPECT_EQ(n, 0);
    Check("end");
  }
}

// kv_cache.h: a release made while a later request of the session is live (superseded) changes
// nothing remembered; the later one is remembered when it lets go.
TEST_F(SessionHintsEdgeTest, SupersededReleaseIsNotRemembered) {
  Make("reuse_index");
  const std::vector<int32_t> p = Iota(2 * kB, 100);
  RunWritten(1, 41, p);
  ASSERT_EQ(AttachNew(2, p, /*session=*/41), 2 * kB);  // the session's next request
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  HintOutcome o = RetainS(41, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kRejected) << o.reason;
  EXPECT_EQ(o.blocks, 0);
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(2), Iota(kB, 900)).status());
  KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(2), 3 * kB));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  o = RetainS(41, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 3) << "request 2's written blocks";
  Check("end");
}

// Found by review: released out of order, the earlier request overwrote what the session
// remembered of the later one (RetainSession then retained 2 blocks, not the later 3).
TEST_F(SessionHintsEdgeTest, OutOfOrderReleaseKeepsTheLatestRequestRemembered) {
  Make("reuse_index");
  RunWritten(1, 42, Iota(2 * kB, 100));
  RunWritten(2, 42, Iota(3 * kB, 500));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  const HintOutcome o = RetainS(42, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 3) << "request 2's written blocks";
  Check("end");
}

// The bound of kRememberedSessions: the oldest session is forgotten first.
TEST_F(SessionHintsEdgeTest, RememberedSessionsAreBounded) {
  Make("lru", 16, 0);
  const int64_t n = KvCache::kRememberedSessions + 1;
  for (int64_t s = 1; s <= n; ++s) {
    const auto id = static_cast<uint64_t>(s);
    ASSERT_TRUE(cache_->CreateSequence(SequenceId(id), {.session = id}).ok());
    ASSERT_TRUE(cache_->Append(SequenceId(id), Iota(kB, static_cast<int32_t>(s * kB))).ok());
    ASSERT_TRUE(cache_->ReportWritten(SequenceId(id), kB).ok());
    ASSERT_TRUE(cache_->Release(SequenceId(id)).ok());
  }
  Check("after");
  EXPECT_EQ(RetainS(1, 1, absl::Minutes(1)).result, Result::kRejected) << "forgotten";
  HintOutcome o = RetainS(2, 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kClipped) << "remembered, its block evicted long ago";
  EXPECT_EQ(o.blocks, 0);
  o = RetainS(static_cast<uint64_t>(n), 1, absl::Minutes(1));
  EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
  EXPECT_EQ(o.blocks, 1);
}

// ---- Prefetch -----------------------------------------------------------------------------------

TEST_F(SessionHintsEdgeTest, PrefetchEdges) {
  Make("lru", 8, 32);
  KVTIER_ASSERT_OK_AND_ASSIGN(int64_t n, cache_->Prefetch({}));
  EXPECT_EQ(n, 0);
  KVTIER_ASSERT_OK_AND_ASSIGN(n, cache_->Prefetch(Iota(kB - 1, 1)));
  EXPECT_EQ(n, 0);
  SequenceOptions bad_extras;
  bad_extras.multimodal = {MultimodalItem{.start_token = 0, .num_tokens = 1, .digest = ""}};
  EXPECT_THAT(cache_->Prefetch(Iota(kB, 1), bad_extras).status(),
              IsError(StatusCode::kInvalidArgument, ""));
  const std::vector<int32_t> p = Iota(2 * kB, 100);
  WriteAndRelease(1, 1, p, 70);
  KVTIER_ASSERT_OK_AND_ASSIGN(n, cache_->Prefetch(p));
  EXPECT_EQ(n, 0) << "already in HBM";
  env_->clock().Advance(absl::Seconds(1));
  WriteAndRelease(2, 2, Iota(8 * kB, 5000));
  Idle();
  ASSERT_EQ(CachedIn(p, kDram), 2);
  KVTIER_ASSERT_OK(cache_->ResetPrefixCache(Tier::kHbm).status());  // HBM free for the prefetch
  Idle();
  ASSERT_EQ(CachedIn(p, kDram), 2);
  KVTIER_ASSERT_OK_AND_ASSIGN(n, cache_->Prefetch(p));
  EXPECT_EQ(n, 2);
  // Invalidate while the onboarding may still run: never a wrong block.
  (void)Invalidate(p, kB);
  Idle();
  Check("prefetched");
  const int64_t attached = AttachNew(3, p);
  EXPECT_TRUE(attached == kB || attached == 2 * kB) << attached;
  EXPECT_EQ(Mismatches(3, attached / kB, 70), 0);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  Idle();
  Check("end");
}

// ---- the whole API with every policy, with and without DRAM
// --------------------------------------

class SessionHintsEdgeParamTest
    : public SessionHintsEdgeTest,
      public ::testing::WithParamInterface<std::tuple<std::string, int64_t>> {};

TEST_P(SessionHintsEdgeParamTest, EveryHintUnderPressureKeepsKvCorrect) {
  const auto& [policy, dram] = GetParam();
  Make(policy, 12, dram);
  const std::vector<int32_t> sys = Iota(2 * kB, 1);  // a shared system prompt
  uint64_t id = 1;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    for (uint64_t s = 1; s <= 3; ++s) {
      const std::vector<int32_t> turn =
          Concat(sys, Iota(kB + 1, static_cast<int32_t>(10000 * s + 100 * round)));
      const uint64_t seq = id++;
      KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(seq), {.session = s}));
      KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult a, cache_->AttachPrefix(SequenceId(seq), turn));
      if (a.attached_tokens > 0) {
        EXPECT_EQ(Mismatches(seq, a.attached_tokens / kB, 555), 0) << "sys prompt KV";
      }
      const auto rest = absl::MakeConstSpan(turn).subspan(static_cast<size_t>(a.attached_tokens));
      KVTIER_ASSERT_OK(cache_->Append(SequenceId(seq), rest).status());
      const auto n = static_cast<int64_t>(turn.size());
      KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(SequenceId(seq), 0, n));
      const DeviceBlockTable table = t.block_table();
      for (int64_t b = a.attached_tokens / kB; b < 2; ++b) {
        WriteBlockPattern(env_->geometry(), table, static_cast<size_t>(b),
                          555 + static_cast<uint32_t>(b));
      }
      KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
      KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(seq), n));
      Check("written");
      switch ((round + s) % 4) {
        case 0: {
          KVTIER_ASSERT_OK(cache_->Pause(SequenceId(seq), absl::Seconds(static_cast<double>(s))));
          Check("paused");
          (void)InvalidateS(s);
          Check("invalidated session of paused");
          KVTIER_ASSERT_OK_AND_ASSIGN(Completion c, cache_->Resume(SequenceId(seq)));
          (void)c.Wait();
          EXPECT_EQ(Mismatches(seq, 2, 555), 0);
          HintOutcome o = Released(
              seq, {.stop_reason = StopReason::kToolUse, .expected_idle = absl::ZeroDuration()});
          EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
          EXPECT_EQ(o.blocks, 3);
          break;
        }
        case 1: {
          HintOutcome o = Released(seq, {.stop_reason = StopReason::kEndTurn,
                                         .expected_idle = absl::InfiniteDuration()});
          EXPECT_EQ(o.result, Result::kRejected);
          EXPECT_EQ(RetainS(s, 3, absl::Minutes(5)).result, Result::kAccepted);
          break;
        }
        case 2: {
          HintOutcome o = Released(seq, {.stop_reason = StopReason::kLength});
          EXPECT_EQ(o.result, Result::kAccepted);
          o = Invalidate(turn, 2 * kB);  // the turn's own block; sys stays
          EXPECT_EQ(o.result, Result::kAccepted) << o.reason;
          EXPECT_EQ(o.blocks, 1);
          EXPECT_EQ(Cached(turn), 2 * kB);
          break;
        }
        default: {
          HintOutcome o = Released(
              seq, {.stop_reason = StopReason::kToolUse, .expected_idle = absl::Milliseconds(1)});
          EXPECT_EQ(o.result, Result::kAccepted);
          (void)Retain(turn, kNaN, absl::Minutes(1));
          EXPECT_NE(Retain(sys, 1, absl::Hours(1)).result, Result::kRejected);
          (void)cache_->Prefetch(turn);
          break;
        }
      }
      Check("hinted");
      env_->clock().Advance(absl::Seconds(2));
    }
    // Pressure: a request that takes most of HBM.
    RunWritten(1000 + round, 99, Iota(10 * kB, 700000 + 1000 * round), 42);
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(1000 + round)));
    Check("pressure");
    if (round == 3) {
      KVTIER_ASSERT_OK(cache_->ResetPrefixCache().status());
      Check("reset");
    }
  }
  Idle();
  Check("end");
  testing::ExpectAllReleased(cache_->stats());
}

INSTANTIATE_TEST_SUITE_P(
    SessionHintsEdgeAll, SessionHintsEdgeParamTest,
    ::testing::Combine(::testing::Values("lru", "reuse_index", "learned", "cost_aware"),
                       ::testing::Values(int64_t{0}, int64_t{32})),
    [](const ::testing::TestParamInfo<std::tuple<std::string, int64_t>>& param_info) {
      return std::get<0>(param_info.param) +
             (std::get<1>(param_info.param) > 0 ? "_dram" : "_hbm_only");
    });

}  // namespace
}  // namespace kvtier
