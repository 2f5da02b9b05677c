// RM-2: a remote value whose bytes were changed (one flipped bit), or that was written under
// another namespace: a miss, counted as corrupt, never returned.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/remote_tier.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

KvGeometry Geometry() {
  return *KvGeometry::Create({.num_layers = 2, .num_kv_heads = 2, .head_dim = 64,
                              .tokens_per_block = 16});
}

std::unique_ptr<RemoteTier> Tier(std::shared_ptr<InProcessTransport> store,
                                 const std::string& model, const std::string& secret = "") {
  auto ns = CacheNamespace::Create(Geometry(), {.model_id = model, .weights_fingerprint = "w"});
  EXPECT_TRUE(ns.ok());
  auto tier = RemoteTier::Create(*ns, {.transport = std::move(store), .capacity_blocks = 4,
                                       .codec = Codec::kShuffleZstd, .hmac_secret = secret});
  EXPECT_TRUE(tier.ok()) << tier.status();
  return std::move(*tier);
}

TEST(Regress_RM_2, FlippedBitIsACountedMissNeverABlock) {
  for (const std::string secret : {"", "deployment-secret"}) {
    auto store = std::make_shared<InProcessTransport>();
    auto tier = Tier(store, "model-a", secret);
    const std::vector<std::byte> block = testing::RandomBytes(Geometry().bytes_per_block(), 1);
    const BlockKey key{5, 6};
    KVTIER_ASSERT_OK(tier->WriteBlock(SlotId(0), key, block).Wait());
    std::vector<std::byte>* stored = store->MutableValueForTest(tier->StoreKey(key));
    ASSERT_NE(stored, nullptr);
    for (size_t at : {size_t{3}, size_t{30}, stored->size() / 2, stored->size() - 1}) {
      KVTIER_ASSERT_OK(tier->WriteBlock(SlotId(0), key, block).Wait());
      stored = store->MutableValueForTest(tier->StoreKey(key));
      (*stored)[at] ^= std::byte{0x01};
      std::vector<std::byte> out(block.size());
      const absl::Status s = tier->ReadBlock(SlotId(0), key, absl::MakeSpan(out)).Wait();
      EXPECT_TRUE(absl::IsDataLoss(s)) << "bit flipped at byte " << at << ": " << s;
      // A miss from now on, without asking the store again.
      EXPECT_TRUE(absl::IsNotFound(tier->ReadBlock(SlotId(0), key, absl::MakeSpan(out)).Wait()));
    }
    EXPECT_EQ(tier->corrupt_reads(), 4);
  }
}

TEST(Regress_RM_2, ValueOfAnotherNamespaceIsACountedMiss) {
  auto store = std::make_shared<InProcessTransport>();
  auto ours = Tier(store, "model-a");
  auto theirs = Tier(store, "model-b");
  const BlockKey key{7, 8};
  const std::vector<std::byte> their_block = testing::RandomBytes(Geometry().bytes_per_block(), 2);
  KVTIER_ASSERT_OK(theirs->WriteBlock(SlotId(1), key, their_block).Wait());
  // Different namespaces never share a store key ...
  EXPECT_NE(ours->StoreKey(key), theirs->StoreKey(key));
  // ... and a foreign value planted under our key (a buggy or hostile writer) is refused.
  KVTIER_ASSERT_OK(ours->WriteBlock(SlotId(1), key, testing::RandomBytes(their_block.size(), 3)).Wait());
  *store->MutableValueForTest(ours->StoreKey(key)) = *store->MutableValueForTest(theirs->StoreKey(key));
  std::vector<std::byte> out(their_block.size());
  EXPECT_THAT(ours->ReadBlock(SlotId(1), key, absl::MakeSpan(out)).Wait(),
              testing::IsError(absl::StatusCode::kDataLoss, "another namespace"));
  EXPECT_EQ(ours->corrupt_reads(), 1);
  EXPECT_TRUE(out != their_block) << "the foreign block was handed out";
}

}  // namespace
}  // namespace kvtier
