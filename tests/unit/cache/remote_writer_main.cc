// A second process for remote discovery's cross-process test: builds a KvCache (16 HBM blocks, a
// remote tier of 32 over a shared directory or a Redis URL, written through) in the namespace the
// cache tests use (KvCacheEnv::Namespace(): tiny model, weights w0), computes a prompt of
// `tokens` tokens (100, 101, ...) writing block i's bytes from seed + i as a kernel would
// (kv_cache_fixture.h's pattern), waits until write-through has stored it, and exits.
//
// Usage: kvtier_remote_writer dir|url <directory or redis URL> <seed> <tokens>
// Exit codes: 0 once every full block is in the store; 2 for a bad argument or any error
// (message on stderr).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtier/kv_cache.h"
#include "kvtier/tier_stack.h"
#include "tests/testing/kv_cache_fixture.h"

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvtier_remote_writer: %s\n", message.c_str());
  return 2;
}

int Fail(const absl::Status& status) { return Fail(std::string(status.ToString())); }

}  // namespace

int main(int argc, char** argv) {
  using namespace kvtier;  // NOLINT: a small program
  namespace kt = kvtier::testing;
  if (argc != 5) return Fail("usage: kvtier_remote_writer dir|url <store> <seed> <tokens>");
  const std::string kind = argv[1];
  const std::string store = argv[2];
  const auto seed = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
  const int tokens = std::atoi(argv[4]);
  if ((kind != "dir" && kind != "url") || tokens < 1) return Fail("bad arguments");
  auto g = KvGeometry::Create({.num_layers = 2,
                               .num_kv_heads = 2,
                               .head_dim = 8,
                               .dtype = KvDtype::kBf16,
                               .tokens_per_block = kt::KvCacheEnv::kTokensPerBlock});
  if (!g.ok()) return Fail(g.status());
  auto ns = CacheNamespace::Create(*g, {.model_id = "kvtier-test/tiny-model",
                                        .weights_fingerprint = "w0",
                                        .hbm_layout = HbmLayout::kLayerFirst});
  if (!ns.ok()) return Fail(ns.status());
  TierStackOptions stack;
  stack.tiers[TierIndex(Tier::kHbm)].capacity_blocks = 16;
  stack.hbm.layout = HbmLayout::kLayerFirst;
  stack.tiers[TierIndex(Tier::kRemote)].capacity_blocks = 32;
  (kind == "dir" ? stack.remote_directory : stack.remote_url) = store;
  auto tiers = BuildTierStack(*ns, stack);
  if (!tiers.ok()) return Fail(tiers.status());
  KvCacheOptions options;
  options.tiers = *std::move(tiers);
  options.write_policy = WritePolicy::kWriteThrough;
  auto cache = KvCache::Create(*ns, std::move(options));
  if (!cache.ok()) return Fail(cache.status());
  KvCache& c = **cache;

  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (int i = 0; i < tokens; ++i) prompt[static_cast<size_t>(i)] = 100 + i;
  const SequenceId id(1);
  if (absl::Status s = c.CreateSequence(id); !s.ok()) return Fail(s);
  if (auto a = c.Append(id, prompt); !a.ok()) return Fail(a.status());
  auto t = c.EnsureResident(id, 0, tokens);
  if (!t.ok()) return Fail(t.status());
  const int64_t blocks = tokens / g->tokens_per_block();
  for (int64_t i = 0; i < blocks; ++i) {
    kt::ForEachBlockByte(*g, t->block_table(), static_cast<size_t>(i),
                         seed + static_cast<uint32_t>(i),
                         [](std::byte* p, std::byte want) { *p = want; });
  }
  if (absl::Status s = c.ReportWritten(id, tokens); !s.ok()) return Fail(s);
  if (absl::Status s = c.ReleaseTicket(*t); !s.ok()) return Fail(s);
  if (absl::Status s = c.WaitIdle(absl::Now() + absl::Seconds(30)); !s.ok()) return Fail(s);
  if (absl::Status s = c.Release(id); !s.ok()) return Fail(s);
  const int64_t stored = c.stats().tiers[TierIndex(Tier::kRemote)].stored;
  if (stored != blocks) {
    return Fail(absl::StrCat(stored, " of ", blocks, " blocks reached the store"));
  }
  return 0;
}
