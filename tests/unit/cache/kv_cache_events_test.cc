// KvCache's events as a KV-aware router reads them (kv_cache_stats.h CacheEvent): the parent key,
// token count, adapter and worker of every stored and removed block copy, kAllCleared from
// ResetPrefixCache; and the callback subscription (KvCache::SubscribeEvents): exactly the events
// PollEvents returns, in order, none after the handle goes, no deadlock when a callback reads the
// cache, and increasing numbers while two threads change the cache at once.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
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
using ::kvtier::testing::KvCacheFixture;
using ::kvtier::testing::KvCacheTestConfig;
using ::testing::ElementsAre;
using ::testing::SizeIs;

constexpr int kB = 4;  // KvCacheEnv::kTokensPerBlock
constexpr char kWorker[] = "host3:gpu1";

SequenceId Seq(uint64_t id) { return SequenceId(id); }

SequenceOptions Lora(const std::string& id) {
  SequenceOptions o;
  o.adapter = AdapterIdentity{id, 7};
  return o;
}

bool SameEvent(const CacheEvent& a, const CacheEvent& b) {
  return a.sequence == b.sequence && a.kind == b.kind && a.tier == b.tier && a.key == b.key &&
         a.has_parent == b.has_parent && a.parent_key == b.parent_key &&
         a.num_tokens == b.num_tokens && a.adapter_id == b.adapter_id && a.worker_id == b.worker_id;
}

// Collects what a subscription's callback receives, from any thread.
class Recorder {
 public:
  CacheEventCallback Callback() {
    return [this](absl::Span<const CacheEvent> batch) {
      std::lock_guard<std::mutex> lock(mu_);
      ++batches_;
      // Within a batch, and across batches, the numbers run on without a gap.
      for (const CacheEvent& e : batch) {
        if (!events_.empty() && e.sequence != events_.back().sequence + 1) ++gaps_;
        events_.push_back(e);
      }
    };
  }
  std::vector<CacheEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  int batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }
  int gaps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return gaps_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<CacheEvent> events_;
  int batches_ = 0;
  int gaps_ = 0;
};

class KvCacheEventsTest : public KvCacheFixture {
 protected:
  void BuildWithWorker(const KvCacheTestConfig& config) {
    Build(config, [](KvCacheOptions& o) { o.worker_id = kWorker; });
  }
  // Creates `id` with `options`, appends `tokens` and reports them all written.
  void Write(uint64_t id, const std::vector<int32_t>& tokens, const SequenceOptions& options = {}) {
    KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(id), options));
    ASSERT_TRUE(cache_->Append(Seq(id), tokens).ok());
    KVTIER_ASSERT_OK(cache_->ReportWritten(Seq(id), static_cast<int64_t>(tokens.size())));
  }
  std::vector<BlockKey> Keys(const std::vector<int32_t>& tokens,
                             const SequenceOptions& options = {}) {
    absl::StatusOr<HashedPrompt> p = cache_->HashPrompt(tokens, options);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::vector<BlockKey>(p->keys().begin(), p->keys().end())
                  : std::vector<BlockKey>();
  }
  static std::vector<CacheEvent> OfKind(const std::vector<CacheEvent>& events, CacheEventKind k) {
    std::vector<CacheEvent> out;
    for (const CacheEvent& e : events) {
      if (e.kind == k) out.push_back(e);
    }
    return out;
  }
};

TEST_F(KvCacheEventsTest, StoredEventsChainParentsAndNameTokensAdapterAndWorker) {
  BuildWithWorker({.hbm_blocks = 16, .dram_blocks = 0});
  const std::vector<int32_t> lora_tokens = Iota(3 * kB, 100);
  const std::vector<int32_t> base_tokens = Iota(2 * kB, 900);
  Write(1, lora_tokens, Lora("lora-sql"));
  Write(2, base_tokens);
  const std::vector<BlockKey> lora_keys = Keys(lora_tokens, Lora("lora-sql"));
  const std::vector<BlockKey> base_keys = Keys(base_tokens);
  const std::vector<CacheEvent> events = cache_->PollEvents(0);
  ASSERT_THAT(events, SizeIs(5));
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].sequence, i + 1);
    EXPECT_EQ(events[i].kind, CacheEventKind::kStored);
    EXPECT_EQ(events[i].tier, Tier::kHbm);
    EXPECT_EQ(events[i].num_tokens, kB);
    EXPECT_EQ(events[i].worker_id, kWorker);
  }
  // Sequence 1's three blocks under its adapter, each the child of the one before.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i].key, lora_keys[i]);
    EXPECT_EQ(events[i].adapter_id, "lora-sql");
  }
  EXPECT_FALSE(events[0].has_parent);
  EXPECT_EQ(events[0].parent_key, kRootBlockKey);
  EXPECT_TRUE(events[1].has_parent);
  EXPECT_EQ(events[1].parent_key, lora_keys[0]);
  EXPECT_TRUE(events[2].has_parent);
  EXPECT_EQ(events[2].parent_key, lora_keys[1]);
  // Sequence 2: the base model, no adapter; its own chain.
  EXPECT_EQ(events[3].key, base_keys[0]);
  EXPECT_FALSE(events[3].has_parent);
  EXPECT_EQ(events[3].adapter_id, "");
  EXPECT_EQ(events[4].key, base_keys[1]);
  EXPECT_TRUE(events[4].has_parent);
  EXPECT_EQ(events[4].parent_key, base_keys[0]);
  EXPECT_EQ(events[4].adapter_id, "");
  KVTIER_EXPECT_OK(cache_->Release(Seq(1)));
  KVTIER_EXPECT_OK(cache_->Release(Seq(2)));
}

TEST_F(KvCacheEventsTest, WorkerIdIsEmptyByDefaultAndBoundedInLength) {
  Build({.hbm_blocks = 8, .dram_blocks = 0});
  Write(1, Iota(kB, 100));
  const std::vector<CacheEvent> events = cache_->PollEvents(0);
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].worker_id, "");
  KVTIER_EXPECT_OK(cache_->Release(Seq(1)));
  KvCacheOptions o = env_->MakeOptions();
  o.worker_id = std::string(257, 'w');
  EXPECT_THAT(KvCache::Create(env_->ns(), std::move(o)),
              IsError(StatusCode::kInvalidArgument, "worker_id"));
}

TEST_F(KvCacheEventsTest, EvictionRemovesWithTheFieldsTheStoreHad) {
  // HBM of 4 blocks and nothing below: an eviction drops the block (kRemoved from HBM).
  BuildWithWorker({.hbm_blocks = 4, .dram_blocks = 0});
  const std::vector<int32_t> tokens = Iota(2 * kB, 100);
  Write(1, tokens, Lora("lora-sql"));
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  const uint64_t stored_up_to = cache_->stats().last_event_sequence;
  ASSERT_EQ(stored_up_to, 2u);
  // Four new blocks take every slot: both cached blocks go, leaf first.
  Write(2, Iota(4 * kB, 5000));
  const std::vector<CacheEvent> all = cache_->PollEvents(0);
  const std::vector<CacheEvent> removed = OfKind(all, CacheEventKind::kRemoved);
  ASSERT_THAT(removed, SizeIs(2));
  const std::vector<BlockKey> keys = Keys(tokens, Lora("lora-sql"));
  EXPECT_EQ(removed[0].key, keys[1]);
  EXPECT_TRUE(removed[0].has_parent);
  EXPECT_EQ(removed[0].parent_key, keys[0]);
  EXPECT_EQ(removed[1].key, keys[0]);
  EXPECT_FALSE(removed[1].has_parent);
  EXPECT_EQ(removed[1].parent_key, kRootBlockKey);
  for (const CacheEvent& r : removed) {
    EXPECT_EQ(r.tier, Tier::kHbm);
    EXPECT_EQ(r.num_tokens, kB);
    EXPECT_EQ(r.adapter_id, "lora-sql");
    EXPECT_EQ(r.worker_id, kWorker);
    // The same fields as the block's kStored, but the kind and number.
    const auto stored = std::find_if(all.begin(), all.end(), [&](const CacheEvent& s) {
      return s.kind == CacheEventKind::kStored && s.key == r.key;
    });
    ASSERT_NE(stored, all.end());
    EXPECT_LE(stored->sequence, stored_up_to);
    CacheEvent same = r;
    same.kind = CacheEventKind::kStored;
    same.sequence = stored->sequence;
    EXPECT_TRUE(SameEvent(same, *stored));
  }
  KVTIER_EXPECT_OK(cache_->Release(Seq(2)));
}

TEST_F(KvCacheEventsTest, ResetPrefixCacheEndsWithAllCleared) {
  BuildWithWorker({.hbm_blocks = 8, .dram_blocks = 0});
  Write(1, Iota(2 * kB, 100), Lora("lora-sql"));
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  const uint64_t before = cache_->stats().last_event_sequence;
  absl::StatusOr<int64_t> dropped = cache_->ResetPrefixCache(Tier::kHbm);
  KVTIER_ASSERT_OK(dropped.status());
  EXPECT_EQ(*dropped, 2);
  const std::vector<CacheEvent> events = cache_->PollEvents(before);
  ASSERT_THAT(events, SizeIs(3));
  EXPECT_EQ(events[0].kind, CacheEventKind::kRemoved);
  EXPECT_EQ(events[0].adapter_id, "lora-sql");
  EXPECT_EQ(events[1].kind, CacheEventKind::kRemoved);
  EXPECT_EQ(events[1].adapter_id, "lora-sql");
  const CacheEvent& cleared = events[2];
  EXPECT_EQ(cleared.kind, CacheEventKind::kAllCleared);
  EXPECT_EQ(cleared.tier, Tier::kHbm);
  EXPECT_EQ(cleared.key, kRootBlockKey);
  EXPECT_FALSE(cleared.has_parent);
  EXPECT_EQ(cleared.num_tokens, 0);
  EXPECT_EQ(cleared.adapter_id, "");
  EXPECT_EQ(cleared.worker_id, kWorker);
  EXPECT_EQ(cleared.sequence, before + 3);
}

TEST_F(KvCacheEventsTest, SubscribeRejectsAnEmptyCallback) {
  Build({.hbm_blocks = 8, .dram_blocks = 0});
  EXPECT_THAT(cache_->SubscribeEvents(nullptr), IsError(StatusCode::kInvalidArgument, "callback"));
  EXPECT_EQ(cache_->stats().last_event_sequence, 0u);
}

TEST_F(KvCacheEventsTest, SubscriptionReceivesExactlyWhatPollEventsReturns) {
  // A DRAM tier under a small HBM: evictions demote, so copies land on transfer threads too.
  BuildWithWorker({.hbm_blocks = 8, .dram_blocks = 32});
  Write(1, Iota(2 * kB, 1));  // before the subscription: not delivered
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  const uint64_t before = cache_->stats().last_event_sequence;
  ASSERT_EQ(before, 2u);
  Recorder rec;
  absl::StatusOr<EventSubscription> sub = cache_->SubscribeEvents(rec.Callback());
  KVTIER_ASSERT_OK(sub.status());
  EXPECT_TRUE(sub->active());
  EXPECT_EQ(sub->first_sequence(), before + 1);
  for (uint64_t id = 2; id < 8; ++id) {
    Write(id, Iota(5 * kB, static_cast<int32_t>(id * 1000)),
          id % 2 == 0 ? Lora("lora-a") : SequenceOptions{});
    KVTIER_ASSERT_OK(cache_->Release(Seq(id)));
  }
  KVTIER_ASSERT_OK(cache_->ResetPrefixCache().status());
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
  const std::vector<CacheEvent> polled = cache_->PollEvents(sub->first_sequence() - 1, 100000);
  const std::vector<CacheEvent> got = rec.events();
  ASSERT_EQ(got.size(), polled.size());
  ASSERT_GT(got.size(), 30u);  // 30 blocks stored, demotions, removals, the clears
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(SameEvent(got[i], polled[i])) << "event " << i;
  }
  EXPECT_EQ(got.front().sequence, before + 1);
  EXPECT_EQ(got.back().sequence, cache_->stats().last_event_sequence);
  EXPECT_EQ(rec.gaps(), 0);
  // Batched: one call per cache call (or landed transfer), not one per event.
  EXPECT_LT(rec.batches(), static_cast<int>(got.size()));
  // Demotions happened (their stores landed on the transfer engine's threads).
  EXPECT_FALSE(OfKind(got, CacheEventKind::kAllCleared).empty());
  EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](const CacheEvent& e) {
    return e.kind == CacheEventKind::kStored && e.tier == Tier::kDram;
  }));
}

TEST_F(KvCacheEventsTest, DestroyingTheSubscriptionStopsDelivery) {
  Build({.hbm_blocks = 16, .dram_blocks = 0});
  Recorder rec;
  {
    absl::StatusOr<EventSubscription> sub = cache_->SubscribeEvents(rec.Callback());
    KVTIER_ASSERT_OK(sub.status());
    // A moved subscription keeps delivering; the moved-from one is inactive.
    EventSubscription moved = *std::move(sub);
    EXPECT_FALSE(sub->active());  // NOLINT(bugprone-use-after-move): checking the moved-from
    EXPECT_TRUE(moved.active());
    Write(1, Iota(2 * kB, 100));
    EXPECT_THAT(rec.events(), SizeIs(2));
  }
  Write(2, Iota(2 * kB, 900));
  EXPECT_THAT(rec.events(), SizeIs(2));
  EXPECT_EQ(cache_->stats().last_event_sequence, 4u);
  // Unsubscribe ends it too, and is idempotent.
  absl::StatusOr<EventSubscription> sub = cache_->SubscribeEvents(rec.Callback());
  KVTIER_ASSERT_OK(sub.status());
  sub->Unsubscribe();
  sub->Unsubscribe();
  EXPECT_FALSE(sub->active());
  KVTIER_EXPECT_OK(cache_->Release(Seq(1)));
  KVTIER_EXPECT_OK(cache_->Release(Seq(2)));
  Write(3, Iota(kB, 5000));
  EXPECT_THAT(rec.events(), SizeIs(2));
  KVTIER_EXPECT_OK(cache_->Release(Seq(3)));
}

TEST_F(KvCacheEventsTest, CallbackMayReadTheCacheAndUnsubscribeItself) {
  Build({.hbm_blocks = 16, .dram_blocks = 0});
  std::vector<uint64_t> seen_last;  // stats().last_event_sequence inside each call
  std::vector<size_t> polled;       // what PollEvents returned inside each call
  EventSubscription sub;
  int calls = 0;
  absl::StatusOr<EventSubscription> made =
      cache_->SubscribeEvents([&](absl::Span<const CacheEvent> batch) {
        ++calls;
        seen_last.push_back(cache_->stats().last_event_sequence);
        polled.push_back(cache_->PollEvents(batch.front().sequence - 1).size());
        if (calls == 2) sub.Unsubscribe();  // from inside its own callback: no wait
      });
  KVTIER_ASSERT_OK(made.status());
  sub = *std::move(made);
  Write(1, Iota(3 * kB, 100));  // 3 kStored in one ReportWritten: one batch
  EXPECT_EQ(calls, 1);
  EXPECT_THAT(seen_last, ElementsAre(3u));
  EXPECT_THAT(polled, ElementsAre(3u));
  Write(2, Iota(kB, 900));
  EXPECT_EQ(calls, 2);
  EXPECT_THAT(seen_last, ElementsAre(3u, 4u));
  EXPECT_THAT(polled, ElementsAre(3u, 1u));
  EXPECT_FALSE(sub.active());
  Write(3, Iota(kB, 5000));
  EXPECT_EQ(calls, 2);
  for (uint64_t id = 1; id <= 3; ++id) KVTIER_EXPECT_OK(cache_->Release(Seq(id)));
}

TEST_F(KvCacheEventsTest, TwoThreadsAppendingDeliverIncreasingNumbers) {
  // Small HBM over DRAM: the two threads evict and demote each other's blocks.
  Build({.hbm_blocks = 12, .dram_blocks = 64});
  std::mutex mu;
  std::vector<uint64_t> numbers;
  std::atomic<int> out_of_order{0};
  absl::StatusOr<EventSubscription> sub =
      cache_->SubscribeEvents([&](absl::Span<const CacheEvent> batch) {
        std::lock_guard<std::mutex> lock(mu);
        for (const CacheEvent& e : batch) {
          if (!numbers.empty() && e.sequence <= numbers.back()) ++out_of_order;
          numbers.push_back(e.sequence);
        }
      });
  KVTIER_ASSERT_OK(sub.status());
  const auto worker = [&](uint64_t base) {
    for (uint64_t i = 0; i < 40; ++i) {
      const uint64_t id = base + i;
      // Every third request repeats an earlier prompt: attach hits and onboards from DRAM too.
      const int32_t first = static_cast<int32_t>((i % 3 == 2 ? base + i - 2 : id) * 100);
      const std::vector<int32_t> prompt = Iota(3 * kB, first);
      if (!cache_->CreateSequence(Seq(id)).ok()) continue;
      absl::StatusOr<AttachResult> hit = cache_->AttachPrefix(Seq(id), prompt);
      const int64_t attached = hit.ok() ? hit->attached_tokens : 0;
      const std::vector<int32_t> rest(prompt.begin() + attached, prompt.end());
      if (cache_->Append(Seq(id), rest).ok()) {
        (void)cache_->EnsureResident(Seq(id), 0, static_cast<int64_t>(prompt.size()));
        (void)cache_->ReportWritten(Seq(id), static_cast<int64_t>(prompt.size()));
      }
      (void)cache_->Release(Seq(id));
    }
  };
  std::thread a(worker, 1000);
  std::thread b(worker, 5000);
  a.join();
  b.join();
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(20)));
  const uint64_t last = cache_->stats().last_event_sequence;
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(out_of_order.load(), 0);
  ASSERT_FALSE(numbers.empty());
  EXPECT_GT(last, 80u);  // 2 x 40 requests of 3 blocks, less the hits, plus demotions
  // Every event from the first on, each once, none missing.
  EXPECT_EQ(numbers.front(), sub->first_sequence());
  EXPECT_EQ(numbers.back(), last);
  EXPECT_EQ(numbers.size(), last - sub->first_sequence() + 1);
}

TEST_F(KvCacheEventsTest, SubscriptionMayOutliveItsCache) {
  Build({.hbm_blocks = 8, .dram_blocks = 0});
  Recorder rec;
  absl::StatusOr<EventSubscription> sub = cache_->SubscribeEvents(rec.Callback());
  KVTIER_ASSERT_OK(sub.status());
  Write(1, Iota(kB, 100));
  KVTIER_ASSERT_OK(cache_->Release(Seq(1)));
  std::vector<CacheEvent> kept = cache_->PollEvents(0);
  DropCache();
  EXPECT_TRUE(sub->active());
  sub->Unsubscribe();  // the cache is gone: only lets go
  ASSERT_THAT(kept, SizeIs(1));
  EXPECT_EQ(kept[0].num_tokens, kB);  // events own nothing of the cache
  EXPECT_THAT(rec.events(), SizeIs(1));
}

}  // namespace
}  // namespace kvtier
