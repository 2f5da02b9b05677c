// Eviction candidacy (eviction_candidacy.h): the traits a candidate is ranked with (every field,
// the run_blocks walk and where it stops, no walk for a policy that does not read it), the
// leaf-first rule's truth table (and that `held` is asked only when it decides), and
// SyncCandidacy's calls on a policy and the registered bit it leaves.
#include "kvtier/eviction_candidacy.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/eviction_policy.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
BlockKey Key(uint64_t i) { return BlockKey{i, i * 7 + 1}; }

// A chain of blocks Key(1) <- Key(2) <- ... (Key(1) a root), with the given use counts.
class Chain {
 public:
  explicit Chain(const std::vector<uint32_t>& uses) {
    for (size_t i = 0; i < uses.size(); ++i) {
      facts_[Key(i + 1)] = CandidateFacts{.uses = uses[i],
                                          .parent = i == 0 ? kRootBlockKey : Key(i),
                                          .last_use = kT0 + absl::Seconds(i)};
    }
  }
  const CandidateFacts& at(uint64_t i) const { return facts_.at(Key(i)); }
  void Forget(uint64_t i) { facts_.erase(Key(i)); }
  std::optional<CandidateFacts> Lookup(const BlockKey& key) {
    ++lookups;
    auto it = facts_.find(key);
    if (it == facts_.end()) return std::nullopt;
    return it->second;
  }
  BlockTraits TraitsOf(const EvictionPolicy& policy, uint64_t i, int64_t bytes = 4096) {
    return CandidateTraits(policy, at(i), bytes,
                           [this](const BlockKey& key) { return Lookup(key); });
  }

  int lookups = 0;

 private:
  absl::flat_hash_map<BlockKey, CandidateFacts> facts_;
};

std::unique_ptr<EvictionPolicy> CostAware() {
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakeCostAwarePolicy();
  EXPECT_TRUE(p.ok());
  return std::move(p).value();
}

TEST(CandidateTraitsTest, EveryFieldFromTheFacts) {
  const auto policy = CostAware();
  const CandidateFacts block{.uses = 3,
                             .retention_priority = 1.5,
                             .priority_until = kT0 + absl::Minutes(5),
                             .parent = Key(9),
                             .last_use = kT0};
  int lookups = 0;
  const BlockTraits t = CandidateTraits(*policy, block, 163840, [&](const BlockKey& key) {
    ++lookups;
    EXPECT_EQ(key, Key(9));
    return std::optional<CandidateFacts>();  // the parent is unknown: the walk stops there
  });
  EXPECT_EQ(t.expected_reuse, 3);
  EXPECT_EQ(t.recompute_seconds, 0);
  EXPECT_EQ(t.bytes, 163840);
  EXPECT_EQ(t.retention_priority, 1.5);
  EXPECT_EQ(t.priority_until, kT0 + absl::Minutes(5));
  EXPECT_EQ(t.parent, Key(9));
  EXPECT_EQ(t.run_blocks, 1);
  EXPECT_EQ(lookups, 1);
}

TEST(CandidateTraitsTest, ExpectedReuseIsAtLeastOne) {
  const auto policy = CostAware();
  Chain chain({0});
  const BlockTraits t = chain.TraitsOf(*policy, 1);
  EXPECT_EQ(t.expected_reuse, 1);
  EXPECT_EQ(t.parent, kRootBlockKey);
  EXPECT_EQ(t.run_blocks, 1);
  EXPECT_EQ(chain.lookups, 0) << "a root has no parent to look up";
}

TEST(CandidateTraitsTest, RunStopsAtTheFirstParentWithAnotherUseCount) {
  const auto policy = CostAware();
  //          Key: 1  2  3  4  5  6
  Chain chain({1, 2, 2, 1, 1, 1});
  EXPECT_EQ(chain.TraitsOf(*policy, 6).run_blocks, 3);  // 6, 5, 4; 3 has 2 uses
  EXPECT_EQ(chain.lookups, 3);                          // 5, 4 and 3
  EXPECT_EQ(chain.TraitsOf(*policy, 4).run_blocks, 1);  // 3 differs at once
  EXPECT_EQ(chain.TraitsOf(*policy, 3).run_blocks, 2);  // 3, 2; 1 has 1 use
  EXPECT_EQ(chain.TraitsOf(*policy, 1).run_blocks, 1);  // the root
}

TEST(CandidateTraitsTest, RunStopsAtTheRoot) {
  const auto policy = CostAware();
  Chain chain({2, 2, 2, 2, 2});
  EXPECT_EQ(chain.TraitsOf(*policy, 5).run_blocks, 5);
  EXPECT_EQ(chain.lookups, 4) << "Key(1)'s parent is the root: not looked up";
}

TEST(CandidateTraitsTest, RunStopsAtAnUnknownParent) {
  const auto policy = CostAware();
  Chain chain({1, 1, 1, 1, 1});
  chain.Forget(3);
  EXPECT_EQ(chain.TraitsOf(*policy, 5).run_blocks, 2);  // 5, 4; 3 is not known
}

TEST(CandidateTraitsTest, RunIsCountedUpToThirtyTwo) {
  const auto policy = CostAware();
  Chain chain(std::vector<uint32_t>(40, 1));
  EXPECT_EQ(chain.TraitsOf(*policy, 40).run_blocks, kMaxRunBlocks);
  EXPECT_EQ(kMaxRunBlocks, 32);
  EXPECT_EQ(chain.lookups, 31) << "the block and 31 parents";
  chain.lookups = 0;
  EXPECT_EQ(chain.TraitsOf(*policy, 32).run_blocks, 32) << "exactly 31 parents to the root";
  EXPECT_EQ(chain.lookups, 31);
  chain.lookups = 0;
  EXPECT_EQ(chain.TraitsOf(*policy, 31).run_blocks, 31);
  EXPECT_EQ(chain.lookups, 30);
}

TEST(CandidateTraitsTest, NoWalkForAPolicyThatDoesNotReadRunBlocks) {
  const auto lru = MakeLruPolicy();
  ASSERT_FALSE(lru->reads_run_blocks());
  Chain chain({1, 1, 1, 1});
  const BlockTraits t = chain.TraitsOf(*lru, 4, 512);
  EXPECT_EQ(t.run_blocks, 1);
  EXPECT_EQ(chain.lookups, 0);
  // Everything else is as for any policy.
  EXPECT_EQ(t.expected_reuse, 1);
  EXPECT_EQ(t.bytes, 512);
  EXPECT_EQ(t.parent, Key(3));
  const auto cost_aware = CostAware();
  ASSERT_TRUE(cost_aware->reads_run_blocks());
  EXPECT_EQ(chain.TraitsOf(*cost_aware, 4).run_blocks, 4);
}

// ---- The leaf-first rule ----

TEST(IsEvictionCandidateTest, TruthTable) {
  struct Case {
    bool ready;
    bool leaving;
    uint32_t child_copies;
    uint32_t leaving_children;
    bool held;
    bool candidate;
  };
  const Case cases[] = {
      // A released leaf, and one whose every child copy is leaving.
      {true, false, 0, 0, false, true},
      {true, false, 2, 2, false, true},
      // Each fact alone takes candidacy away.
      {false, false, 0, 0, false, false},  // not ready (absent, or still being written)
      {true, true, 0, 0, false, false},    // itself being demoted away
      {true, false, 1, 0, false, false},   // a cached child
      {true, false, 3, 2, false, false},   // one child copy that is not leaving
      {true, false, 0, 0, true, false},    // held (a sequence, a ticket or a reader)
      // And together.
      {false, true, 1, 0, true, false},
      {true, true, 2, 2, true, false},
      {false, false, 2, 2, false, false},
  };
  for (const Case& c : cases) {
    const CopyFacts copy{.ready = c.ready,
                         .leaving = c.leaving,
                         .child_copies = c.child_copies,
                         .leaving_children = c.leaving_children};
    EXPECT_EQ(IsEvictionCandidate(copy, [&] { return c.held; }), c.candidate)
        << "ready " << c.ready << " leaving " << c.leaving << " children " << c.child_copies
        << " leaving " << c.leaving_children << " held " << c.held;
  }
}

TEST(IsEvictionCandidateTest, HeldIsAskedOnlyWhenItDecides) {
  int asked = 0;
  auto held = [&] {
    ++asked;
    return false;
  };
  EXPECT_FALSE(IsEvictionCandidate(CopyFacts{.ready = false}, held));
  EXPECT_FALSE(IsEvictionCandidate(CopyFacts{.ready = true, .leaving = true}, held));
  EXPECT_FALSE(IsEvictionCandidate(CopyFacts{.ready = true, .child_copies = 1}, held));
  EXPECT_EQ(asked, 0);
  EXPECT_TRUE(IsEvictionCandidate(CopyFacts{.ready = true}, held));
  EXPECT_EQ(asked, 1);
}

// ---- SyncCandidacy ----

// lru, logging every call as "add K@T run R", "remove K" (K = key.hi, T seconds after kT0).
class LoggingPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "logging"; }
  bool reads_run_blocks() const override { return true; }
  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    log.push_back(absl::StrCat("add ", key.hi, "@", absl::ToInt64Seconds(now - kT0), " run ",
                               traits.run_blocks));
    return refuse_adds ? absl::InvalidArgumentError("refused") : lru_->Add(key, traits, now);
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    return lru_->Touch(key, traits, now);
  }
  absl::Status Remove(const BlockKey& key) override {
    log.push_back(absl::StrCat("remove ", key.hi));
    return lru_->Remove(key);
  }
  std::optional<BlockKey> Victim(absl::Time now) override { return lru_->Victim(now); }
  int64_t size() const override { return lru_->size(); }

  std::vector<std::string> log;
  bool refuse_adds = false;

 private:
  std::unique_ptr<EvictionPolicy> lru_ = MakeLruPolicy();
};

TEST(SyncCandidacyTest, AddsRemovesAndLeavesAlone) {
  LoggingPolicy policy;
  Chain chain({1, 1, 1});
  auto lookup = [&](const BlockKey& key) { return chain.Lookup(key); };
  bool registered = false;
  // Not a candidate, not registered: nothing.
  KVTIER_EXPECT_OK(SyncCandidacy(policy, Key(3), false, chain.at(3), 4096, lookup, &registered));
  EXPECT_FALSE(registered);
  EXPECT_THAT(policy.log, IsEmpty());
  EXPECT_EQ(chain.lookups, 0);
  // Becomes one: Added with its traits (the walk included), touched at its last use.
  KVTIER_EXPECT_OK(SyncCandidacy(policy, Key(3), true, chain.at(3), 4096, lookup, &registered));
  EXPECT_TRUE(registered);
  EXPECT_EQ(policy.size(), 1);
  // Still one: no second Add.
  KVTIER_EXPECT_OK(SyncCandidacy(policy, Key(3), true, chain.at(3), 4096, lookup, &registered));
  EXPECT_TRUE(registered);
  // Stops being one: Removed.
  KVTIER_EXPECT_OK(SyncCandidacy(policy, Key(3), false, chain.at(3), 4096, lookup, &registered));
  EXPECT_FALSE(registered);
  EXPECT_EQ(policy.size(), 0);
  EXPECT_THAT(policy.log, ElementsAre("add 3@2 run 3", "remove 3"));
}

TEST(SyncCandidacyTest, ARefusedAddLeavesItUnregistered) {
  LoggingPolicy policy;
  policy.refuse_adds = true;
  Chain chain({1});
  auto lookup = [&](const BlockKey& key) { return chain.Lookup(key); };
  bool registered = false;
  EXPECT_THAT(SyncCandidacy(policy, Key(1), true, chain.at(1), 4096, lookup, &registered),
              IsError(StatusCode::kInvalidArgument, "refused"));
  EXPECT_FALSE(registered);
  EXPECT_THAT(policy.log, ElementsAre("add 1@0 run 1"));
}

TEST(SyncCandidacyTest, AFailedRemoveStillUnregisters) {
  LoggingPolicy policy;
  Chain chain({1});
  auto lookup = [&](const BlockKey& key) { return chain.Lookup(key); };
  bool registered = true;  // the caller believes so; the policy does not know the block
  EXPECT_THAT(SyncCandidacy(policy, Key(1), false, chain.at(1), 4096, lookup, &registered),
              IsError(StatusCode::kNotFound, "not a candidate"));
  EXPECT_FALSE(registered);
  EXPECT_THAT(policy.log, ElementsAre("remove 1"));
}

TEST(SyncCandidacyTest, TraitsOutOfRangeAreThePolicysError) {
  const auto lru = MakeLruPolicy();
  Chain chain({1});
  bool registered = false;
  EXPECT_THAT(SyncCandidacy(
                  *lru, Key(1), true, chain.at(1), /*bytes=*/0,
                  [&](const BlockKey& key) { return chain.Lookup(key); }, &registered),
              IsError(StatusCode::kInvalidArgument, "bytes 0"));
  EXPECT_FALSE(registered);
  EXPECT_EQ(lru->size(), 0);
}

}  // namespace
}  // namespace kvtier
