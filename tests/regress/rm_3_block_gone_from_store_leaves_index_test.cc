// RM-3: a block the remote store no longer has (evicted by the store's own policy, expired, or
// deleted by another worker) stayed in the index after the read that found it missing, so every
// later request matched it again and failed to load it again (tried from outside: 521 failed
// loads from 243 missing blocks). Now the first read that finds it missing (kNotFound) drops the
// copy from the index, as a corrupt read (kDataLoss) already did: the next lookup misses at once
// and no read is tried again. A transient failure (kUnavailable) keeps the copy: it may load later.
#include <cstdint>
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
constexpr int kHbmBlocks = 8;
constexpr int kRemote = TierIndex(Tier::kRemote);

class Regress_RM_3 : public testing::KvCacheFixture {
 protected:
  void SetUp() override {
    Build({.hbm_blocks = kHbmBlocks, .dram_blocks = 0, .remote_blocks = 16});
  }

  // Sequence `id` caches `tokens` (reported written) and is released.
  void AddReleased(uint64_t id, const std::vector<int32_t>& tokens) {
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(id)));
    KVTIER_ASSERT_OK(cache_->Append(SequenceId(id), tokens).status());
    KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(id), static_cast<int64_t>(tokens.size())));
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(id)));
  }
  // Every HBM slot taken by a filler that is never written, then released: the prompt's blocks
  // are demoted to the remote tier.
  void EvictAllOfHbm(uint64_t filler) {
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(filler)));
    KVTIER_ASSERT_OK(cache_->Append(SequenceId(filler), Iota(kHbmBlocks * kB, 500000)).status());
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(filler)));
    KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(30)));
  }
  // Attaches `prompt` plus one token to a new sequence `id` and asks for its blocks in HBM.
  // Returns how many were resident; the sequence is released.
  int64_t AttachAndLoad(uint64_t id, const std::vector<int32_t>& prompt) {
    std::vector<int32_t> query = prompt;
    query.push_back(1);
    EXPECT_TRUE(cache_->CreateSequence(SequenceId(id)).ok());
    absl::StatusOr<AttachResult> r = cache_->AttachPrefix(SequenceId(id), query);
    EXPECT_TRUE(r.ok()) << r.status();
    int64_t resident = 0;
    if (r.ok() && r->attached_tokens > 0) {
      absl::StatusOr<ResidencyTicket> t =
          cache_->EnsureResident(SequenceId(id), 0, r->attached_tokens);
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) {
        resident = t->resident_tokens();
        EXPECT_TRUE(cache_->ReleaseTicket(*t).ok());
      }
    }
    EXPECT_TRUE(cache_->Release(SequenceId(id)).ok());
    return resident;
  }
};

TEST_F(Regress_RM_3, BlockTheStoreNoLongerHasLeavesTheIndexOnTheFirstFailedRead) {
  const std::vector<int32_t> prompt = Iota(16, 100);  // 4 blocks
  ASSERT_NO_FATAL_FAILURE(AddReleased(1, prompt));
  ASSERT_NO_FATAL_FAILURE(EvictAllOfHbm(99));
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup before, cache_->Lookup(prompt));
  ASSERT_EQ(before.blocks_by_tier[kRemote], 4) << StatsString(cache_->stats());

  // The store lost every value (its own eviction under maxmemory reads the same: a missing key).
  env_->transport().SetFailure(absl::NotFoundError("evicted by the store"));
  EXPECT_EQ(AttachAndLoad(2, prompt), 0);
  const int64_t failed = cache_->stats().tiers[kRemote].failed_loads;
  EXPECT_GE(failed, 1) << StatsString(cache_->stats());
  EXPECT_EQ(cache_->stats().tiers[kRemote].missing_reads, failed);

  // Not matched again, and so not read again.
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup after, cache_->Lookup(prompt));
  EXPECT_EQ(after.matched_tokens, 0) << StatsString(cache_->stats());
  EXPECT_EQ(after.blocks_by_tier[kRemote], 0);
  EXPECT_EQ(AttachAndLoad(3, prompt), 0);
  EXPECT_EQ(cache_->stats().tiers[kRemote].failed_loads, failed);
  env_->transport().SetFailure(absl::OkStatus());
}

TEST_F(Regress_RM_3, TransientStoreFailureKeepsTheBlockForALaterRead) {
  const std::vector<int32_t> prompt = Iota(16, 100);
  ASSERT_NO_FATAL_FAILURE(AddReleased(1, prompt));
  ASSERT_NO_FATAL_FAILURE(EvictAllOfHbm(99));
  env_->transport().SetFailure(absl::UnavailableError("store restarting"));
  EXPECT_EQ(AttachAndLoad(2, prompt), 0);
  EXPECT_GE(cache_->stats().tiers[kRemote].failed_loads, 1);
  EXPECT_EQ(cache_->stats().tiers[kRemote].missing_reads, 0);
  // Still indexed; once the store answers again the blocks load.
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup still, cache_->Lookup(prompt));
  EXPECT_EQ(still.blocks_by_tier[kRemote], 4) << StatsString(cache_->stats());
  env_->transport().SetFailure(absl::OkStatus());
  // The breaker may still be open for its first backoff (100 ms): wait it out.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(AttachAndLoad(3, prompt), 16) << StatsString(cache_->stats());
}

// The other half of the fault: keys of blocks the cache evicted from the remote tier stayed in
// the store (tried from outside: 169,764 keys for a 52,428-slot tier). Evicted blocks' values are
// deleted now, so a store only this cache writes holds at most the tier's capacity.
TEST_F(Regress_RM_3, StoreHoldsNoMoreThanTheTierAfterManyEvictions) {
  constexpr int kRemoteBlocks = 16;
  // 12 prompts of 4 blocks each, every one pushed down to the remote tier: 48 blocks through a
  // 16-slot tier.
  for (uint64_t p = 0; p < 12; ++p) {
    ASSERT_NO_FATAL_FAILURE(AddReleased(10 + p, Iota(16, static_cast<int>(1000 * (p + 1)))));
    ASSERT_NO_FATAL_FAILURE(EvictAllOfHbm(100 + p));
  }
  const KvCacheStats s = cache_->stats();
  EXPECT_GT(s.tiers[kRemote].evictions, 0) << StatsString(s);
  EXPECT_LE(env_->transport().size(), kRemoteBlocks) << StatsString(s);
  EXPECT_EQ(env_->transport().size(),
            s.tiers[kRemote].capacity_blocks - s.tiers[kRemote].free_blocks)
      << StatsString(s);
  // The newest prompt is still there, whole.
  EXPECT_EQ(AttachAndLoad(200, Iota(16, 12000)), 16) << StatsString(cache_->stats());
}

}  // namespace
}  // namespace kvtier
