// RM-1: the remote store stops in the middle of a batched get. Every request completes by its
// deadline (a miss, never a hang and never a wrong block), the other tiers keep serving, the
// breaker stops sending work to the dead store, and the same RemoteTier and transport work again
// once the server is back: no restart of anything on the worker.
#include <atomic>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/dram_tier.h"
#include "kvtier/redis_transport.h"
#include "kvtier/remote_tier.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::kvtier::testing::RedisServer;

constexpr int kBlocks = 64;

// 256 KiB blocks: 64 of them take long enough on loopback for a kill to land mid-batch.
KvGeometry Geometry() {
  return *KvGeometry::Create(
      {.num_layers = 4, .num_kv_heads = 8, .head_dim = 128, .tokens_per_block = 16});
}

class Regress_RM_1 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::RedisServerAvailable()) GTEST_SKIP() << "redis-server is not installed";
    auto server = RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto transport = RedisTransport::Create({.endpoints = {server_->address()},
                                             .reconnect_backoff_min = absl::Milliseconds(10),
                                             .reconnect_backoff_max = absl::Milliseconds(100)});
    ASSERT_TRUE(transport.ok()) << transport.status();
    auto ns = CacheNamespace::Create(Geometry(), {.model_id = "rm-1", .weights_fingerprint = "w"});
    ASSERT_TRUE(ns.ok());
    auto remote =
        RemoteTier::Create(*ns, {.transport = std::shared_ptr<Transport>(*std::move(transport)),
                                 .capacity_blocks = kBlocks,
                                 .breaker_failures = 3,
                                 .breaker_backoff_min = absl::Milliseconds(50),
                                 .breaker_backoff_max = absl::Milliseconds(200)});
    ASSERT_TRUE(remote.ok()) << remote.status();
    remote_ = *std::move(remote);
    auto dram =
        DramTier::Create(Geometry(), {.capacity_bytes = kBlocks * Geometry().bytes_per_block()});
    ASSERT_TRUE(dram.ok()) << dram.status();
    dram_ = *std::move(dram);

    const int64_t bytes = Geometry().bytes_per_block();
    std::vector<BlockWrite> writes;
    for (int i = 0; i < kBlocks; ++i) {
      blocks_.push_back(testing::RandomBytes(bytes, static_cast<uint32_t>(i)));
      keys_.push_back(BlockKey{static_cast<uint64_t>(i), 77});
    }
    for (int i = 0; i < kBlocks; ++i) {
      writes.push_back({SlotId(static_cast<uint64_t>(i)), keys_[static_cast<size_t>(i)],
                        blocks_[static_cast<size_t>(i)]});
    }
    for (Completion& c :
         remote_->WriteBlocks(writes, {.deadline = absl::Now() + absl::Seconds(20)})) {
      KVTIER_ASSERT_OK(c.Wait());
    }
    for (Completion& c : dram_->WriteBlocks(writes)) KVTIER_ASSERT_OK(c.Wait());
  }

  // Reads every block from `tier`; returns their completions and fills `outs`.
  std::vector<Completion> ReadAll(TierBackend& tier, std::vector<std::vector<std::byte>>& outs,
                                  absl::Time deadline) {
    outs.assign(kBlocks, std::vector<std::byte>(static_cast<size_t>(Geometry().bytes_per_block())));
    std::vector<BlockRead> reads;
    for (int i = 0; i < kBlocks; ++i) {
      reads.push_back({SlotId(static_cast<uint64_t>(i)), keys_[static_cast<size_t>(i)],
                       absl::MakeSpan(outs[static_cast<size_t>(i)])});
    }
    return tier.ReadBlocks(reads, {.deadline = deadline});
  }

  void ExpectDramServesEverything() {
    std::vector<std::vector<std::byte>> outs;
    const absl::Time start = absl::Now();
    std::vector<Completion> got = ReadAll(*dram_, outs, start + absl::Seconds(5));
    for (int i = 0; i < kBlocks; ++i) {
      KVTIER_ASSERT_OK(got[static_cast<size_t>(i)].Wait());
      ASSERT_EQ(outs[static_cast<size_t>(i)], blocks_[static_cast<size_t>(i)]) << "block " << i;
    }
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(500)) << "DRAM waited on the remote store";
  }

  // Every completion fires by `deadline` (plus scheduling slack); OK ones hold the right block,
  // the others are misses the caller recomputes. Returns the number of misses.
  int ExpectEachByDeadline(std::vector<Completion>& got, std::vector<std::vector<std::byte>>& outs,
                           absl::Time deadline) {
    int misses = 0;
    for (int i = 0; i < kBlocks; ++i) {
      const absl::Status s =
          got[static_cast<size_t>(i)].WaitUntil(deadline + absl::Milliseconds(250));
      EXPECT_FALSE(absl::IsDeadlineExceeded(s) && !got[static_cast<size_t>(i)].done())
          << "block " << i << " still pending after its deadline";
      if (s.ok()) {
        EXPECT_EQ(outs[static_cast<size_t>(i)], blocks_[static_cast<size_t>(i)]) << "block " << i;
      } else {
        EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
        ++misses;
      }
    }
    return misses;
  }

  std::unique_ptr<RedisServer> server_;
  std::unique_ptr<RemoteTier> remote_;
  std::unique_ptr<DramTier> dram_;
  std::vector<std::vector<std::byte>> blocks_;
  std::vector<BlockKey> keys_;
};

TEST_F(Regress_RM_1, ServerKilledMidBatchedGetThenBack) {
  std::vector<std::vector<std::byte>> outs;
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  std::vector<Completion> got = ReadAll(*remote_, outs, deadline);
  // Kill the server as soon as the first block has arrived: the rest of the batch is in flight.
  Completion first_arrived;
  for (Completion& c : got)
    c.OnDone([first_arrived](const absl::Status&) { first_arrived.Complete(absl::OkStatus()); });
  KVTIER_ASSERT_OK(first_arrived.WaitFor(absl::Seconds(5)));
  ASSERT_TRUE(server_->Kill().ok());
  const int misses = ExpectEachByDeadline(got, outs, deadline);
  EXPECT_GT(misses, 0) << "the kill landed after the whole batch: no request was cut short";
  ExpectDramServesEverything();

  // Requests to the dead store now fail at once, then the breaker bypasses it altogether.
  for (int i = 0; i < 5; ++i) {
    std::vector<std::byte> out(static_cast<size_t>(Geometry().bytes_per_block()));
    const absl::Time start = absl::Now();
    const absl::Status s = remote_
                               ->ReadBlock(SlotId(0), keys_[0], absl::MakeSpan(out),
                                           {.deadline = start + absl::Seconds(2)})
                               .Wait();
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  }
  EXPECT_EQ(remote_->health(), RemoteHealth::kBypassed);
  EXPECT_GE(remote_->breaker_opened(), 1);
  EXPECT_GT(remote_->bypassed_requests(), 0);

  // The server comes back (empty: it kept nothing). The same tier writes and reads again once a
  // probe gets through; nothing on the worker is restarted.
  ASSERT_TRUE(server_->Restart().ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  absl::Status written;
  do {
    absl::SleepFor(absl::Milliseconds(20));
    written = remote_->WriteBlock(SlotId(1), keys_[1], blocks_[1]).Wait();
  } while (!written.ok() && absl::Now() < give_up);
  KVTIER_ASSERT_OK(written);
  EXPECT_EQ(remote_->health(), RemoteHealth::kHealthy);
  std::vector<std::byte> out(static_cast<size_t>(Geometry().bytes_per_block()));
  KVTIER_EXPECT_OK(remote_->ReadBlock(SlotId(1), keys_[1], absl::MakeSpan(out)).Wait());
  EXPECT_EQ(out, blocks_[1]);
  // A block the old server held is gone: a plain miss, not a corrupt or stale block.
  EXPECT_TRUE(
      absl::IsNotFound(remote_->ReadBlock(SlotId(2), keys_[2], absl::MakeSpan(out)).Wait()));
}

TEST_F(Regress_RM_1, ServerHungMidBatchedGetThenResumes) {
  std::vector<std::vector<std::byte>> outs;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(800);
  std::vector<Completion> got = ReadAll(*remote_, outs, deadline);
  Completion first_arrived;
  for (Completion& c : got)
    c.OnDone([first_arrived](const absl::Status&) { first_arrived.Complete(absl::OkStatus()); });
  KVTIER_ASSERT_OK(first_arrived.WaitFor(absl::Seconds(5)));
  ASSERT_TRUE(server_->Pause().ok());
  ExpectDramServesEverything();  // while the remote batch hangs
  const int misses = ExpectEachByDeadline(got, outs, deadline);
  EXPECT_GT(misses, 0);
  ASSERT_TRUE(server_->Resume().ok());
  // The data is still in the server: after a probe, every block reads back right.
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  int ok = 0;
  while (ok < kBlocks && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    got = ReadAll(*remote_, outs, absl::Now() + absl::Seconds(2));
    ok = 0;
    for (int i = 0; i < kBlocks; ++i) {
      if (got[static_cast<size_t>(i)].Wait().ok()) {
        ASSERT_EQ(outs[static_cast<size_t>(i)], blocks_[static_cast<size_t>(i)]);
        ++ok;
      }
    }
  }
  EXPECT_EQ(ok, kBlocks);
}

}  // namespace
}  // namespace kvtier
