#include "remote/circuit_breaker.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/remote_tier.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using internal::CircuitBreaker;
using ::kvtier::testing::IsError;
using State = CircuitBreaker::State;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
const absl::Status kDown = absl::UnavailableError("store down");

TEST(CircuitBreakerTest, OpensAfterConsecutiveFailuresOnly) {
  CircuitBreaker b(3, absl::Milliseconds(100), absl::Seconds(1));
  for (int round = 0; round < 3; ++round) {
    KVTIER_ASSERT_OK(b.Admit(kT0));
    b.Report(kDown, kT0);
    b.Report(absl::DeadlineExceededError("slow"), kT0);
    // Any answer from the store, a miss or a corrupt value included, resets the count.
    b.Report(round == 0 ? absl::OkStatus()
                        : (round == 1 ? absl::NotFoundError("miss") : absl::DataLossError("bad")),
             kT0);
    EXPECT_EQ(b.state(), State::kClosed);
  }
  // Cancellations and argument errors are not the store's health.
  b.Report(kDown, kT0);
  b.Report(kDown, kT0);
  b.Report(absl::CancelledError("shutdown"), kT0);
  b.Report(absl::InvalidArgumentError("bad key"), kT0);
  EXPECT_EQ(b.state(), State::kClosed);
  b.Report(kDown, kT0);
  EXPECT_EQ(b.state(), State::kOpen);
  EXPECT_EQ(b.opened(), 1);
  EXPECT_THAT(b.Admit(kT0 + absl::Milliseconds(50)),
              IsError(StatusCode::kUnavailable, "circuit open after 3 consecutive failures"));
  EXPECT_THAT(b.Admit(kT0 + absl::Milliseconds(50)),
              IsError(StatusCode::kUnavailable, "store down"));
  EXPECT_EQ(b.bypassed(), 2);
}

TEST(CircuitBreakerTest, ProbesWithDoublingBackoffAndClosesOnSuccess) {
  CircuitBreaker b(1, absl::Milliseconds(100), absl::Milliseconds(350));
  b.Report(kDown, kT0);
  ASSERT_EQ(b.state(), State::kOpen);
  EXPECT_FALSE(b.Admit(kT0 + absl::Milliseconds(99)).ok());
  // One probe after the backoff; others wait for its outcome.
  absl::Time t = kT0 + absl::Milliseconds(100);
  KVTIER_ASSERT_OK(b.Admit(t));
  EXPECT_EQ(b.state(), State::kHalfOpen);
  EXPECT_THAT(b.Admit(t), IsError(StatusCode::kUnavailable, "a probe is in flight"));
  // The probe fails: open again for twice as long (200 ms), then 350 ms (the cap), then 350 ms.
  for (const absl::Duration backoff :
       {absl::Milliseconds(200), absl::Milliseconds(350), absl::Milliseconds(350)}) {
    b.Report(kDown, t);
    EXPECT_EQ(b.state(), State::kOpen);
    EXPECT_FALSE(b.Admit(t + backoff - absl::Milliseconds(1)).ok());
    t += backoff;
    KVTIER_ASSERT_OK(b.Admit(t));
  }
  EXPECT_EQ(b.probes(), 4);
  b.Report(absl::NotFoundError("the store answered"), t);
  EXPECT_EQ(b.state(), State::kClosed);
  KVTIER_EXPECT_OK(b.Admit(t));
  // Closed again, the backoff starts over from the minimum.
  b.Report(kDown, t);
  EXPECT_FALSE(b.Admit(t + absl::Milliseconds(99)).ok());
  KVTIER_EXPECT_OK(b.Admit(t + absl::Milliseconds(100)));
  EXPECT_EQ(b.opened(), 2);
}

TEST(CircuitBreakerTest, AProbeThatNeverReportsIsReplacedAfterTheMaximumBackoff) {
  CircuitBreaker b(1, absl::Milliseconds(10), absl::Seconds(1));
  b.Report(kDown, kT0);
  KVTIER_ASSERT_OK(b.Admit(kT0 + absl::Milliseconds(10)));
  EXPECT_FALSE(b.Admit(kT0 + absl::Milliseconds(500)).ok());
  KVTIER_EXPECT_OK(b.Admit(kT0 + absl::Milliseconds(1010)));
}

TEST(CircuitBreakerTest, ZeroThresholdNeverOpens) {
  CircuitBreaker b(0, absl::Milliseconds(10), absl::Seconds(1));
  for (int i = 0; i < 100; ++i) b.Report(kDown, kT0);
  EXPECT_EQ(b.state(), State::kClosed);
  KVTIER_EXPECT_OK(b.Admit(kT0));
}

// The breaker inside RemoteTier: a failing store is bypassed without being asked, and used again
// once a probe gets an answer.
TEST(RemoteTierBreakerTest, BypassesAFailingStoreAndRecovers) {
  const KvGeometry geometry = *KvGeometry::Create(
      {.num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .tokens_per_block = 4});
  auto ns = CacheNamespace::Create(geometry, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns.ok());
  auto store = std::make_shared<InProcessTransport>();
  auto tier = RemoteTier::Create(*ns, {.transport = store,
                                       .capacity_blocks = 2,
                                       .breaker_failures = 2,
                                       .breaker_backoff_min = absl::Milliseconds(30),
                                       .breaker_backoff_max = absl::Milliseconds(30)});
  ASSERT_TRUE(tier.ok()) << tier.status();
  const std::vector<std::byte> block = testing::RandomBytes(geometry.bytes_per_block(), 1);
  std::vector<std::byte> out(block.size());
  const BlockKey key{1, 2};
  KVTIER_ASSERT_OK((*tier)->WriteBlock(SlotId(0), key, block).Wait());

  store->SetFailure(kDown);
  EXPECT_THAT((*tier)->ReadBlock(SlotId(0), key, absl::MakeSpan(out)).Wait(),
              IsError(StatusCode::kUnavailable, "store down"));
  EXPECT_THAT((*tier)->WriteBlock(SlotId(1), key, block).Wait(),
              IsError(StatusCode::kUnavailable, "store down"));
  EXPECT_EQ((*tier)->health(), RemoteHealth::kBypassed);
  // Now refused by the tier itself; the slot written before is not forgotten.
  store->SetFailure(absl::OkStatus());
  EXPECT_THAT((*tier)->ReadBlock(SlotId(0), key, absl::MakeSpan(out)).Wait(),
              IsError(StatusCode::kUnavailable, "circuit open"));
  EXPECT_EQ((*tier)->bypassed_requests(), 1);
  absl::SleepFor(absl::Milliseconds(40));
  KVTIER_EXPECT_OK((*tier)->ReadBlock(SlotId(0), key, absl::MakeSpan(out)).Wait());
  EXPECT_EQ(out, block);
  EXPECT_EQ((*tier)->health(), RemoteHealth::kHealthy);
  EXPECT_EQ((*tier)->breaker_opened(), 1);
}

// Found in review: every kDeadlineExceeded counted against the store, the caller's own short
// deadline too. Five 20 ms discovery probes against a live store that answers in 30 ms opened
// the breaker and bypassed the remote tier. A timeout now counts only for a request given at
// least kPatience times the store's recent answer time.
TEST(CircuitBreakerTest, AShortDeadlineIsTheCallersImpatienceNotTheStoresFailure) {
  const absl::Status late = absl::DeadlineExceededError("no answer by the deadline");
  CircuitBreaker b(2, absl::Milliseconds(100), absl::Seconds(10));
  // Until the store has answered once, every timeout counts (a store dead from the start).
  CircuitBreaker fresh(2, absl::Milliseconds(100), absl::Seconds(1));
  fresh.Report(late, kT0, kT0, kT0 + absl::Milliseconds(20));
  fresh.Report(late, kT0, kT0, kT0 + absl::Milliseconds(20));
  EXPECT_EQ(fresh.state(), State::kOpen);

  b.Report(absl::OkStatus(), kT0 + absl::Milliseconds(30), kT0);  // answered in 30 ms
  EXPECT_EQ(b.answer_time(), absl::Milliseconds(30));
  absl::Time t = kT0 + absl::Milliseconds(100);
  for (int i = 0; i < 5; ++i) {
    b.Report(late, t + absl::Milliseconds(20), t, t + absl::Milliseconds(20));
    t += absl::Milliseconds(20);
  }
  EXPECT_EQ(b.state(), State::kClosed);
  // 4 x 30 ms = 120 ms: a request given that long and unanswered is the store's failure.
  b.Report(late, t + absl::Milliseconds(120), t, t + absl::Milliseconds(120));
  b.Report(late, t + absl::Milliseconds(120), t, t + absl::Milliseconds(120));
  EXPECT_EQ(b.state(), State::kOpen);
  // A half-open probe that was too short to tell lets the next request probe at once.
  t += absl::Seconds(1);
  KVTIER_ASSERT_OK(b.Admit(t));
  EXPECT_EQ(b.state(), State::kHalfOpen);
  b.Report(late, t + absl::Milliseconds(20), t, t + absl::Milliseconds(20));
  EXPECT_EQ(b.state(), State::kOpen);
  KVTIER_EXPECT_OK(b.Admit(t + absl::Milliseconds(20)));
  b.Report(absl::NotFoundError("miss"), t + absl::Milliseconds(50), t + absl::Milliseconds(20));
  EXPECT_EQ(b.state(), State::kClosed);
  EXPECT_EQ(b.answer_time(), absl::Microseconds(30000));  // 30 + (30 - 30) / 8
  // A store that has answered nothing for backoff_max (10 s) is not slow but hung: short
  // timeouts count again (found in review: with short deadlines only, it never opened).
  const absl::Time quiet = t + absl::Milliseconds(50) + absl::Seconds(10);
  b.Report(late, quiet, quiet - absl::Milliseconds(20), quiet);
  b.Report(late, quiet + absl::Milliseconds(20), quiet, quiet + absl::Milliseconds(20));
  EXPECT_EQ(b.state(), State::kOpen);
}

// A store that answers writes in 30 ms and needs longer than discovery's short probes: the
// probes time out, the tier stays healthy; probes given a second that time out open it.
class SlowStore final : public Transport {
 public:
  std::string name() const override { return "slow"; }
  std::vector<Completion> Put(absl::Span<const TransportPut> items, absl::Time deadline) override {
    absl::SleepFor(absl::Milliseconds(30));
    return inner_.Put(items, deadline);
  }
  std::vector<Completion> Get(absl::Span<const TransportGet> items, absl::Time deadline) override {
    return inner_.Get(items, deadline);
  }
  std::vector<Completion> Exists(absl::Span<const std::string> keys, absl::Time) override {
    return std::vector<Completion>(
        keys.size(), Completion::Done(absl::DeadlineExceededError("no answer by the deadline")));
  }
  std::vector<Completion> Delete(absl::Span<const std::string> keys, absl::Time deadline) override {
    return inner_.Delete(keys, deadline);
  }

 private:
  InProcessTransport inner_;
};

TEST(RemoteTierBreakerTest, ShortProbeDeadlinesDoNotOpenTheBreaker) {
  const KvGeometry geometry = *KvGeometry::Create(
      {.num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .tokens_per_block = 4});
  auto ns = CacheNamespace::Create(geometry, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns.ok());
  auto tier = RemoteTier::Create(*ns, {.transport = std::make_shared<SlowStore>(),
                                       .capacity_blocks = 2,
                                       .breaker_failures = 3,
                                       .breaker_backoff_min = absl::Seconds(10),
                                       .breaker_backoff_max = absl::Seconds(10)});
  ASSERT_TRUE(tier.ok()) << tier.status();
  const std::vector<std::byte> block = testing::RandomBytes(geometry.bytes_per_block(), 1);
  KVTIER_ASSERT_OK((*tier)->WriteBlock(SlotId(0), BlockKey{1, 2}, block).Wait());
  const BlockKey probe[] = {BlockKey{3, 4}};
  for (int i = 0; i < 6; ++i) {
    EXPECT_THAT((*tier)->ProbeBlocks(probe, absl::Now() + absl::Milliseconds(10)),
                IsError(StatusCode::kDeadlineExceeded, ""));
  }
  EXPECT_EQ((*tier)->health(), RemoteHealth::kHealthy);
  EXPECT_EQ((*tier)->breaker_opened(), 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE((*tier)->ProbeBlocks(probe, absl::Now() + absl::Seconds(1)).ok());
  }
  EXPECT_EQ((*tier)->health(), RemoteHealth::kBypassed);
}

// The breaker hears once per batch, for writes as for reads: one failed batch of three blocks
// is one failure, not three (found on re-reading: WriteBlocks still reported per block).
TEST(RemoteTierBreakerTest, AFailedBatchCountsOnceForWritesAndReads) {
  const KvGeometry geometry = *KvGeometry::Create(
      {.num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .tokens_per_block = 4});
  auto ns = CacheNamespace::Create(geometry, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns.ok());
  const std::vector<std::byte> block = testing::RandomBytes(geometry.bytes_per_block(), 1);
  for (const bool writes : {true, false}) {
    auto store = std::make_shared<InProcessTransport>();
    auto tier = RemoteTier::Create(*ns, {.transport = store,
                                         .capacity_blocks = 3,
                                         .breaker_failures = 2,
                                         .breaker_backoff_min = absl::Seconds(10),
                                         .breaker_backoff_max = absl::Seconds(10)});
    ASSERT_TRUE(tier.ok());
    std::vector<BlockWrite> w;
    for (uint64_t i = 0; i < 3; ++i) w.push_back({SlotId(i), BlockKey{i, 9}, block});
    for (Completion& c : (*tier)->WriteBlocks(w)) KVTIER_ASSERT_OK(c.Wait());
    std::vector<std::vector<std::byte>> outs(3, std::vector<std::byte>(block.size()));
    std::vector<BlockRead> r;
    for (uint64_t i = 0; i < 3; ++i)
      r.push_back({SlotId(i), BlockKey{i, 9}, absl::MakeSpan(outs[i])});
    store->SetFailure(kDown);
    auto run = [&] {
      std::vector<Completion> done = writes ? (*tier)->WriteBlocks(w) : (*tier)->ReadBlocks(r);
      for (Completion& c : done) EXPECT_FALSE(c.Wait().ok());
    };
    run();
    EXPECT_EQ((*tier)->health(), RemoteHealth::kHealthy) << (writes ? "writes" : "reads");
    run();
    EXPECT_EQ((*tier)->health(), RemoteHealth::kBypassed) << (writes ? "writes" : "reads");
    run();  // refused at once: every block of the batch counts as bypassed
    EXPECT_EQ((*tier)->bypassed_requests(), 3) << (writes ? "writes" : "reads");
  }
}

TEST(RemoteTierBreakerTest, RejectsBadOptions) {
  const KvGeometry geometry = *KvGeometry::Create(
      {.num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .tokens_per_block = 4});
  auto ns = CacheNamespace::Create(geometry, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns.ok());
  auto store = std::make_shared<InProcessTransport>();
  auto make = [&](RemoteTierOptions o) {
    o.transport = store;
    if (o.capacity_blocks == 0) o.capacity_blocks = 1;
    return RemoteTier::Create(*ns, o).status();
  };
  EXPECT_THAT(make({.key_prefix = "a/../b"}), IsError(StatusCode::kInvalidArgument, "key prefix"));
  EXPECT_THAT(make({.key_prefix = "sp ace"}), IsError(StatusCode::kInvalidArgument, "key prefix"));
  EXPECT_THAT(make({.capacity_blocks = int64_t{1} << 62}),
              IsError(StatusCode::kInvalidArgument, "overflows"));
  EXPECT_THAT(make({.breaker_failures = -1}),
              IsError(StatusCode::kInvalidArgument, "breaker_failures"));
  EXPECT_THAT(make({.breaker_backoff_min = absl::ZeroDuration()}),
              IsError(StatusCode::kInvalidArgument, "backoff"));
  EXPECT_THAT(
      make({.breaker_backoff_min = absl::Seconds(2), .breaker_backoff_max = absl::Seconds(1)}),
      IsError(StatusCode::kInvalidArgument, "backoff"));
  KVTIER_EXPECT_OK(make({.key_prefix = "prod-1.kv:"}));
  KVTIER_EXPECT_OK(make({.codec = Codec::kFp8E4m3}));
  // The lossy FP8 codec reads bf16 elements; on fp16 KV it would decode garbage.
  const KvGeometry fp16 = *KvGeometry::Create({.num_layers = 1,
                                               .num_kv_heads = 1,
                                               .head_dim = 64,
                                               .dtype = KvDtype::kFp16,
                                               .tokens_per_block = 4});
  auto ns16 = CacheNamespace::Create(fp16, {.model_id = "m", .weights_fingerprint = "w"});
  ASSERT_TRUE(ns16.ok());
  EXPECT_THAT(RemoteTier::Create(
                  *ns16, {.transport = store, .capacity_blocks = 1, .codec = Codec::kFp8E4m3})
                  .status(),
              IsError(StatusCode::kInvalidArgument, "fp16"));
}

}  // namespace
}  // namespace kvtier
