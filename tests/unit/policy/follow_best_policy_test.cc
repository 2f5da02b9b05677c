// follow_best (eviction_policy.h): the live tier follows the candidate whose shadow cache hits
// most, so a ranking that loses to LRU on a workload is not the one running it.
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/eviction_policy.h"
#include "tests/testing/policy_testing.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

using ::kvtier::testing::At;
using ::kvtier::testing::Key;

// Evicts the most recently added candidate: the wrong order for a workload that reuses recent
// blocks, the right one for a loop larger than the cache.
class MruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "mru"; }
  absl::Status Add(const BlockKey& key, const BlockTraits&, absl::Time now) override {
    order_.insert({now, key});
    at_[key] = now;
    return absl::OkStatus();
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& t, absl::Time now) override {
    (void)Remove(key);
    return Add(key, t, now);
  }
  absl::Status Remove(const BlockKey& key) override {
    auto it = at_.find(key);
    if (it == at_.end()) return absl::NotFoundError("not a candidate");
    order_.erase({it->second, key});
    at_.erase(it);
    return absl::OkStatus();
  }
  std::optional<BlockKey> Victim(absl::Time) override {
    if (order_.empty()) return std::nullopt;
    return std::prev(order_.end())->second;
  }
  int64_t size() const override { return static_cast<int64_t>(at_.size()); }

 private:
  std::set<std::pair<absl::Time, BlockKey>> order_;
  std::map<BlockKey, absl::Time> at_;
};

std::unique_ptr<EvictionPolicy> LruThenMru(int64_t capacity) {
  std::vector<EvictionPolicyFactory> c;
  c.push_back([]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); });
  c.push_back([]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
    return std::unique_ptr<EvictionPolicy>(std::make_unique<MruPolicy>());
  });
  auto p = MakeFollowBestPolicy(std::move(c), {.capacity_blocks = capacity, .sample_rate = 1});
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

// Requests of single blocks `keys` in order, one per second, as a cache of one tier would run
// them: observed, then the block a candidate.
void Replay(EvictionPolicy& p, const std::vector<uint64_t>& keys, double& t) {
  for (uint64_t k : keys) {
    const std::vector<BlockKey> blocks = {Key(k)};
    p.ObserveRequest({.blocks = blocks, .now = At(t)});
    (void)p.Remove(Key(k));
    KVTIER_ASSERT_OK(p.Add(Key(k), {}, At(t)));
    while (p.size() > 8) {
      std::optional<BlockKey> v = p.Victim(At(t));
      ASSERT_TRUE(v.has_value());
      KVTIER_ASSERT_OK(p.Remove(*v));
    }
    t += 1;
  }
}

TEST(FollowBestPolicyTest, FollowsLruWhereRecencyWinsAndTheOtherWhereItLoses) {
  auto p = LruThenMru(8);
  EXPECT_EQ(p->name(), "follow_best");
  EXPECT_EQ(FollowedPolicy(*p), "lru");  // the first candidate leads at the start
  double t = 0;
  // A loop over 12 blocks with a cache of 8: LRU never hits, MRU keeps 7 of them.
  std::vector<uint64_t> loop;
  for (int round = 0; round < 40; ++round) {
    for (uint64_t k = 0; k < 12; ++k) loop.push_back(k);
  }
  Replay(*p, loop, t);
  EXPECT_EQ(FollowedPolicy(*p), "mru");
  // Then a hot set of 4 blocks, each reused at once: recency wins, MRU's shadow keeps missing the
  // blocks it just threw out. Long enough for the old hits to decay.
  std::vector<uint64_t> hot;
  for (int round = 0; round < 6000; ++round)
    hot.push_back(100 + (round % 5 == 4 ? 200 + round : round % 4));
  Replay(*p, hot, t);
  EXPECT_EQ(FollowedPolicy(*p), "lru");
  // What the miniature simulations cost and decided: every access sampled (rate 1), two
  // switches, and time spent.
  const FollowBestStats stats = FollowBestStatsOf(*p);
  EXPECT_EQ(stats.sampled_accesses, static_cast<int64_t>(loop.size() + hot.size()));
  EXPECT_EQ(stats.leader_changes, 2);
  EXPECT_GT(stats.shadow_seconds, 0);
  const FollowBestStats none = FollowBestStatsOf(*MakeLruPolicy());
  EXPECT_EQ(none.sampled_accesses, 0);
  EXPECT_EQ(none.shadow_seconds, 0);
}

// One tier of `capacity` blocks run by `p`: an agent session alternates between two prompts of
// two blocks each (it released one and comes back with the other, then the first again), while
// one-off requests of two new blocks each go between. Returns the session's block hits.
int64_t AlternatingSession(EvictionPolicy& p, int steps, int64_t capacity) {
  std::set<BlockKey> held;
  int64_t hits = 0;
  uint64_t fresh = 1000;
  double t = 0;
  auto request = [&](const std::vector<BlockKey>& blocks, uint64_t session) {
    p.ObserveRequest({.blocks = blocks, .now = At(t), .session = session});
    for (const BlockKey& k : blocks) {
      if (held.contains(k)) {
        if (session != 0) ++hits;
        (void)p.Remove(k);
      }
    }
    if (session != 0) {
      p.ObserveRelease({.blocks = blocks, .now = At(t), .session = session,
                        .stop_reason = StopReason::kToolUse});
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      held.insert(blocks[i]);
      const BlockTraits traits{.parent = i == 0 ? kRootBlockKey : blocks[i - 1]};
      EXPECT_TRUE(p.Add(blocks[i], traits, At(t)).ok());
    }
    while (static_cast<int64_t>(held.size()) > capacity) {
      std::optional<BlockKey> v = p.Victim(At(t));
      if (!v.has_value()) break;
      EXPECT_TRUE(p.Remove(*v).ok());
      held.erase(*v);
    }
    t += 1;
  };
  for (int step = 0; step < steps; ++step) {
    request(step % 2 == 0 ? std::vector<BlockKey>{Key(1), Key(2)}
                          : std::vector<BlockKey>{Key(3), Key(4)},
            /*session=*/7);
    request({Key(fresh), Key(fresh + 1)}, /*session=*/0);
    fresh += 2;
  }
  return hits;
}

// The fallback: on a workload where the learned index loses to LRU (the session's "moved on"
// rule throws out the prompt it comes back to), the tier follows LRU, even with the learned index
// leading at the start.
TEST(FollowBestPolicyTest, WhereTheLearnedIndexLosesToLruTheTierFollowsLru) {
  constexpr int kSteps = 3000;
  constexpr int64_t kCapacity = 8;
  auto reuse_index = MakeReuseIndexPolicy();
  KVTIER_ASSERT_OK(reuse_index.status());
  const int64_t lru_hits = AlternatingSession(*MakeLruPolicy(), kSteps, kCapacity);
  const int64_t index_hits = AlternatingSession(**reuse_index, kSteps, kCapacity);
  ASSERT_GT(lru_hits, index_hits + kSteps / 2) << "the workload must favour LRU";

  std::vector<EvictionPolicyFactory> c;
  c.push_back([] { return MakeReuseIndexPolicy(); });
  c.push_back([]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); });
  auto p = MakeFollowBestPolicy(std::move(c), {.capacity_blocks = kCapacity, .sample_rate = 1});
  KVTIER_ASSERT_OK(p.status());
  EXPECT_EQ(FollowedPolicy(**p), "reuse_index");
  const int64_t followed_hits = AlternatingSession(**p, kSteps, kCapacity);
  EXPECT_EQ(FollowedPolicy(**p), "lru");
  // Close to LRU's hits: only the requests before the switch went the index's way.
  EXPECT_GE(followed_hits, lru_hits * 9 / 10);
}

TEST(FollowBestPolicyTest, LearnedIsLruAndReuseIndex) {
  auto p = MakeLearnedPolicy(1000);
  KVTIER_ASSERT_OK(p.status());
  EXPECT_EQ((*p)->name(), "follow_best");
  EXPECT_EQ(FollowedPolicy(**p), "reuse_index");  // it leads at the start
  EXPECT_TRUE((*p)->observes_requests());
  EXPECT_EQ(FollowedPolicy(*MakeLruPolicy()), "");
}

// LRU that counts the Removes, Discards and Evicteds it is told of, in counts shared by every
// instance.
struct CallCounts {
  int removes = 0;
  int discards = 0;
  int evicted = 0;
  absl::Time evicted_at;
};
class CountingLru final : public EvictionPolicy {
 public:
  explicit CountingLru(std::shared_ptr<CallCounts> counts) : counts_(std::move(counts)) {}
  std::string_view name() const override { return "counting_lru"; }
  absl::Status Add(const BlockKey& key, const BlockTraits& t, absl::Time now) override {
    return lru_->Add(key, t, now);
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& t, absl::Time now) override {
    return lru_->Touch(key, t, now);
  }
  absl::Status Remove(const BlockKey& key) override {
    ++counts_->removes;
    return lru_->Remove(key);
  }
  absl::Status Discard(const BlockKey& key) override {
    ++counts_->discards;
    return lru_->Remove(key);
  }
  absl::Status Evicted(const BlockKey& key, absl::Time now) override {
    ++counts_->evicted;
    counts_->evicted_at = now;
    return lru_->Remove(key);
  }
  std::optional<BlockKey> Victim(absl::Time now) override { return lru_->Victim(now); }
  int64_t size() const override { return lru_->size(); }

 private:
  std::shared_ptr<CallCounts> counts_;
  std::unique_ptr<EvictionPolicy> lru_ = MakeLruPolicy();
};

// A Discard (a block dropped unused: an invalidation) reaches every live candidate as a Discard,
// not as a Remove, which cost_aware would count as a reuse.
TEST(FollowBestPolicyTest, ADiscardReachesEveryCandidateAsADiscard) {
  auto counts = std::make_shared<CallCounts>();
  std::vector<EvictionPolicyFactory> c(
      2, [counts]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
        return std::unique_ptr<EvictionPolicy>(std::make_unique<CountingLru>(counts));
      });
  auto p = MakeFollowBestPolicy(std::move(c), {.capacity_blocks = 8, .sample_rate = 1});
  ASSERT_TRUE(p.ok()) << p.status();
  KVTIER_ASSERT_OK((*p)->Add(Key(1), {}, At(0)));
  KVTIER_ASSERT_OK((*p)->Discard(Key(1)));
  EXPECT_EQ(counts->discards, 2);
  EXPECT_EQ(counts->removes, 0);
  EXPECT_EQ((*p)->size(), 0);
  EXPECT_THAT((*p)->Discard(Key(1)), IsError(StatusCode::kNotFound, ""));
}

// The candidates that do not lead hear of the leader's evictions as evictions (Evicted), not as
// Removes, which cost_aware counts as reuses: a cost_aware beside a leading lru learned that
// every block it lost was used again, and ranked by that once its shadow took the lead.
TEST(FollowBestPolicyTest, OthersHearTheLeadersEvictionsAsEvictions) {
  auto counts = std::make_shared<CallCounts>();
  std::vector<EvictionPolicyFactory> c;
  c.push_back([]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); });
  c.push_back([counts]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
    return std::unique_ptr<EvictionPolicy>(std::make_unique<CountingLru>(counts));
  });
  auto p = MakeFollowBestPolicy(c, {.capacity_blocks = 8});
  KVTIER_ASSERT_OK(p.status());
  EvictionPolicy& policy = **p;
  ASSERT_EQ(FollowedPolicy(policy), "lru");
  KVTIER_ASSERT_OK(policy.Add(Key(1), {}, At(10)));
  KVTIER_ASSERT_OK(policy.Add(Key(2), {}, At(11)));
  KVTIER_ASSERT_OK(policy.Add(Key(3), {}, At(12)));
  ASSERT_EQ(policy.Victim(At(20)), Key(1));
  KVTIER_ASSERT_OK(policy.Remove(Key(1)));  // evicted
  EXPECT_EQ(counts->evicted, 1);
  EXPECT_EQ(counts->evicted_at, At(20));
  EXPECT_EQ(counts->removes, 0);
  KVTIER_ASSERT_OK(policy.Remove(Key(3)));  // pinned again: not the victim
  EXPECT_EQ(counts->removes, 1);
  ASSERT_EQ(policy.Victim(At(30)), Key(2));
  KVTIER_ASSERT_OK(policy.Discard(Key(2)));  // dropped on the caller's word instead
  EXPECT_EQ(counts->discards, 1);
  EXPECT_EQ(counts->evicted, 1);
  // A victim kept (a request came between: KvCache waits for room below) and then pinned is a
  // reuse, not an eviction.
  KVTIER_ASSERT_OK(policy.Add(Key(4), {}, At(40)));
  ASSERT_EQ(policy.Victim(At(41)), Key(4));
  policy.ObserveRequest({.now = At(42)});
  KVTIER_ASSERT_OK(policy.Remove(Key(4)));
  EXPECT_EQ(counts->evicted, 1);
  EXPECT_EQ(counts->removes, 2);
  // cost_aware's Evicted is an eviction too: after it, the block is no candidate.
  auto cost_aware = MakeCostAwarePolicy();
  KVTIER_ASSERT_OK(cost_aware.status());
  KVTIER_ASSERT_OK((*cost_aware)->Add(BlockKey{0, 7}, {}, absl::FromUnixSeconds(1)));
  KVTIER_EXPECT_OK((*cost_aware)->Evicted(BlockKey{0, 7}, absl::FromUnixSeconds(5)));
  EXPECT_EQ((*cost_aware)->size(), 0);
  EXPECT_THAT((*cost_aware)->Evicted(BlockKey{0, 7}, absl::FromUnixSeconds(6)),
              IsError(StatusCode::kNotFound, ""));
}

TEST(FollowBestPolicyTest, Errors) {
  EXPECT_THAT(MakeFollowBestPolicy({}, {.capacity_blocks = 8}).status(),
              IsError(StatusCode::kInvalidArgument, "no candidates"));
  std::vector<EvictionPolicyFactory> c;
  c.push_back([]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); });
  EXPECT_THAT(MakeFollowBestPolicy(c, {.capacity_blocks = 0}).status(),
              IsError(StatusCode::kInvalidArgument, "capacity_blocks"));
  EXPECT_THAT(MakeFollowBestPolicy(c, {.capacity_blocks = 8, .sample_rate = 2}).status(),
              IsError(StatusCode::kInvalidArgument, "sample_rate"));
  EXPECT_THAT(MakeFollowBestPolicy(c, {.capacity_blocks = 8, .confidence = -1}).status(),
              IsError(StatusCode::kInvalidArgument, "confidence"));
  std::vector<EvictionPolicyFactory> bad;
  bad.push_back([]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
    return absl::InvalidArgumentError("factory says no");
  });
  EXPECT_THAT(MakeFollowBestPolicy(bad, {.capacity_blocks = 8}).status(),
              IsError(StatusCode::kInvalidArgument, "factory says no"));
  // A factory that is empty, or that answers OK with no policy, is refused (the first was a
  // std::bad_function_call, the second a null dereference).
  std::vector<EvictionPolicyFactory> empty(1);
  EXPECT_THAT(MakeFollowBestPolicy(empty, {.capacity_blocks = 8}).status(),
              IsError(StatusCode::kInvalidArgument, "candidate 0"));
  std::vector<EvictionPolicyFactory> null = c;
  null.push_back([]() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return nullptr; });
  EXPECT_THAT(MakeFollowBestPolicy(null, {.capacity_blocks = 8}).status(),
              IsError(StatusCode::kInvalidArgument, "candidate 1"));
}

}  // namespace
}  // namespace kvtier
