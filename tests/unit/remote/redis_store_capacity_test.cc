// A store the cache does not own: Redis under a small maxmemory with allkeys-lru evicts blocks by
// its own policy, and a block it evicted reads as a miss (kNotFound), never as an error of
// another kind or a corrupt block. (The cache then drops it from its index on that first read:
// Regress_RM_3.) Real redis-server on loopback, started and stopped by the test.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/redis_transport.h"
#include "kvtier/remote_tier.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::kvtier::testing::RedisServer;

TEST(RedisStoreCapacityTest, BlocksEvictedUnderMaxmemoryAreMissesNeverErrors) {
  if (!testing::RedisServerAvailable()) GTEST_SKIP() << "redis-server is not installed";
  // 2 MiB for values and Redis's own overhead; 64 blocks of 64 KiB (4 MiB) go through it.
  auto server = RedisServer::Start(
      {.extra_args = {"--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"}});
  ASSERT_TRUE(server.ok()) << server.status();
  auto transport = RedisTransport::Create({.endpoints = {(*server)->address()}});
  ASSERT_TRUE(transport.ok()) << transport.status();
  const KvGeometry g = *KvGeometry::Create(
      {.num_layers = 4, .num_kv_heads = 4, .head_dim = 64, .tokens_per_block = 16});
  ASSERT_EQ(g.bytes_per_block(), 64 * 1024);
  auto ns = CacheNamespace::Create(g, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns.ok());
  // A slot budget larger than what the store keeps: capacity is the store's.
  auto tier = RemoteTier::Create(
      *ns, {.transport = std::shared_ptr<Transport>(std::move(*transport)), .capacity_blocks = 64});
  ASSERT_TRUE(tier.ok()) << tier.status();

  constexpr int kBlocks = 64;
  std::vector<std::vector<std::byte>> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    blocks.push_back(testing::RandomBytes(g.bytes_per_block(), 100 + i));
    KVTIER_ASSERT_OK(
        (*tier)
            ->WriteBlock(SlotId(i), BlockKey{1, static_cast<uint64_t>(i)}, blocks.back())
            .Wait());
  }
  int found = 0;
  int missing = 0;
  std::vector<std::byte> out(g.bytes_per_block());
  for (int i = 0; i < kBlocks; ++i) {
    const absl::Status s =
        (*tier)
            ->ReadBlock(SlotId(i), BlockKey{1, static_cast<uint64_t>(i)}, absl::MakeSpan(out))
            .Wait();
    if (s.ok()) {
      ++found;
      EXPECT_TRUE(out == blocks[i]) << "block " << i << " came back with other bytes";
    } else {
      EXPECT_TRUE(absl::IsNotFound(s)) << "block " << i << ": " << s;
      ++missing;
    }
  }
  EXPECT_GT(missing, 0) << "maxmemory evicted nothing";
  EXPECT_GT(found, 0) << "maxmemory kept nothing";
  // The newest block is among those kept (LRU keeps the recently written).
  KVTIER_EXPECT_OK((*tier)
                       ->ReadBlock(SlotId(kBlocks - 1),
                                   BlockKey{1, static_cast<uint64_t>(kBlocks - 1)},
                                   absl::MakeSpan(out))
                       .Wait());
  EXPECT_EQ((*tier)->corrupt_reads(), 0);
  EXPECT_EQ((*tier)->health(), RemoteHealth::kHealthy);
}

}  // namespace
}  // namespace kvtier
