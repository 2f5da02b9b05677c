// Prints the namespace digest and the block keys of a fixed 64-token prompt, one hex value per
// line, for the namespace described by its arguments. Case ID-4 runs it as separate processes.
//
// Usage: kvtier_key_printer [dtype=bf16] [tp_rank=0] [tp_size=1] [weights=w1]
//                           [pp_rank=0] [pp_size=1] [first_layer=0] [algorithm=xxh3_128|sha256]
// Exit codes: 0 on success, 2 for a bad argument or a library error (message on stderr).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvtier/cache_namespace.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/prefix_hasher.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvtier_key_printer: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtype = "bf16", weights = "w1", algorithm = "xxh3_128";
  int tp_rank = 0, tp_size = 1, pp_rank = 0, pp_size = 1, first_layer = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) return Fail("expected key=value, got " + arg);
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "dtype") {
      dtype = value;
    } else if (key == "weights") {
      weights = value;
    } else if (key == "algorithm") {
      algorithm = value;
    } else if (key == "tp_rank") {
      tp_rank = std::atoi(value.c_str());
    } else if (key == "tp_size") {
      tp_size = std::atoi(value.c_str());
    } else if (key == "pp_rank") {
      pp_rank = std::atoi(value.c_str());
    } else if (key == "pp_size") {
      pp_size = std::atoi(value.c_str());
    } else if (key == "first_layer") {
      first_layer = std::atoi(value.c_str());
    } else {
      return Fail("unknown argument " + key);
    }
  }
  auto kv_dtype = kvtier::ParseKvDtype(dtype);
  if (!kv_dtype.ok()) return Fail(std::string(kv_dtype.status().message()));
  auto geometry = kvtier::KvGeometry::Create(
      {.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .dtype = *kv_dtype,
       .tokens_per_block = 16});
  if (!geometry.ok()) return Fail(std::string(geometry.status().message()));
  auto ns = kvtier::CacheNamespace::Create(*geometry, {.model_id = "meta-llama/Llama-3.1-8B",
                                                       .weights_fingerprint = weights,
                                                       .tp_rank = tp_rank,
                                                       .tp_size = tp_size,
                                                       .pp_rank = pp_rank,
                                                       .pp_size = pp_size,
                                                       .first_layer = first_layer});
  if (!ns.ok()) return Fail(std::string(ns.status().message()));
  auto hasher = kvtier::PrefixHasher::Create(
      *ns, algorithm == "sha256" ? kvtier::HashAlgorithm::kSha256
                                 : kvtier::HashAlgorithm::kXxh3_128);
  if (!hasher.ok()) return Fail(std::string(hasher.status().message()));
  std::vector<int32_t> tokens(64);
  for (int i = 0; i < 64; ++i) tokens[i] = 128000 + 7 * i;
  auto keys = hasher->BlockKeys(tokens);
  if (!keys.ok()) return Fail(std::string(keys.status().message()));
  std::printf("%s\n", ns->DigestHex().c_str());
  for (const kvtier::BlockKey& k : *keys) std::printf("%s\n", k.ToHex().c_str());
  return 0;
}
