// What a scheduler calls besides the serving loop (kv_cache.h): Truncate, RoomWait::kNever,
// CheckRoom, ResetPrefixCache and SequenceOptions::enable_caching.
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_cache_stats.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::kvtier::testing::KvCacheEnv;
using ::kvtier::testing::KvCacheTestConfig;

constexpr int kB = KvCacheEnv::kTokensPerBlock;
constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr int kDram = TierIndex(Tier::kDram);

SequenceId Seq(uint64_t id) { return SequenceId(id); }

class SchedulerApiTest : public testing::KvCacheFixture {
 protected:
  // Creates `id` (with `options`), appends `tokens` and reports the first `written` written.
  void Add(uint64_t id, const std::vector<int32_t>& tokens, int64_t written,
           const SequenceOptions& options = {}) {
    KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(id), options));
    KVTIER_ASSERT_OK(cache_->Append(Seq(id), tokens).status());
    if (written > 0) {
      KVTIER_ASSERT_OK(cache_->ReportWritten(Seq(id), written));
    }
  }
  int64_t Matched(const std::vector<int32_t>& tokens) {
    auto l = cache_->Lookup(tokens);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? l->matched_tokens : -1;
  }
  int64_t FreeHbm() { return cache_->stats().tiers[kHbm].free_blocks; }
};

// ---------------------------------------------------------------- Truncate

TEST_F(SchedulerApiTest, TruncateInsideAFullBlockCopiesItsHeadAndKeepsTheSourceForTheCopy) {
  Build({.hbm_blocks = 16});
  const std::vector<int32_t> tokens = Iota(2 * kB + 2, 100);  // blocks 0, 1 full; 2 partial
  Add(1, tokens, static_cast<int64_t>(tokens.size()));
  const int64_t free_before = FreeHbm();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::optional<BlockCopy> copy, cache_->Truncate(Seq(1), kB + 2));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->num_tokens, 2);
  EXPECT_NE(copy->src, copy->dst);
  KVTIER_ASSERT_OK_AND_ASSIGN(SequenceInfo info, cache_->GetSequence(Seq(1)));
  EXPECT_EQ(info.num_tokens, kB + 2);
  EXPECT_EQ(info.written_tokens, kB + 2);
  EXPECT_EQ(info.num_blocks, 2);
  // The old partial block is freed, the copy's slot taken: the free count is unchanged, and the
  // cut block (still referenced for the copy) stays indexed.
  EXPECT_EQ(FreeHbm(), free_before);
  KVTIER_ASSERT_OK(cache_->CheckInvariants());
  EXPECT_EQ(Matched(Iota(2 * kB, 100)), 2 * kB);
  // The next call lets the copy's source go; the sequence goes on from the cut.
  std::vector<int32_t> more = Iota(kB, 900);
  KVTIER_ASSERT_OK(cache_->Append(Seq(1), more).status());
  KVTIER_ASSERT_OK(cache_->ReportWritten(Seq(1), 2 * kB + 2));
  KVTIER_ASSERT_OK(cache_->CheckInvariants());
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  std::vector<int32_t> branch = Iota(kB + 2, 100);
  branch.insert(branch.end(), more.begin(), more.end());
  EXPECT_EQ(Matched(branch), 2 * kB);             // block 0, then the new block 1 from the branch
  EXPECT_EQ(Matched(Iota(2 * kB, 100)), 2 * kB);  // the cut block stays cached
}

TEST_F(SchedulerApiTest, TruncateAtABlockBoundaryLetsGoOfTheCutBlocks) {
  Build({.hbm_blocks = 16});
  const std::vector<int32_t> tokens = Iota(3 * kB, 100);
  Add(1, tokens, kB);  // block 0 written; blocks 1 and 2 never will be
  const int64_t free_before = FreeHbm();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::optional<BlockCopy> copy, cache_->Truncate(Seq(1), kB));
  EXPECT_FALSE(copy.has_value());
  EXPECT_EQ(FreeHbm(), free_before + 2);  // private, unwritten: freed
  KVTIER_ASSERT_OK_AND_ASSIGN(SequenceInfo info, cache_->GetSequence(Seq(1)));
  EXPECT_EQ(info.num_tokens, kB);
  EXPECT_EQ(info.num_blocks, 1);
  // Inside the partial last block: nothing moves.
  KVTIER_ASSERT_OK(cache_->Append(Seq(1), Iota(3, 500)).status());
  KVTIER_ASSERT_OK_AND_ASSIGN(copy, cache_->Truncate(Seq(1), kB + 1));
  EXPECT_FALSE(copy.has_value());
  KVTIER_ASSERT_OK_AND_ASSIGN(info, cache_->GetSequence(Seq(1)));
  EXPECT_EQ(info.num_tokens, kB + 1);
  EXPECT_EQ(info.num_blocks, 2);
  // Written blocks cut away stay cached for others.
  Add(2, tokens, 3 * kB);
  KVTIER_ASSERT_OK_AND_ASSIGN(copy, cache_->Truncate(Seq(2), 0));
  EXPECT_FALSE(copy.has_value());
  EXPECT_EQ(Matched(tokens), 3 * kB);
}

TEST_F(SchedulerApiTest, TruncateErrors) {
  Build({.hbm_blocks = 16});
  Add(1, Iota(2 * kB, 100), 2 * kB);
  EXPECT_THAT(cache_->Truncate(Seq(1), -1), IsError(StatusCode::kOutOfRange, ""));
  EXPECT_THAT(cache_->Truncate(Seq(1), 2 * kB + 1), IsError(StatusCode::kOutOfRange, ""));
  EXPECT_THAT(cache_->Truncate(Seq(7), 0), IsError(StatusCode::kNotFound, ""));
  // A paused sequence's blocks are in DRAM: a cut inside one needs it resident first.
  KVTIER_ASSERT_OK(cache_->Pause(Seq(1), absl::Seconds(1)));
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_THAT(cache_->Truncate(Seq(1), 1), IsError(StatusCode::kFailedPrecondition, ""));
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  EXPECT_THAT(cache_->Truncate(Seq(1), 0), IsError(StatusCode::kFailedPrecondition, ""));
}

// ---------------------------------------------------------------- RoomWait and CheckRoom

TEST_F(SchedulerApiTest, CheckRoomCountsFreeEvictableAndMissingSlots) {
  Build({.hbm_blocks = 16});
  Add(1, Iota(4 * kB, 100), 4 * kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));  // 4 cached blocks
  Add(2, Iota(4 * kB - 1, 300), 0);           // 4 held, the last partial
  KVTIER_ASSERT_OK_AND_ASSIGN(RoomCheck r, cache_->CheckRoom(10));
  EXPECT_EQ(r.needed_slots, 10);
  EXPECT_EQ(r.free_slots, 8);
  EXPECT_EQ(r.evictable_slots, 4);
  EXPECT_EQ(r.demotions_in_flight, 0);
  EXPECT_FALSE(r.fits_now);
  EXPECT_TRUE(r.fits_after_evictions);
  EXPECT_EQ(r.missing_slots, 0);
  KVTIER_ASSERT_OK_AND_ASSIGN(r, cache_->CheckRoom(14));
  EXPECT_FALSE(r.fits_after_evictions);
  EXPECT_EQ(r.missing_slots, 2);
  // One more token fills sequence 2's partial block; two more need a new slot.
  KVTIER_ASSERT_OK_AND_ASSIGN(r, cache_->CheckRoom(Seq(2), 1));
  EXPECT_EQ(r.needed_slots, 0);
  EXPECT_TRUE(r.fits_now);
  KVTIER_ASSERT_OK_AND_ASSIGN(r, cache_->CheckRoom(Seq(2), 2));
  EXPECT_EQ(r.needed_slots, 1);
  EXPECT_THAT(cache_->CheckRoom(-1), IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(cache_->CheckRoom(Seq(2), -1), IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(cache_->CheckRoom(Seq(9), 1), IsError(StatusCode::kNotFound, ""));
}

// A ticket open on a running sequence's blocks locks held slots, not cached ones: the cached
// blocks of another request are still evictable (before, every locked slot was taken off them).
// A ticket on a released sequence's blocks locks cached slots, which no eviction may take.
TEST_F(SchedulerApiTest, CheckRoomTakesOnlyCachedSlotsATicketLocksOffTheEvictable) {
  Build({.hbm_blocks = 16, .dram_blocks = 0});
  Add(1, Iota(4 * kB, 100), 4 * kB);  // running, 4 held blocks
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket running, cache_->EnsureResident(Seq(1), 0, 4 * kB));
  Add(2, Iota(4 * kB, 300), 4 * kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(2)));  // 4 cached blocks
  KVTIER_ASSERT_OK_AND_ASSIGN(RoomCheck r, cache_->CheckRoom(12));
  EXPECT_EQ(r.free_slots, 8);
  EXPECT_EQ(r.evictable_slots, 4);
  EXPECT_TRUE(r.fits_after_evictions);
  EXPECT_EQ(r.missing_slots, 0);
  // What CheckRoom promised, an Append that drops what it may at once gets.
  KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(3)));
  KVTIER_EXPECT_OK(cache_->Append(Seq(3), Iota(12 * kB, 900), RoomWait::kNever).status());
  KVTIER_ASSERT_OK(cache_->Release(Seq(3)));

  // Sequence 1 lets go with its ticket still open: its 4 blocks are cached and locked.
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  KVTIER_ASSERT_OK_AND_ASSIGN(r, cache_->CheckRoom(1));
  EXPECT_EQ(r.free_slots, 12);  // sequence 3's 12 unwritten blocks were freed
  EXPECT_EQ(r.evictable_slots, 0);
  KVTIER_ASSERT_OK(cache_->ReleaseTicket(running));
  KVTIER_ASSERT_OK_AND_ASSIGN(r, cache_->CheckRoom(1));
  EXPECT_EQ(r.evictable_slots, 4);
}

TEST_F(SchedulerApiTest, RoomWaitNeverAnswersAtOnceWhenHbmIsHeld) {
  // room_wait is long: a call that waited would hold the test for a minute.
  Build({.hbm_blocks = 8}, [](KvCacheOptions& o) { o.room_wait = absl::Seconds(60); });
  Add(1, Iota(8 * kB, 100), 0);  // every HBM slot held
  KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(2)));
  EXPECT_THAT(cache_->Append(Seq(2), Iota(kB, 500), RoomWait::kNever),
              IsError(StatusCode::kResourceExhausted, ""));
  KVTIER_ASSERT_OK_AND_ASSIGN(SequenceInfo info, cache_->GetSequence(Seq(2)));
  EXPECT_EQ(info.num_tokens, 0);  // nothing changed
  EXPECT_THAT(cache_->Fork(Seq(1), Seq(3), kB + 1, RoomWait::kNever),
              IsError(StatusCode::kResourceExhausted, ""));
  EXPECT_THAT(cache_->Truncate(Seq(1), kB + 1, RoomWait::kNever),
              IsError(StatusCode::kResourceExhausted, ""));
  KVTIER_ASSERT_OK_AND_ASSIGN(RoomCheck r, cache_->CheckRoom(Seq(2), kB));
  EXPECT_EQ(r.missing_slots, 1);
}

TEST_F(SchedulerApiTest, RoomWaitNeverDropsWhatCanGoAtOnce) {
  // No tier below HBM: evicting is dropping, which frees a slot at once.
  Build({.hbm_blocks = 8, .dram_blocks = 0});
  Add(1, Iota(8 * kB, 100), 8 * kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(KvAppendResult a,
                              cache_->Append(Seq(2), Iota(3 * kB, 500), RoomWait::kNever));
  EXPECT_EQ(a.num_new_slots, 3);
  EXPECT_EQ(cache_->stats().tiers[kHbm].evictions, 3);
}

TEST_F(SchedulerApiTest, RoomWaitNeverStartsDemotionsAndSucceedsOnceTheyLand) {
  Build({.hbm_blocks = 8, .dram_blocks = 16});
  Add(1, Iota(8 * kB, 100), 8 * kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(2)));
  absl::StatusOr<KvAppendResult> a = cache_->Append(Seq(2), Iota(2 * kB, 500), RoomWait::kNever);
  if (!a.ok()) {
    // The demotions were started, not waited for: once they land the same call succeeds.
    EXPECT_THAT(a, IsError(StatusCode::kResourceExhausted, ""));
    KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
    a = cache_->Append(Seq(2), Iota(2 * kB, 500), RoomWait::kNever);
  }
  KVTIER_ASSERT_OK(a.status());
  EXPECT_EQ(a->num_new_slots, 2);
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
  const KvCacheStats s = cache_->stats();
  EXPECT_EQ(s.tiers[kHbm].demotions, 2);  // no more than needed
  EXPECT_EQ(s.tiers[kDram].stored, 2);
}

// ---------------------------------------------------------------- ResetPrefixCache

TEST_F(SchedulerApiTest, ResetPrefixCacheDropsDroppableCopiesAndSaysAllCleared) {
  Build({.hbm_blocks = 16, .dram_blocks = 16});
  const std::vector<int32_t> released = Iota(3 * kB, 100);
  const std::vector<int32_t> held = Iota(2 * kB, 300);
  Add(1, released, 3 * kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  Add(2, held, 2 * kB);
  const uint64_t after = cache_->stats().last_event_sequence;
  KVTIER_ASSERT_OK_AND_ASSIGN(int64_t dropped, cache_->ResetPrefixCache());
  EXPECT_EQ(dropped, 3);
  EXPECT_EQ(Matched(released), 0);
  EXPECT_EQ(Matched(held), 2 * kB);  // held blocks stay
  const std::vector<CacheEvent> events = cache_->PollEvents(after);
  int removed = 0;
  std::vector<Tier> cleared;
  for (const CacheEvent& e : events) {
    removed += e.kind == CacheEventKind::kRemoved ? 1 : 0;
    if (e.kind == CacheEventKind::kAllCleared) cleared.push_back(e.tier);
  }
  EXPECT_EQ(removed, 3);
  EXPECT_EQ(cleared, (std::vector<Tier>{Tier::kHbm, Tier::kDram}));
  EXPECT_EQ(events.back().kind, CacheEventKind::kAllCleared);
  // One tier; a tier the cache does not have.
  KVTIER_ASSERT_OK_AND_ASSIGN(dropped, cache_->ResetPrefixCache(Tier::kDram));
  EXPECT_EQ(dropped, 0);
  EXPECT_THAT(cache_->ResetPrefixCache(Tier::kNvme), IsError(StatusCode::kInvalidArgument, ""));
}

// A block that loses every copy while its child keeps one (a ticket locks the child in HBM)
// forgets its own parent; written again, it finds the parent again. The entries name parents
// by handle: CheckInvariants checks each handle names a live element and every child count.
TEST_F(SchedulerApiTest, ABlockThatLosesEveryCopyUnderALockedChildIsFoundAgainWhenRewritten) {
  Build({.hbm_blocks = 16, .dram_blocks = 16});
  const std::vector<int32_t> tokens = Iota(3 * kB, 100);  // blocks G, P, C
  Add(1, tokens, 3 * kB);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket ticket,
                              cache_->EnsureResident(Seq(1), 2 * kB, 3 * kB));
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  KVTIER_ASSERT_OK_AND_ASSIGN(int64_t dropped, cache_->ResetPrefixCache());
  EXPECT_EQ(dropped, 2);  // G and P; C is locked
  EXPECT_EQ(cache_->stats().indexed_blocks, 1);
  EXPECT_EQ(Matched(tokens), 0);  // the chain is broken at G
  KVTIER_ASSERT_OK(cache_->CheckInvariants());
  Add(2, Iota(2 * kB, 100), 2 * kB);  // G and P again
  EXPECT_EQ(cache_->stats().indexed_blocks, 3);
  EXPECT_EQ(Matched(tokens), 3 * kB);  // C is reachable again
  KVTIER_ASSERT_OK(cache_->CheckInvariants());
  KVTIER_ASSERT_OK(cache_->ReleaseTicket(ticket));
  KVTIER_ASSERT_OK(cache_->Release(Seq(2)));
}

// ---------------------------------------------------------------- enable_caching

TEST_F(SchedulerApiTest, ASequenceWithCachingOffSharesNothing) {
  Build({.hbm_blocks = 16});
  const std::vector<int32_t> tokens = Iota(3 * kB, 100);
  const int64_t free_before = FreeHbm();
  Add(1, tokens, 3 * kB, {.enable_caching = false});
  EXPECT_EQ(Matched(tokens), 0);
  EXPECT_THAT(cache_->Pause(Seq(1), absl::Seconds(1)),
              IsError(StatusCode::kFailedPrecondition, ""));
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  EXPECT_EQ(FreeHbm(), free_before);  // private blocks: freed
  EXPECT_EQ(cache_->stats().indexed_blocks, 0);
  // Cached by another sequence, still not attached to one with caching off.
  Add(2, tokens, 3 * kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(2)));
  KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(3), {.enable_caching = false}));
  std::vector<int32_t> query = tokens;
  query.push_back(7);
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(Seq(3), query));
  EXPECT_EQ(r.attached_tokens, 0);
  EXPECT_EQ(Matched(tokens), 3 * kB);
}

// A caching-off sequence whose tokens equal another request's cached block read none of it: its
// release neither makes that block recent nor gives it the sequence's retention. With LRU, the
// block cached first is still the first to go (before, the release touched and retained it,
// and the other one went).
TEST_F(SchedulerApiTest, ACachingOffReleaseLeavesOtherRequestsBlocksAlone) {
  Build({.hbm_blocks = 4, .dram_blocks = 0});
  const std::vector<int32_t> a = Iota(kB, 100);
  const std::vector<int32_t> b = Iota(kB, 300);
  Add(1, a, kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  env_->clock().Advance(absl::Seconds(1));
  Add(2, b, kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(2)));
  env_->clock().Advance(absl::Seconds(1));
  Add(3, a, kB, {.retention_priority = 5, .retention = absl::Minutes(10), .enable_caching = false});
  KVTIER_ASSERT_OK(cache_->Release(Seq(3)));
  env_->clock().Advance(absl::Seconds(1));
  Add(4, Iota(3 * kB, 900), 0);  // one of the two cached blocks must go
  EXPECT_EQ(Matched(a), 0);
  EXPECT_EQ(Matched(b), kB);
}

// ---------------------------------------------------------------- preemption

TEST_F(SchedulerApiTest, AReadmissionAfterPreemptionIsCountedAsSuchNotAsHits) {
  Build({.hbm_blocks = 16});
  const std::vector<int32_t> tokens = Iota(3 * kB, 100);
  Add(1, tokens, 3 * kB);
  KVTIER_ASSERT_OK(cache_->Release(Seq(1), {.preempted = true}).status());
  std::vector<int32_t> query = tokens;
  query.push_back(7);
  KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(2), {.readmission = true}));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(Seq(2), query));
  EXPECT_EQ(r.attached_tokens, 3 * kB);
  KvCacheStats s = cache_->stats();
  EXPECT_EQ(s.preemptions, 1);
  EXPECT_EQ(s.readmitted_blocks, 3);
  EXPECT_EQ(s.tiers[kHbm].hits, 0);
  // Another request's attach of the same blocks is a hit.
  KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(3)));
  KVTIER_ASSERT_OK(cache_->AttachPrefix(Seq(3), query).status());
  s = cache_->stats();
  EXPECT_EQ(s.tiers[kHbm].hits, 3);
  EXPECT_EQ(s.readmitted_blocks, 3);
}

}  // namespace
}  // namespace kvtier
