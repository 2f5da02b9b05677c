// KC-2: a dead remote store failed calls and became a retry storm. With HBM full of droppable
// blocks whose only demotion target is a remote tier whose every store call fails, making room
// picked the same victim again and again: its demotion failed at once (the breaker is open), it
// stayed, and it was picked again, hundreds of thousands of times for the whole room wait, whose
// last pass then started one more demotion instead of dropping it: Append failed with
// kResourceExhausted after room_wait, and EnsureResident took longer still. Now a tier whose
// store failed is skipped as a demotion target for a back-off (doubling while it keeps failing,
// reset by a success), so such victims are dropped and counted, and the calls return at once.
#include <vector>

#include "absl/status/status.h"
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

using ::kvtier::testing::Iota;
using ::kvtier::testing::KvCacheEnv;
using ::kvtier::testing::StatsString;
using ::testing::Each;

constexpr int kB = KvCacheEnv::kTokensPerBlock;
constexpr int kRemote = TierIndex(Tier::kRemote);

class Regress_KC_2 : public testing::KvCacheFixture {
 protected:
  void SetUp() override {
    // A long room wait: the calls below must not need it.
    Build({.hbm_blocks = 3, .dram_blocks = 0, .remote_blocks = 8},
          [](KvCacheOptions& o) { o.room_wait = absl::Seconds(10); });
  }

  absl::Status Compute(uint64_t id, const std::vector<int32_t>& tokens) {
    if (absl::Status s = cache_->CreateSequence(SequenceId(id)); !s.ok()) return s;
    if (auto a = cache_->Append(SequenceId(id), tokens); !a.ok()) return a.status();
    return cache_->ReportWritten(SequenceId(id), static_cast<int64_t>(tokens.size()));
  }
};

TEST_F(Regress_KC_2, DeadRemoteStoreNeitherFailsCallsNorStorms) {
  // A 2-block prefix reaches the remote tier (pushed out of HBM by a filler, freed on release).
  const std::vector<int32_t> prefix = Iota(2 * kB, 100);
  KVTIER_ASSERT_OK(Compute(1, prefix));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(2)));
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(2), Iota(3 * kB, 500000)).status());
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(prefix));
  ASSERT_EQ(where.blocks_by_tier[kRemote], 2) << StatsString(cache_->stats());
  // HBM is then full of droppable blocks (a released 3-block prompt), and a request attaches
  // the remote prefix.
  KVTIER_ASSERT_OK(Compute(3, Iota(3 * kB, 7000)));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(3)));
  ASSERT_EQ(cache_->stats().tiers[0].droppable_blocks, 3);
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(4)));
  std::vector<int32_t> query = prefix;
  query.push_back(1);
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(SequenceId(4), query));
  ASSERT_EQ(r.attached_blocks_by_tier[kRemote], 2);

  // The store dies: every call fails at once.
  env_->transport().SetFailure(absl::UnavailableError("injected: store down"));

  // A new request's block needs a slot: the victim cannot be demoted, so it is dropped.
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(5)));
  absl::Time start = absl::Now();
  absl::StatusOr<KvAppendResult> appended = cache_->Append(SequenceId(5), Iota(kB, 9000));
  absl::Duration took = absl::Now() - start;
  KVTIER_ASSERT_OK(appended.status()) << " after " << took << "\n" << StatsString(cache_->stats());
  EXPECT_LT(took, absl::Seconds(2));

  // Onboarding the remote prefix makes room the same way, and its reads fail: the blocks are
  // reported not resident (the caller recomputes them); the call itself succeeds, at once.
  start = absl::Now();
  absl::StatusOr<ResidencyTicket> t = cache_->EnsureResident(SequenceId(4), 0, 2 * kB);
  took = absl::Now() - start;
  KVTIER_ASSERT_OK(t.status());
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_THAT(t->block_status(), Each(BlockResidency::kNotResident));

  // No retry storm: a handful of failed stores, not one per attempt.
  const KvCacheStats s = cache_->stats();
  EXPECT_LE(s.tiers[kRemote].failed_stores, 4) << StatsString(s);
  EXPECT_GE(s.tiers[0].evictions, 3) << StatsString(s);
  // Nothing the waiting request holds was lost: its blocks are still indexed in the store.
  KVTIER_ASSERT_OK_AND_ASSIGN(where, cache_->Lookup(prefix));
  EXPECT_EQ(where.blocks_by_tier[kRemote], 2);
  KVTIER_EXPECT_OK(cache_->ReleaseTicket(*t));
}

}  // namespace
}  // namespace kvtier
