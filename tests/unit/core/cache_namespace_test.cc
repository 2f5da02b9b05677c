#include "kvtier/cache_namespace.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/byte_writer.h"
#include "internal/hex.h"
#include "internal/sha256.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

// SHA-256 of `msg`, truncated to the 16 bytes a namespace digest keeps, as hex.
std::string TruncatedSha256Hex(const std::vector<uint8_t>& msg) {
  auto sha = internal::Sha256::Create();
  EXPECT_TRUE(sha.ok()) << sha.status();
  auto digest = sha->Hash(msg.data(), msg.size());
  EXPECT_TRUE(digest.ok()) << digest.status();
  return internal::HexEncode(digest->data(), 16);
}

TEST(CacheNamespaceTest, GoldenDigest) {
  // Pins the namespace digest of schema 2 (docs/formats.md). If this changes, every stored key
  // changes: bump kKeySchemaVersion instead of editing this value.
  const CacheNamespace ns = testing::MakeNamespace(testing::Llama8B(), testing::LlamaNamespaceOptions());
  EXPECT_EQ(ns.DigestHex(), "d2a0c8595b56272900f0c5987cb297fa");
  EXPECT_EQ(ns.geometry(), testing::Llama8B());
  EXPECT_EQ(ns.options().model_id, "meta-llama/Llama-3.1-8B-Instruct");
}

// The documented layout (docs/formats.md, "Namespace digest"), written out by hand, hashes to the
// same digest: the format document and the code agree.
TEST(CacheNamespaceTest, DocumentedLayoutReproducesDigest) {
  CacheNamespaceOptions o = testing::LlamaNamespaceOptions();
  o.hbm_layout = HbmLayout::kBlockFirst;
  o.tp_rank = 1;
  o.tp_size = 2;
  o.pp_rank = 3;
  o.pp_size = 4;
  o.first_layer = 96;
  const CacheNamespace ns = testing::MakeNamespace(testing::Llama8B(32, KvDtype::kFp8E4m3), o);
  std::vector<uint8_t> msg;
  internal::ByteWriter w(&msg);
  w.Bytes("kvtier-namespace", 16);
  w.U8(0x01);  // schema version
  w.U32(4);
  w.U32(2);
  w.Field(0x02, "meta-llama/Llama-3.1-8B-Instruct");
  w.Field(0x03, "0e9e39f2");
  w.U8(0x04);  // geometry
  w.U32(26);
  w.U8(0);     // kMha
  w.U32(32);   // layers
  w.U32(8);    // KV heads
  w.U32(128);  // head_dim
  w.U32(0);    // kv_lora_rank
  w.U32(0);    // qk_rope_head_dim
  w.U8(2);     // kFp8E4m3
  w.U32(32);   // tokens per block
  w.U8(0x05);  // HBM layout
  w.U32(1);
  w.U8(1);  // kBlockFirst
  w.U8(0x06);  // tensor parallel
  w.U32(8);
  w.U32(1);
  w.U32(2);
  w.U8(0x07);  // pipeline parallel
  w.U32(8);
  w.U32(3);
  w.U32(4);
  w.U8(0x08);  // first layer
  w.U32(4);
  w.U32(96);
  auto sha = internal::Sha256::Create();
  ASSERT_TRUE(sha.ok());
  auto digest = sha->Hash(msg.data(), msg.size());
  ASSERT_TRUE(digest.ok());
  EXPECT_TRUE(std::equal(ns.digest().begin(), ns.digest().end(), digest->begin()));
}

// The schema-1 digest of GoldenDigest's inputs, kept to show that schema 2 moved every key: the
// schema-1 layout written out by hand (no pipeline fields, version 1) still hashes to the value
// schema 1 pinned, and the schema-2 digest of the same inputs differs from it. Block keys chain
// from this digest, so blocks stored by a schema-1 process (NVMe slots, remote values) are never
// matched by a schema-2 one: they are misses, never wrong bytes.
TEST(CacheNamespaceTest, Schema1DigestDiffersFromSchema2) {
  constexpr char kSchema1Digest[] = "8bb38539472eaf4d8d324b3f6d7542ae";
  std::vector<uint8_t> msg;
  internal::ByteWriter w(&msg);
  w.Bytes("kvtier-namespace", 16);
  w.U8(0x01);
  w.U32(4);
  w.U32(1);  // schema 1
  w.Field(0x02, "meta-llama/Llama-3.1-8B-Instruct");
  w.Field(0x03, "0e9e39f2");
  w.U8(0x04);
  w.U32(26);
  w.U8(0);     // kMha
  w.U32(32);   // layers
  w.U32(8);    // KV heads
  w.U32(128);  // head_dim
  w.U32(0);
  w.U32(0);
  w.U8(0);    // kBf16
  w.U32(16);  // tokens per block
  w.U8(0x05);
  w.U32(1);
  w.U8(0);  // kLayerFirst
  w.U8(0x06);
  w.U32(8);
  w.U32(0);
  w.U32(1);
  EXPECT_EQ(TruncatedSha256Hex(msg), kSchema1Digest);
  const CacheNamespace ns =
      testing::MakeNamespace(testing::Llama8B(), testing::LlamaNamespaceOptions());
  EXPECT_NE(ns.DigestHex(), kSchema1Digest);
}

// Two pipeline stages of one model with equal per-rank geometry (same layer count, heads, dtype)
// hold different layers' KV: their digests differ, whether they differ in the stage or only in
// the layers they hold.
TEST(CacheNamespaceTest, PipelineStagesWithEqualGeometryDiffer) {
  CacheNamespaceOptions stage0 = testing::LlamaNamespaceOptions();
  stage0.pp_size = 2;
  CacheNamespaceOptions stage1 = stage0;
  stage1.pp_rank = 1;
  EXPECT_NE(testing::MakeNamespace(testing::Llama8B(), stage0).DigestHex(),
            testing::MakeNamespace(testing::Llama8B(), stage1).DigestHex());
  CacheNamespaceOptions later_layers = stage0;
  later_layers.first_layer = 32;
  EXPECT_NE(testing::MakeNamespace(testing::Llama8B(), stage0).DigestHex(),
            testing::MakeNamespace(testing::Llama8B(), later_layers).DigestHex());
}

// Defaults are a single stage holding layers from 0: spelling them out changes nothing.
TEST(CacheNamespaceTest, DefaultsEqualExplicitSingleStage) {
  CacheNamespaceOptions explicit_options = testing::LlamaNamespaceOptions();
  explicit_options.pp_rank = 0;
  explicit_options.pp_size = 1;
  explicit_options.first_layer = 0;
  const CacheNamespaceOptions defaults{.model_id = "meta-llama/Llama-3.1-8B-Instruct",
                                       .weights_fingerprint = "0e9e39f2"};
  EXPECT_EQ(defaults.pp_rank, 0);
  EXPECT_EQ(defaults.pp_size, 1);
  EXPECT_EQ(defaults.first_layer, 0);
  EXPECT_EQ(testing::MakeNamespace(testing::Llama8B(), defaults).DigestHex(),
            testing::MakeNamespace(testing::Llama8B(), explicit_options).DigestHex());
}

TEST(CacheNamespaceTest, EveryFieldChangesTheDigest) {
  const CacheNamespaceOptions base = testing::LlamaNamespaceOptions();
  const std::string d0 = testing::MakeNamespace(testing::Llama8B(), base).DigestHex();
  auto digest = [](const KvGeometry& g, const CacheNamespaceOptions& o) {
    return testing::MakeNamespace(g, o).DigestHex();
  };
  CacheNamespaceOptions o = base;
  o.model_id = "meta-llama/Llama-3.1-8B";
  EXPECT_NE(digest(testing::Llama8B(), o), d0);
  o = base;
  o.weights_fingerprint = "0e9e39f3";
  EXPECT_NE(digest(testing::Llama8B(), o), d0);
  o = base;
  o.hbm_layout = HbmLayout::kBlockFirst;
  EXPECT_NE(digest(testing::Llama8B(), o), d0);
  o = base;
  o.tp_size = 2;
  const std::string rank0 = digest(testing::Llama8B(), o);
  o.tp_rank = 1;
  EXPECT_NE(digest(testing::Llama8B(), o), rank0);
  EXPECT_NE(rank0, d0);
  o = base;
  o.pp_size = 2;
  const std::string stage0 = digest(testing::Llama8B(), o);
  o.pp_rank = 1;
  EXPECT_NE(digest(testing::Llama8B(), o), stage0);
  EXPECT_NE(stage0, d0);
  o = base;
  o.first_layer = 1;
  EXPECT_NE(digest(testing::Llama8B(), o), d0);
  EXPECT_NE(digest(testing::Llama8B(16, KvDtype::kFp8E4m3), base), d0);
  EXPECT_NE(digest(testing::Llama8B(32), base), d0);
  // Same inputs, same digest: no per-process seed.
  EXPECT_EQ(digest(testing::Llama8B(), base), d0);
}

TEST(CacheNamespaceTest, FieldsCannotShiftIntoEachOther) {
  // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
  CacheNamespaceOptions a = testing::LlamaNamespaceOptions();
  a.model_id = "ab";
  a.weights_fingerprint = "c";
  CacheNamespaceOptions b = a;
  b.model_id = "a";
  b.weights_fingerprint = "bc";
  EXPECT_NE(testing::MakeNamespace(testing::Llama8B(), a).DigestHex(),
            testing::MakeNamespace(testing::Llama8B(), b).DigestHex());
}

TEST(CacheNamespaceTest, RejectsBadOptionsNamingThem) {
  const KvGeometry g = testing::Llama8B();
  CacheNamespaceOptions o = testing::LlamaNamespaceOptions();
  o.model_id = "";
  EXPECT_THAT(CacheNamespace::Create(g, o), IsError(StatusCode::kInvalidArgument, "model_id has 0"));
  o = testing::LlamaNamespaceOptions();
  o.weights_fingerprint = std::string(1025, 'x');
  EXPECT_THAT(CacheNamespace::Create(g, o),
              IsError(StatusCode::kInvalidArgument, "weights_fingerprint has 1025"));
  o = testing::LlamaNamespaceOptions();
  o.tp_size = 0;
  EXPECT_THAT(CacheNamespace::Create(g, o), IsError(StatusCode::kInvalidArgument, "tp_size = 0"));
  o.tp_size = 4;
  o.tp_rank = 4;
  EXPECT_THAT(CacheNamespace::Create(g, o), IsError(StatusCode::kInvalidArgument, "tp_rank = 4"));
  o.tp_rank = -1;
  EXPECT_THAT(CacheNamespace::Create(g, o), IsError(StatusCode::kInvalidArgument, "tp_rank = -1"));
  o = testing::LlamaNamespaceOptions();
  o.hbm_layout = static_cast<HbmLayout>(5);
  EXPECT_THAT(CacheNamespace::Create(g, o),
              IsError(StatusCode::kInvalidArgument, "unknown hbm_layout 5"));
}

TEST(CacheNamespaceTest, RejectsBadPipelineOptionsNamingThem) {
  const KvGeometry g = testing::Llama8B();  // 32 layers
  CacheNamespaceOptions o = testing::LlamaNamespaceOptions();
  o.pp_size = 0;
  EXPECT_THAT(CacheNamespace::Create(g, o), IsError(StatusCode::kInvalidArgument, "pp_size = 0"));
  o.pp_size = 65537;
  EXPECT_THAT(CacheNamespace::Create(g, o),
              IsError(StatusCode::kInvalidArgument, "pp_size = 65537"));
  o.pp_size = 65536;
  o.pp_rank = 65535;
  KVTIER_EXPECT_OK(CacheNamespace::Create(g, o).status());
  o.pp_size = 4;
  o.pp_rank = 4;
  EXPECT_THAT(CacheNamespace::Create(g, o), IsError(StatusCode::kInvalidArgument, "pp_rank = 4"));
  o.pp_rank = -1;
  EXPECT_THAT(CacheNamespace::Create(g, o), IsError(StatusCode::kInvalidArgument, "pp_rank = -1"));
  o = testing::LlamaNamespaceOptions();
  o.first_layer = -1;
  EXPECT_THAT(CacheNamespace::Create(g, o),
              IsError(StatusCode::kInvalidArgument, "first_layer = -1"));
  // The end of the range held, first_layer + num_layers (one past the last layer), fits in int32.
  constexpr int kMax = std::numeric_limits<int32_t>::max();
  o.first_layer = kMax - 31;
  EXPECT_THAT(CacheNamespace::Create(g, o),
              IsError(StatusCode::kInvalidArgument, "first_layer = 2147483616"));
  o.first_layer = kMax - 32;
  KVTIER_EXPECT_OK(CacheNamespace::Create(g, o).status());
}

}  // namespace
}  // namespace kvtier
