// KC-1: a hung remote store starved other requests. Four single-block onboards from a store that
// never answers took every bounce buffer of the transfer engine and kept them (the cache's
// transfers had no deadline); the demotions a fifth request's Append started to make room queued
// behind them, and at the end of room_wait the Append failed with kResourceExhausted ("demotions
// still in flight") while 8 HBM blocks were droppable. Now every transfer of the cache has a
// deadline (an onboard its ticket's, or a bound; a demotion the room wait's), a copy that has not
// started by then gives up without touching its slots, and the room wait's last pass drops
// droppable blocks instead of counting on demotions that cannot land in time.
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/deadline_timer.h"
#include "internal/mutex.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/kv_cache.h"
#include "kvtier/remote_tier.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::kvtier::testing::KvCacheEnv;
using ::kvtier::testing::StatsString;
using ::testing::Each;

constexpr int kB = KvCacheEnv::kTokensPerBlock;

// A store that stops answering on Hang(): every later item stays unanswered until its call's
// deadline (kDeadlineExceeded then, as Transport promises) or Release() (kUnavailable). Before
// Hang() it forwards to an in-process store.
class HangingTransport final : public Transport {
 public:
  ~HangingTransport() override { Release(); }

  void Hang() {
    internal::MutexLock lock(&mu_);
    hung_ = true;
  }
  // Answers every parked item (kUnavailable) and forwards later calls again.
  void Release() {
    std::vector<Completion> parked;
    {
      internal::MutexLock lock(&mu_);
      hung_ = false;
      parked.swap(parked_);
    }
    for (Completion& c : parked) c.Complete(absl::UnavailableError("hanging store released"));
  }

  std::string name() const override { return "hanging"; }
  std::vector<Completion> Put(absl::Span<const TransportPut> items, absl::Time deadline) override {
    if (std::vector<Completion> out; Park(items.size(), deadline, out)) return out;
    return inner_.Put(items, deadline);
  }
  std::vector<Completion> Get(absl::Span<const TransportGet> items, absl::Time deadline) override {
    if (std::vector<Completion> out; Park(items.size(), deadline, out)) return out;
    return inner_.Get(items, deadline);
  }
  std::vector<Completion> Exists(absl::Span<const std::string> keys, absl::Time deadline) override {
    if (std::vector<Completion> out; Park(keys.size(), deadline, out)) return out;
    return inner_.Exists(keys, deadline);
  }
  std::vector<Completion> Delete(absl::Span<const std::string> keys, absl::Time deadline) override {
    if (std::vector<Completion> out; Park(keys.size(), deadline, out)) return out;
    return inner_.Delete(keys, deadline);
  }

 private:
  bool Park(size_t n, absl::Time deadline, std::vector<Completion>& out) {
    internal::MutexLock lock(&mu_);
    if (!hung_) return false;
    for (size_t i = 0; i < n; ++i) {
      Completion c;
      out.push_back(c);
      parked_.push_back(c);
      if (deadline != absl::InfiniteFuture()) {
        timer_.Schedule(deadline, [c] {
          c.Complete(absl::DeadlineExceededError("hanging store: the call's deadline passed"));
        });
      }
    }
    return true;
  }

  InProcessTransport inner_;
  internal::Mutex mu_;
  bool hung_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Completion> parked_ ABSL_GUARDED_BY(mu_);
  internal::DeadlineTimer timer_;  // last: joined first, before the parked list goes
};

class Regress_KC_1 : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = std::make_unique<KvCacheEnv>(
        testing::KvCacheTestConfig{.hbm_blocks = 16, .dram_blocks = 0});
    auto cache = env_->NewCache([&](KvCacheOptions& o) {
      auto remote = RemoteTier::Create(env_->ns(), {.transport = store_, .capacity_blocks = 64});
      ASSERT_TRUE(remote.ok()) << remote.status();
      o.tiers[TierIndex(Tier::kRemote)] = std::move(*remote);
      o.room_wait = absl::Milliseconds(200);
      o.bounce_buffers = 4;
    });
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }
  void TearDown() override {
    store_->Release();  // nothing may still wait on the store when the cache goes
    if (cache_ != nullptr) {
      KVTIER_EXPECT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
      KVTIER_EXPECT_OK(cache_->CheckInvariants());
    }
    cache_.reset();
  }

  absl::Status Compute(uint64_t id, const std::vector<int32_t>& tokens) {
    if (absl::Status s = cache_->CreateSequence(SequenceId(id)); !s.ok()) return s;
    if (auto a = cache_->Append(SequenceId(id), tokens); !a.ok()) return a.status();
    return cache_->ReportWritten(SequenceId(id), static_cast<int64_t>(tokens.size()));
  }

  std::shared_ptr<HangingTransport> store_ = std::make_shared<HangingTransport>();
  std::unique_ptr<KvCacheEnv> env_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(Regress_KC_1, HungRemoteStoreDoesNotStarveOtherRequests) {
  // Four single-block prompts reach the remote tier: computed, released, and pushed out of HBM
  // by a filler that takes every slot (never written, so it is freed on release).
  for (int i = 0; i < 4; ++i) {
    KVTIER_ASSERT_OK(Compute(1 + i, Iota(kB, 1000 * (i + 1))));
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(1 + i)));
  }
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(9)));
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(9), Iota(16 * kB, 500000)).status());
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(9)));
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
  for (int i = 0; i < 4; ++i) {
    KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup l, cache_->Lookup(Iota(kB, 1000 * (i + 1))));
    ASSERT_EQ(l.blocks_by_tier[TierIndex(Tier::kRemote)], 1) << "prompt " << i;
  }
  // An 8-block prefix, released: 8 droppable HBM blocks, 8 free slots.
  KVTIER_ASSERT_OK(Compute(10, Iota(8 * kB, 7000)));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(10)));
  ASSERT_EQ(cache_->stats().tiers[0].droppable_blocks, 8) << StatsString(cache_->stats());

  // The store stops answering. Four requests attach their remote block and onboard it: each
  // copy takes a bounce buffer (remote and HBM are both staged) and an HBM slot, and hangs. Two
  // tickets have a deadline, two none.
  store_->Hang();
  std::vector<ResidencyTicket> tickets;
  const absl::Time onboard_deadline = absl::Now() + absl::Seconds(1);
  for (int i = 0; i < 4; ++i) {
    const SequenceId id(20 + i);
    KVTIER_ASSERT_OK(cache_->CreateSequence(id));
    std::vector<int32_t> query = Iota(kB, 1000 * (i + 1));
    query.push_back(1);
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(id, query));
    ASSERT_EQ(r.attached_blocks_by_tier[TierIndex(Tier::kRemote)], 1);
    KVTIER_ASSERT_OK_AND_ASSIGN(
        ResidencyTicket t,
        cache_->EnsureResident(id, 0, kB,
                               {.deadline = i < 2 ? onboard_deadline : absl::InfiniteFuture(),
                                .mode = ResidencyMode::kAsync}));
    tickets.push_back(t);
  }

  // A fifth request needs 8 slots: 4 are free, and 8 blocks are droppable. Its Append must not
  // fail, and must return within its room wait (200 ms; the bound here is generous).
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(30)));
  const absl::Time start = absl::Now();
  absl::StatusOr<KvAppendResult> appended = cache_->Append(SequenceId(30), Iota(8 * kB, 90000));
  const absl::Duration took = absl::Now() - start;
  KVTIER_ASSERT_OK(appended.status()) << " after " << took << "\n" << StatsString(cache_->stats());
  EXPECT_EQ(appended->num_new_slots, 8);
  EXPECT_LT(took, absl::Seconds(2));

  // The hung onboards end by their deadlines (the two without one by the cache's bound), as
  // misses, and give back their bounce buffers and slots: the cache goes idle while the store
  // still hangs.
  for (const ResidencyTicket& t : tickets) {
    EXPECT_THAT(t.completion().WaitFor(absl::Seconds(5)),
                IsError(absl::StatusCode::kUnavailable, ""));
    EXPECT_THAT(t.block_status(), Each(BlockResidency::kNotResident));
  }
  KVTIER_EXPECT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(5)));
  const KvCacheStats s = cache_->stats();
  EXPECT_EQ(s.tiers[0].in_flight_blocks, 0) << StatsString(s);
  EXPECT_EQ(s.tiers[TierIndex(Tier::kRemote)].in_flight_blocks, 0) << StatsString(s);
  KVTIER_EXPECT_OK(cache_->CheckInvariants());
  for (const ResidencyTicket& t : tickets) KVTIER_EXPECT_OK(cache_->ReleaseTicket(t));
}

}  // namespace
}  // namespace kvtier
