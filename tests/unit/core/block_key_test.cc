#include "kvtier/block_key.h"

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(BlockKeyTest, BytesAreBigEndianHiThenLo) {
  const BlockKey k{.hi = 0x0102030405060708ULL, .lo = 0x090a0b0c0d0e0f10ULL};
  const std::array<uint8_t, 16> b = k.ToBytes();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b[i], i + 1);
  EXPECT_EQ(BlockKey::FromBytes(b), k);
  EXPECT_EQ(k.ToHex(), "0102030405060708090a0b0c0d0e0f10");
}

TEST(BlockKeyTest, RootIsZeroAndOrdered) {
  EXPECT_EQ(kRootBlockKey.ToHex(), std::string(32, '0'));
  EXPECT_LT((BlockKey{0, 5}), (BlockKey{1, 0}));
  EXPECT_NE((BlockKey{1, 2}), (BlockKey{2, 1}));
  absl::flat_hash_set<BlockKey> set = {BlockKey{1, 2}, BlockKey{2, 1}, BlockKey{1, 2}};
  EXPECT_EQ(set.size(), 2u);
}

}  // namespace
}  // namespace kvtier
