// TR-2: fork B from A at token 33 (A has 40 tokens, B=16): appending to B must not change A's
// third block (copy-on-write of the partial block); both read back their own tokens.
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/slot_token_store.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Iota;
using ::testing::ElementsAreArray;

constexpr int kB = 16;

class Regress_TR_2 : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cache = env_.NewCache();
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }

  // One forward pass, as an engine runs it: the blocks of tokens [0, tokens.size()) are made
  // resident, the kernel writes the KV of positions [from, tokens.size()), ReportWritten.
  void Compute(SequenceId id, const std::vector<int32_t>& tokens, int64_t from) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket t, cache_->EnsureResident(id, 0, n));
    pool_ = t.block_table().pool;  // the HBM tier's addresses: valid while the cache lives
    ASSERT_NO_FATAL_FAILURE(kv_.WriteTokens(t.block_table(), tokens, from));
    KVTIER_ASSERT_OK(cache_->ReportWritten(id, n));
    KVTIER_ASSERT_OK(cache_->ReleaseTicket(t));
  }

  // The token ids the sequence's blocks hold, position by position, and its HBM slots.
  std::vector<int32_t> ReadBack(SequenceId id, int64_t n, std::vector<int32_t>* slots = nullptr) {
    auto t = cache_->EnsureResident(id, 0, n);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    std::vector<int32_t> out = kv_.ReadBack(t->block_table(), n);
    if (slots != nullptr) *slots = t->block_table().slots;
    KVTIER_EXPECT_OK(cache_->ReleaseTicket(*t));
    return out;
  }

  // What the engine does with a Fork's BlockCopy, at once (before anything could free `src`).
  void Copy(const BlockCopy& copy) { kv_.Copy(pool_, copy); }

  void TearDown() override {
    if (cache_ == nullptr) return;
    KVTIER_EXPECT_OK(cache_->WaitIdle(absl::Now() + absl::Seconds(30)));
    KVTIER_EXPECT_OK(cache_->CheckInvariants());
    testing::ExpectAllReleased(cache_->stats());
  }

  testing::KvCacheEnv env_{{.hbm_blocks = 16, .dram_blocks = 0, .tokens_per_block = kB}};
  testing::SlotTokenStore kv_{env_.geometry()};
  DevicePoolView pool_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(Regress_TR_2, AppendToForkNeverChangesParentsPartialBlock) {
  const SequenceId a(1);
  const SequenceId b(2);
  std::vector<int32_t> a_tokens = Iota(40);
  KVTIER_ASSERT_OK(cache_->CreateSequence(a));
  KVTIER_ASSERT_OK(cache_->Append(a, a_tokens).status());
  ASSERT_NO_FATAL_FAILURE(Compute(a, a_tokens, 0));
  std::vector<int32_t> a_slots;
  ASSERT_THAT(ReadBack(a, 40, &a_slots), ElementsAreArray(a_tokens));
  ASSERT_EQ(a_slots.size(), 3u);

  KVTIER_ASSERT_OK_AND_ASSIGN(std::optional<BlockCopy> copy, cache_->Fork(a, b, 33));
  ASSERT_TRUE(copy.has_value()) << "a fork inside a block must copy that block";
  EXPECT_EQ(static_cast<int32_t>(copy->src.value()), a_slots[2]);
  EXPECT_EQ(copy->num_tokens, 1);
  ASSERT_NO_FATAL_FAILURE(Copy(*copy));
  std::vector<int32_t> b_slots;
  const std::vector<int32_t> b_head(a_tokens.begin(), a_tokens.begin() + 33);
  EXPECT_THAT(ReadBack(b, 33, &b_slots), ElementsAreArray(b_head));
  ASSERT_EQ(b_slots.size(), 3u);
  EXPECT_EQ(b_slots[0], a_slots[0]);  // full blocks are shared
  EXPECT_EQ(b_slots[1], a_slots[1]);
  EXPECT_NE(b_slots[2], a_slots[2]);
  EXPECT_EQ(b_slots[2], static_cast<int32_t>(copy->dst.value()));

  // B appends 20 tokens and computes them: its third block fills, a fourth opens.
  std::vector<int32_t> b_tokens = b_head;
  for (int32_t t : Iota(20, 9000)) b_tokens.push_back(t);
  KVTIER_ASSERT_OK(cache_->Append(b, Iota(20, 9000)).status());
  ASSERT_NO_FATAL_FAILURE(Compute(b, b_tokens, 33));
  // A appends too, into its own partial block.
  for (int32_t t : Iota(4, 7000)) a_tokens.push_back(t);
  KVTIER_ASSERT_OK(cache_->Append(a, Iota(4, 7000)).status());
  ASSERT_NO_FATAL_FAILURE(Compute(a, a_tokens, 40));

  EXPECT_THAT(ReadBack(a, 44), ElementsAreArray(a_tokens));
  EXPECT_THAT(ReadBack(b, 53), ElementsAreArray(b_tokens));
  // The cache's token lists agree: each sequence's full blocks are keyed by its own tokens
  // (B's third block by tokens 32..47 of B; A's third block is still partial).
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup la, cache_->Lookup(a_tokens));
  EXPECT_EQ(la.matched_tokens, 32);
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixLookup lb, cache_->Lookup(b_tokens));
  EXPECT_EQ(lb.matched_tokens, 48);

  KVTIER_ASSERT_OK(cache_->Release(a));
  KVTIER_ASSERT_OK(cache_->Release(b));
}

TEST_F(Regress_TR_2, ForkOfSealedBlockAlsoCopies) {
  // The whole kind: forking inside a block that is already full (sealed, immutable, shareable)
  // must copy it too, or the child's appends would write into a block others may share.
  const SequenceId a(1);
  const SequenceId b(2);
  const std::vector<int32_t> a_tokens = Iota(48);
  KVTIER_ASSERT_OK(cache_->CreateSequence(a));
  KVTIER_ASSERT_OK(cache_->Append(a, a_tokens).status());
  ASSERT_NO_FATAL_FAILURE(Compute(a, a_tokens, 0));
  std::vector<int32_t> a_slots;
  ASSERT_THAT(ReadBack(a, 48, &a_slots), ElementsAreArray(a_tokens));

  KVTIER_ASSERT_OK_AND_ASSIGN(std::optional<BlockCopy> copy, cache_->Fork(a, b, 40));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(static_cast<int32_t>(copy->src.value()), a_slots[2]);
  EXPECT_EQ(copy->num_tokens, 8);
  ASSERT_NO_FATAL_FAILURE(Copy(*copy));
  std::vector<int32_t> b_tokens(a_tokens.begin(), a_tokens.begin() + 40);
  for (int32_t t : Iota(8, 500)) b_tokens.push_back(t);
  KVTIER_ASSERT_OK(cache_->Append(b, Iota(8, 500)).status());
  ASSERT_NO_FATAL_FAILURE(Compute(b, b_tokens, 40));

  EXPECT_THAT(ReadBack(a, 48), ElementsAreArray(a_tokens));
  EXPECT_THAT(ReadBack(b, 48), ElementsAreArray(b_tokens));
  KVTIER_ASSERT_OK(cache_->Release(a));
  KVTIER_ASSERT_OK(cache_->Release(b));
}

}  // namespace
}  // namespace kvtier
