#include "kvtier/cache_namespace.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "internal/byte_writer.h"
#include "internal/sha256.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

TEST(CacheNamespaceTest, GoldenDigest) {
  // Pins the namespace digest of schema 1 (docs/formats.md). If this changes, every stored key
  // changes: bump kKeySchemaVersion instead of editing this value.
  const CacheNamespace ns = testing::MakeNamespace(testing::Llama8B(), testing::LlamaNamespaceOptions());
  EXPECT_EQ(ns.DigestHex(), "8bb38539472eaf4d8d324b3f6d7542ae");
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
  const CacheNamespace ns = testing::MakeNamespace(testing::Llama8B(32, KvDtype::kFp8E4m3), o);
  std::vector<uint8_t> msg;
  internal::ByteWriter w(&msg);
  w.Bytes("kvtier-namespace", 16);
  w.U8(0x01);  // schema version
  w.U32(4);
  w.U32(1);
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
  auto sha = internal::Sha256::Create();
  ASSERT_TRUE(sha.ok());
  auto digest = sha->Hash(msg.data(), msg.size());
  ASSERT_TRUE(digest.ok());
  EXPECT_TRUE(std::equal(ns.digest().begin(), ns.digest().end(), digest->begin()));
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

}  // namespace
}  // namespace kvtier
