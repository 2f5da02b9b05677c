// Remote discovery (src/cache/remote_discovery.cc): a cache finds, by key, blocks another cache
// (or another process) of the same namespace put in a shared store (an in-process map, a
// directory, a real Redis, a real Redis Cluster of 3 masters), attaches them as remote blocks and
// onboards them byte-exact; other namespaces and tenants find nothing; a hung or failing store
// ends the match by the probe's deadline without failing the call; and with discovery off (or no
// probe-capable remote tier) the store is never asked. Faults of a real redis-server (slow,
// paused, evicting) are in remote_discovery_redis_fault_test.cc.
#include <sys/wait.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/directory_transport.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/kv_cache.h"
#include "kvtier/nvme_tier.h"
#include "kvtier/redis_transport.h"
#include "kvtier/remote_tier.h"
#include "kvtier/tier_stack.h"
#include "kvtier/transport.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/unit/cache/remote_discovery_helpers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::discovery_testing::ComputeAndStore;
using ::kvtier::discovery_testing::ExpectBlocksFromSeed;
using ::kvtier::discovery_testing::ExpectHealthy;
using ::kvtier::discovery_testing::kRemote;
using ::kvtier::discovery_testing::NamespaceWithWeights;
using ::kvtier::discovery_testing::NewCache;
using ::kvtier::discovery_testing::Seq;
using ::kvtier::discovery_testing::StoreFromAnotherCache;
using ::kvtier::testing::BlockPatternMismatches;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::kvtier::testing::KvCacheEnv;
using ::kvtier::testing::StatsString;
using ::testing::Each;

// A Transport over an InProcessTransport that counts Exists and Get calls and can make them hang
// (never answer: the completions stay pending) or fail with a status.
class ProbeDouble final : public Transport {
 public:
  enum class Mode { kForward, kHang, kFail };
  ProbeDouble() : inner_(std::make_shared<InProcessTransport>()) {}

  void set_mode(Mode mode, absl::Status failure = absl::OkStatus()) {
    internal::MutexLock lock(&mu_);
    mode_ = mode;
    failure_ = std::move(failure);
  }
  // Runs at the start of every Exists call (the cache's lock is not held then).
  void set_on_exists(std::function<void()> hook) {
    internal::MutexLock lock(&mu_);
    on_exists_ = std::move(hook);
  }
  int64_t exists_calls() const { return exists_calls_.load(); }
  int64_t exists_keys() const { return exists_keys_.load(); }
  int64_t get_calls() const { return get_calls_.load(); }
  int64_t get_keys() const { return get_keys_.load(); }

  std::string name() const override { return "probe_double"; }
  std::vector<Completion> Put(absl::Span<const TransportPut> items, absl::Time deadline) override {
    return inner_->Put(items, deadline);
  }
  std::vector<Completion> Get(absl::Span<const TransportGet> items, absl::Time deadline) override {
    get_calls_.fetch_add(1);
    get_keys_.fetch_add(static_cast<int64_t>(items.size()));
    return inner_->Get(items, deadline);
  }
  std::vector<Completion> Exists(absl::Span<const std::string> keys, absl::Time deadline) override {
    exists_calls_.fetch_add(1);
    exists_keys_.fetch_add(static_cast<int64_t>(keys.size()));
    std::function<void()> hook;
    {
      internal::MutexLock lock(&mu_);
      hook = on_exists_;
    }
    if (hook) hook();
    internal::MutexLock lock(&mu_);
    switch (mode_) {
      case Mode::kForward:
        return inner_->Exists(keys, deadline);
      case Mode::kHang:
        return std::vector<Completion>(keys.size());  // pending for ever
      case Mode::kFail:
        return std::vector<Completion>(keys.size(), Completion::Done(failure_));
    }
    return {};
  }
  std::vector<Completion> Delete(absl::Span<const std::string> keys, absl::Time deadline) override {
    return inner_->Delete(keys, deadline);
  }

 private:
  std::shared_ptr<InProcessTransport> inner_;
  std::atomic<int64_t> exists_calls_{0};
  std::atomic<int64_t> exists_keys_{0};
  std::atomic<int64_t> get_calls_{0};
  std::atomic<int64_t> get_keys_{0};
  internal::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kForward;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_exists_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------- two caches over one store

enum class StoreKind { kInProcess, kDirectory, kRedis, kRedisCluster };

std::string StoreName(const ::testing::TestParamInfo<StoreKind>& info) {
  switch (info.param) {
    case StoreKind::kInProcess:
      return "InProcess";
    case StoreKind::kDirectory:
      return "Directory";
    case StoreKind::kRedis:
      return "Redis";
    case StoreKind::kRedisCluster:
      return "RedisCluster";
  }
  return "Unknown";
}

class SharedStoreTest : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case StoreKind::kInProcess:
        transport_ = std::make_shared<InProcessTransport>();
        break;
      case StoreKind::kDirectory: {
        auto t = DirectoryTransport::Create({.root = dir_.File("store")});
        ASSERT_TRUE(t.ok()) << t.status();
        transport_ = std::move(*t);
        break;
      }
      case StoreKind::kRedis: {
        if (!testing::RedisServerAvailable()) {
          GTEST_SKIP()
              << "redis-server is not on PATH: the Redis case of remote discovery needs it";
        }
        auto server = testing::RedisServer::Start();
        ASSERT_TRUE(server.ok()) << server.status();
        redis_ = std::move(*server);
        RedisTransportOptions o;
        o.endpoints = {redis_->address()};
        auto t = RedisTransport::Create(o);
        ASSERT_TRUE(t.ok()) << t.status();
        transport_ = std::move(*t);
        break;
      }
      case StoreKind::kRedisCluster: {
        if (!testing::RedisServerAvailable()) {
          GTEST_SKIP() << "redis-server is not on PATH: the Redis Cluster case of remote "
                          "discovery needs it";
        }
        auto cluster = testing::RedisCluster::Start(3);
        ASSERT_TRUE(cluster.ok()) << cluster.status();
        cluster_ = std::move(*cluster);
        RedisTransportOptions o;
        o.cluster = true;
        o.endpoints = cluster_->addresses();  // every node a seed
        auto t = RedisTransport::Create(o);
        ASSERT_TRUE(t.ok()) << t.status();
        // The first request of a cluster transport also reads the slot map (CLUSTER SLOTS):
        // done here, so a cache's first probe spends its 20 ms on the probe alone.
        std::vector<std::string> keys;
        for (int i = 0; i < 16; ++i) keys.push_back(absl::StrCat("warm-up-", i));
        for (Completion& c : (*t)->Exists(keys, absl::Now() + absl::Seconds(5))) {
          const absl::Status s = c.Wait();
          ASSERT_TRUE(s.ok() || absl::IsNotFound(s)) << s;
        }
        ASSERT_EQ((*t)->stats().slot_map_refreshes, 1);
        transport_ = std::move(*t);
        break;
      }
    }
  }

  // The URL of the Redis store for another process (kvtier_remote_writer's "url" argument).
  std::string RedisUrl() const {
    if (cluster_ != nullptr) {
      return absl::StrCat("redis-cluster://", absl::StrJoin(cluster_->addresses(), ","));
    }
    return absl::StrCat("redis://", redis_->address());
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::RedisServer> redis_;  // outlive the transport (declared before)
  std::unique_ptr<testing::RedisCluster> cluster_;
  std::shared_ptr<Transport> transport_;
};

TEST_P(SharedStoreTest, FreshCacheFindsAndOnboardsAnotherCachesBlocksByteExact) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  const std::vector<int32_t> prompt = Iota(16, 100);  // 4 full blocks
  std::vector<int32_t> query = prompt;
  query.push_back(7);  // the last token is computed: all 4 blocks can be restored
  {
    // Cache A computes the prompt; write-through puts its 4 blocks in the store. Then A goes.
    KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> a, NewCache(ns, transport_, 32));
    ASSERT_NO_FATAL_FAILURE(ComputeAndStore(*a, 1, prompt, 40));
    EXPECT_EQ(a->stats().tiers[kRemote].stored, 4) << StatsString(a->stats());
    ExpectHealthy(*a);
  }

  // Cache B, fresh, same namespace, same store: its index is empty.
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b, NewCache(ns, transport_, 32));
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, b->Lookup(query));
  EXPECT_EQ(where.matched_tokens, 16);
  EXPECT_EQ(where.blocks_by_tier[kRemote], 4);
  EXPECT_EQ(where.discovered_blocks, 4);
  EXPECT_EQ(b->stats().indexed_blocks, 0) << "Lookup must not index what it found";

  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(2), query));
  EXPECT_EQ(r.matched_tokens, 16);
  EXPECT_EQ(r.attached_tokens, 16);
  EXPECT_EQ(r.attached_blocks_by_tier[kRemote], 4);
  KvCacheStats s = b->stats();
  EXPECT_EQ(s.remote_probe.probes, 2) << StatsString(s);
  EXPECT_EQ(s.remote_probe.failures, 0);
  EXPECT_EQ(s.remote_probe.keys_probed, 8);
  EXPECT_EQ(s.remote_probe.blocks_found, 8);  // 4 by Lookup, 4 by AttachPrefix
  EXPECT_EQ(s.remote_probe.blocks_indexed, 4);
  EXPECT_EQ(s.tiers[kRemote].hits, 4);
  EXPECT_LE(s.remote_probe.latency_us_max, s.remote_probe.latency_us_total);

  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(2), 0, 16));
  ASSERT_THAT(t.block_status(), Each(BlockResidency::kResident));
  ExpectBlocksFromSeed(ns.geometry(), t.block_table(), 4, 40);
  KVTIER_ASSERT_OK(b->ReleaseTicket(t));
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  EXPECT_EQ(b->stats().blocks_moved[kRemote][TierIndex(Tier::kHbm)], 4);

  // A second attach of the prompt matches locally now: no probe (the match reaches the limit).
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(3)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult again, b->AttachPrefix(Seq(3), query));
  EXPECT_EQ(again.attached_tokens, 16);
  EXPECT_EQ(b->stats().remote_probe.probes, 2);
  KVTIER_ASSERT_OK(b->Release(Seq(3)));

  // The same tokens under another tenant salt are other blocks: the store has none of them.
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(4), {.tenant_salt = "tenant-b"}));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult salted, b->AttachPrefix(Seq(4), query));
  EXPECT_EQ(salted.attached_tokens, 0);
  s = b->stats();
  EXPECT_EQ(s.remote_probe.probes, 3);
  EXPECT_EQ(s.remote_probe.blocks_found, 8);
  KVTIER_ASSERT_OK(b->Release(Seq(4)));
  ExpectHealthy(*b);

  // A cache of other weights over the same store shares nothing.
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> c,
                              NewCache(NamespaceWithWeights("w1"), transport_, 32));
  KVTIER_ASSERT_OK(c->CreateSequence(Seq(5)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult other, c->AttachPrefix(Seq(5), query));
  EXPECT_EQ(other.attached_tokens, 0);
  EXPECT_EQ(c->stats().remote_probe.probes, 1);
  EXPECT_EQ(c->stats().remote_probe.blocks_found, 0);
  KVTIER_ASSERT_OK(c->Release(Seq(5)));
  ExpectHealthy(*c);
}

// Everything that enters a block's identity keeps caches apart over one store: another model,
// another pipeline stage or first layer (namespace), another adapter load generation (block
// extras). Each finds none of the blocks; the same identity finds all four.
TEST_P(SharedStoreTest, OtherModelStageOrAdapterGenerationSharesNothing) {
  const std::vector<int32_t> prompt = Iota(16, 300);
  std::vector<int32_t> query = prompt;
  query.push_back(7);
  const SequenceOptions adapter_gen1{.adapter = AdapterIdentity{.id = "lora-a", .load_generation = 1}};
  const SequenceOptions adapter_gen2{.adapter = AdapterIdentity{.id = "lora-a", .load_generation = 2}};
  auto ns_with = [](CacheNamespaceOptions o) {
    o.weights_fingerprint = "w0";
    o.hbm_layout = HbmLayout::kLayerFirst;
    auto ns = CacheNamespace::Create(KvCacheEnv::Geometry(), o);
    EXPECT_TRUE(ns.ok()) << ns.status();
    return *ns;
  };
  const CacheNamespace ours = ns_with({.model_id = "kvtier-test/tiny-model"});
  {
    KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> a, NewCache(ours, transport_, 32));
    ASSERT_NO_FATAL_FAILURE(ComputeAndStore(*a, 1, prompt, 70, adapter_gen1));
    EXPECT_EQ(a->stats().tiers[kRemote].stored, 4) << StatsString(a->stats());
  }
  const auto found = [&](const CacheNamespace& ns, const SequenceOptions& options) -> int64_t {
    auto cache = NewCache(ns, transport_, 32);
    EXPECT_TRUE(cache.ok()) << cache.status();
    if (!cache.ok()) return -1;
    EXPECT_TRUE((*cache)->CreateSequence(Seq(9), options).ok());
    absl::StatusOr<AttachResult> r = (*cache)->AttachPrefix(Seq(9), query);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE((*cache)->Release(Seq(9)).ok());
    return r.ok() ? r->attached_blocks_by_tier[kRemote] : -1;
  };
  EXPECT_EQ(found(ours, adapter_gen1), 4);
  EXPECT_EQ(found(ours, adapter_gen2), 0) << "another adapter load generation";
  EXPECT_EQ(found(ours, {}), 0) << "no adapter";
  EXPECT_EQ(found(ns_with({.model_id = "kvtier-test/other-model"}), adapter_gen1), 0)
      << "another model";
  EXPECT_EQ(found(ns_with({.model_id = "kvtier-test/tiny-model", .pp_rank = 1, .pp_size = 2}),
                  adapter_gen1),
            0)
      << "another pipeline stage";
  EXPECT_EQ(found(ns_with({.model_id = "kvtier-test/tiny-model", .first_layer = 2}), adapter_gen1),
            0)
      << "another first layer";
}

// Runs kvtier_remote_writer (another process) with `args`; its exit code, -1 if it did not exit.
int RunWriter(const std::string& args) {
  const std::string command = absl::StrCat(KVTIER_REMOTE_WRITER, " ", args);
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The same across processes: another process computes and stores the prompt and exits; this
// one's fresh cache finds the blocks in the shared directory, Redis or Redis Cluster (the writer
// is given a redis:// or redis-cluster:// URL) and onboards them byte-exact.
TEST_P(SharedStoreTest, BlocksWrittenByAnotherProcessAreFoundAndOnboarded) {
  std::string args;
  switch (GetParam()) {
    case StoreKind::kInProcess:
      GTEST_SKIP() << "an in-process store is not reachable from another process";
    case StoreKind::kDirectory:
      args = absl::StrCat("dir ", dir_.File("store"));
      break;
    case StoreKind::kRedis:
    case StoreKind::kRedisCluster:
      args = absl::StrCat("url ", RedisUrl());
      break;
  }
  ASSERT_EQ(RunWriter(absl::StrCat(args, " 70 20")), 0);  // 5 blocks from seed 70
  if (cluster_ != nullptr) {
    // The writer spoke cluster: its 5 values sit on the nodes owning their slots, not all on one.
    int64_t keys = 0;
    int nodes_with_keys = 0;
    for (int i = 0; i < cluster_->size(); ++i) {
      KVTIER_ASSERT_OK_AND_ASSIGN(std::string dbsize, cluster_->node(i).Command({"DBSIZE"}));
      keys += std::stoll(dbsize);
      nodes_with_keys += dbsize != "0" ? 1 : 0;
    }
    EXPECT_EQ(keys, 5);
    EXPECT_GE(nodes_with_keys, 2);
  }
  const CacheNamespace ns = NamespaceWithWeights("w0");
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b, NewCache(ns, transport_, 32));
  std::vector<int32_t> query = Iota(20, 100);
  query.push_back(3);
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(1)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(1), query));
  EXPECT_EQ(r.attached_blocks_by_tier[kRemote], 5) << StatsString(b->stats());
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(1), 0, 20));
  ASSERT_THAT(t.block_status(), Each(BlockResidency::kResident));
  ExpectBlocksFromSeed(ns.geometry(), t.block_table(), 5, 70);
  KVTIER_ASSERT_OK(b->ReleaseTicket(t));
  KVTIER_ASSERT_OK(b->Release(Seq(1)));
  ExpectHealthy(*b);
}

INSTANTIATE_TEST_SUITE_P(Stores, SharedStoreTest,
                         ::testing::Values(StoreKind::kInProcess, StoreKind::kDirectory,
                                           StoreKind::kRedis, StoreKind::kRedisCluster),
                         StoreName);

// ---------------------------------------------------------------- extending a local match

TEST(RemoteDiscoveryTest, ProbeStartsWhereTheLocalMatchEnds) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<ProbeDouble>();
  const std::vector<int32_t> prompt = Iota(24, 300);  // 6 blocks
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 90));
  // B has the first 2 blocks itself (computed with the same bytes), the store all 6.
  KVTIER_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<KvCache> b,
      NewCache(ns, store, 32, [](KvCacheOptions& o) { o.write_policy = WritePolicy::kWriteBack; }));
  const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 8);
  ASSERT_NO_FATAL_FAILURE(ComputeAndStore(*b, 1, head, 90));
  const int64_t calls_before = store->exists_calls();
  const int64_t keys_before = store->exists_keys();
  std::vector<int32_t> query = prompt;
  query.push_back(1);
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(2), query));
  EXPECT_EQ(r.attached_tokens, 24);
  EXPECT_EQ(r.attached_blocks_by_tier[TierIndex(Tier::kHbm)], 2);
  EXPECT_EQ(r.attached_blocks_by_tier[kRemote], 4);
  EXPECT_EQ(store->exists_calls() - calls_before, 1);  // one batched call
  EXPECT_EQ(store->exists_keys() - keys_before, 4);    // blocks 2..5 only
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(2), 0, 24));
  ASSERT_THAT(t.block_status(), Each(BlockResidency::kResident));
  ExpectBlocksFromSeed(ns.geometry(), t.block_table(), 6, 90);
  KVTIER_ASSERT_OK(b->ReleaseTicket(t));
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  ExpectHealthy(*b);
}

TEST(RemoteDiscoveryTest, WindowBoundsTheKeysOfOneProbe) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<ProbeDouble>();
  const std::vector<int32_t> prompt = Iota(24, 300);
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 90));
  KVTIER_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<KvCache> b,
      NewCache(ns, store, 32, [](KvCacheOptions& o) { o.remote_probe_window_blocks = 3; }));
  std::vector<int32_t> query = prompt;
  query.push_back(1);
  const int64_t keys_before = store->exists_keys();
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(2), query));
  EXPECT_EQ(r.attached_tokens, 12);  // one window of 3 blocks
  EXPECT_EQ(store->exists_keys() - keys_before, 3);
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  ExpectHealthy(*b);
}

// A request's remote blocks reach the store as one batched read: EnsureResident of 8 discovered
// blocks makes one Get of 8 keys (the copies to HBM are staged, so as many start together as
// there are bounce buffers: 8 here), with the bytes each block had.
TEST(RemoteDiscoveryTest, OnboardingReadsARequestsRemoteBlocksInOneBatch) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<ProbeDouble>();
  const std::vector<int32_t> prompt = Iota(32, 500);  // 8 blocks
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 60));
  KVTIER_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<KvCache> b,
      NewCache(ns, store, 32, [](KvCacheOptions& o) { o.bounce_buffers = 8; }));
  std::vector<int32_t> query = prompt;
  query.push_back(1);
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(2), query));
  ASSERT_EQ(r.attached_blocks_by_tier[kRemote], 8);
  const int64_t calls = store->get_calls();
  const int64_t keys = store->get_keys();
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(2), 0, 32));
  ASSERT_THAT(t.block_status(), Each(BlockResidency::kResident));
  EXPECT_EQ(store->get_calls() - calls, 1);
  EXPECT_EQ(store->get_keys() - keys, 8);
  ExpectBlocksFromSeed(ns.geometry(), t.block_table(), 8, 60);
  KVTIER_ASSERT_OK(b->ReleaseTicket(t));
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  ExpectHealthy(*b);
}

// Restart: a cache destroyed and made again over the same NVMe file and the same shared
// directory finds its blocks in both tiers (the NVMe tier by its own warm restart, the store by
// discovery) and onboards them byte-exact. Write-back, 16 HBM blocks, 4 NVMe blocks: of six
// 4-block prompts, HBM evicts the two oldest (LRU) to NVMe, which demotes the oldest on to the
// store; what was only in HBM is gone with the process.
TEST(RemoteDiscoveryTest, RecreatedCacheFindsItsBlocksInNvmeAndTheStoreByteExact) {
  testing::TempDir dir;
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = DirectoryTransport::Create({.root = dir.File("store")});
  ASSERT_TRUE(store.ok()) << store.status();
  const std::shared_ptr<Transport> shared = *std::move(store);
  const std::string nvme_path = dir.File("nvme.bin");
  const auto with_nvme = [&](KvCacheOptions& o) {
    const KvGeometry& g = ns.geometry();
    auto nvme =
        NvmeTier::Create(g, {.path = nvme_path, .capacity_bytes = 4 * NvmeTier::SlotBytes(g)});
    ASSERT_TRUE(nvme.ok()) << nvme.status();
    o.tiers[TierIndex(Tier::kNvme)] = std::move(*nvme);
    o.write_policy = WritePolicy::kWriteBack;
  };
  const auto prompt = [](int p) { return Iota(16, 1000 * (p + 1)); };
  const auto seed = [](int p) { return static_cast<uint32_t>(10 * (p + 1)); };
  {
    KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> a, NewCache(ns, shared, 32, with_nvme));
    for (int p = 0; p < 6; ++p) {
      ASSERT_NO_FATAL_FAILURE(
          ComputeAndStore(*a, static_cast<uint64_t>(p + 1), prompt(p), seed(p)));
    }
    ExpectHealthy(*a);
    EXPECT_EQ(a->stats().tiers[TierIndex(Tier::kNvme)].demotions, 4) << StatsString(a->stats());
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b, NewCache(ns, shared, 32, with_nvme));
  for (int p = 0; p < 6; ++p) {
    std::vector<int32_t> query = prompt(p);
    query.push_back(1);
    KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, b->Lookup(query));
    EXPECT_EQ(where.blocks_by_tier[kRemote], p == 0 ? 4 : 0) << "prompt " << p;
    EXPECT_EQ(where.blocks_by_tier[TierIndex(Tier::kNvme)], p == 1 ? 4 : 0) << "prompt " << p;
    const uint64_t id = static_cast<uint64_t>(100 + p);
    KVTIER_ASSERT_OK(b->CreateSequence(Seq(id)));
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(id), query));
    EXPECT_EQ(r.attached_tokens, p < 2 ? 16 : 0) << "prompt " << p;
    if (r.attached_tokens == 16) {
      KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(id), 0, 16));
      ASSERT_THAT(t.block_status(), Each(BlockResidency::kResident));
      ExpectBlocksFromSeed(ns.geometry(), t.block_table(), 4, seed(p));
      KVTIER_ASSERT_OK(b->ReleaseTicket(t));
    }
    KVTIER_ASSERT_OK(b->Release(Seq(id)));
  }
  EXPECT_EQ(b->stats().remote_probe.blocks_indexed, 4);
  EXPECT_EQ(b->stats().blocks_moved[TierIndex(Tier::kNvme)][TierIndex(Tier::kHbm)], 4);
  EXPECT_EQ(b->stats().blocks_moved[kRemote][TierIndex(Tier::kHbm)], 4);
  ExpectHealthy(*b);
}

// The hashed forms discover as the plain ones do.
TEST(RemoteDiscoveryTest, HashedLookupAndAttachDiscoverToo) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<InProcessTransport>();
  const std::vector<int32_t> prompt = Iota(16, 100);
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 40));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b, NewCache(ns, store, 32));
  std::vector<int32_t> query = prompt;
  query.push_back(1);
  KVTIER_ASSERT_OK_AND_ASSIGN(HashedPrompt hashed, b->HashPrompt(query));
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, b->LookupHashed(hashed));
  EXPECT_EQ(where.matched_tokens, 16);
  EXPECT_EQ(where.discovered_blocks, 4);
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachHashedPrefix(Seq(2), hashed));
  EXPECT_EQ(r.attached_blocks_by_tier[kRemote], 4);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(2), 0, 16));
  ASSERT_THAT(t.block_status(), Each(BlockResidency::kResident));
  EXPECT_EQ(BlockPatternMismatches(ns.geometry(), t.block_table(), 3, 43), 0);
  KVTIER_ASSERT_OK(b->ReleaseTicket(t));
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  ExpectHealthy(*b);
}

// A block the store dropped after it was discovered (evicted by the store, deleted by another
// worker) is a miss when read, never an error: it is reported not resident, leaves the index
// (missing_reads), and the next probe no longer finds it.
TEST(RemoteDiscoveryTest, BlockGoneFromTheStoreAfterDiscoveryIsAMiss) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<InProcessTransport>();
  const std::vector<int32_t> prompt = Iota(16, 100);
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 40));
  ASSERT_EQ(store->size(), 4);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b, NewCache(ns, store, 32));
  std::vector<int32_t> query = prompt;
  query.push_back(1);
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(2), query));
  ASSERT_EQ(r.attached_blocks_by_tier[kRemote], 4);
  // The store loses every value (as Redis under maxmemory would).
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteTier> keys_of,
                              RemoteTier::Create(ns, {.transport = store, .capacity_blocks = 1}));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> block_keys, b->hasher().BlockKeys(prompt, {}));
  for (const BlockKey& k : block_keys) {
    const std::string key = keys_of->StoreKey(k);
    KVTIER_ASSERT_OK(store->Delete({&key, 1}, absl::InfiniteFuture())[0].status());
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(2), 0, 16));
  EXPECT_EQ(t.resident_tokens(), 0);
  EXPECT_EQ(t.block_status()[0], BlockResidency::kNotResident);
  KVTIER_ASSERT_OK(b->ReleaseTicket(t));
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  KVTIER_ASSERT_OK(b->WaitIdle(absl::Now() + absl::Seconds(30)));
  const KvCacheStats s = b->stats();
  EXPECT_GE(s.tiers[kRemote].missing_reads, 1) << StatsString(s);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, b->Lookup(query));
  EXPECT_EQ(where.blocks_by_tier[kRemote], 0);
  EXPECT_EQ(where.discovered_blocks, 0);
  ExpectHealthy(*b);
}

// A value damaged in the store (one flipped byte) is found by the probe but never served: the
// read fails its frame check, is counted as corrupt, and the block is a miss that the request
// recomputes. Its next write replaces the damaged value, so a third cache then finds every block
// whole.
TEST(RemoteDiscoveryTest, CorruptValueInTheStoreIsACountedMissNeverABlock) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<InProcessTransport>();
  const std::vector<int32_t> prompt = Iota(16, 100);
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 40));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteTier> keys_of,
                              RemoteTier::Create(ns, {.transport = store, .capacity_blocks = 1}));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b, NewCache(ns, store, 32));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> block_keys, b->hasher().BlockKeys(prompt, {}));
  std::vector<std::byte>* value = store->MutableValueForTest(keys_of->StoreKey(block_keys[0]));
  ASSERT_NE(value, nullptr);
  value->back() ^= std::byte{0x10};  // a payload byte of block 0

  std::vector<int32_t> query = prompt;
  query.push_back(1);
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(2), query));
  ASSERT_EQ(r.attached_blocks_by_tier[kRemote], 4);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(2), 0, 16));
  EXPECT_EQ(t.block_status()[0], BlockResidency::kNotResident) << "a corrupt block was served";
  KVTIER_ASSERT_OK(b->ReleaseTicket(t));
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  KVTIER_ASSERT_OK(b->WaitIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_GE(b->stats().tiers[kRemote].corrupt_reads, 1) << StatsString(b->stats());

  // B computes the prompt itself; write-through stores block 0 again, replacing the damage.
  ASSERT_NO_FATAL_FAILURE(ComputeAndStore(*b, 3, prompt, 40));
  ExpectHealthy(*b);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> c, NewCache(ns, store, 32));
  KVTIER_ASSERT_OK(c->CreateSequence(Seq(4)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult again, c->AttachPrefix(Seq(4), query));
  ASSERT_EQ(again.attached_blocks_by_tier[kRemote], 4);
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket whole, c->EnsureResident(Seq(4), 0, 16));
  ASSERT_THAT(whole.block_status(), Each(BlockResidency::kResident));
  ExpectBlocksFromSeed(ns.geometry(), whole.block_table(), 4, 40);
  KVTIER_ASSERT_OK(c->ReleaseTicket(whole));
  KVTIER_ASSERT_OK(c->Release(Seq(4)));
  EXPECT_EQ(c->stats().tiers[kRemote].corrupt_reads, 0);
  ExpectHealthy(*c);
}

// The lock is dropped for the probe: a sequence released meanwhile fails the attach as a released
// sequence does, and nothing is adopted for it (on error nothing changes).
TEST(RemoteDiscoveryTest, SequenceReleasedDuringTheProbeAdoptsNothing) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<ProbeDouble>();
  const std::vector<int32_t> prompt = Iota(16, 100);
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 40));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b, NewCache(ns, store, 32));
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KvCache* cache = b.get();
  store->set_on_exists([cache] { KVTIER_EXPECT_OK(cache->Release(Seq(2))); });
  std::vector<int32_t> query = prompt;
  query.push_back(1);
  EXPECT_THAT(b->AttachPrefix(Seq(2), query).status(),
              IsError(StatusCode::kFailedPrecondition, "released"));
  store->set_on_exists({});
  const KvCacheStats s = b->stats();
  EXPECT_EQ(s.remote_probe.probes, 1) << StatsString(s);
  EXPECT_EQ(s.remote_probe.blocks_found, 4);
  EXPECT_EQ(s.remote_probe.blocks_indexed, 0);
  EXPECT_EQ(s.indexed_blocks, 0);
  EXPECT_EQ(s.tiers[kRemote].free_blocks, 32);
  ExpectHealthy(*b);
}

// This worker's budget of remote slots bounds what it indexes: with 2 slots, 2 of 4 found blocks
// are adopted (the ones just added are never evicted for the next), and the rest is recomputed.
TEST(RemoteDiscoveryTest, RemoteSlotBudgetBoundsAdoption) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<InProcessTransport>();
  const std::vector<int32_t> prompt = Iota(16, 100);
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 40));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b, NewCache(ns, store, 2));
  std::vector<int32_t> query = prompt;
  query.push_back(1);
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(2), query));
  EXPECT_EQ(r.attached_blocks_by_tier[kRemote], 2);
  EXPECT_EQ(r.attached_tokens, 8);
  const KvCacheStats s = b->stats();
  EXPECT_EQ(s.remote_probe.blocks_found, 4) << StatsString(s);
  EXPECT_EQ(s.remote_probe.blocks_indexed, 2);
  EXPECT_EQ(s.tiers[kRemote].free_blocks, 0);
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  ExpectHealthy(*b);
}

// ---------------------------------------------------------------- faults

class FaultyStoreTest : public ::testing::Test {
 protected:
  // B's store answers nothing (hang) or fails; B holds the prompt's first 2 blocks itself.
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(ComputeAndStoreHead()); }
  void ComputeAndStoreHead() {
    auto b = NewCache(ns_, store_, 32, [](KvCacheOptions& o) {
      o.write_policy = WritePolicy::kWriteBack;  // nothing written to the store
      o.remote_probe_timeout = absl::Milliseconds(200);
    });
    ASSERT_TRUE(b.ok()) << b.status();
    cache_ = std::move(*b);
    ASSERT_NO_FATAL_FAILURE(
        ComputeAndStore(*cache_, 1, std::vector<int32_t>(prompt_.begin(), prompt_.begin() + 8), 5));
  }
  // AttachPrefix returns within the probe's timeout (plus a margin for a loaded machine),
  // attaches the local match only and counts one failed probe.
  void ExpectLocalMatchOnly(uint64_t id) {
    std::vector<int32_t> query = prompt_;
    query.push_back(1);
    KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(id)));
    const int64_t calls = store_->exists_calls();
    const int64_t failures = cache_->stats().remote_probe.failures;
    const absl::Time start = absl::Now();
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(Seq(id), query));
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(200) + absl::Seconds(2));
    EXPECT_EQ(r.attached_tokens, 8);
    EXPECT_EQ(r.attached_blocks_by_tier[TierIndex(Tier::kHbm)], 2);
    EXPECT_EQ(r.attached_blocks_by_tier[kRemote], 0);
    EXPECT_EQ(store_->exists_calls() - calls, 1);
    EXPECT_EQ(cache_->stats().remote_probe.failures - failures, 1) << StatsString(cache_->stats());
    KVTIER_ASSERT_OK(cache_->Release(Seq(id)));

    KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(query));
    EXPECT_EQ(where.matched_tokens, 8);
    EXPECT_EQ(where.discovered_blocks, 0);
    EXPECT_EQ(cache_->stats().remote_probe.failures - failures, 2);
  }
  void TearDown() override {
    if (cache_ != nullptr) ExpectHealthy(*cache_);
  }

  const CacheNamespace ns_ = NamespaceWithWeights("w0");
  const std::vector<int32_t> prompt_ = Iota(24, 300);
  std::shared_ptr<ProbeDouble> store_ = std::make_shared<ProbeDouble>();
  std::unique_ptr<KvCache> cache_;
};

TEST_F(FaultyStoreTest, HungProbeEndsTheMatchByItsDeadline) {
  store_->set_mode(ProbeDouble::Mode::kHang);
  ASSERT_NO_FATAL_FAILURE(ExpectLocalMatchOnly(2));
  EXPECT_GE(cache_->stats().remote_probe.latency_us_max, 150'000);  // it did wait for the store
}

TEST_F(FaultyStoreTest, UnavailableStoreEndsTheMatch) {
  store_->set_mode(ProbeDouble::Mode::kFail, absl::UnavailableError("store down"));
  ASSERT_NO_FATAL_FAILURE(ExpectLocalMatchOnly(2));
}

// A store that keeps failing opens the remote tier's breaker: probes are then refused at once,
// without a store call, and still counted as failed.
TEST_F(FaultyStoreTest, OpenBreakerSkipsTheStore) {
  store_->set_mode(ProbeDouble::Mode::kFail, absl::UnavailableError("store down"));
  std::vector<int32_t> query = prompt_;
  query.push_back(1);
  for (int i = 0; i < 5; ++i) {  // RemoteTierOptions::breaker_failures
    KVTIER_ASSERT_OK(cache_->Lookup(query).status());
  }
  const int64_t calls = store_->exists_calls();
  EXPECT_EQ(calls, 5);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(query));
  EXPECT_EQ(where.matched_tokens, 8);
  EXPECT_EQ(store_->exists_calls(), calls);
  EXPECT_EQ(cache_->stats().remote_probe.failures, 6);
}

// ---------------------------------------------------------------- off

TEST(RemoteDiscoveryTest, WindowZeroNeverAsksTheStore) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<ProbeDouble>();
  const std::vector<int32_t> prompt = Iota(16, 100);
  ASSERT_NO_FATAL_FAILURE(StoreFromAnotherCache(ns, store, prompt, 40));
  const int64_t calls = store->exists_calls();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b,
                              NewCache(ns, store, 32, [](KvCacheOptions& o) {
                                o.remote_probe_window_blocks = 0;
                                o.remote_probe_timeout = absl::ZeroDuration();  // unused then
                              }));
  std::vector<int32_t> query = prompt;
  query.push_back(1);
  KVTIER_ASSERT_OK(b->CreateSequence(Seq(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(2), query));
  EXPECT_EQ(r.attached_tokens, 0);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, b->Lookup(query));
  EXPECT_EQ(where.matched_tokens, 0);
  EXPECT_EQ(store->exists_calls(), calls);
  EXPECT_EQ(b->stats().remote_probe.probes, 0);
  KVTIER_ASSERT_OK(b->Release(Seq(2)));
  ExpectHealthy(*b);
}

TEST(RemoteDiscoveryTest, NoProbeCapableRemoteTierNeverProbes) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  std::vector<int32_t> query = Iota(17, 100);
  for (const bool metadata : {false, true}) {
    SCOPED_TRACE(metadata ? "metadata remote tier" : "no remote tier");
    KVTIER_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<KvCache> c,
        NewCache(ns, nullptr, metadata ? 32 : 0, {},
                 metadata ? TierBackendKind::kMetadata : TierBackendKind::kNative));
    KVTIER_ASSERT_OK(c->CreateSequence(Seq(1)));
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, c->AttachPrefix(Seq(1), query));
    EXPECT_EQ(r.attached_tokens, 0);
    KVTIER_ASSERT_OK(c->Lookup(query).status());
    EXPECT_EQ(c->stats().remote_probe.probes, 0);
    KVTIER_ASSERT_OK(c->Release(Seq(1)));
    ExpectHealthy(*c);
  }
}

// ---------------------------------------------------------------- options

TEST(RemoteDiscoveryTest, CreateRejectsBadProbeOptions) {
  const CacheNamespace ns = NamespaceWithWeights("w0");
  auto store = std::make_shared<InProcessTransport>();
  EXPECT_THAT(
      NewCache(ns, store, 4, [](KvCacheOptions& o) { o.remote_probe_window_blocks = -1; }).status(),
      IsError(StatusCode::kInvalidArgument, "remote_probe_window_blocks"));
  EXPECT_THAT(NewCache(ns, store, 4, [](KvCacheOptions& o) { o.remote_probe_window_blocks = 4097; })
                  .status(),
              IsError(StatusCode::kInvalidArgument, "remote_probe_window_blocks"));
  EXPECT_THAT(NewCache(ns, store, 4,
                       [](KvCacheOptions& o) { o.remote_probe_timeout = absl::ZeroDuration(); })
                  .status(),
              IsError(StatusCode::kInvalidArgument, "remote_probe_timeout"));
  EXPECT_THAT(NewCache(ns, store, 4,
                       [](KvCacheOptions& o) { o.remote_probe_timeout = absl::InfiniteDuration(); })
                  .status(),
              IsError(StatusCode::kInvalidArgument, "remote_probe_timeout"));
  KVTIER_EXPECT_OK(NewCache(ns, store, 4, [](KvCacheOptions& o) {
                     o.remote_probe_window_blocks = 4096;
                   }).status());
}

}  // namespace
}  // namespace kvtier
