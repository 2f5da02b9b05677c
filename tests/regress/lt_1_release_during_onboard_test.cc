// LT-1: start an onboard into HBM slots for sequence A, release A while the copy is in flight,
// allocate sequence B: B never receives A's slots until the copy has completed or been
// confirmed dead, and B's blocks never hold A's bytes.
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
using ::kvtier::testing::StatsString;
using ::kvtier::testing::WriteBlockPattern;
using ::testing::Each;

constexpr int kB = testing::KvCacheEnv::kTokensPerBlock;
constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr int64_t kHbmBlocks = 8;

TEST(Regress_LT_1, InFlightOnboardSlotsAreNeverHandedToAnotherSequence) {
  testing::KvCacheEnv env({.hbm_blocks = kHbmBlocks, .dram_blocks = 16, .fault_injectors = true});
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache, env.NewCache());
  const KvGeometry& g = env.geometry();

  // A 4-block prompt with known bytes, cached and then moved out of HBM to DRAM: a filler
  // sequence takes every HBM slot (demoting the prompt's blocks) and is released unwritten.
  const std::vector<int32_t> prompt = Iota(4 * kB, 100);
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(1)));
  KVTIER_ASSERT_OK(cache->Append(SequenceId(1), prompt).status());
  {
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache->EnsureResident(SequenceId(1), 0, 4 * kB));
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_NO_FATAL_FAILURE(
          WriteBlockPattern(g, t.block_table(), i, static_cast<uint32_t>(i + 1)));
    }
    KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(1), 4 * kB));
    KVTIER_ASSERT_OK(cache->ReleaseTicket(t));
  }
  KVTIER_ASSERT_OK(cache->Release(SequenceId(1)));
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(9)));
  KVTIER_ASSERT_OK(cache->Append(SequenceId(9), Iota(kHbmBlocks * kB, 90000)).status());
  KVTIER_ASSERT_OK(cache->Release(SequenceId(9)));
  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
  std::vector<int32_t> query = prompt;
  query.push_back(7);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache->Lookup(query));
  ASSERT_EQ(where.blocks_by_tier[TierIndex(Tier::kDram)], 4) << StatsString(cache->stats());

  // Sequence A attaches the prompt; onboarding it into HBM is slow (300 ms per block, one after
  // the other), so A's deadline passes with every copy still running, and A gives up: it
  // releases its ticket and itself while the copies are in flight.
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult attached, cache->AttachPrefix(SequenceId(2), query));
  ASSERT_EQ(attached.attached_tokens, 4 * kB);
  env.fault(Tier::kHbm)->SetDelay(absl::Milliseconds(300));
  KVTIER_ASSERT_OK_AND_ASSIGN(
      ResidencyTicket a,
      cache->EnsureResident(SequenceId(2), 0, 4 * kB,
                            {.deadline = absl::Now() + absl::Milliseconds(100)}));
  EXPECT_THAT(a.block_status(), Each(BlockResidency::kNotResident));
  KVTIER_ASSERT_OK(cache->ReleaseTicket(a));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(2)));
  const KvCacheStats during = cache->stats();
  ASSERT_EQ(during.tiers[kHbm].in_flight_blocks, 4)
      << "the scenario needs A's copies in flight now\n"
      << StatsString(during);
  ASSERT_EQ(during.tiers[kHbm].free_blocks, kHbmBlocks - 4);

  // Sequence B takes the free HBM slots at once, and its kernel writes B's bytes into them at
  // once: a late write of A into one of them would overwrite those bytes. B's fifth block has
  // no slot while A's copies are in flight: the append is refused (or waits until one of them
  // has landed, when that block is only droppable).
  env.fault(Tier::kHbm)->SetDelay(absl::ZeroDuration());
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(3)));
  KVTIER_ASSERT_OK(cache->Append(SequenceId(3), Iota(4 * kB, 5000)).status());
  EXPECT_EQ(cache->stats().tiers[kHbm].in_flight_blocks, 4) << "A's copies landed too early";
  {
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache->EnsureResident(SequenceId(3), 0, 4 * kB));
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_NO_FATAL_FAILURE(
          WriteBlockPattern(g, t.block_table(), i, static_cast<uint32_t>(100 + i)));
    }
    KVTIER_ASSERT_OK(cache->ReleaseTicket(t));
  }
  const absl::StatusOr<KvAppendResult> fifth = cache->Append(SequenceId(3), Iota(kB, 6000));
  if (!fifth.ok()) {
    EXPECT_TRUE(absl::IsResourceExhausted(fifth.status())) << fifth.status();
    EXPECT_GT(cache->stats().tiers[kHbm].in_flight_blocks, 0)
        << "refused although A's copies had landed";
    KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
    KVTIER_ASSERT_OK(cache->Append(SequenceId(3), Iota(kB, 6000)).status());
  }
  {
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t,
                                cache->EnsureResident(SequenceId(3), 4 * kB, 5 * kB));
    ASSERT_NO_FATAL_FAILURE(WriteBlockPattern(g, t.block_table(), 0, 104));
    KVTIER_ASSERT_OK(cache->ReleaseTicket(t));
  }

  // Once every copy of A has landed, B's blocks still hold B's bytes, five distinct slots.
  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
  {
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache->EnsureResident(SequenceId(3), 0, 5 * kB));
    ASSERT_THAT(t.block_status(), Each(BlockResidency::kResident));
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(BlockPatternMismatches(g, t.block_table(), i, static_cast<uint32_t>(100 + i)), 0)
          << "B's block " << i << " (slot " << t.block_table().slots[i] << ") holds A's bytes";
    }
    KVTIER_ASSERT_OK(cache->ReleaseTicket(t));
  }
  // And A's blocks, attached again, hold the prompt's bytes, not B's. (B goes first: its
  // unwritten blocks are freed, so the block B's fifth one evicted can be onboarded again.)
  KVTIER_ASSERT_OK(cache->Release(SequenceId(3)));
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(4)));
  KVTIER_ASSERT_OK_AND_ASSIGN(attached, cache->AttachPrefix(SequenceId(4), query));
  ASSERT_EQ(attached.attached_tokens, 4 * kB);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket c, cache->EnsureResident(SequenceId(4), 0, 4 * kB));
  ASSERT_THAT(c.block_status(), Each(BlockResidency::kResident));
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(BlockPatternMismatches(g, c.block_table(), i, static_cast<uint32_t>(i + 1)), 0)
        << "prompt block " << i;
  }
  KVTIER_ASSERT_OK(cache->ReleaseTicket(c));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(4)));
  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
  KVTIER_EXPECT_OK(cache->CheckInvariants());
  testing::ExpectAllReleased(cache->stats());
}

}  // namespace
}  // namespace kvtier
