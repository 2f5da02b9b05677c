// Session hints through KvCache (kv_cache.h Release(id, hints), Pause; session_hints.h): each
// answered with its outcome, and their effect on what the reuse_index policy keeps.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/cost_model.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::kvtier::testing::KvCacheEnv;

constexpr int kB = KvCacheEnv::kTokensPerBlock;

class SessionHintsTest : public ::testing::Test {
 protected:
  void Make(const std::string& policy, int64_t hbm_blocks = 16, int64_t dram_blocks = 0,
            bool demote_by_value = true) {
    env_ = std::make_unique<KvCacheEnv>(
        testing::KvCacheTestConfig{.hbm_blocks = hbm_blocks, .dram_blocks = dram_blocks});
    auto cache = env_->NewCache([&](KvCacheOptions& o) {
      o.eviction_policy = policy;
      o.demote_by_value = demote_by_value;
    });
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
  }
  void TearDown() override {
    if (cache_ != nullptr) {
      KVTIER_EXPECT_OK(cache_->CheckInvariants());
    }
  }

  // A request of `session` with `tokens`, computed and written, not released.
  void RunWritten(uint64_t id, uint64_t session, const std::vector<int32_t>& tokens) {
    testing::RunWritten(*cache_, id, session, tokens);
  }
  // A request of `session` that attaches what the cache has of `tokens`, computes the rest and
  // writes it, not released; returns the attached tokens (-1 on error, which it reports).
  int64_t RunAttached(uint64_t id, uint64_t session, const std::vector<int32_t>& tokens) {
    EXPECT_TRUE(cache_->CreateSequence(SequenceId(id), {.session = session}).ok());
    auto attach = cache_->AttachPrefix(SequenceId(id), tokens);
    EXPECT_TRUE(attach.ok()) << attach.status();
    if (!attach.ok()) return -1;
    const auto rest = absl::MakeConstSpan(tokens).subspan(attach->attached_tokens);
    EXPECT_TRUE(cache_->Append(SequenceId(id), rest).ok());
    EXPECT_TRUE(cache_->ReportWritten(SequenceId(id), static_cast<int64_t>(tokens.size())).ok());
    return attach->attached_tokens;
  }
  HintOutcome ReleaseWith(uint64_t id, ReleaseHints hints) {
    auto o = cache_->Release(SequenceId(id), hints);
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : HintOutcome{};
  }
  int64_t Cached(const std::vector<int32_t>& tokens) {
    auto l = cache_->Lookup(tokens);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? l->matched_tokens : -1;
  }

  std::unique_ptr<KvCacheEnv> env_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(SessionHintsTest, ReleaseAnswersEachHintWithItsOutcome) {
  Make("reuse_index");
  RunWritten(1, /*session=*/7, Iota(3 * kB + 1, 100));
  HintOutcome o =
      ReleaseWith(1, {.stop_reason = StopReason::kToolUse, .expected_idle = absl::Seconds(9)});
  EXPECT_EQ(o.result, HintOutcome::Result::kAccepted);
  EXPECT_EQ(o.reason, "");
  EXPECT_EQ(o.blocks, 3);  // the written full blocks; the partial one is freed
  EXPECT_EQ(Cached(Iota(3 * kB + 1, 100)), 3 * kB);

  // A bad idle estimate is rejected, the stop reason taken, and the release still happens.
  RunWritten(2, 7, Iota(2 * kB, 300));
  o = ReleaseWith(2, {.stop_reason = StopReason::kEndTurn, .expected_idle = absl::Seconds(-1)});
  EXPECT_EQ(o.result, HintOutcome::Result::kRejected);
  EXPECT_NE(o.reason.find("expected_idle"), std::string::npos) << o.reason;
  EXPECT_THAT(cache_->Release(SequenceId(2)), IsError(StatusCode::kFailedPrecondition, "released"));
  EXPECT_EQ(Cached(Iota(2 * kB, 300)), 2 * kB);

  // Both rules at once (a bad estimate; last_turn on a preempted request): kRejected, and the
  // preemption is counted whatever the outcome.
  RunWritten(4, 7, Iota(kB, 700));
  const int64_t preemptions = cache_->stats().preemptions;
  o = ReleaseWith(4, {.stop_reason = StopReason::kEndTurn,
                      .expected_idle = absl::InfiniteDuration(),
                      .preempted = true,
                      .last_turn = true});
  EXPECT_EQ(o.result, HintOutcome::Result::kRejected);
  EXPECT_NE(o.reason.find("expected_idle"), std::string::npos) << o.reason;
  EXPECT_EQ(cache_->stats().preemptions, preemptions + 1);

  // No session: nothing to tie the hint to; released all the same.
  RunWritten(3, 0, Iota(kB, 500));
  o = ReleaseWith(3, {.stop_reason = StopReason::kToolUse});
  EXPECT_EQ(o.result, HintOutcome::Result::kRejected);
  EXPECT_NE(o.reason.find("no session"), std::string::npos) << o.reason;
  EXPECT_EQ(o.blocks, 1);
  EXPECT_THAT(cache_->Release(SequenceId(3)), IsError(StatusCode::kFailedPrecondition, "released"));

  // Errors are the sequence's own.
  EXPECT_THAT(cache_->Release(SequenceId(99), ReleaseHints{}).status(),
              IsError(StatusCode::kNotFound, ""));
}

// last_turn on a release that a later request of the session supersedes (created after it, or a
// Fork's child) is not used, and the answer says so: kClipped. The later request's last_turn is
// taken. Without last_turn, a superseded release is accepted as any.
TEST_F(SessionHintsTest, ALastTurnOfASupersededReleaseIsClipped) {
  Make("reuse_index");
  RunWritten(1, /*session=*/7, Iota(2 * kB, 100));
  RunWritten(2, 7, Iota(2 * kB, 300));
  // With an estimate too: it is last_turn that is not used (the estimate is, where last_turn
  // would have set it aside).
  HintOutcome o = ReleaseWith(
      1,
      {.stop_reason = StopReason::kEndTurn, .expected_idle = absl::Seconds(30), .last_turn = true});
  EXPECT_EQ(o.result, HintOutcome::Result::kClipped);
  EXPECT_NE(o.reason.find("later request"), std::string::npos) << o.reason;
  EXPECT_EQ(o.blocks, 2);
  o = ReleaseWith(2, {.stop_reason = StopReason::kEndTurn, .last_turn = true});
  EXPECT_EQ(o.result, HintOutcome::Result::kAccepted) << o.reason;

  RunWritten(3, 8, Iota(kB, 500));
  RunWritten(4, 8, Iota(kB, 600));
  o = ReleaseWith(3, {.stop_reason = StopReason::kToolUse});
  EXPECT_EQ(o.result, HintOutcome::Result::kAccepted) << o.reason;
  KVTIER_ASSERT_OK(cache_->Fork(SequenceId(4), SequenceId(5), kB).status());
  o = ReleaseWith(4, {.stop_reason = StopReason::kEndTurn, .last_turn = true});
  EXPECT_EQ(o.result, HintOutcome::Result::kClipped) << o.reason;
  o = ReleaseWith(5, {.stop_reason = StopReason::kEndTurn, .last_turn = true});
  EXPECT_EQ(o.result, HintOutcome::Result::kAccepted) << o.reason;
}

// 100 sessions: each request ends in tool_use and its session is back 5 s later; that second
// request ends in end_turn and its session never returns. Then X (tool_use, released first) and
// Y (end_turn, released after) wait, and a 15-block request leaves room for one of them. LRU keeps
// Y, the newer; reuse_index, having learned what the stop reasons mean, keeps X.
TEST_F(SessionHintsTest, StopReasonsDecideWhichReleasedSessionIsKept) {
  for (const std::string policy : {"lru", "reuse_index"}) {
    Make(policy);
    uint64_t id = 1;
    for (uint64_t s = 1; s <= 100; ++s) {
      const std::vector<int32_t> first = Iota(kB, static_cast<int32_t>(s * 1000));
      std::vector<int32_t> second = first;
      for (int32_t v : Iota(kB, static_cast<int32_t>(s * 1000 + 500))) second.push_back(v);
      RunWritten(id, s, first);
      ReleaseWith(id++, {.stop_reason = StopReason::kToolUse});
      env_->clock().Advance(absl::Seconds(5));
      ASSERT_GE(RunAttached(id, s, second), 0);
      ReleaseWith(id++, {.stop_reason = StopReason::kEndTurn});
      env_->clock().Advance(absl::Seconds(7));
    }
    const std::vector<int32_t> x = Iota(kB, 900000), y = Iota(kB, 910000);
    RunWritten(id, 5000, x);
    ReleaseWith(id++, {.stop_reason = StopReason::kToolUse});
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(id, 5001, y);
    ReleaseWith(id++, {.stop_reason = StopReason::kEndTurn});
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(id, 5002, Iota(15 * kB, 920000));  // held: 15 of the 16 HBM slots
    const bool x_kept = Cached(x) == kB, y_kept = Cached(y) == kB;
    EXPECT_NE(x_kept, y_kept) << policy;
    if (policy == "lru") {
      EXPECT_TRUE(y_kept) << "lru keeps the newer release";
    } else {
      EXPECT_TRUE(x_kept) << "reuse_index keeps the session that comes back";
    }
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(id)));
  }
}

// Tier-aware value: a victim its session moved on from (the session's next request did not read
// it) is not worth restoring, so it is dropped, not demoted to DRAM; the session's current block,
// of which nothing is known yet, is demoted. With demote_by_value off, both are demoted.
TEST_F(SessionHintsTest, AVictimNotWorthRestoringIsDroppedNotDemoted) {
  for (const bool by_value : {true, false}) {
    Make("reuse_index", /*hbm_blocks=*/16, /*dram_blocks=*/32, by_value);
    const std::vector<int32_t> a = Iota(kB, 1000), b = Iota(kB, 2000);
    RunWritten(1, /*session=*/7, a);
    ReleaseWith(1, {.stop_reason = StopReason::kToolUse});
    env_->clock().Advance(absl::Seconds(5));
    // The session comes back with another context (a compaction): block a is not in it.
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(2), {.session = 7}));
    KVTIER_ASSERT_OK(cache_->AttachPrefix(SequenceId(2), b).status());
    KVTIER_ASSERT_OK(cache_->Append(SequenceId(2), b).status());
    KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(2), kB));
    ReleaseWith(2, {.stop_reason = StopReason::kToolUse});
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(3, /*session=*/9, Iota(16 * kB, 5000));  // every HBM slot: a and b go
    const KvCacheStats stats = cache_->stats();
    EXPECT_EQ(Cached(b), kB) << "demoted to DRAM";
    if (by_value) {
      EXPECT_EQ(Cached(a), 0) << "dropped";
      EXPECT_EQ(stats.tiers[0].value_drops, 1);
    } else {
      EXPECT_EQ(Cached(a), kB);
      EXPECT_EQ(stats.tiers[0].value_drops, 0);
    }
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  }
}

// Tier-aware value with a positive chance: a victim is demoted only if p x (recompute - restore)
// pays for the copy down. 30 sessions let a block go after tool_use and 6 come back 5 s later;
// two minutes on (a refresh has counted those 30 lives in the table's first bucket; the next
// bucket, [120 s, 180 s), is not counted until 180 s, so the first 30 blocks still have no
// estimate and are demoted either way), 24 more let theirs go, and 2 s into their wait each has
// a chance near 0.19. A request that needs every HBM slot then evicts all 54. With the copy down
// as long as the restore and a third of the recompute time, demoting pays only from p = 0.5: the
// 24 are dropped. With a tenth, it pays from p = 0.11: they are demoted. Without
// demote_by_value, all are.
TEST_F(SessionHintsTest, AVictimIsDemotedOnlyIfItsChanceOfReusePaysForTheCopy) {
  const int64_t block_bytes = KvCacheEnv::Geometry().bytes_per_block();
  const PrefillCostOptions cost{
      .params = 1e6, .num_layers = 2, .d_model = 64, .flops_per_second = 1e9};
  auto model = PrefillCostModel::Create(cost);
  ASSERT_TRUE(model.ok()) << model.status();
  const double recompute_s = absl::ToDoubleSeconds(model->RecomputeTime(0, kB));
  struct Case {
    double restore_share;  // of the first block's recompute time
    bool by_value;
    int64_t dropped;
  };
  for (const Case c : {Case{1.0 / 3, true, 24}, Case{0.1, true, 0}, Case{1.0 / 3, false, 0}}) {
    SCOPED_TRACE(absl::StrCat("restore ", c.restore_share, " of recompute, by value ", c.by_value));
    env_ = std::make_unique<KvCacheEnv>(
        testing::KvCacheTestConfig{.hbm_blocks = 64, .dram_blocks = 128});
    auto cache = env_->NewCache([&](KvCacheOptions& o) {
      o.eviction_policy = "reuse_index";
      o.demote_by_value = c.by_value;
      o.prefill_cost = cost;
      o.measure_bandwidth = false;
      o.links[TierIndex(Tier::kDram)] = {
          absl::ZeroDuration(), static_cast<double>(block_bytes) / (c.restore_share * recompute_s)};
    });
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    uint64_t id = 1;
    auto prompt = [](uint64_t s) { return Iota(kB, static_cast<int32_t>(s * 1000)); };
    for (uint64_t s = 1; s <= 30; ++s) {
      RunWritten(id, s, prompt(s));
      ReleaseWith(id++, {.stop_reason = StopReason::kToolUse});
    }
    env_->clock().Advance(absl::Seconds(5));
    for (uint64_t s = 1; s <= 6; ++s) {  // back, with one token more
      std::vector<int32_t> next = prompt(s);
      next.push_back(7);
      EXPECT_EQ(RunAttached(id, s, next), kB);
      ReleaseWith(id++, {.stop_reason = StopReason::kEndTurn});
    }
    env_->clock().Advance(absl::Minutes(2));
    for (uint64_t s = 31; s <= 54; ++s) {
      RunWritten(id, s, prompt(s));
      ReleaseWith(id++, {.stop_reason = StopReason::kToolUse});
    }
    env_->clock().Advance(absl::Seconds(2));
    RunWritten(id, 99, Iota(64 * kB, 900000));  // every HBM slot: all 54 blocks go
    KVTIER_ASSERT_OK(cache_->WaitIdle());
    const KvCacheStats stats = cache_->stats();
    EXPECT_EQ(stats.tiers[0].value_drops, c.dropped);
    EXPECT_EQ(stats.tiers[0].demotions, 54 - c.dropped);
    for (uint64_t s = 1; s <= 54; ++s) {
      EXPECT_EQ(Cached(prompt(s)), s > 30 && c.dropped > 0 ? 0 : kB) << "session " << s;
    }
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(id)));
    KVTIER_EXPECT_OK(cache_->CheckInvariants());
  }
}

// last_turn: the session sends nothing more. Its block goes first though younger (no data yet:
// otherwise the oldest goes) and, not worth restoring, is dropped rather than demoted; without
// the hint, or with it on a preempted request (which comes back: kClipped), the older block of
// the other session is the victim, demoted to DRAM.
TEST_F(SessionHintsTest, ALastTurnReleaseGoesFirstAndIsDropped) {
  for (const int mode : {0, 1, 2}) {
    const bool last_turn = mode == 0;
    SCOPED_TRACE(mode == 0 ? "last_turn" : mode == 1 ? "no hint" : "last_turn, preempted");
    Make("reuse_index", /*hbm_blocks=*/16, /*dram_blocks=*/32);
    const std::vector<int32_t> a = Iota(kB, 1000), b = Iota(kB, 2000);
    RunWritten(1, /*session=*/7, a);
    ReleaseWith(1, {.stop_reason = StopReason::kToolUse});
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(2, /*session=*/8, b);
    HintOutcome o = ReleaseWith(2, {.stop_reason = StopReason::kEndTurn,
                                    .preempted = mode == 2,
                                    .last_turn = mode != 1});
    EXPECT_EQ(o.result,
              mode == 2 ? HintOutcome::Result::kClipped : HintOutcome::Result::kAccepted);
    if (mode == 2) {
      EXPECT_NE(o.reason.find("preempted"), std::string::npos) << o.reason;
    }
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(3, /*session=*/9, Iota(15 * kB, 5000));  // one slot short: one victim
    const KvCacheStats stats = cache_->stats();
    auto in_hbm = [&](const std::vector<int32_t>& p) {
      auto l = cache_->Lookup(p);
      EXPECT_TRUE(l.ok()) << l.status();
      return l.ok() ? l->blocks_by_tier[0] : -1;
    };
    if (last_turn) {
      EXPECT_EQ(Cached(b), 0) << "dropped";
      EXPECT_EQ(in_hbm(a), 1);
      EXPECT_EQ(stats.tiers[0].value_drops, 1);
    } else {
      EXPECT_EQ(in_hbm(b), 1);
      EXPECT_EQ(in_hbm(a), 0);
      EXPECT_EQ(Cached(a), kB) << "demoted to DRAM";
      EXPECT_EQ(stats.tiers[0].value_drops, 0);
    }
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  }
}

// An idle estimate given with last_turn is not used (no next request to wait for): kClipped.
TEST_F(SessionHintsTest, AnIdleEstimateWithLastTurnIsClipped) {
  Make("reuse_index");
  RunWritten(1, /*session=*/7, Iota(2 * kB, 100));
  HintOutcome o = ReleaseWith(1, {.stop_reason = StopReason::kEndTurn,
                                  .expected_idle = absl::Seconds(30),
                                  .last_turn = true});
  EXPECT_EQ(o.result, HintOutcome::Result::kClipped);
  EXPECT_NE(o.reason.find("last_turn"), std::string::npos) << o.reason;
  EXPECT_EQ(o.blocks, 2);
}

TEST_F(SessionHintsTest, RetainKeepsAPrefixOverNewerBlocks) {
  for (const std::string policy : {"lru", "reuse_index"}) {
    Make(policy, /*hbm_blocks=*/8);
    const std::vector<int32_t> kept = Iota(2 * kB, 100), other = Iota(2 * kB, 200);
    RunWritten(1, 1, kept);
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(2, 2, other);
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
    // Three of the prompt's blocks asked for, two cached: clipped to those.
    std::vector<int32_t> longer = kept;
    for (int32_t v : Iota(kB, 300)) longer.push_back(v);
    auto o = cache_->RetainPrefix(longer, 2.0, absl::Minutes(10));
    KVTIER_ASSERT_OK(o.status());
    EXPECT_EQ(o->result, HintOutcome::Result::kClipped) << policy;
    EXPECT_EQ(o->blocks, 2) << policy;
    env_->clock().Advance(absl::Seconds(1));
    // 6 new blocks held: two of the four cached ones must go. Without the retention the older
    // prompt would (both policies evict it first with no other signal).
    RunWritten(3, 3, Iota(6 * kB, 400));
    EXPECT_EQ(Cached(kept), 2 * kB) << policy;
    EXPECT_EQ(Cached(other), 0) << policy;
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
    auto bad = cache_->RetainPrefix(kept, -1, absl::Minutes(1));
    KVTIER_ASSERT_OK(bad.status());
    EXPECT_EQ(bad->result, HintOutcome::Result::kRejected);
  }
}

TEST_F(SessionHintsTest, InvalidateDropsTheDeadPartOfAContext) {
  Make("reuse_index");
  const std::vector<int32_t> context = Iota(4 * kB, 100);
  RunWritten(1, 1, context);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  // A second conversation shares the first block and holds it.
  std::vector<int32_t> shared(context.begin(), context.begin() + kB);
  RunWritten(2, 2, shared);
  // Compaction from token 1 * kB: blocks 1-3 are dead; block 0 stays (and is held anyway).
  auto o = cache_->InvalidatePrefix(context, kB);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kAccepted) << o->reason;
  EXPECT_EQ(o->blocks, 3);
  EXPECT_EQ(Cached(context), kB);
  // From token 0 the held first block is kept: clipped.
  o = cache_->InvalidatePrefix(context, 0);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kClipped);
  EXPECT_EQ(o->blocks, 0);
  EXPECT_EQ(Cached(context), kB);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  o = cache_->InvalidatePrefix(context, 0);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kAccepted);
  EXPECT_EQ(o->blocks, 1);
  EXPECT_EQ(Cached(context), 0);
  auto bad = cache_->InvalidatePrefix(context, -1);
  KVTIER_ASSERT_OK(bad.status());
  EXPECT_EQ(bad->result, HintOutcome::Result::kRejected);
}

// The session forms: RetainSession keeps the blocks of session 1's released request over newer
// ones as RetainPrefix does, with no tokens to name; InvalidateSession drops a session's dead
// blocks (a block another session holds stays) and forgets it.
TEST_F(SessionHintsTest, RetainSessionKeepsTheSessionsReleasedBlocks) {
  for (const std::string policy : {"lru", "reuse_index"}) {
    Make(policy, /*hbm_blocks=*/8);
    const std::vector<int32_t> kept = Iota(2 * kB, 100), other = Iota(2 * kB, 200);
    RunWritten(1, 1, kept);
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(2, 2, other);
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
    auto o = cache_->RetainSession(1, 2.0, absl::Minutes(10));
    KVTIER_ASSERT_OK(o.status());
    EXPECT_EQ(o->result, HintOutcome::Result::kAccepted) << policy << ": " << o->reason;
    EXPECT_EQ(o->blocks, 2) << policy;
    env_->clock().Advance(absl::Seconds(1));
    RunWritten(3, 3, Iota(6 * kB, 400));
    EXPECT_EQ(Cached(kept), 2 * kB) << policy;
    EXPECT_EQ(Cached(other), 0) << policy;
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
    for (auto [session, priority] : {std::pair<uint64_t, double>{99, 1.0}, {0, 1.0}, {1, -1.0}}) {
      auto bad = cache_->RetainSession(session, priority, absl::Minutes(1));
      KVTIER_ASSERT_OK(bad.status());
      EXPECT_EQ(bad->result, HintOutcome::Result::kRejected) << session;
      EXPECT_FALSE(bad->reason.empty());
    }
  }
}

// The leading blocks another remembered session's prompt starts with stay: invalidating the
// session that extended that prompt drops only its own blocks.
TEST_F(SessionHintsTest, InvalidateSessionKeepsTheBlocksAnotherSessionsPromptStartsWith) {
  Make("reuse_index");
  const std::vector<int32_t> context = Iota(4 * kB, 100);
  const std::vector<int32_t> prefix(context.begin(), context.begin() + 2 * kB);
  RunWritten(1, 1, prefix);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  env_->clock().Advance(absl::Seconds(1));
  EXPECT_EQ(RunAttached(2, 2, context), 2 * kB);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  auto o = cache_->InvalidateSession(2);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kClipped) << o->reason;
  EXPECT_NE(o->reason.find("first 2 blocks are kept"), std::string::npos) << o->reason;
  EXPECT_EQ(o->blocks, 2);
  EXPECT_EQ(Cached(context), 2 * kB);  // session 1's prompt
  // Session 2 is forgotten: nothing keeps session 1's blocks from its own invalidation.
  o = cache_->InvalidateSession(1);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kAccepted) << o->reason;
  EXPECT_EQ(o->blocks, 2);
  EXPECT_EQ(Cached(context), 0);
}

// A sequence with caching off shares no block: its hints are rejected and its session remembers
// nothing, so they cannot rank, retain or drop blocks another request cached under its tokens.
TEST_F(SessionHintsTest, HintsOfASequenceWithCachingOffTouchNoCachedBlock) {
  Make("reuse_index");
  const std::vector<int32_t> tokens = Iota(2 * kB, 100);
  RunWritten(1, 1, tokens);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(2), {.session = 2, .enable_caching = false}));
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(2), tokens).status());
  KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(2), static_cast<int64_t>(tokens.size())));
  auto o = cache_->Release(SequenceId(2), {.stop_reason = StopReason::kEndTurn, .last_turn = true});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kRejected);
  EXPECT_NE(o->reason.find("caching off"), std::string::npos) << o->reason;
  auto invalidated = cache_->InvalidateSession(2);
  KVTIER_ASSERT_OK(invalidated.status());
  EXPECT_EQ(invalidated->result, HintOutcome::Result::kRejected) << invalidated->reason;
  auto retained = cache_->RetainSession(2, 1.0, absl::Minutes(1));
  KVTIER_ASSERT_OK(retained.status());
  EXPECT_EQ(retained->result, HintOutcome::Result::kRejected) << retained->reason;
  EXPECT_EQ(Cached(tokens), 2 * kB);
}

TEST_F(SessionHintsTest, InvalidateSessionDropsItsBlocksAndForgetsIt) {
  Make("reuse_index");
  const std::vector<int32_t> context = Iota(4 * kB, 100);
  RunWritten(1, 1, context);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  std::vector<int32_t> shared(context.begin(), context.begin() + kB);
  RunWritten(2, 2, shared);  // holds the first block
  auto o = cache_->InvalidateSession(1);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kClipped) << o->reason;
  EXPECT_EQ(o->blocks, 3);
  EXPECT_EQ(Cached(context), kB);
  o = cache_->InvalidateSession(1);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kRejected) << "forgotten after the first";
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  // Session 2's release is remembered: its one block goes.
  o = cache_->InvalidateSession(2);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kAccepted) << o->reason;
  EXPECT_EQ(o->blocks, 1);
  EXPECT_EQ(Cached(context), 0);
  KVTIER_EXPECT_OK(cache_->CheckInvariants());
}

}  // namespace
}  // namespace kvtier
