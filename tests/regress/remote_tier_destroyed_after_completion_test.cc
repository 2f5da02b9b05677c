// What broke (found by kvtier_remote_bench): RemoteTier's completion callbacks held the tier's
// state, and with it the transport. Completion::Complete destroys its callbacks after waking the
// waiter, on the transport's worker thread; a caller that dropped the tier as soon as its wait
// returned could leave the last reference there, and ~RedisTransport then joined its own worker:
// std::system_error "Resource deadlock avoided" and abort. The callbacks now hold only what they
// use, never the transport, so the transport always goes on the thread that drops the tier.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/redis_transport.h"
#include "kvtier/remote_tier.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

TEST(Regress_RemoteTierDestroyedAfterCompletion, TransportNeverDestroyedOnItsOwnWorker) {
  if (!testing::RedisServerAvailable()) GTEST_SKIP() << "redis-server is not installed";
  auto server = testing::RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const KvGeometry geometry = *KvGeometry::Create(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .tokens_per_block = 16});
  auto ns = CacheNamespace::Create(geometry, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns.ok());
  const std::vector<std::byte> block = testing::RandomBytes(geometry.bytes_per_block(), 1);
  std::vector<std::byte> out(block.size());
  for (int i = 0; i < 200; ++i) {
    auto transport = RedisTransport::Create({.endpoints = {(*server)->address()}});
    ASSERT_TRUE(transport.ok()) << transport.status();
    // The tier owns the only reference to the transport.
    auto tier = RemoteTier::Create(
        *ns,
        {.transport = std::shared_ptr<Transport>(*std::move(transport)), .capacity_blocks = 1});
    ASSERT_TRUE(tier.ok()) << tier.status();
    KVTIER_ASSERT_OK((*tier)->WriteBlock(SlotId(0), BlockKey{1, 1}, block).Wait());
    KVTIER_ASSERT_OK((*tier)->ReadBlock(SlotId(0), BlockKey{1, 1}, absl::MakeSpan(out)).Wait());
    tier->reset();  // at once, while the worker may still be inside Complete
  }
  EXPECT_EQ(out, block);
}

}  // namespace
}  // namespace kvtier
