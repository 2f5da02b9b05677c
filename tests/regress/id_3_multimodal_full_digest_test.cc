// ID-3: a prompt with a multimodal item over positions [p, p+576) stored with image digest D1;
// the same tokens with digest D2 that shares its low 16 bits with D1: a miss from the first
// block overlapping the image.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/block_index.h"
#include "kvtier/prefix_hasher.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

TEST(Regress_ID_3, DigestsSharingLow16BitsMissFromFirstImageBlock) {
  constexpr int kB = 16;
  constexpr int64_t kImageStart = 40;  // inside block 2 = [32, 48)
  constexpr int64_t kImageTokens = 576;
  const PrefixHasher hasher = testing::MakeHasher(kB);
  std::vector<int32_t> prompt = testing::Iota(40);
  prompt.insert(prompt.end(), kImageTokens, 128256);  // the image placeholder token
  for (int32_t t : testing::Iota(24, 5000)) prompt.push_back(t);
  ASSERT_EQ(prompt.size(), 640u);

  // 32-byte digests equal in every byte but one in the middle: equal low 16 bits whichever end
  // a truncating implementation would read.
  std::string d1(32, '\0');
  for (int i = 0; i < 32; ++i) d1[i] = static_cast<char>(0x30 + i);
  std::string d2 = d1;
  d2[15] ^= 0x01;
  ASSERT_EQ(d1.substr(0, 2), d2.substr(0, 2));
  ASSERT_EQ(d1.substr(30, 2), d2.substr(30, 2));

  auto extras = [&](const std::string& digest) {
    BlockExtras e;
    e.multimodal.push_back(
        {.start_token = kImageStart, .num_tokens = kImageTokens, .digest = digest});
    return e;
  };
  auto index = std::move(BlockIndex::Create(kB)).value();
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> stored, hasher.BlockKeys(prompt, extras(d1)));
  ASSERT_EQ(stored.size(), 40u);
  for (size_t i = 0; i < stored.size(); ++i) {
    KVTIER_ASSERT_OK(index->AddCopy(stored[i], Tier::kHbm, SlotId(static_cast<uint32_t>(i)),
                                    CopyState::kReady));
  }

  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> other, hasher.BlockKeys(prompt, extras(d2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(PrefixMatch m, index->Match(other, 640));
  EXPECT_EQ(m.matched_tokens, 32) << "the match must end at block 2, the first image block";
  EXPECT_EQ(other[0], stored[0]);
  EXPECT_EQ(other[1], stored[1]);
  for (size_t i = 2; i < other.size(); ++i) EXPECT_NE(other[i], stored[i]) << "block " << i;

  // Control: the same image hits the whole prompt.
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<BlockKey> same, hasher.BlockKeys(prompt, extras(d1)));
  EXPECT_EQ(index->Match(same, 640)->matched_tokens, 640);
}

}  // namespace
}  // namespace kvtier
