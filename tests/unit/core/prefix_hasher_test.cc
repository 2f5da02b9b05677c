#include "kvtier/prefix_hasher.h"

#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/byte_writer.h"
#include "internal/sha256.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::kvtier::testing::MakeHasher;

std::vector<std::string> Hex(const std::vector<BlockKey>& keys) {
  std::vector<std::string> out;
  for (const BlockKey& k : keys) out.push_back(k.ToHex());
  return out;
}

BlockExtras FullExtras() {
  BlockExtras e;
  e.adapter = AdapterIdentity{.id = "sql-lora", .load_generation = 7};
  e.tenant_salt = "tenant-42";
  e.multimodal.push_back({.start_token = 20, .num_tokens = 8, .digest = std::string(32, '\x5a')});
  return e;
}

// --- Golden vectors: these pin every byte of key schema 2. If one changes, every stored key
// changes with it: bump kKeySchemaVersion (and these values) deliberately, never by accident.
TEST(PrefixHasherTest, GoldenXxh3) {
  auto keys = MakeHasher(16).BlockKeys(Iota(40));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT(Hex(*keys), ::testing::ElementsAre("2a04166004540fed553852a4d81cfb73",
                                                 "c258924fcbf7fa37d84018b2c09f3b0b"));
}

TEST(PrefixHasherTest, GoldenSha256) {
  auto keys = MakeHasher(16, HashAlgorithm::kSha256).BlockKeys(Iota(40));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT(Hex(*keys), ::testing::ElementsAre("65caa0e4043449f486833745e3252f32",
                                                 "7f0b94465ce491dc97db4707b86d8ca5"));
}

TEST(PrefixHasherTest, GoldenXxh3WithExtras) {
  auto keys = MakeHasher(16).BlockKeys(Iota(40), FullExtras());
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT(Hex(*keys), ::testing::ElementsAre("94e1912bb16ca3dd09f71daf1713b37b",
                                                 "99ad9ceba21be4b4c5c45c0f92a1f021"));
}

// The schema-1 golden keys of the three tests above, kept to show that schema 2 changed them all.
// The block key layout itself did not change; the namespace digest it starts from did (schema 2
// added the pipeline stage), so the schema-1 XXH3 keys are rebuilt here from the schema-1 digest
// (CacheNamespaceTest.Schema1DigestDiffersFromSchema2) and every schema-2 key differs from its
// schema-1 value. Blocks a schema-1 process stored are therefore never matched: misses, never
// another namespace's bytes.
TEST(PrefixHasherTest, Schema1KeysDifferFromSchema2) {
  constexpr uint8_t kSchema1Digest[16] = {0x8b, 0xb3, 0x85, 0x39, 0x47, 0x2e, 0xaf, 0x4d,
                                          0x8d, 0x32, 0x4b, 0x3f, 0x6d, 0x75, 0x42, 0xae};
  const std::vector<std::string> schema1_xxh3 = {"6e49b8fa2047eb023fe4032dd03b5848",
                                                 "efda267be5164040cf7c5e2be45c8283"};
  const std::vector<std::string> schema1_sha256 = {"87ad87b89cbf93e7c35b441efab26105",
                                                   "b23a058dcc42db60224a1f61603c077b"};
  const std::vector<std::string> schema1_extras = {"81e9b8b268d22c60d84c75f1fe965180",
                                                   "f17510bd342434fe6f4d45fca12fd88c"};
  const std::vector<int32_t> tokens = Iota(40);
  BlockKey parent = kRootBlockKey;
  for (int block = 0; block < 2; ++block) {
    std::vector<uint8_t> msg;
    internal::ByteWriter w(&msg);
    w.Bytes(kSchema1Digest, 16);
    w.Bytes(parent.ToBytes().data(), 16);
    w.U8(0x10);
    w.U32(64);
    for (int i = 0; i < 16; ++i) w.U32(static_cast<uint32_t>(tokens[block * 16 + i]));
    const XXH128_hash_t h = XXH3_128bits(msg.data(), msg.size());
    parent = BlockKey{.hi = h.high64, .lo = h.low64};
    EXPECT_EQ(parent.ToHex(), schema1_xxh3[block]) << "block " << block;
  }
  auto xxh3 = MakeHasher(16).BlockKeys(tokens);
  auto sha256 = MakeHasher(16, HashAlgorithm::kSha256).BlockKeys(tokens);
  auto extras = MakeHasher(16).BlockKeys(tokens, FullExtras());
  ASSERT_TRUE(xxh3.ok() && sha256.ok() && extras.ok());
  for (int block = 0; block < 2; ++block) {
    EXPECT_NE((*xxh3)[block].ToHex(), schema1_xxh3[block]) << "block " << block;
    EXPECT_NE((*sha256)[block].ToHex(), schema1_sha256[block]) << "block " << block;
    EXPECT_NE((*extras)[block].ToHex(), schema1_extras[block]) << "block " << block;
  }
}

// Two pipeline stages with equal per-rank geometry (each holds 32 layers) get unrelated keys for
// the same tokens, whether their namespaces differ in pp_rank or only in first_layer: one stage's
// stored blocks can never be read as another's.
TEST(PrefixHasherTest, PipelineStagesGetDifferentKeysForSameTokens) {
  auto keys_of = [](const CacheNamespaceOptions& o) {
    auto hasher = PrefixHasher::Create(testing::MakeNamespace(testing::Llama8B(), o),
                                       HashAlgorithm::kXxh3_128);
    EXPECT_TRUE(hasher.ok()) << hasher.status();
    auto keys = hasher->BlockKeys(Iota(64));
    EXPECT_TRUE(keys.ok()) << keys.status();
    return *keys;
  };
  CacheNamespaceOptions stage0 = testing::LlamaNamespaceOptions();
  stage0.pp_size = 2;
  CacheNamespaceOptions stage1 = stage0;
  stage1.pp_rank = 1;
  CacheNamespaceOptions later_layers = stage0;
  later_layers.first_layer = 32;
  const std::vector<BlockKey> k0 = keys_of(stage0);
  const std::vector<BlockKey> k1 = keys_of(stage1);
  const std::vector<BlockKey> k_later = keys_of(later_layers);
  ASSERT_EQ(k0.size(), 4u);
  ASSERT_EQ(k1.size(), 4u);
  ASSERT_EQ(k_later.size(), 4u);
  for (size_t i = 0; i < k0.size(); ++i) {
    EXPECT_NE(k0[i], k1[i]) << "block " << i;
    EXPECT_NE(k0[i], k_later[i]) << "block " << i;
    EXPECT_NE(k1[i], k_later[i]) << "block " << i;
  }
  // Same stage, same keys: the stage is a namespace input, not a per-process seed.
  EXPECT_EQ(keys_of(stage1), k1);
}

// The documented layout (docs/formats.md, "Block key"), written out by hand here, hashes to the
// same keys: the format document and the code agree.
TEST(PrefixHasherTest, DocumentedLayoutReproducesKeys) {
  const PrefixHasher hasher = MakeHasher(16);
  const std::vector<int32_t> tokens = Iota(40);
  const BlockExtras extras = FullExtras();
  auto keys = hasher.BlockKeys(tokens, extras);
  ASSERT_TRUE(keys.ok());

  BlockKey parent = kRootBlockKey;
  for (int block = 0; block < 2; ++block) {
    std::vector<uint8_t> msg;
    internal::ByteWriter w(&msg);
    w.Bytes(hasher.namespace_digest().data(), 16);
    w.Bytes(parent.ToBytes().data(), 16);
    w.U8(0x01);  // adapter id
    w.U32(8);
    w.Bytes("sql-lora", 8);
    w.U8(0x02);  // adapter load generation
    w.U32(8);
    w.U64(7);
    w.U8(0x03);  // tenant salt
    w.U32(9);
    w.Bytes("tenant-42", 9);
    // The image covers tokens [20, 28): it overlaps block 1 only ([16, 32)), at offset 4.
    if (block == 1) {
      w.U8(0x04);
      w.U32(16 + 32);
      w.U64(4);
      w.U64(8);
      w.Bytes(std::string(32, '\x5a').data(), 32);
    }
    w.U8(0x10);  // tokens
    w.U32(64);
    for (int i = 0; i < 16; ++i) w.U32(static_cast<uint32_t>(tokens[block * 16 + i]));
    const XXH128_hash_t h = XXH3_128bits(msg.data(), msg.size());
    const BlockKey expected{.hi = h.high64, .lo = h.low64};
    EXPECT_EQ((*keys)[block], expected) << "block " << block;
    parent = expected;
  }
}

// An item that began in an earlier block and continues past this one: its offset is negative
// (two's complement) and every block it overlaps carries it. Pinned by hand from formats.md.
TEST(PrefixHasherTest, DocumentedLayoutOfItemSpanningBlocks) {
  const PrefixHasher hasher = MakeHasher(16);
  const std::vector<int32_t> tokens = Iota(16, 3000);
  BlockExtras extras;
  extras.multimodal.push_back({.start_token = 10, .num_tokens = 100, .digest = "D1"});  // [10,110)
  extras.multimodal.push_back({.start_token = 200, .num_tokens = 5, .digest = "D2"});   // later
  const BlockKey parent{0x1111, 0x2222};
  std::vector<BlockKey> keys;
  KVTIER_ASSERT_OK(hasher.AppendBlockKeys(parent, 48, tokens, extras, &keys));  // block [48,64)
  ASSERT_EQ(keys.size(), 1u);

  std::vector<uint8_t> msg;
  internal::ByteWriter w(&msg);
  w.Bytes(hasher.namespace_digest().data(), 16);
  w.Bytes(parent.ToBytes().data(), 16);
  w.U8(0x04);
  w.U32(16 + 2);
  w.U64(static_cast<uint64_t>(int64_t{10} - 48));  // -38
  w.U64(100);
  w.Bytes("D1", 2);
  w.U8(0x10);
  w.U32(64);
  for (int32_t t : tokens) w.U32(static_cast<uint32_t>(t));
  const XXH128_hash_t h = XXH3_128bits(msg.data(), msg.size());
  EXPECT_EQ(keys[0], (BlockKey{.hi = h.high64, .lo = h.low64}));
}

TEST(PrefixHasherTest, Sha256IsTruncatedDigestOfSameMessage) {
  const PrefixHasher hasher = MakeHasher(16, HashAlgorithm::kSha256);
  const std::vector<int32_t> tokens = Iota(16);
  auto keys = hasher.BlockKeys(tokens);
  ASSERT_TRUE(keys.ok());
  std::vector<uint8_t> msg;
  internal::ByteWriter w(&msg);
  w.Bytes(hasher.namespace_digest().data(), 16);
  w.Bytes(kRootBlockKey.ToBytes().data(), 16);
  w.U8(0x10);
  w.U32(64);
  for (int32_t t : tokens) w.U32(static_cast<uint32_t>(t));
  auto sha = internal::Sha256::Create();
  ASSERT_TRUE(sha.ok());
  auto digest = sha->Hash(msg.data(), msg.size());
  ASSERT_TRUE(digest.ok());
  std::array<uint8_t, 16> head;
  std::memcpy(head.data(), digest->data(), 16);
  EXPECT_EQ((*keys)[0], BlockKey::FromBytes(head));
}

TEST(PrefixHasherTest, OnlyFullBlocksGetKeys) {
  const PrefixHasher h = MakeHasher(16);
  EXPECT_EQ(h.BlockKeys(Iota(15))->size(), 0u);
  EXPECT_EQ(h.BlockKeys(Iota(16))->size(), 1u);
  EXPECT_EQ(h.BlockKeys(Iota(47))->size(), 2u);
  EXPECT_EQ(h.BlockKeys(Iota(48))->size(), 3u);
  // The partial tail does not influence the full blocks' keys.
  EXPECT_EQ(*h.BlockKeys(Iota(47)), *h.BlockKeys(Iota(32)));
}

TEST(PrefixHasherTest, KeysChainOverTheirParents) {
  const PrefixHasher h = MakeHasher(16);
  std::vector<int32_t> a = Iota(48);
  std::vector<int32_t> b = a;
  b[20] = 7;  // block 1 differs
  auto ka = *h.BlockKeys(a);
  auto kb = *h.BlockKeys(b);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);
  EXPECT_NE(ka[2], kb[2]);  // same tokens in block 2, different parent
  // Equal blocks at different depths get different keys.
  std::vector<int32_t> repeated(32, 5);
  auto kr = *h.BlockKeys(repeated);
  EXPECT_NE(kr[0], kr[1]);
}

TEST(PrefixHasherTest, ContinuationEqualsWholeSequence) {
  const PrefixHasher h = MakeHasher(16);
  const std::vector<int32_t> tokens = Iota(80);
  BlockExtras extras = FullExtras();
  extras.multimodal[0] = {.start_token = 30, .num_tokens = 40, .digest = "img"};
  auto whole = *h.BlockKeys(tokens, extras);
  ASSERT_EQ(whole.size(), 5u);
  std::vector<BlockKey> pieces;
  KVTIER_ASSERT_OK(h.AppendBlockKeys(kRootBlockKey, 0, absl::MakeSpan(tokens).subspan(0, 32),
                                     extras, &pieces));
  KVTIER_ASSERT_OK(h.AppendBlockKeys(pieces.back(), 32, absl::MakeSpan(tokens).subspan(32),
                                     extras, &pieces));
  EXPECT_EQ(pieces, whole);
}

TEST(PrefixHasherTest, AlgorithmsAndEmptySaltDiffer) {
  const std::vector<int32_t> t = Iota(16);
  EXPECT_NE(*MakeHasher(16).BlockKeys(t), *MakeHasher(16, HashAlgorithm::kSha256).BlockKeys(t));
  BlockExtras empty_salt;
  empty_salt.tenant_salt = "";
  EXPECT_NE(*MakeHasher(16).BlockKeys(t, empty_salt), *MakeHasher(16).BlockKeys(t));
  EXPECT_EQ(HashAlgorithmName(HashAlgorithm::kXxh3_128), "xxh3_128");
  EXPECT_EQ(HashAlgorithmName(HashAlgorithm::kSha256), "sha256");
  EXPECT_EQ(HashAlgorithmName(static_cast<HashAlgorithm>(9)), "unknown");
}

TEST(PrefixHasherTest, MultimodalItemMarksExactlyTheBlocksItOverlaps) {
  const PrefixHasher h = MakeHasher(16);
  const std::vector<int32_t> tokens = Iota(96);
  BlockExtras image;
  image.multimodal.push_back({.start_token = 31, .num_tokens = 34, .digest = "D1"});  // [31, 65)
  auto plain = *h.BlockKeys(tokens);
  auto with = *h.BlockKeys(tokens, image);
  EXPECT_EQ(with[0], plain[0]);  // [0, 16)
  EXPECT_NE(with[1], plain[1]);  // [16, 32) holds token 31
  EXPECT_NE(with[4], plain[4]);  // [64, 80) holds token 64
  // Block 5 [80, 96) does not overlap, but its parent differs, so its key does too.
  EXPECT_NE(with[5], plain[5]);
  // Moving the item by one token inside the same blocks changes the keys (offsets are hashed).
  BlockExtras moved = image;
  moved.multimodal[0].start_token = 32;
  EXPECT_NE(h.BlockKeys(tokens, moved)->at(2), with[2]);
}

TEST(PrefixHasherTest, RejectsBadArgumentsAndAppendsNothing) {
  const PrefixHasher h = MakeHasher(16);
  const std::vector<int32_t> t = Iota(32);
  std::vector<BlockKey> keys = {BlockKey{1, 1}};
  const BlockKey some{3, 4};
  EXPECT_THAT(h.AppendBlockKeys(kRootBlockKey, 0, t, {}, nullptr),
              IsError(StatusCode::kInvalidArgument, "keys is null"));
  EXPECT_THAT(h.AppendBlockKeys(some, -16, t, {}, &keys),
              IsError(StatusCode::kInvalidArgument, "first_position = -16"));
  EXPECT_THAT(h.AppendBlockKeys(some, 20, t, {}, &keys),
              IsError(StatusCode::kInvalidArgument, "first_position = 20"));
  EXPECT_THAT(h.AppendBlockKeys(some, INT64_MAX - 15, t, FullExtras(), &keys),
              IsError(StatusCode::kInvalidArgument, "first_position = 9223372036854775792"));
  EXPECT_THAT(h.AppendBlockKeys(some, PrefixHasher::kMaxPosition - 16, t, {}, &keys),
              IsError(StatusCode::kInvalidArgument, "passes the largest position"));
  EXPECT_THAT(h.AppendBlockKeys(kRootBlockKey, 16, t, {}, &keys),
              IsError(StatusCode::kInvalidArgument, "does not fit first_position = 16"));
  EXPECT_THAT(h.AppendBlockKeys(some, 0, t, {}, &keys),
              IsError(StatusCode::kInvalidArgument, "does not fit first_position = 0"));

  auto bad = [&](auto mutate) {
    BlockExtras e = FullExtras();
    mutate(e);
    return h.AppendBlockKeys(kRootBlockKey, 0, t, e, &keys);
  };
  EXPECT_THAT(bad([](BlockExtras& e) { e.adapter->id = ""; }),
              IsError(StatusCode::kInvalidArgument, "adapter id has 0 bytes"));
  EXPECT_THAT(bad([](BlockExtras& e) { e.tenant_salt = std::string(1025, 's'); }),
              IsError(StatusCode::kInvalidArgument, "tenant salt has 1025 bytes"));
  EXPECT_THAT(bad([](BlockExtras& e) { e.multimodal[0].start_token = -1; }),
              IsError(StatusCode::kInvalidArgument, "start_token = -1"));
  EXPECT_THAT(bad([](BlockExtras& e) { e.multimodal[0].num_tokens = 0; }),
              IsError(StatusCode::kInvalidArgument, "num_tokens = 0"));
  EXPECT_THAT(bad([](BlockExtras& e) { e.multimodal[0].digest = ""; }),
              IsError(StatusCode::kInvalidArgument, "digest has 0 bytes"));
  EXPECT_THAT(bad([](BlockExtras& e) { e.multimodal[0].digest = std::string(65, 'd'); }),
              IsError(StatusCode::kInvalidArgument, "digest has 65 bytes"));
  EXPECT_THAT(bad([](BlockExtras& e) {
                e.multimodal.push_back({.start_token = 25, .num_tokens = 2, .digest = "x"});
              }),
              IsError(StatusCode::kInvalidArgument, "multimodal item 1 starts at 25"));
  EXPECT_EQ(keys.size(), 1u);  // nothing appended by any failed call
  BlockExtras empty_adapter;
  empty_adapter.adapter = AdapterIdentity{};
  EXPECT_THAT(h.BlockKeys(t, empty_adapter),
              IsError(StatusCode::kInvalidArgument, "adapter id has 0 bytes"));
}

TEST(PrefixHasherTest, RejectsUnknownAlgorithm) {
  const CacheNamespace ns =
      testing::MakeNamespace(testing::Llama8B(), testing::LlamaNamespaceOptions());
  EXPECT_THAT(PrefixHasher::Create(ns, static_cast<HashAlgorithm>(5)),
              IsError(StatusCode::kInvalidArgument, "unknown hash algorithm 5"));
}

}  // namespace
}  // namespace kvtier
