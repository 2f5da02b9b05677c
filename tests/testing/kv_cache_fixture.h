// What a KvCache test builds on: a tiny geometry (2 layers x 2 KV heads x head_dim 8, bf16,
// 4 tokens per block unless configured: 512-byte blocks), its namespace, a settable clock, and
// fresh tier backends for every cache, built by the tier stack builder (emulated HBM and DRAM;
// optionally an NVMe file in a temporary directory and a remote tier over an in-process store),
// each optionally behind a FaultInjectingTier. Plus the checks every KvCache test repeats: the
// per-tier accounting of the stats, and KV bytes written and read back through the device pool
// the way an attention kernel addresses them. And KvCacheFixture, a gtest fixture holding one
// environment and its cache and checking the cache a test leaves.
//
// The namespace's model id is not one KnownModelCost knows, so a cache built here has no prefill
// cost model unless a test sets one: AttachPrefix restores every matched block (but what the
// prompt's last token needs computed), which keeps the expected numbers simple.
#ifndef KVTIER_TESTS_TESTING_KV_CACHE_FIXTURE_H_
#define KVTIER_TESTS_TESTING_KV_CACHE_FIXTURE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/device_block_table.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_cache_stats.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_stack.h"
#include "tests/testing/fault_injecting_tier.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace kvtier::testing {

// A clock for KvCacheOptions::clock that moves only when told: it starts at the real time of its
// creation and only goes forward, so recency, retention and policy ages are deterministic, and a
// deadline set from absl::Now() in the past is in the past for it too. Thread-safe.
class FakeClock {
 public:
  FakeClock() : now_ns_(absl::ToUnixNanos(absl::Now())) {}
  absl::Time Now() const { return absl::FromUnixNanos(now_ns_.load(std::memory_order_acquire)); }
  void Advance(absl::Duration d) {
    if (d > absl::ZeroDuration()) now_ns_.fetch_add(absl::ToInt64Nanoseconds(d));
  }

 private:
  std::atomic<int64_t> now_ns_;
};

struct KvCacheTestConfig {
  int64_t hbm_blocks = 16;
  int64_t dram_blocks = 32;      // 0: no DRAM tier
  int64_t nvme_blocks = 0;       // 0: no NVMe tier
  int64_t remote_blocks = 0;     // 0: no remote tier
  bool fault_injectors = false;  // every tier behind a FaultInjectingTier (see fault())
  HbmLayout hbm_layout = HbmLayout::kLayerFirst;
  bool fake_clock = true;  // options.clock reads clock(); false: the cache's default (absl::Now)
  int tokens_per_block = 4;  // KvCacheEnv::kTokensPerBlock; the regression cases use B = 16
};

class KvCacheEnv {
 public:
  static constexpr int kTokensPerBlock = 4;

  static KvGeometry Geometry(int tokens_per_block = kTokensPerBlock) {
    auto g = KvGeometry::Create({.num_layers = 2,
                                 .num_kv_heads = 2,
                                 .head_dim = 8,
                                 .dtype = KvDtype::kBf16,
                                 .tokens_per_block = tokens_per_block});
    EXPECT_TRUE(g.ok()) << g.status();
    return *g;
  }
  static CacheNamespace Namespace(HbmLayout layout = HbmLayout::kLayerFirst,
                                  int tokens_per_block = kTokensPerBlock) {
    auto ns = CacheNamespace::Create(
        Geometry(tokens_per_block),
        {.model_id = "kvtier-test/tiny-model", .weights_fingerprint = "w0", .hbm_layout = layout});
    EXPECT_TRUE(ns.ok()) << ns.status();
    return *ns;
  }

  explicit KvCacheEnv(const KvCacheTestConfig& config = {})
      : config_(config),
        ns_(Namespace(config.hbm_layout, config.tokens_per_block)),
        clock_(std::make_shared<FakeClock>()),
        transport_(std::make_shared<InProcessTransport>()) {}

  KvCacheEnv(const KvCacheEnv&) = delete;
  KvCacheEnv& operator=(const KvCacheEnv&) = delete;

  const KvCacheTestConfig& config() const { return config_; }
  const CacheNamespace& ns() const { return ns_; }
  const KvGeometry& geometry() const { return ns_.geometry(); }
  FakeClock& clock() { return *clock_; }
  InProcessTransport& transport() { return *transport_; }
  const TempDir& dir() const { return dir_; }

  // Options holding fresh backends for every configured tier (a new NVMe file each call), the
  // fake clock (if configured) and room_wait = 5 s; every other field at its default.
  KvCacheOptions MakeOptions() {
    KvCacheOptions options;
    faults_ = {};
    TierStackOptions stack;
    stack.tiers[TierIndex(Tier::kHbm)].capacity_blocks = config_.hbm_blocks;
    stack.hbm.layout = config_.hbm_layout;
    stack.tiers[TierIndex(Tier::kDram)].capacity_blocks = std::max<int64_t>(config_.dram_blocks, 0);
    stack.dram.pin_for_cuda = false;
    stack.tiers[TierIndex(Tier::kNvme)].capacity_blocks = std::max<int64_t>(config_.nvme_blocks, 0);
    if (config_.nvme_blocks > 0) {
      stack.nvme.path = dir_.File(absl::StrCat("nvme_", files_++, ".bin"));
    }
    stack.nvme.queue_depth = 8;
    stack.tiers[TierIndex(Tier::kRemote)].capacity_blocks =
        std::max<int64_t>(config_.remote_blocks, 0);
    stack.remote.transport = transport_;
    if (config_.fault_injectors) {
      stack.wrap = [this](Tier t, std::unique_ptr<TierBackend> backend) {
        auto wrapped = std::make_unique<FaultInjectingTier>(std::move(backend));
        faults_[TierIndex(t)] = wrapped.get();
        return std::unique_ptr<TierBackend>(std::move(wrapped));
      };
    }
    absl::StatusOr<TierBackends> tiers = BuildTierStack(ns_, stack);
    EXPECT_TRUE(tiers.ok()) << tiers.status();
    if (tiers.ok()) options.tiers = *std::move(tiers);
    if (config_.fake_clock) {
      options.clock = [clock = clock_] { return clock->Now(); };
    }
    options.room_wait = absl::Seconds(5);
    return options;
  }

  absl::StatusOr<std::unique_ptr<KvCache>> NewCache(absl::FunctionRef<void(KvCacheOptions&)> edit) {
    KvCacheOptions options = MakeOptions();
    edit(options);
    return KvCache::Create(ns_, std::move(options));
  }
  absl::StatusOr<std::unique_ptr<KvCache>> NewCache() {
    return NewCache([](KvCacheOptions&) {});
  }

  // The FaultInjectingTier around tier `t` of the options MakeOptions returned last; nullptr
  // without fault_injectors or for an absent tier. Owned by that cache: valid while it lives.
  FaultInjectingTier* fault(Tier t) const { return faults_[TierIndex(t)]; }

 private:
  KvCacheTestConfig config_;
  TempDir dir_;  // before the tiers' files are made, after every cache is gone (see KvCacheTest)
  CacheNamespace ns_;
  std::shared_ptr<FakeClock> clock_;
  std::shared_ptr<InProcessTransport> transport_;
  std::array<FaultInjectingTier*, kNumTiers> faults_{};
  int files_ = 0;
};

// Every field of `s`, for failure messages and for "nothing changed" comparisons.
inline std::string StatsString(const KvCacheStats& s) {
  std::string out = absl::StrCat(
      "live_sequences=", s.live_sequences, " open_tickets=", s.open_tickets,
      " attach_queries=", s.attach_queries, " query_tokens=", s.query_tokens,
      " matched_tokens=", s.matched_tokens, " attached_tokens=", s.attached_tokens,
      " cached_but_recomputed_blocks=", s.cached_but_recomputed_blocks,
      " indexed_blocks=", s.indexed_blocks, " last_event_sequence=", s.last_event_sequence);
  for (int i = 0; i < kNumTiers; ++i) {
    const KvTierStats& t = s.tiers[static_cast<size_t>(i)];
    absl::StrAppend(&out, "\n  ", std::string(TierName(static_cast<Tier>(i))),
                    ": present=", t.present, " capacity=", t.capacity_blocks,
                    " free=", t.free_blocks, " locked=", t.locked_blocks, " held=", t.held_blocks,
                    " droppable=", t.droppable_blocks, " in_flight=", t.in_flight_blocks,
                    " quarantined=", t.quarantined_blocks, " hits=", t.hits, " misses=", t.misses,
                    " bytes_in=", t.bytes_in, " bytes_out=", t.bytes_out, " stored=", t.stored,
                    " evictions=", t.evictions, " demotions=", t.demotions,
                    " failed_loads=", t.failed_loads, " corrupt_reads=", t.corrupt_reads);
  }
  return out;
}

// The gauges of kv_cache_stats.h: per present tier, free + locked + held + droppable +
// in_flight + quarantined == capacity with every term >= 0; an absent tier is all zeros.
// Returns a description of the first violation, or "" if none.
inline std::string TierAccountingError(const KvCacheStats& s) {
  for (int i = 0; i < kNumTiers; ++i) {
    const KvTierStats& t = s.tiers[static_cast<size_t>(i)];
    const std::string name(TierName(static_cast<Tier>(i)));
    if (!t.present) {
      if (t.capacity_blocks != 0 || t.free_blocks != 0 || t.locked_blocks != 0 ||
          t.held_blocks != 0 || t.droppable_blocks != 0 || t.in_flight_blocks != 0 ||
          t.quarantined_blocks != 0 || t.hits != 0 || t.stored != 0 || t.bytes_in != 0) {
        return absl::StrCat(name, " is absent but has non-zero stats");
      }
      continue;
    }
    if (t.free_blocks < 0 || t.locked_blocks < 0 || t.held_blocks < 0 || t.droppable_blocks < 0 ||
        t.in_flight_blocks < 0 || t.quarantined_blocks < 0) {
      return absl::StrCat(name, " has a negative gauge");
    }
    // Counters that count subsets of others (kv_cache_stats.h). A demotion used to be counted
    // when it started and its eviction when it landed, so a snapshot could show more demotions
    // than evictions (found by the fuzzer).
    if (t.demotions > t.evictions || t.corrupt_reads + t.missing_reads > t.failed_loads) {
      return absl::StrCat(name, ": demotions ", t.demotions, " > evictions ", t.evictions,
                          " or corrupt + missing reads ", t.corrupt_reads, " + ", t.missing_reads,
                          " > failed loads ", t.failed_loads);
    }
    const int64_t sum = t.free_blocks + t.locked_blocks + t.held_blocks + t.droppable_blocks +
                        t.in_flight_blocks + t.quarantined_blocks;
    if (sum != t.capacity_blocks) {
      return absl::StrCat(name,
                          ": free + locked + held + droppable + in_flight + quarantined = ", sum,
                          " != capacity ", t.capacity_blocks);
    }
  }
  return "";
}

inline void ExpectTierAccounting(const KvCacheStats& s) {
  const std::string error = TierAccountingError(s);
  EXPECT_EQ(error, "") << StatsString(s);
}

// The state after every sequence and ticket was released and the cache is idle: nothing held,
// locked or in flight in any tier, no live sequence or open ticket, and the accounting holds.
inline void ExpectAllReleased(const KvCacheStats& s) {
  for (int i = 0; i < kNumTiers; ++i) {
    const KvTierStats& t = s.tiers[static_cast<size_t>(i)];
    EXPECT_EQ(t.held_blocks, 0) << TierName(static_cast<Tier>(i)) << "\n" << StatsString(s);
    EXPECT_EQ(t.locked_blocks, 0) << TierName(static_cast<Tier>(i)) << "\n" << StatsString(s);
    EXPECT_EQ(t.in_flight_blocks, 0) << TierName(static_cast<Tier>(i)) << "\n" << StatsString(s);
  }
  EXPECT_EQ(s.live_sequences, 0);
  EXPECT_EQ(s.open_tickets, 0);
  ExpectTierAccounting(s);
}

// KV bytes as an attention kernel writes and reads them: every element of block `i` of `table`
// (K and V planes, every layer, token, head and dimension), addressed as device_block_table.h
// says, with bytes derived from `seed`. The pool must be host accessible (the emulated HBM).
inline std::byte PatternByte(uint32_t seed, int layer, int plane, int token, int head, int64_t b) {
  uint64_t x = (uint64_t{seed} * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(layer) << 40) ^
               (static_cast<uint64_t>(plane) << 36) ^ (static_cast<uint64_t>(token) << 20) ^
               (static_cast<uint64_t>(head) << 12) ^ static_cast<uint64_t>(b);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::byte>(x);
}

// Calls fn(address, expected byte) for every byte of block `i` of `table`.
inline void ForEachBlockByte(const KvGeometry& g, const DeviceBlockTable& table, size_t i,
                             uint32_t seed, const std::function<void(std::byte*, std::byte)>& fn) {
  const DevicePoolView& pool = table.pool;
  const int64_t slot = table.slots[i];
  const int64_t head_bytes = int64_t{g.head_dim()} * KvDtypeBytes(g.dtype());
  for (int layer = 0; layer < g.num_layers(); ++layer) {
    for (int plane = 0; plane < 2; ++plane) {
      for (int t = 0; t < g.tokens_per_block(); ++t) {
        for (int h = 0; h < g.num_kv_heads(); ++h) {
          std::byte* p = KvAddress(pool, slot, layer, static_cast<KvPlane>(plane), t, h);
          for (int64_t b = 0; b < head_bytes; ++b) {
            fn(p + b, PatternByte(seed, layer, plane, t, h, b));
          }
        }
      }
    }
  }
}

inline void WriteBlockPattern(const KvGeometry& g, const DeviceBlockTable& table, size_t i,
                              uint32_t seed) {
  ASSERT_TRUE(table.pool.host_accessible);
  ASSERT_GE(table.slots[i], 0);
  ASSERT_EQ(table.pool.k_base.size(), static_cast<size_t>(g.num_layers()));
  ASSERT_EQ(table.pool.v_base.size(), static_cast<size_t>(g.num_layers()));
  ForEachBlockByte(g, table, i, seed, [](std::byte* p, std::byte want) { *p = want; });
}

// Number of bytes of block `i` that differ from the pattern (0: the block reads back intact).
inline int64_t BlockPatternMismatches(const KvGeometry& g, const DeviceBlockTable& table, size_t i,
                                      uint32_t seed) {
  if (!table.pool.host_accessible || table.slots[i] < 0) return -1;
  int64_t bad = 0;
  ForEachBlockByte(g, table, i, seed, [&](std::byte* p, std::byte want) { bad += *p != want; });
  return bad;
}

// A request of `session` with `tokens`, computed and written, not released (sequence `id`).
inline void RunWritten(KvCache& cache, uint64_t id, uint64_t session,
                       const std::vector<int32_t>& tokens) {
  KVTIER_ASSERT_OK(cache.CreateSequence(SequenceId(id), {.session = session}));
  KVTIER_ASSERT_OK(cache.Append(SequenceId(id), tokens).status());
  KVTIER_ASSERT_OK(cache.ReportWritten(SequenceId(id), static_cast<int64_t>(tokens.size())));
}

// A test of one cache: Build makes a fresh KvCacheEnv and its cache; the cache the test leaves is
// checked when it is dropped (TearDown, or the next Build): idle within 10 s, every invariant,
// the stats' accounting.
class KvCacheFixture : public ::testing::Test {
 protected:
  void TearDown() override { DropCache(); }

  void DropCache() {
    if (cache_ != nullptr) {
      KVTIER_EXPECT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(10)));
      KVTIER_EXPECT_OK(cache_->CheckInvariants());
      ExpectTierAccounting(cache_->stats());
    }
    cache_.reset();
  }

  // A new environment of `config` and its cache (KvCacheEnv::NewCache; `edit` changes the options
  // before KvCache::Create). A fatal failure, leaving cache_ null, if Create fails.
  void Build(const KvCacheTestConfig& config, absl::FunctionRef<void(KvCacheOptions&)> edit) {
    DropCache();
    env_ = std::make_unique<KvCacheEnv>(config);
    absl::StatusOr<std::unique_ptr<KvCache>> cache = env_->NewCache(edit);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
  }
  void Build(const KvCacheTestConfig& config) {
    Build(config, [](KvCacheOptions&) {});
  }

  std::unique_ptr<KvCacheEnv> env_;  // before cache_: the cache's NVMe files live in its dir
  std::unique_ptr<KvCache> cache_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_KV_CACHE_FIXTURE_H_
