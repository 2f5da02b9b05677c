// KC-5: a block computed by two requests at once. Two sequences miss the same 48-token prefix,
// both compute it and report it written. The second one's copies were never indexed
// (ReportWritten skipped a key that already had an HBM copy): HBM held the prefix twice, Pause
// did not move the second sequence's references down, and once the first sequence's copies were
// evicted Lookup of the prefix found nothing although the second sequence still held the bytes.
// Now one block key has one HBM copy: once a duplicate's own write has completed, its holders
// take the indexed copy (the duplicate is freed), and if the indexed copy was still being
// written and then failed, the duplicate becomes the indexed copy.
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::kvtier::testing::BlockPatternMismatches;
using ::kvtier::testing::Iota;
using ::kvtier::testing::KvCacheEnv;
using ::kvtier::testing::StatsString;
using ::kvtier::testing::WriteBlockPattern;

constexpr int kB = KvCacheEnv::kTokensPerBlock;
constexpr int kPrefixTokens = 48;
constexpr int kPrefixBlocks = kPrefixTokens / kB;
constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr int kDram = TierIndex(Tier::kDram);

class Regress_KC_5 : public testing::KvCacheFixture {
 protected:
  // Sequence `id` misses the prefix: nothing of it is cached yet.
  void MissPrefix(uint64_t id) {
    const SequenceId seq(id);
    KVTIER_ASSERT_OK(cache_->CreateSequence(seq));
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(seq, prefix_));
    ASSERT_EQ(r.attached_tokens, 0);
    KVTIER_ASSERT_OK(cache_->Append(seq, prefix_).status());
  }
  // Its kernel writes every block's bytes (the same bytes for the same block, whoever computes
  // it) and the sequence reports them written, ready when `ready` fires.
  void ComputePrefix(uint64_t id, Completion ready = Completion::Done(absl::OkStatus())) {
    const SequenceId seq(id);
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(seq, 0, kPrefixTokens));
    for (size_t i = 0; i < kPrefixBlocks; ++i) {
      ASSERT_NO_FATAL_FAILURE(
          WriteBlockPattern(env_->geometry(), t.block_table(), i, static_cast<uint32_t>(i + 1)));
    }
    KVTIER_ASSERT_OK(cache_->ReportWritten(seq, kPrefixTokens, ready));
    KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
  }
  // Both sequences miss the prefix, then compute it: 1 reports first.
  void ComputeTwice(Completion first_ready = Completion::Done(absl::OkStatus())) {
    ASSERT_NO_FATAL_FAILURE(MissPrefix(1));
    ASSERT_NO_FATAL_FAILURE(MissPrefix(2));
    ASSERT_NO_FATAL_FAILURE(ComputePrefix(1, first_ready));
    ASSERT_NO_FATAL_FAILURE(ComputePrefix(2));
  }

  // The sequence's blocks read back as the prefix's bytes.
  void ExpectPrefixBytes(uint64_t id) {
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t,
                                cache_->EnsureResident(SequenceId(id), 0, kPrefixTokens));
    for (size_t i = 0; i < kPrefixBlocks; ++i) {
      EXPECT_EQ(BlockPatternMismatches(env_->geometry(), t.block_table(), i,
                                       static_cast<uint32_t>(i + 1)),
                0)
          << "block " << i;
    }
    KVTIER_EXPECT_OK(cache_->ReleaseTicket(t));
  }

  // The first sequence goes; another request needs as many slots as the prefix has blocks
  // (with no lower tier, an evicted block is lost). What sequence 2 holds stays findable.
  void ExpectPrefixOutlivesFirstSequence() {
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(3)));
    KVTIER_ASSERT_OK(cache_->Append(SequenceId(3), Iota(kPrefixTokens, 5000)).status());
    KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(prefix_));
    EXPECT_EQ(where.matched_tokens, kPrefixTokens) << StatsString(cache_->stats());
  }

  const std::vector<int32_t> prefix_ = Iota(kPrefixTokens, 100);
};

TEST_F(Regress_KC_5, SecondCopyIsDroppedAndThePrefixStaysFindable) {
  Build({.hbm_blocks = 2 * kPrefixBlocks, .dram_blocks = 0});
  ComputeTwice();
  // One HBM copy per block, referenced by both sequences; the duplicates are free again.
  KvCacheStats s = cache_->stats();
  EXPECT_EQ(s.tiers[kHbm].held_blocks, kPrefixBlocks) << StatsString(s);
  EXPECT_EQ(s.tiers[kHbm].free_blocks, kPrefixBlocks) << StatsString(s);
  ExpectPrefixBytes(2);
  ASSERT_NO_FATAL_FAILURE(ExpectPrefixOutlivesFirstSequence());
  ExpectPrefixBytes(2);
}

TEST_F(Regress_KC_5, PauseMovesTheSecondSequenceDown) {
  Build({.hbm_blocks = 2 * kPrefixBlocks, .dram_blocks = 2 * kPrefixBlocks});
  ComputeTwice();
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(2), absl::Minutes(1)));
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
  KVTIER_ASSERT_OK_AND_ASSIGN(SequenceInfo info, cache_->GetSequence(SequenceId(2)));
  EXPECT_EQ(info.blocks_by_tier[kHbm], 0) << StatsString(cache_->stats());
  EXPECT_EQ(info.blocks_by_tier[kDram], kPrefixBlocks);
  // Only sequence 1 holds HBM now.
  EXPECT_EQ(cache_->stats().tiers[kHbm].held_blocks, kPrefixBlocks) << StatsString(cache_->stats());
}

TEST_F(Regress_KC_5, DuplicateWrittenFirstTakesOverWhenTheFirstCopyFails) {
  Build({.hbm_blocks = 2 * kPrefixBlocks, .dram_blocks = 0});
  // Sequence 1 reports first, but its kernel is still running; sequence 2's copy is complete.
  Completion first_kernel;
  ComputeTwice(first_kernel);
  // Sequence 1's kernel fails: its blocks are not the prefix. Sequence 2's are.
  first_kernel.Complete(absl::InternalError("injected: kernel failed"));
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(prefix_));
  EXPECT_EQ(where.matched_tokens, kPrefixTokens) << StatsString(cache_->stats());
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  KVTIER_ASSERT_OK_AND_ASSIGN(where, cache_->Lookup(prefix_));
  EXPECT_EQ(where.matched_tokens, kPrefixTokens);
  ExpectPrefixBytes(2);
  // A third request finds it and attaches the one copy.
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(3)));
  std::vector<int32_t> query = prefix_;
  query.push_back(1);
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(SequenceId(3), query));
  EXPECT_EQ(r.attached_tokens, kPrefixTokens);
  EXPECT_EQ(cache_->stats().tiers[kHbm].held_blocks, kPrefixBlocks);
}

TEST_F(Regress_KC_5, DuplicateWrittenFirstJoinsTheFirstCopyWhenItLands) {
  Build({.hbm_blocks = 2 * kPrefixBlocks, .dram_blocks = 0});
  Completion first_kernel;
  ComputeTwice(first_kernel);
  first_kernel.Complete(absl::OkStatus());
  const KvCacheStats s = cache_->stats();
  EXPECT_EQ(s.tiers[kHbm].held_blocks, kPrefixBlocks) << StatsString(s);
  ExpectPrefixBytes(2);
  ASSERT_NO_FATAL_FAILURE(ExpectPrefixOutlivesFirstSequence());
}

}  // namespace
}  // namespace kvtier
