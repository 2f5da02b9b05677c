#include "kvtier/kv_geometry.h"

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench/replay/trace/csv.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/shared_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

TEST(KvGeometryTest, Llama8BSizes) {
  const KvGeometry g = testing::Llama8B(16);
  EXPECT_EQ(g.kv_planes(), 2);
  EXPECT_EQ(g.elements_per_token_per_layer(), 2048);
  EXPECT_EQ(g.bytes_per_token_per_layer(), 4096);
  EXPECT_EQ(g.bytes_per_token(), 131072);
  EXPECT_EQ(g.bytes_per_block_per_layer(), 65536);
  EXPECT_EQ(g.bytes_per_block(), 2097152);
  EXPECT_EQ(g.BlocksForTokens(0), 0);
  EXPECT_EQ(g.BlocksForTokens(-5), 0);
  EXPECT_EQ(g.BlocksForTokens(1), 1);
  EXPECT_EQ(g.BlocksForTokens(16), 1);
  EXPECT_EQ(g.BlocksForTokens(17), 2);
  EXPECT_EQ(g.ToString(), "mha layers=32 kv_heads=8 head_dim=128 dtype=bf16 tokens_per_block=16");
}

TEST(KvGeometryTest, Fp8HalvesBytes) {
  EXPECT_EQ(testing::Llama8B(16, KvDtype::kFp8E4m3).bytes_per_token(), 65536);
  EXPECT_EQ(testing::Llama8B(16, KvDtype::kFp8E5m2).bytes_per_token(), 65536);
  EXPECT_EQ(testing::Llama8B(16, KvDtype::kFp16).bytes_per_token(), 131072);
}

TEST(KvGeometryTest, MlaDeepSeekV3) {
  auto g = KvGeometry::Create({.attention = AttentionKind::kMla,
                               .num_layers = 61,
                               .kv_lora_rank = 512,
                               .qk_rope_head_dim = 64,
                               .tokens_per_block = 64});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->kv_planes(), 1);
  EXPECT_EQ(g->bytes_per_token(), 70272);
  EXPECT_EQ(g->bytes_per_block(), 4497408);
  EXPECT_EQ(g->ToString(),
            "mla layers=61 kv_lora_rank=512 qk_rope_head_dim=64 dtype=bf16 tokens_per_block=64");
}

TEST(KvGeometryTest, RejectsBadFieldsNamingThem) {
  KvGeometryOptions ok{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128};
  auto with = [&](auto mutate) {
    KvGeometryOptions o = ok;
    mutate(o);
    return KvGeometry::Create(o);
  };
  EXPECT_THAT(with([](auto& o) { o.num_layers = 0; }),
              IsError(StatusCode::kInvalidArgument, "num_layers = 0"));
  EXPECT_THAT(with([](auto& o) { o.num_layers = -3; }),
              IsError(StatusCode::kInvalidArgument, "num_layers = -3"));
  EXPECT_THAT(with([](auto& o) { o.num_kv_heads = 0; }),
              IsError(StatusCode::kInvalidArgument, "num_kv_heads = 0"));
  EXPECT_THAT(with([](auto& o) { o.head_dim = 70000; }),
              IsError(StatusCode::kInvalidArgument, "head_dim = 70000"));
  EXPECT_THAT(with([](auto& o) { o.tokens_per_block = 0; }),
              IsError(StatusCode::kInvalidArgument, "tokens_per_block = 0"));
  EXPECT_THAT(with([](auto& o) { o.kv_lora_rank = 512; }),
              IsError(StatusCode::kInvalidArgument, "kv_lora_rank = 512 must be 0"));
  EXPECT_THAT(with([](auto& o) { o.dtype = static_cast<KvDtype>(9); }),
              IsError(StatusCode::kInvalidArgument, "unknown dtype 9"));
  EXPECT_THAT(with([](auto& o) { o.attention = static_cast<AttentionKind>(7); }),
              IsError(StatusCode::kInvalidArgument, "unknown attention kind 7"));
  // MLA must not carry MHA fields, and needs a latent width.
  EXPECT_THAT(KvGeometry::Create({.attention = AttentionKind::kMla, .num_layers = 61,
                                  .num_kv_heads = 128, .kv_lora_rank = 512}),
              IsError(StatusCode::kInvalidArgument, "num_kv_heads = 128 must be 0"));
  EXPECT_THAT(KvGeometry::Create({.attention = AttentionKind::kMla, .num_layers = 61}),
              IsError(StatusCode::kInvalidArgument, "kv_lora_rank = 0"));
}

TEST(KvGeometryTest, RejectsBlocksOverOneGiB) {
  // 126 layers * 2 * 8 heads * 128 * 2 B = 516096 B/token; 4096 tokens = 2 GiB.
  auto g = KvGeometry::Create(
      {.num_layers = 126, .num_kv_heads = 8, .head_dim = 128, .tokens_per_block = 4096});
  EXPECT_THAT(g, IsError(StatusCode::kInvalidArgument, "2113929216 bytes, over the 1073741824"));
}

TEST(KvGeometryTest, DtypeNamesRoundTrip) {
  for (KvDtype d : {KvDtype::kBf16, KvDtype::kFp16, KvDtype::kFp8E4m3, KvDtype::kFp8E5m2}) {
    auto parsed = ParseKvDtype(KvDtypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(*ParseKvDtype("BFloat16"), KvDtype::kBf16);
  EXPECT_EQ(*ParseKvDtype("fp8"), KvDtype::kFp8E4m3);
  EXPECT_THAT(ParseKvDtype("int4"), IsError(StatusCode::kInvalidArgument, "\"int4\""));
  EXPECT_EQ(KvDtypeName(static_cast<KvDtype>(42)), "unknown");
  EXPECT_EQ(KvDtypeBytes(static_cast<KvDtype>(42)), 0);
}

TEST(KvGeometryTest, TensorParallelShardsThenReplicatesHeads) {
  const KvGeometry g = testing::Llama8B();
  EXPECT_EQ(g.ShardedForTensorParallel(1)->num_kv_heads(), 8);
  EXPECT_EQ(g.ShardedForTensorParallel(4)->num_kv_heads(), 2);
  EXPECT_EQ(g.ShardedForTensorParallel(4)->bytes_per_token(), 131072 / 4);
  EXPECT_EQ(g.ShardedForTensorParallel(16)->num_kv_heads(), 1);  // replicated beyond 8
  EXPECT_THAT(g.ShardedForTensorParallel(0), IsError(StatusCode::kInvalidArgument, "tp_size = 0"));
  EXPECT_THAT(g.ShardedForTensorParallel(3),
              IsError(StatusCode::kInvalidArgument, "does not divide num_kv_heads = 8"));
  EXPECT_THAT(g.ShardedForTensorParallel(12),
              IsError(StatusCode::kInvalidArgument, "not a multiple of num_kv_heads = 8"));
  auto mla = KvGeometry::Create({.attention = AttentionKind::kMla, .num_layers = 61,
                                 .kv_lora_rank = 512, .qk_rope_head_dim = 64});
  ASSERT_TRUE(mla.ok());
  EXPECT_EQ(mla->ShardedForTensorParallel(8)->bytes_per_token(), 70272);  // latent replicated
}

// --- Every row of ../shared/models/kv_geometry.csv ---

using ::kvtier::replay::SplitCsvLine;

TEST(KvGeometryTest, MatchesEveryRowOfSharedModelTable) {
  const auto path = testing::SharedFile("models/kv_geometry.csv");
  if (path.empty()) {
    GTEST_SKIP() << "shared/models/kv_geometry.csv not found under " << testing::SharedDir()
                 << " (set KVTIER_SHARED_DIR)";
  }
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const std::vector<std::string> header = SplitCsvLine(line);
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < header.size(); ++i) col[header[i]] = i;
  for (const char* name :
       {"model", "attention", "num_key_value_heads", "head_dim", "kv_lora_rank",
        "qk_rope_head_dim", "layers_growing_with_context", "kv_bytes_per_token_bf16",
        "kv_bytes_per_16tok_block_bf16", "kv_bytes_per_64tok_block_bf16",
        "kv_bytes_per_512tok_block_bf16"}) {
    ASSERT_TRUE(col.count(name)) << "column " << name << " missing from " << path;
  }

  int rows = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> f = SplitCsvLine(line);
    ASSERT_EQ(f.size(), header.size()) << line;
    const std::string& model = f[col["model"]];
    auto num = [&](const char* name) { return std::stoll(f[col[name]]); };
    for (int tokens_per_block : {16, 64, 512}) {
      KvGeometryOptions o;
      o.num_layers = static_cast<int>(num("layers_growing_with_context"));
      o.tokens_per_block = tokens_per_block;
      if (f[col["attention"]] == "MLA") {
        o.attention = AttentionKind::kMla;
        o.kv_lora_rank = static_cast<int>(num("kv_lora_rank"));
        o.qk_rope_head_dim = static_cast<int>(num("qk_rope_head_dim"));
      } else {
        o.num_kv_heads = static_cast<int>(num("num_key_value_heads"));
        o.head_dim = static_cast<int>(num("head_dim"));
      }
      auto g = KvGeometry::Create(o);
      ASSERT_TRUE(g.ok()) << model << ": " << g.status();
      EXPECT_EQ(g->bytes_per_token(), num("kv_bytes_per_token_bf16")) << model;
      const std::string block_col =
          "kv_bytes_per_" + std::to_string(tokens_per_block) + "tok_block_bf16";
      EXPECT_EQ(g->bytes_per_block(), num(block_col.c_str())) << model;
      o.dtype = KvDtype::kFp8E4m3;  // the models README: FP8 halves every byte column
      EXPECT_EQ(KvGeometry::Create(o)->bytes_per_token() * 2, num("kv_bytes_per_token_bf16"))
          << model;
    }
    ++rows;
  }
  EXPECT_EQ(rows, 16) << "rows in " << path;
}

}  // namespace
}  // namespace kvtier
