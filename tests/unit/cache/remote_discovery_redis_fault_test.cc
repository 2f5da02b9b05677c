// Remote discovery over a real redis-server in trouble, at the level of the cache: another cache
// stored a prompt, cache B holds its first blocks itself (HBM) and finds the rest in the store.
//   * A store that stops answering for a while (DEBUG SLEEP, CLIENT PAUSE): B's AttachPrefix and
//     Lookup return by the probe's deadline with the local match, count a failed probe, and fail
//     nothing; once the store answers again, B finds and onboards the rest byte-exact.
//   * A store that evicts (allkeys-lru under a small maxmemory, before discovery or between
//     discovery and the read) or loses a key (another worker's DEL): whatever B onboards is
//     byte-exact, what the store no longer has is a counted miss (a missing read, or not found by
//     the probe), never an error or wrong bytes, and the cache's invariants hold.
// The in-process fault doubles of remote_discovery_test.cc cover the same paths without a server;
// these check them against the real thing. Each test skips when redis-server is not installed.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/status_macros.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/redis_transport.h"
#include "kvtier/remote_tier.h"
#include "kvtier/transport.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/cache/remote_discovery_helpers.h"

namespace kvtier {
namespace {

using ::kvtier::discovery_testing::ComputeAndStore;
using ::kvtier::discovery_testing::ExpectHealthy;
using ::kvtier::discovery_testing::kB;
using ::kvtier::discovery_testing::kRemote;
using ::kvtier::discovery_testing::NamespaceWithWeights;
using ::kvtier::discovery_testing::NewCache;
using ::kvtier::discovery_testing::Seq;
using ::kvtier::testing::BlockPatternMismatches;
using ::kvtier::testing::Iota;
using ::kvtier::testing::RedisServer;
using ::kvtier::testing::StatsString;
using ::testing::Each;

constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr absl::Duration kProbeTimeout = absl::Milliseconds(200);
// What a loaded machine may add to a call bounded by the probe's deadline.
constexpr absl::Duration kSlack = absl::Seconds(2);

// A transport of its own to `server` (a connection other than any cache's).
std::shared_ptr<Transport> Connect(const RedisServer& server) {
  auto t = RedisTransport::Create({.endpoints = {server.address()}});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::shared_ptr<Transport>(std::move(*t)) : nullptr;
}

// The integer field `name` of the server's INFO; -1 if absent.
int64_t InfoField(const RedisServer& server, const std::string& name) {
  absl::StatusOr<std::string> info = server.Command({"INFO"});
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*info, absl::ByAnyChar("\r\n"))) {
    int64_t value = 0;
    if (absl::ConsumePrefix(&line, absl::StrCat(name, ":")) && absl::SimpleAtoi(line, &value)) {
      return value;
    }
  }
  return -1;
}

// Waits, up to 5 s, until an EXISTS over `watcher` is still unanswered after 200 ms: the server
// has stopped answering. False if it kept answering.
bool WaitUntilStalled(Transport& watcher) {
  const std::string key = "stall-check";
  for (const absl::Time give_up = absl::Now() + absl::Seconds(5); absl::Now() < give_up;) {
    const absl::Status s =
        watcher.Exists({&key, 1}, absl::Now() + absl::Milliseconds(200))[0].Wait();
    if (absl::IsDeadlineExceeded(s)) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

class RedisDiscoveryFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::RedisServerAvailable()) {
      GTEST_SKIP() << "redis-server is not on PATH: remote discovery's faults of a real Redis "
                      "need it";
    }
  }

  // Starts the server with `extra_args`; another cache (its own connection) stores prompt_ (6
  // blocks, block i from kSeed + i) there and goes. Then cache B, over a connection of its own:
  // write-back (B never writes the store: every value there is the other cache's), the probe's
  // timeout kProbeTimeout, and the prompt's first 2 blocks computed in its HBM with the same
  // bytes. B's first Lookup (which also opens its connection) finds the other 4 in the store.
  void StartWithHeadLocal(std::vector<std::string> extra_args = {}) {
    auto server = RedisServer::Start({.extra_args = std::move(extra_args)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    {
      KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> a, NewCache(ns_, Connect(*server_), 32));
      ASSERT_NO_FATAL_FAILURE(ComputeAndStore(*a, 1, prompt_, kSeed));
      ASSERT_EQ(a->stats().tiers[kRemote].stored, 6) << StatsString(a->stats());
    }
    KVTIER_ASSERT_OK_AND_ASSIGN(std::string keys, server_->Command({"DBSIZE"}));
    ASSERT_EQ(keys, "6");
    KVTIER_ASSERT_OK_AND_ASSIGN(cache_, NewCache(ns_, Connect(*server_), 32, [](KvCacheOptions& o) {
                                  o.write_policy = WritePolicy::kWriteBack;
                                  o.remote_probe_timeout = kProbeTimeout;
                                }));
    ASSERT_NO_FATAL_FAILURE(ComputeAndStore(
        *cache_, 1, std::vector<int32_t>(prompt_.begin(), prompt_.begin() + 2 * kB), kSeed));
    KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(Query()));
    ASSERT_EQ(where.matched_tokens, 24);
    ASSERT_EQ(where.blocks_by_tier[kHbm], 2);
    ASSERT_EQ(where.discovered_blocks, 4);
    ASSERT_EQ(cache_->stats().remote_probe.failures, 0);
  }

  void TearDown() override {
    if (cache_ != nullptr) ExpectHealthy(*cache_);
  }

  std::vector<int32_t> Query() const {
    std::vector<int32_t> query = prompt_;
    query.push_back(1);  // the last token is computed: all 6 blocks can be restored
    return query;
  }

  // While the store does not answer: AttachPrefix returns within the probe's timeout (plus
  // slack), attaches the 2 local blocks only (2 HBM hits) and counts one failed probe of the 4
  // keys after them; Lookup the same. The probes did wait for the store.
  void ExpectLocalMatchOnly(uint64_t id) {
    const KvCacheStats before = cache_->stats();
    KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(id)));
    const absl::Time start = absl::Now();
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(Seq(id), Query()));
    EXPECT_LT(absl::Now() - start, kProbeTimeout + kSlack);
    EXPECT_EQ(r.matched_tokens, 8);
    EXPECT_EQ(r.attached_tokens, 8);
    EXPECT_EQ(r.attached_blocks_by_tier[kHbm], 2);
    EXPECT_EQ(r.attached_blocks_by_tier[kRemote], 0);
    KvCacheStats s = cache_->stats();
    EXPECT_EQ(s.tiers[kHbm].hits - before.tiers[kHbm].hits, 2) << StatsString(s);
    EXPECT_EQ(s.remote_probe.probes - before.remote_probe.probes, 1);
    EXPECT_EQ(s.remote_probe.failures - before.remote_probe.failures, 1);
    EXPECT_EQ(s.remote_probe.keys_probed - before.remote_probe.keys_probed, 4);
    EXPECT_EQ(s.remote_probe.blocks_found, before.remote_probe.blocks_found);
    EXPECT_EQ(s.remote_probe.blocks_indexed, before.remote_probe.blocks_indexed);
    // The 2 local blocks are resident at once (no store read).
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(Seq(id), 0, 8));
    EXPECT_THAT(t.block_status(), Each(BlockResidency::kResident));
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(Mismatches(t, i), 0);
    }
    KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
    KVTIER_ASSERT_OK(cache_->Release(Seq(id)));

    const absl::Time lookup_start = absl::Now();
    KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(Query()));
    EXPECT_LT(absl::Now() - lookup_start, kProbeTimeout + kSlack);
    EXPECT_EQ(where.matched_tokens, 8);
    EXPECT_EQ(where.discovered_blocks, 0);
    s = cache_->stats();
    EXPECT_EQ(s.remote_probe.failures - before.remote_probe.failures, 2) << StatsString(s);
    EXPECT_GE(s.remote_probe.latency_us_max, 150'000) << "the probes did not wait for the store";
    EXPECT_EQ(s.tiers[kRemote].failed_loads, 0);
  }

  // Once the store answers again: a new sequence attaches all 6 blocks (2 local, 4 found) and
  // onboards the 4 byte-exact.
  void ExpectWholePromptAgain(uint64_t id) {
    const KvCacheStats before = cache_->stats();
    KVTIER_ASSERT_OK(cache_->CreateSequence(Seq(id)));
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(Seq(id), Query()));
    EXPECT_EQ(r.attached_tokens, 24) << StatsString(cache_->stats());
    EXPECT_EQ(r.attached_blocks_by_tier[kHbm], 2);
    EXPECT_EQ(r.attached_blocks_by_tier[kRemote], 4);
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(Seq(id), 0, 24));
    ASSERT_THAT(t.block_status(), Each(BlockResidency::kResident));
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(Mismatches(t, i), 0) << "block " << i;
    }
    KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
    KVTIER_ASSERT_OK(cache_->Release(Seq(id)));
    const KvCacheStats s = cache_->stats();
    EXPECT_EQ(s.remote_probe.failures, before.remote_probe.failures) << StatsString(s);
    EXPECT_EQ(s.remote_probe.blocks_indexed - before.remote_probe.blocks_indexed, 4);
    EXPECT_EQ(s.blocks_moved[kRemote][kHbm] - before.blocks_moved[kRemote][kHbm], 4);
    EXPECT_EQ(s.tiers[kRemote].failed_loads, 0);
  }

  // Attaches the query to a new sequence (2 local, 4 remote blocks) and returns its ticket for
  // blocks [0, 6) after `lose` has run: the store loses some values between discovery and read.
  absl::StatusOr<ResidencyTicket> AttachThenRead(uint64_t id, const std::function<void()>& lose) {
    KVTIER_RETURN_IF_ERROR(cache_->CreateSequence(Seq(id)));
    absl::StatusOr<AttachResult> r = cache_->AttachPrefix(Seq(id), Query());
    if (!r.ok()) return r.status();
    EXPECT_EQ(r->attached_blocks_by_tier[kHbm], 2);
    EXPECT_EQ(r->attached_blocks_by_tier[kRemote], 4);
    lose();
    return cache_->EnsureResident(Seq(id), 0, 24);
  }

  // Bytes of block i of `t` other than the other cache wrote for block i of prompt_; -1 if the
  // block is not resident.
  int64_t Mismatches(const ResidencyTicket& t, size_t i) const {
    return BlockPatternMismatches(ns_.geometry(), t.block_table(), i,
                                  kSeed + static_cast<uint32_t>(i));
  }

  // The store key of block i of prompt_.
  std::string StoreKeyOf(size_t i) const {
    auto keys_of = RemoteTier::Create(ns_, {.transport = Connect(*server_), .capacity_blocks = 1});
    EXPECT_TRUE(keys_of.ok()) << keys_of.status();
    auto keys = cache_->hasher().BlockKeys(prompt_, {});
    EXPECT_TRUE(keys.ok()) << keys.status();
    return keys_of.ok() && keys.ok() ? (*keys_of)->StoreKey((*keys)[i]) : "";
  }

  static constexpr uint32_t kSeed = 5;
  const CacheNamespace ns_ = NamespaceWithWeights("w0");
  const std::vector<int32_t> prompt_ = Iota(24, 300);  // 6 blocks
  std::unique_ptr<RedisServer> server_;                // outlives the caches' connections
  std::unique_ptr<KvCache> cache_;                     // B
};

// DEBUG SLEEP blocks the server's one command thread: every connection stays open, nothing is
// answered. (Redis 7 refuses DEBUG unless enable-debug-command allows it.)
TEST_F(RedisDiscoveryFaultTest, SleepingServerEndsTheMatchByTheProbeDeadlineThenServesAgain) {
  ASSERT_NO_FATAL_FAILURE(StartWithHeadLocal({"--enable-debug-command", "yes"}));
  std::shared_ptr<Transport> watcher = Connect(*server_);
  absl::StatusOr<std::string> slept;
  std::thread sleeper([&] { slept = server_->Command({"DEBUG", "SLEEP", "2"}); });
  const bool stalled = WaitUntilStalled(*watcher);
  if (stalled) ExpectLocalMatchOnly(2);
  sleeper.join();  // the sleep is over
  ASSERT_TRUE(stalled) << "DEBUG SLEEP did not stall the server";
  KVTIER_ASSERT_OK(slept.status());
  EXPECT_EQ(*slept, "OK");
  ASSERT_NO_FATAL_FAILURE(ExpectWholePromptAgain(3));
}

// CLIENT PAUSE ALL holds every client's commands, new connections' too, until it ends.
TEST_F(RedisDiscoveryFaultTest, PausedClientsEndTheMatchByTheProbeDeadlineThenServeAgain) {
  ASSERT_NO_FATAL_FAILURE(StartWithHeadLocal());
  KVTIER_ASSERT_OK_AND_ASSIGN(std::string paused,
                              server_->Command({"CLIENT", "PAUSE", "1500", "ALL"}));
  ASSERT_EQ(paused, "OK");
  ExpectLocalMatchOnly(2);
  // A PING is held as well: answered once the pause is over.
  KVTIER_ASSERT_OK_AND_ASSIGN(std::string pong, server_->Command({"PING"}));
  EXPECT_EQ(pong, "PONG");
  ASSERT_NO_FATAL_FAILURE(ExpectWholePromptAgain(3));
}

// Another worker deletes a block's value after B found it: that block is not resident (its load
// found nothing: a missing read, kNotFound), the blocks around it are resident byte-exact, and
// the block leaves the index, so the next lookup ends the match before it.
TEST_F(RedisDiscoveryFaultTest, ValueDeletedBetweenAttachAndReadIsAMissingRead) {
  ASSERT_NO_FATAL_FAILURE(StartWithHeadLocal());
  const std::string key3 = StoreKeyOf(3);
  absl::StatusOr<ResidencyTicket> t = AttachThenRead(2, [&] {
    absl::StatusOr<std::string> deleted = server_->Command({"DEL", key3});
    ASSERT_TRUE(deleted.ok()) << deleted.status();
    EXPECT_EQ(*deleted, "1");
  });
  KVTIER_ASSERT_OK(t.status());
  const std::vector<BlockResidency> status = t->block_status();
  ASSERT_EQ(status.size(), 6u);
  EXPECT_EQ(status[3], BlockResidency::kNotResident);
  EXPECT_EQ(t->block_error(3).code(), absl::StatusCode::kNotFound) << t->block_error(3);
  EXPECT_EQ(t->resident_tokens(), 12);  // blocks 0..2
  for (size_t i = 0; i < 6; ++i) {
    if (i == 3) continue;
    EXPECT_EQ(status[i], BlockResidency::kResident) << "block " << i;
    EXPECT_EQ(Mismatches(*t, i), 0) << "block " << i;
  }
  KVTIER_ASSERT_OK(cache_->ReleaseTicket(*t));
  KVTIER_ASSERT_OK(cache_->Release(Seq(2)));
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(30)));
  KvCacheStats s = cache_->stats();
  EXPECT_EQ(s.tiers[kRemote].failed_loads, 1) << StatsString(s);
  EXPECT_EQ(s.tiers[kRemote].missing_reads, 1);
  EXPECT_EQ(s.tiers[kRemote].corrupt_reads, 0);
  EXPECT_EQ(s.blocks_moved[kRemote][kHbm], 3);

  // Blocks 0..2 are local now; block 3 is in neither the index nor the store.
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(Query()));
  EXPECT_EQ(where.matched_tokens, 12);
  EXPECT_EQ(where.blocks_by_tier[kHbm], 3);
  EXPECT_EQ(where.discovered_blocks, 0);
  s = cache_->stats();
  EXPECT_EQ(s.remote_probe.failures, 0) << StatsString(s);
  EXPECT_EQ(s.tiers[kRemote].failed_loads, 1);
}

// The store evicts by its own policy between discovery and read: with allkeys-lru, lowering
// maxmemory below what the server uses makes it evict every key it can. B's 4 found blocks are
// missing reads, never errors; its 2 local blocks are resident; a later lookup finds nothing more
// in the store.
TEST_F(RedisDiscoveryFaultTest, StoreEvictingBetweenAttachAndReadLeavesTheLocalBlocks) {
  ASSERT_NO_FATAL_FAILURE(StartWithHeadLocal({"--maxmemory-policy", "allkeys-lru"}));
  absl::StatusOr<ResidencyTicket> t = AttachThenRead(2, [&] {
    absl::StatusOr<std::string> set = server_->Command({"CONFIG", "SET", "maxmemory", "1"});
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_EQ(*set, "OK");
    // Evicted by the next command at the latest (this one).
    absl::StatusOr<std::string> keys = server_->Command({"DBSIZE"});
    ASSERT_TRUE(keys.ok()) << keys.status();
    EXPECT_EQ(*keys, "0");
  });
  KVTIER_ASSERT_OK(t.status());
  const std::vector<BlockResidency> status = t->block_status();
  ASSERT_EQ(status.size(), 6u);
  EXPECT_EQ(t->resident_tokens(), 8);
  for (size_t i = 0; i < 6; ++i) {
    if (i < 2) {
      EXPECT_EQ(status[i], BlockResidency::kResident) << "block " << i;
      EXPECT_EQ(Mismatches(*t, i), 0);
    } else {
      EXPECT_EQ(status[i], BlockResidency::kNotResident) << "block " << i;
      EXPECT_EQ(t->block_error(static_cast<int64_t>(i)).code(), absl::StatusCode::kNotFound)
          << "block " << i << ": " << t->block_error(static_cast<int64_t>(i));
    }
  }
  KVTIER_ASSERT_OK(cache_->ReleaseTicket(*t));
  KVTIER_ASSERT_OK(cache_->Release(Seq(2)));
  KVTIER_ASSERT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(30)));
  const KvCacheStats s = cache_->stats();
  EXPECT_EQ(s.tiers[kRemote].failed_loads, 4) << StatsString(s);
  EXPECT_EQ(s.tiers[kRemote].missing_reads, 4);
  EXPECT_EQ(s.tiers[kRemote].corrupt_reads, 0);
  EXPECT_EQ(s.blocks_moved[kRemote][kHbm], 0);
  EXPECT_EQ(InfoField(*server_, "evicted_keys"), 6);

  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup where, cache_->Lookup(Query()));
  EXPECT_EQ(where.matched_tokens, 8);
  EXPECT_EQ(where.discovered_blocks, 0);
  EXPECT_EQ(cache_->stats().remote_probe.failures, 0);
}

// The store holds less than another cache wrote: 32 prompts of 4 blocks of 16 KiB (2 MiB of
// payload) go through about 768 KiB of room under allkeys-lru, so the store evicts most of them
// by its own choice. Fresh cache B attaches every prompt: each attach succeeds with the run of
// leading blocks the store still had, each onboarded block is byte-exact, a block evicted after
// it was found is a missing read, and the counters add up exactly.
TEST(RedisDiscoveryEvictionTest, BlocksEvictedUnderMaxmemoryAreMissesNeverWrongBytes) {
  if (!testing::RedisServerAvailable()) {
    GTEST_SKIP() << "redis-server is not on PATH: remote discovery's faults of a real Redis "
                    "need it";
  }
  auto server = RedisServer::Start({.extra_args = {"--maxmemory-policy", "allkeys-lru"}});
  ASSERT_TRUE(server.ok()) << server.status();
  // The room is set above what the empty server uses (about 1 MiB, depending on the version),
  // so the store keeps some blocks and evicts the others whatever its baseline.
  const int64_t baseline = InfoField(**server, "used_memory");
  ASSERT_GT(baseline, 0);
  KVTIER_ASSERT_OK(
      (*server)
          ->Command({"CONFIG", "SET", "maxmemory", absl::StrCat(baseline + 768 * 1024)})
          .status());

  // 16 KiB blocks (2 x 4 layers x 4 heads x 64 x 4 tokens x 2 bytes).
  KVTIER_ASSERT_OK_AND_ASSIGN(KvGeometry g, KvGeometry::Create({.num_layers = 4,
                                                                .num_kv_heads = 4,
                                                                .head_dim = 64,
                                                                .dtype = KvDtype::kBf16,
                                                                .tokens_per_block = kB}));
  ASSERT_EQ(g.bytes_per_block(), 16 * 1024);
  const CacheNamespace ns = NamespaceWithWeights("w0", g);
  constexpr int kPrompts = 32;
  constexpr int kBlocks = 4;
  const auto prompt = [](int p) { return Iota(kBlocks * kB, 10'000 + 100 * p); };
  const auto seed = [](int p) { return static_cast<uint32_t>(1000 + 10 * p); };
  {
    // A remote budget above what it writes: the other cache never evicts (and so never deletes)
    // a value itself; only the store does.
    KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> a, NewCache(ns, Connect(**server), 1024));
    for (int p = 0; p < kPrompts; ++p) {
      ASSERT_NO_FATAL_FAILURE(ComputeAndStore(*a, 1 + p, prompt(p), seed(p)));
    }
    const KvCacheStats s = a->stats();
    EXPECT_EQ(s.tiers[kRemote].stored, kPrompts * kBlocks) << StatsString(s);
    EXPECT_EQ(s.tiers[kRemote].failed_stores, 0);
    EXPECT_EQ(s.tiers[kRemote].evictions, 0);
  }
  const int64_t evicted = InfoField(**server, "evicted_keys");
  EXPECT_GT(evicted, 0) << "maxmemory evicted nothing";

  // B: write-back (it never writes the store), a generous probe timeout (the point here is
  // eviction, not time), room for every block it could discover.
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> b,
                              NewCache(ns, Connect(**server), 1024, [](KvCacheOptions& o) {
                                o.write_policy = WritePolicy::kWriteBack;
                                o.remote_probe_timeout = absl::Seconds(2);
                              }));
  int64_t attached = 0;      // remote blocks attached, over all prompts
  int64_t resident = 0;      // of those, onboarded
  int64_t not_resident = 0;  // of those, gone from the store by their read
  int whole_prompts = 0;
  for (int p = 0; p < kPrompts; ++p) {
    SCOPED_TRACE(absl::StrCat("prompt ", p));
    std::vector<int32_t> query = prompt(p);
    query.push_back(1);
    const auto id = static_cast<uint64_t>(100 + p);
    KVTIER_ASSERT_OK(b->CreateSequence(Seq(id)));
    KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, b->AttachPrefix(Seq(id), query));
    const int64_t n = r.attached_blocks_by_tier[kRemote];
    EXPECT_EQ(r.attached_tokens, n * kB);  // nothing local: every attached block was found
    attached += n;
    whole_prompts += n == kBlocks ? 1 : 0;
    if (n > 0) {
      KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, b->EnsureResident(Seq(id), 0, n * kB));
      const std::vector<BlockResidency> status = t.block_status();
      ASSERT_EQ(status.size(), static_cast<size_t>(n));
      for (size_t i = 0; i < status.size(); ++i) {
        if (status[i] == BlockResidency::kResident) {
          ++resident;
          EXPECT_EQ(
              BlockPatternMismatches(g, t.block_table(), i, seed(p) + static_cast<uint32_t>(i)), 0)
              << "block " << i << " was onboarded with wrong bytes";
        } else {
          ++not_resident;
          EXPECT_EQ(status[i], BlockResidency::kNotResident);
          EXPECT_EQ(t.block_error(static_cast<int64_t>(i)).code(), absl::StatusCode::kNotFound)
              << "block " << i << ": " << t.block_error(static_cast<int64_t>(i));
        }
      }
      KVTIER_ASSERT_OK(b->ReleaseTicket(t));
    }
    KVTIER_ASSERT_OK(b->Release(Seq(id)));
  }
  KVTIER_ASSERT_OK(b->WaitIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_GT(attached, 0) << "the store kept no prompt's first block";
  EXPECT_LT(whole_prompts, kPrompts) << "the store evicted nothing of any prompt";
  EXPECT_EQ(resident + not_resident, attached);

  const KvCacheStats s = b->stats();
  EXPECT_EQ(s.remote_probe.probes, kPrompts) << StatsString(s);
  EXPECT_EQ(s.remote_probe.failures, 0);
  EXPECT_EQ(s.remote_probe.keys_probed, kPrompts * kBlocks);
  EXPECT_EQ(s.remote_probe.blocks_found, attached);
  EXPECT_EQ(s.remote_probe.blocks_indexed, attached);
  EXPECT_EQ(s.tiers[kRemote].hits, attached);
  EXPECT_EQ(s.tiers[kRemote].misses, kPrompts * kBlocks - attached);
  EXPECT_EQ(s.tiers[kRemote].failed_loads, not_resident);
  EXPECT_EQ(s.tiers[kRemote].missing_reads, not_resident);
  EXPECT_EQ(s.tiers[kRemote].corrupt_reads, 0);
  EXPECT_EQ(s.blocks_moved[kRemote][kHbm], resident);
  ExpectHealthy(*b);
}

}  // namespace
}  // namespace kvtier
