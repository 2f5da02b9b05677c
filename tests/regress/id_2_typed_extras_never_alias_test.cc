// ID-2: request A has adapter name "S" and no salt; request B has no adapter and tenant salt "S".
// Same tokens: 0 hits across them. Typed fields never alias, whatever bytes a value carries.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/block_index.h"
#include "kvtier/prefix_hasher.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

int64_t CrossHits(const PrefixHasher& hasher, const std::vector<int32_t>& prompt,
                  const BlockExtras& stored, const BlockExtras& queried) {
  auto index = std::move(BlockIndex::Create(hasher.tokens_per_block())).value();
  auto keys = hasher.BlockKeys(prompt, stored);
  EXPECT_TRUE(keys.ok()) << keys.status();
  for (size_t i = 0; i < keys->size(); ++i) {
    EXPECT_TRUE(index->AddCopy((*keys)[i], Tier::kDram, SlotId(static_cast<uint32_t>(i)),
                               CopyState::kReady).ok());
  }
  auto query = hasher.BlockKeys(prompt, queried);
  EXPECT_TRUE(query.ok()) << query.status();
  return index->Match(*query, static_cast<int64_t>(prompt.size()))->matched_tokens;
}

TEST(Regress_ID_2, AdapterNameNeverMeetsEqualTenantSalt) {
  const PrefixHasher hasher = testing::MakeHasher(16);
  const std::vector<int32_t> prompt = testing::Iota(64);
  BlockExtras a;
  a.adapter = AdapterIdentity{.id = "S", .load_generation = 0};
  BlockExtras b;
  b.tenant_salt = "S";
  EXPECT_EQ(CrossHits(hasher, prompt, a, b), 0);
  EXPECT_EQ(CrossHits(hasher, prompt, b, a), 0);
  EXPECT_EQ(CrossHits(hasher, prompt, a, a), 64);  // control
  EXPECT_EQ(CrossHits(hasher, prompt, b, b), 64);
}

TEST(Regress_ID_2, SaltCarryingAnEncodedAdapterStillNeverAliases) {
  // The whole kind of fault: a salt whose bytes spell the adapter fields' encoding (tag, length,
  // value) must still not collide, because it sits inside its own length-prefixed salt field.
  const PrefixHasher hasher = testing::MakeHasher(16);
  const std::vector<int32_t> prompt = testing::Iota(32);
  BlockExtras adapter;
  adapter.adapter = AdapterIdentity{.id = "S", .load_generation = 0};
  BlockExtras forged;
  forged.tenant_salt = std::string("\x01\x01\x00\x00\x00S\x02\x08\x00\x00\x00", 11) +
                       std::string(8, '\0');
  EXPECT_EQ(CrossHits(hasher, prompt, adapter, forged), 0);
  // Neither does an adapter id that contains a salt field, nor two salts split differently
  // between adapter id and salt.
  BlockExtras split1;
  split1.adapter = AdapterIdentity{.id = "ab", .load_generation = 0};
  split1.tenant_salt = "c";
  BlockExtras split2;
  split2.adapter = AdapterIdentity{.id = "a", .load_generation = 0};
  split2.tenant_salt = "bc";
  EXPECT_EQ(CrossHits(hasher, prompt, split1, split2), 0);
}

}  // namespace
}  // namespace kvtier
