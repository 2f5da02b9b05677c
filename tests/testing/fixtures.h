// Common objects for tests: a Llama-3.1-8B geometry, its namespace and hasher, and token ids.
#ifndef KVTIER_TESTS_TESTING_FIXTURES_H_
#define KVTIER_TESTS_TESTING_FIXTURES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/prefix_hasher.h"

namespace kvtier::testing {

// Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128), bf16, `tokens_per_block` tokens per block.
inline KvGeometry Llama8B(int tokens_per_block = 16, KvDtype dtype = KvDtype::kBf16) {
  auto g = KvGeometry::Create({.num_layers = 32,
                               .num_kv_heads = 8,
                               .head_dim = 128,
                               .dtype = dtype,
                               .tokens_per_block = tokens_per_block});
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

inline CacheNamespaceOptions LlamaNamespaceOptions() {
  return {.model_id = "meta-llama/Llama-3.1-8B-Instruct", .weights_fingerprint = "0e9e39f2"};
}

inline CacheNamespace MakeNamespace(const KvGeometry& geometry,
                                    const CacheNamespaceOptions& options) {
  auto ns = CacheNamespace::Create(geometry, options);
  EXPECT_TRUE(ns.ok()) << ns.status();
  return *ns;
}

inline PrefixHasher MakeHasher(int tokens_per_block = 16,
                               HashAlgorithm algorithm = HashAlgorithm::kXxh3_128) {
  auto h = PrefixHasher::Create(MakeNamespace(Llama8B(tokens_per_block), LlamaNamespaceOptions()),
                                algorithm);
  EXPECT_TRUE(h.ok()) << h.status();
  return *h;
}

// Tokens first, first+1, ... (n of them).
inline std::vector<int32_t> Iota(int n, int32_t first = 1000) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_FIXTURES_H_
