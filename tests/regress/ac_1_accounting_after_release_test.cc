// AC-1: after any sequence of create/append/fork/release/evict with every sequence released,
// "held by sequences" is 0 in every tier and free + cached + quarantined == capacity.
//
// A property test with fixed seeds: random operations on page tables sharing one allocator and
// one block index (prefix hits adopt cached blocks, transfers go in flight, fail into quarantine
// and are reclaimed). After every operation the accounting invariant holds, every counter equals
// a recount of slot states, and every slot's reference count equals the number of table entries
// that point at it.
#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "kvtier/block_allocator.h"
#include "kvtier/block_index.h"
#include "kvtier/page_table.h"
#include "kvtier/prefix_hasher.h"
#include "tests/testing/accounting.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

constexpr int kB = 16;
constexpr int64_t kCapacity = 48;

class World {
 public:
  explicit World(uint32_t seed)
      : rng_(seed),
        hasher_(testing::MakeHasher(kB)),
        allocator_(std::move(BlockAllocator::Create(Tier::kHbm, kCapacity)).value()),
        index_(std::move(BlockIndex::Create(kB)).value()) {}

  void Step() {
    switch (rng_() % 10) {
      case 0:
      case 1: Create(); break;
      case 2:
      case 3: AppendTo(); break;
      case 4: Fork(); break;
      case 5: Truncate(); break;
      case 6: Release(); break;
      case 7: Evict(); break;
      case 8: Transfer(); break;
      case 9: SettleQuarantine(); break;
    }
  }

  void ReleaseEverything() {
    while (!live_.empty()) {
      KVTIER_ASSERT_OK(live_.back()->Release());
      live_.pop_back();
    }
    for (SlotId s : in_flight_) KVTIER_ASSERT_OK(allocator_->FailTransfer(s));
    for (SlotId s : in_flight_) quarantined_.push_back(s);
    in_flight_.clear();
  }

  // The invariants that must hold after every operation.
  void Check() {
    testing::ExpectAccounting(*allocator_);
    absl::flat_hash_map<SlotId, uint32_t> refs;
    for (const auto& t : live_) {
      for (SlotId s : t->block_table()) ++refs[s];
    }
    for (int64_t i = 0; i < kCapacity; ++i) {
      const SlotId s(static_cast<uint32_t>(i));
      const SlotState state = *allocator_->state(s);
      const uint32_t want = refs.contains(s) ? refs[s] : 0;
      if (state == SlotState::kWritable || state == SlotState::kSealed) {
        EXPECT_EQ(*allocator_->ref_count(s), want) << "slot " << i;
      } else {
        EXPECT_EQ(want, 0u) << "a table points at slot " << i << " in state "
                            << SlotStateName(state);
      }
    }
    EXPECT_EQ(allocator_->counts().held(), static_cast<int64_t>(refs.size()));
    // Every indexed copy is a block the tier still holds.
    for (const auto& [slot, key] : published_) {
      const SlotState state = *allocator_->state(slot);
      EXPECT_TRUE(state == SlotState::kSealed || state == SlotState::kCached)
          << "indexed slot " << slot.value() << " is " << SlotStateName(state);
    }
  }

  const BlockAllocator& allocator() const { return *allocator_; }
  const std::vector<SlotId>& quarantined() const { return quarantined_; }
  void ReclaimAll() {
    for (SlotId s : quarantined_) KVTIER_ASSERT_OK(allocator_->ReclaimQuarantined(s));
    quarantined_.clear();
  }
  int64_t hits() const { return hits_; }

 private:
  size_t Pick(size_t n) { return rng_() % n; }

  std::vector<int32_t> RandomTokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = static_cast<int32_t>(rng_() % 50);
    return t;
  }

  // Seals publish their key (the first copy of a content wins; duplicates stay unindexed).
  void Publish(const PageTable& t) {
    auto keys = hasher_.BlockKeys(t.tokens());
    ASSERT_TRUE(keys.ok()) << keys.status();
    for (size_t i = 0; i < keys->size(); ++i) {
      const SlotId slot = t.block_table()[i];
      if (index_->Lookup((*keys)[i]).has_value() || published_.contains(slot)) continue;
      KVTIER_ASSERT_OK(index_->AddCopy((*keys)[i], Tier::kHbm, slot, CopyState::kReady, 0));
      published_[slot] = (*keys)[i];
    }
  }

  void Create() {
    // One of a few shared system prompts, then a private suffix.
    std::mt19937 prefix_rng(static_cast<uint32_t>(Pick(3)));
    std::vector<int32_t> prompt(48);
    for (int32_t& x : prompt) x = static_cast<int32_t>(prefix_rng() % 50);
    for (int32_t x : RandomTokens(static_cast<int>(Pick(40)))) prompt.push_back(x);

    auto table = std::move(PageTable::Create(SequenceId(next_id_++), allocator_.get(), kB)).value();
    auto keys = hasher_.BlockKeys(prompt);
    ASSERT_TRUE(keys.ok());
    std::vector<BlockLocation> where;
    auto match = index_->Match(*keys, static_cast<int64_t>(prompt.size()), &where);
    ASSERT_TRUE(match.ok());
    // Two phases: adopt (pin) every matched block first, then allocate the rest.
    for (size_t i = 0; i < where.size(); ++i) {
      KVTIER_ASSERT_OK(table->AppendCachedBlock(
          where[i].tier, where[i].slot, absl::MakeConstSpan(prompt).subspan(i * kB, kB)));
      ++hits_;
    }
    const size_t done = where.size() * kB;
    auto appended = table->Append(absl::MakeConstSpan(prompt).subspan(done));
    if (!appended.ok()) {
      EXPECT_EQ(appended.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(table->num_tokens(), static_cast<int64_t>(done)) << "a failed append changed it";
    }
    Publish(*table);
    live_.push_back(std::move(table));
  }

  void AppendTo() {
    if (live_.empty()) return;
    PageTable& t = *live_[Pick(live_.size())];
    const int64_t before = t.num_tokens();
    auto r = t.Append(RandomTokens(1 + static_cast<int>(Pick(20))));
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(t.num_tokens(), before);
      return;
    }
    Publish(t);
  }

  void Fork() {
    if (live_.empty()) return;
    PageTable& t = *live_[Pick(live_.size())];
    auto f = t.Fork(SequenceId(next_id_++), static_cast<int64_t>(Pick(t.num_tokens() + 1)));
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), absl::StatusCode::kResourceExhausted);
      return;
    }
    live_.push_back(std::move(f->child));
  }

  void Truncate() {
    if (live_.empty()) return;
    PageTable& t = *live_[Pick(live_.size())];
    auto r = t.Truncate(static_cast<int64_t>(Pick(t.num_tokens() + 1)));
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
    }
  }

  void Release() {
    if (live_.empty()) return;
    const size_t i = Pick(live_.size());
    KVTIER_ASSERT_OK(live_[i]->Release());
    // A second release is refused and changes nothing.
    const SlotCounts before = allocator_->counts();
    EXPECT_EQ(live_[i]->Release().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(allocator_->counts().free, before.free);
    live_.erase(live_.begin() + static_cast<ptrdiff_t>(i));
  }

  void Evict() {
    std::vector<SlotId> cached;
    for (int64_t i = 0; i < kCapacity; ++i) {
      const SlotId s(static_cast<uint32_t>(i));
      if (*allocator_->state(s) == SlotState::kCached) cached.push_back(s);
    }
    if (cached.empty()) return;
    const SlotId victim = cached[Pick(cached.size())];
    if (auto it = published_.find(victim); it != published_.end()) {
      KVTIER_ASSERT_OK(index_->RemoveCopy(it->second, Tier::kHbm));
      published_.erase(it);
    }
    KVTIER_ASSERT_OK(allocator_->Evict(victim));
  }

  void Transfer() {
    if (!in_flight_.empty() && Pick(2) == 0) {
      const SlotId s = in_flight_.back();
      in_flight_.pop_back();
      switch (Pick(3)) {
        case 0: KVTIER_ASSERT_OK(allocator_->CompleteTransfer(s)); break;
        case 1: KVTIER_ASSERT_OK(allocator_->CancelTransfer(s)); break;
        case 2:
          KVTIER_ASSERT_OK(allocator_->FailTransfer(s));
          quarantined_.push_back(s);
          break;
      }
      return;
    }
    auto s = allocator_->AllocateForTransfer();
    if (s.ok()) in_flight_.push_back(*s);
  }

  void SettleQuarantine() {
    if (quarantined_.empty()) return;
    KVTIER_ASSERT_OK(allocator_->ReclaimQuarantined(quarantined_.back()));
    quarantined_.pop_back();
  }

  std::mt19937 rng_;
  PrefixHasher hasher_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<BlockIndex> index_;
  std::vector<std::unique_ptr<PageTable>> live_;
  absl::flat_hash_map<SlotId, BlockKey> published_;
  std::vector<SlotId> in_flight_;
  std::vector<SlotId> quarantined_;
  uint64_t next_id_ = 1;
  int64_t hits_ = 0;
};

TEST(Regress_AC_1, HeldIsZeroAndSlotsAccountedAfterRandomOperations) {
  int64_t total_hits = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    World world(seed);
    for (int step = 0; step < 300; ++step) {
      world.Step();
      world.Check();
      if (::testing::Test::HasFailure()) FAIL() << "seed " << seed << " step " << step;
    }
    world.ReleaseEverything();
    const SlotCounts c = world.allocator().counts();
    EXPECT_EQ(c.held(), 0) << "seed " << seed;
    EXPECT_EQ(c.in_flight, 0);
    EXPECT_EQ(c.free + c.cached + c.quarantined, kCapacity) << "seed " << seed;
    EXPECT_EQ(c.quarantined, static_cast<int64_t>(world.quarantined().size()));
    world.ReclaimAll();
    EXPECT_EQ(world.allocator().counts().free + world.allocator().counts().cached, kCapacity);
    world.Check();
    total_hits += world.hits();
  }
  EXPECT_GT(total_hits, 0) << "the workload never hit a cached prefix: it tests too little";
}

}  // namespace
}  // namespace kvtier
