// AC-1: after any sequence of create/append/fork/release/evict with every sequence released,
// "held by sequences" is 0 in every tier and free + cached + quarantined == capacity.
//
// A property test with fixed seeds: random operations on a KvCache whose small HBM forces
// evictions (demoting to DRAM and NVMe), with prefix hits on shared system prompts, forks,
// pauses (references moved a tier down), tickets, and NVMe faults that fail demotions and
// onboards. After every operation CheckInvariants holds (per tier free + used + quarantined ==
// capacity, every slot's reference count equals the references sequences and tickets hold),
// the stats' gauges add up, and every live sequence has the tokens it was given. After the
// final release, nothing is held, locked or in flight in any tier.
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::StatsString;

constexpr int kB = testing::KvCacheEnv::kTokensPerBlock;
constexpr size_t kMaxLive = 5;
constexpr size_t kMaxTokens = 48;

struct Live {
  int64_t num_tokens = 0;
  int64_t written = 0;
  bool paused = false;
};

class World {
 public:
  explicit World(uint32_t seed)
      : rng_(seed),
        env_({.hbm_blocks = 12, .dram_blocks = 8, .nvme_blocks = 24, .fault_injectors = true}) {
    auto cache = env_.NewCache([](KvCacheOptions& o) { o.room_wait = absl::Milliseconds(20); });
    EXPECT_TRUE(cache.ok()) << cache.status();
    if (cache.ok()) cache_ = std::move(*cache);
  }
  bool ok() const { return cache_ != nullptr; }

  void Step() {
    switch (rng_() % 12) {
      case 0:
      case 1: Create(); break;
      case 2:
      case 3: AppendTo(); break;
      case 4: Write(); break;
      case 5: Fork(); break;
      case 6: Release(); break;
      case 7: Pause(); break;
      case 8: Resume(); break;
      case 9: Ticket(); break;
      case 10: ReleaseTicket(); break;
      case 11: Fault(); break;
    }
  }

  // The invariants that must hold after every operation.
  void Check() {
    KVTIER_EXPECT_OK(cache_->CheckInvariants());
    const KvCacheStats s = cache_->stats();
    testing::ExpectTierAccounting(s);
    EXPECT_EQ(s.live_sequences, static_cast<int64_t>(live_.size()));
    EXPECT_EQ(s.open_tickets, static_cast<int64_t>(tickets_.size()));
    for (const auto& [id, m] : live_) {
      auto info = cache_->GetSequence(SequenceId(id));
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->num_tokens, m.num_tokens) << "sequence " << id;
      EXPECT_EQ(info->num_blocks, (m.num_tokens + kB - 1) / kB) << "sequence " << id;
    }
  }

  void ReleaseEverything() {
    for (const ResidencyTicket& t : tickets_) KVTIER_EXPECT_OK(cache_->ReleaseTicket(t));
    tickets_.clear();
    for (const auto& [id, m] : live_) KVTIER_EXPECT_OK(cache_->Release(SequenceId(id)));
    live_.clear();
    env_.fault(Tier::kNvme)->FailNextReads(0, absl::OkStatus());
    env_.fault(Tier::kNvme)->FailNextWrites(0, absl::OkStatus());
    KVTIER_EXPECT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(30)));
  }

  KvCacheStats stats() const { return cache_->stats(); }

 private:
  size_t Pick(size_t n) { return rng_() % n; }
  bool Chance(int percent) { return static_cast<int>(rng_() % 100) < percent; }

  uint64_t PickLive(bool unpaused) {
    std::vector<uint64_t> ids;
    for (const auto& [id, m] : live_) {
      if (!unpaused || !m.paused) ids.push_back(id);
    }
    return ids.empty() ? 0 : ids[Pick(ids.size())];
  }

  std::vector<int32_t> RandomTokens(size_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng_() % 50);
    return t;
  }

  // An error `call` may return here (kv_cache.h): anything else fails the test.
  void ExpectOkOr(const absl::Status& s, StatusCode allowed, const char* call) {
    if (!s.ok() && s.code() != allowed) ADD_FAILURE() << call << ": " << s;
  }

  void Create() {
    if (live_.size() >= kMaxLive) return Release();
    const uint64_t id = next_id_++;
    KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(id)));
    live_[id] = Live{};
    // One of three shared system prompts, then a private suffix.
    std::mt19937 prefix_rng(static_cast<uint32_t>(Pick(3)));
    std::vector<int32_t> prompt(16);
    for (int32_t& x : prompt) x = static_cast<int32_t>(prefix_rng() % 50);
    for (int32_t x : RandomTokens(1 + Pick(16))) prompt.push_back(x);
    auto attached = cache_->AttachPrefix(SequenceId(id), prompt);
    ASSERT_TRUE(attached.ok()) << attached.status();
    live_[id].num_tokens = live_[id].written = attached->attached_tokens;
    auto appended = cache_->Append(
        SequenceId(id), absl::MakeConstSpan(prompt).subspan(attached->attached_tokens));
    ExpectOkOr(appended.status(), StatusCode::kResourceExhausted, "Append after attach");
    if (appended.ok()) live_[id].num_tokens = static_cast<int64_t>(prompt.size());
  }

  void AppendTo() {
    const uint64_t id = PickLive(/*unpaused=*/true);
    if (id == 0 || live_[id].num_tokens >= static_cast<int64_t>(kMaxTokens)) return;
    auto r = cache_->Append(SequenceId(id), RandomTokens(1 + Pick(10)));
    ExpectOkOr(r.status(), StatusCode::kResourceExhausted, "Append");
    if (r.ok()) {
      auto info = cache_->GetSequence(SequenceId(id));
      ASSERT_TRUE(info.ok());
      live_[id].num_tokens = info->num_tokens;
    }
  }

  void Write() {
    const uint64_t id = PickLive(/*unpaused=*/true);
    if (id == 0) return;
    Live& m = live_[id];
    const int64_t n = m.written + static_cast<int64_t>(Pick(m.num_tokens - m.written + 1));
    KVTIER_ASSERT_OK(cache_->ReportWritten(SequenceId(id), n));
    m.written = n;
  }

  void Fork() {
    const uint64_t parent = PickLive(/*unpaused=*/false);
    if (parent == 0 || live_.size() >= kMaxLive) return;
    const Live p = live_[parent];
    const int64_t at = static_cast<int64_t>(Pick(p.num_tokens + 1));
    const uint64_t child = next_id_++;
    auto r = cache_->Fork(SequenceId(parent), SequenceId(child), at);
    if (!r.ok()) {
      // No HBM slot for the copy, or the block to copy is not in HBM (paused).
      EXPECT_TRUE(r.status().code() == StatusCode::kResourceExhausted ||
                  r.status().code() == StatusCode::kFailedPrecondition)
          << r.status();
      EXPECT_EQ(cache_->GetSequence(SequenceId(child)).status().code(), StatusCode::kNotFound);
      return;
    }
    auto info = cache_->GetSequence(SequenceId(child));
    ASSERT_TRUE(info.ok()) << info.status();
    live_[child] = Live{.num_tokens = at, .written = info->written_tokens, .paused = info->paused};
  }

  void Release() {
    if (live_.empty()) return;
    auto it = live_.begin();
    std::advance(it, static_cast<ptrdiff_t>(Pick(live_.size())));
    const uint64_t id = it->first;
    KVTIER_ASSERT_OK(cache_->Release(SequenceId(id)));
    live_.erase(it);
    // A second release is refused and changes nothing.
    const int64_t free_before = cache_->stats().tiers[TierIndex(Tier::kHbm)].free_blocks;
    EXPECT_EQ(cache_->Release(SequenceId(id)).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(cache_->stats().tiers[TierIndex(Tier::kHbm)].free_blocks, free_before);
  }

  void Pause() {
    const uint64_t id = PickLive(/*unpaused=*/true);
    if (id == 0) return;
    KVTIER_ASSERT_OK(cache_->Pause(SequenceId(id), absl::Seconds(30)));
    live_[id].paused = true;
  }

  void Resume() {
    std::vector<uint64_t> paused;
    for (const auto& [id, m] : live_) {
      if (m.paused) paused.push_back(id);
    }
    if (paused.empty()) return;
    const uint64_t id = paused[Pick(paused.size())];
    auto resumed = cache_->Resume(SequenceId(id));
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    live_[id].paused = false;
    // Resuming may find HBM full of held blocks: the completion says so, the call does not.
    (void)resumed->WaitFor(absl::Seconds(10));
  }

  void Ticket() {
    const uint64_t id = PickLive(/*unpaused=*/true);
    if (id == 0 || tickets_.size() >= 4) return;
    const auto mode = static_cast<ResidencyMode>(Pick(3));
    auto t = cache_->EnsureResident(SequenceId(id), 0, live_[id].num_tokens,
                                    {.deadline = absl::Now() + absl::Seconds(5), .mode = mode});
    ExpectOkOr(t.status(), StatusCode::kResourceExhausted, "EnsureResident");
    if (t.ok()) tickets_.push_back(*t);
  }

  void ReleaseTicket() {
    if (tickets_.empty()) return;
    const size_t i = Pick(tickets_.size());
    KVTIER_ASSERT_OK(cache_->ReleaseTicket(tickets_[i]));
    EXPECT_EQ(cache_->ReleaseTicket(tickets_[i]).code(), StatusCode::kFailedPrecondition);
    tickets_.erase(tickets_.begin() + static_cast<ptrdiff_t>(i));
  }

  // The NVMe device fails the next few reads (onboards) or writes (demotions).
  void Fault() {
    const int n = static_cast<int>(1 + Pick(3));
    if (Chance(50)) {
      env_.fault(Tier::kNvme)->FailNextReads(n, absl::UnavailableError("injected EIO"));
    } else {
      env_.fault(Tier::kNvme)->FailNextWrites(n, absl::UnavailableError("injected EIO"));
    }
  }

  std::mt19937 rng_;
  testing::KvCacheEnv env_;  // before cache_: the NVMe file lives in its directory
  std::unique_ptr<KvCache> cache_;
  std::map<uint64_t, Live> live_;
  std::vector<ResidencyTicket> tickets_;
  uint64_t next_id_ = 1;
};

TEST(Regress_AC_1, HeldIsZeroAndSlotsAccountedAfterRandomOperations) {
  int64_t total_hits = 0;
  int64_t total_evictions = 0;
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    World world(seed);
    ASSERT_TRUE(world.ok());
    for (int step = 0; step < 200; ++step) {
      world.Step();
      world.Check();
      if (::testing::Test::HasFailure()) FAIL() << "seed " << seed << " step " << step;
    }
    world.ReleaseEverything();
    world.Check();
    const KvCacheStats s = world.stats();
    for (int i = 0; i < kNumTiers; ++i) {
      const KvTierStats& t = s.tiers[static_cast<size_t>(i)];
      if (!t.present) continue;
      EXPECT_EQ(t.held_blocks, 0) << "seed " << seed << "\n" << StatsString(s);
      EXPECT_EQ(t.locked_blocks, 0) << "seed " << seed;
      EXPECT_EQ(t.in_flight_blocks, 0) << "seed " << seed;
      EXPECT_EQ(t.free_blocks + t.droppable_blocks + t.quarantined_blocks, t.capacity_blocks)
          << "seed " << seed << "\n" << StatsString(s);
      total_hits += t.hits;
      total_evictions += t.evictions;
    }
    if (::testing::Test::HasFailure()) FAIL() << "seed " << seed << " after release";
  }
  EXPECT_GT(total_hits, 0) << "the workload never hit a cached prefix: it tests too little";
  EXPECT_GT(total_evictions, 0) << "the workload never evicted: it tests too little";
}

}  // namespace
}  // namespace kvtier
