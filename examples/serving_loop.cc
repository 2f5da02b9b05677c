// kvtier serving loop: one request's life on KvCache over HBM, DRAM and NVMe (built by
// BuildTierStack, kvtier/tier_stack.h), with a toy model whose KV bytes are checked end to end,
// using only the public API.
//
// A CPU "kernel" writes each token's K and V (deterministic bf16 values) into the emulated HBM
// pool through the ticket's device block table, and a CPU paged attention reads them back the
// same way. The request prefills a prompt and decodes a few tokens, then pauses (an agent waiting
// on a tool) while other requests fill HBM, so its blocks are evicted and demoted to DRAM and on
// to NVMe. On resume the blocks are onboarded again and attention over the new block table must
// give bit-identical outputs. A second turn then finds the conversation's prefix in the cache.
//
// Exit code 0 when every check passes, 1 otherwise.
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvtier/cache_namespace.h"
#include "kvtier/device_block_table.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_stack.h"

namespace {

using namespace kvtier;

std::string g_temp_dir;  // removed at exit, also when OrDie gives up
void RemoveTempDir() {
  if (g_temp_dir.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(g_temp_dir, ignored);
  g_temp_dir.clear();
}

template <typename T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "error: %s\nserving_loop: FAILED\n", v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

void OrDie(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\nserving_loop: FAILED\n", s.ToString().c_str());
    std::exit(1);
  }
}

bool g_ok = true;
void Check(bool cond, const char* what) {
  if (!cond) {
    std::printf("  CHECK FAILED: %s\n", what);
    g_ok = false;
  }
}

// bf16 is the top half of a float32; rounding to nearest even keeps the reference exact.
uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// A value in [-1, 1) that depends on every argument (splitmix64 finalizer).
float Hash(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^ c;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

// The toy model: K (plane 0) and V (plane 1) of `token` at absolute position `pos`.
uint16_t ModelKv(int32_t token, int64_t pos, int layer, int plane, int head, int dim) {
  const uint64_t where =
      (uint64_t(layer) << 48) | (uint64_t(plane) << 40) | (uint64_t(head) << 20) | uint64_t(dim);
  return FloatToBf16(Hash(uint64_t(uint32_t(token)), uint64_t(pos), where));
}

// Reads head_dim bf16 values of (layer, plane, head, token) into `out`.
using KvReader = std::function<void(int layer, int plane, int head, int64_t token, uint16_t* out)>;

constexpr int kNumQueries = 4;

// Paged attention over tokens [0, num_tokens) for kNumQueries fixed query vectors per layer and
// head: softmax(q.K / sqrt(d)) . V, in float, in one fixed order (so results are reproducible
// bit for bit). Output shape [query][layer][head][head_dim].
std::vector<float> Attend(const KvGeometry& g, int64_t num_tokens, const KvReader& read) {
  const int dim = g.head_dim();
  std::vector<float> out;
  std::vector<uint16_t> row(static_cast<size_t>(dim));
  std::vector<float> scores(static_cast<size_t>(num_tokens));
  for (int q = 0; q < kNumQueries; ++q) {
    for (int l = 0; l < g.num_layers(); ++l) {
      for (int h = 0; h < g.num_kv_heads(); ++h) {
        float max_score = -INFINITY;
        for (int64_t t = 0; t < num_tokens; ++t) {
          read(l, 0, h, t, row.data());
          float s = 0;
          for (int d = 0; d < dim; ++d) s += Hash(q, (l << 8) | h, d) * Bf16ToFloat(row[d]);
          scores[t] = s / std::sqrt(static_cast<float>(dim));
          max_score = std::max(max_score, scores[t]);
        }
        std::vector<float> acc(static_cast<size_t>(dim), 0.0f);
        float sum = 0;
        for (int64_t t = 0; t < num_tokens; ++t) {
          const float w = std::exp(scores[t] - max_score);
          sum += w;
          read(l, 1, h, t, row.data());
          for (int d = 0; d < dim; ++d) acc[d] += w * Bf16ToFloat(row[d]);
        }
        for (float a : acc) out.push_back(a / sum);
      }
    }
  }
  return out;
}

// One forward step of a sequence holding `tokens`: make the whole context resident (kWait), let
// the "kernel" write the KV of tokens [first_new, end) into HBM through the block table, run
// attention through the same table if `attend`, report the new tokens written, release the
// ticket. Returns the attention outputs.
std::vector<float> Forward(KvCache& cache, SequenceId id, const KvGeometry& g,
                           const std::vector<int32_t>& tokens, int64_t first_new, bool attend) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const ResidencyTicket ticket =
      OrDie(cache.EnsureResident(id, 0, n, {.mode = ResidencyMode::kWait}));
  const DeviceBlockTable& table = ticket.block_table();
  bool resident = ticket.resident_tokens() == n && table.pool.host_accessible &&
                  static_cast<int64_t>(table.slots.size()) == g.BlocksForTokens(n) &&
                  static_cast<int64_t>(table.pool.v_base.size()) == g.num_layers();
  for (BlockResidency r : ticket.block_status())
    resident = resident && r == BlockResidency::kResident;
  Check(resident, "every block of the context is resident and host-accessible");
  if (!resident) {
    OrDie(cache.ReleaseTicket(ticket));
    return {};
  }
  const size_t row_bytes = static_cast<size_t>(g.head_dim()) * sizeof(uint16_t);
  std::vector<uint16_t> row(static_cast<size_t>(g.head_dim()));
  for (int64_t t = first_new; t < n; ++t) {
    for (int l = 0; l < g.num_layers(); ++l) {
      for (int p = 0; p < 2; ++p) {
        for (int h = 0; h < g.num_kv_heads(); ++h) {
          for (int d = 0; d < g.head_dim(); ++d) row[d] = ModelKv(tokens[t], t, l, p, h, d);
          std::memcpy(CheckedKvAddress(table, t, l, static_cast<KvPlane>(p), h), row.data(),
                      row_bytes);
        }
      }
    }
  }
  std::vector<float> out;
  if (attend) {
    out = Attend(g, n, [&](int l, int p, int h, int64_t t, uint16_t* dst) {
      // The address of (layer, plane, head, token)'s head_dim elements through the table, as
      // device_block_table.h computes it (nullptr for a block outside it or not resident).
      std::memcpy(dst, CheckedKvAddress(table, t, l, static_cast<KvPlane>(p), h), row_bytes);
    });
  }
  if (first_new < n) OrDie(cache.ReportWritten(id, n));  // the "kernel" is done: ready at once
  OrDie(cache.ReleaseTicket(ticket));
  return out;
}

// The same attention computed straight from the model, with no cache at all.
std::vector<float> DenseReference(const KvGeometry& g, const std::vector<int32_t>& tokens) {
  return Attend(g, static_cast<int64_t>(tokens.size()),
                [&](int l, int p, int h, int64_t t, uint16_t* dst) {
                  for (int d = 0; d < g.head_dim(); ++d) dst[d] = ModelKv(tokens[t], t, l, p, h, d);
                });
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 32000);
  return t;
}

std::string PerTier(const std::array<int64_t, kNumTiers>& blocks) {
  std::string s;
  for (int i = 0; i < kNumTiers - 1; ++i) {  // no remote tier here
    s += std::string(TierName(static_cast<Tier>(i))) + " " + std::to_string(blocks[i]) + "  ";
  }
  return s;
}

void PrintStats(const char* when, const KvCacheStats& s) {
  std::printf("  stats %s:\n", when);
  for (int i = 0; i < kNumTiers; ++i) {
    const KvTierStats& t = s.tiers[i];
    if (!t.present) continue;
    std::printf(
        "    %-5s cap %3lld free %3lld held %3lld droppable %3lld | hits %3lld stored %3lld "
        "evicted %3lld demoted %3lld | in %6lld KiB out %6lld KiB\n",
        std::string(TierName(static_cast<Tier>(i))).c_str(),
        static_cast<long long>(t.capacity_blocks), static_cast<long long>(t.free_blocks),
        static_cast<long long>(t.held_blocks), static_cast<long long>(t.droppable_blocks),
        static_cast<long long>(t.hits), static_cast<long long>(t.stored),
        static_cast<long long>(t.evictions), static_cast<long long>(t.demotions),
        static_cast<long long>(t.bytes_in >> 10), static_cast<long long>(t.bytes_out >> 10));
  }
}

}  // namespace

int main() {
  // A small model: 4 layers, 2 KV heads of 16 bf16 elements, 16-token blocks (8 KiB a block).
  const KvGeometry g = OrDie(KvGeometry::Create(
      {.num_layers = 4, .num_kv_heads = 2, .head_dim = 16, .tokens_per_block = 16}));
  // An unknown model id: no cost model, so AttachPrefix restores every matched block.
  const CacheNamespace ns = OrDie(CacheNamespace::Create(
      g, {.model_id = "example/serving-loop-toy", .weights_fingerprint = "demo"}));

  char dir[] = "/tmp/kvtier_serving_loop.XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  g_temp_dir = dir;
  std::atexit(RemoveTempDir);

  // HBM 64 blocks (emulated in host memory, layer-first as a paged-attention kernel reads it),
  // DRAM 16 (small, so demoted blocks go on to NVMe), NVMe 256 slots in a file. No remote tier.
  TierStackOptions stack;
  stack.tiers[TierIndex(Tier::kHbm)].capacity_blocks = 64;
  stack.hbm.layout = HbmLayout::kLayerFirst;
  stack.tiers[TierIndex(Tier::kDram)].capacity_blocks = 16;
  stack.tiers[TierIndex(Tier::kNvme)].capacity_blocks = 256;
  stack.nvme.path = g_temp_dir + "/kv.nvme";
  KvCacheOptions options;
  options.tiers = OrDie(BuildTierStack(ns, stack));
  std::printf("model: %s, %lld bytes per block\n  NVMe tier in %s (%s)\n", g.ToString().c_str(),
              static_cast<long long>(g.bytes_per_block()), dir,
              options.tiers[TierIndex(Tier::kNvme)]->info().name.c_str());
  std::unique_ptr<KvCache> cache = OrDie(KvCache::Create(ns, std::move(options)));

  // Turn 1: prefill a 100-token prompt (nothing cached yet), then decode 20 tokens greedily.
  std::mt19937 rng(11);
  const SequenceId seq(1);
  std::vector<int32_t> tokens = RandomTokens(rng, 100);
  OrDie(cache->CreateSequence(seq));
  const AttachResult first = OrDie(cache->AttachPrefix(seq, tokens));
  Check(first.attached_tokens == 0, "nothing is cached for the first prompt");
  OrDie(cache->Append(seq, absl::MakeConstSpan(tokens).subspan(first.attached_tokens)).status());
  std::vector<float> out = Forward(*cache, seq, g, tokens, first.attached_tokens, true);
  for (int step = 0; step < 20 && !out.empty(); ++step) {
    uint32_t next = 2166136261u;  // FNV-1a of the outputs picks the next token
    for (float f : out) next = (next ^ static_cast<uint32_t>(std::lround(f * 1e4f))) * 16777619u;
    tokens.push_back(static_cast<int32_t>(next % 32000));
    OrDie(cache->Append(seq, {tokens.back()}).status());
    out = Forward(*cache, seq, g, tokens, static_cast<int64_t>(tokens.size()) - 1, true);
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t full_blocks = n / g.tokens_per_block();
  const std::vector<float> before = Forward(*cache, seq, g, tokens, n, true);
  Check(SameBits(before, DenseReference(g, tokens)), "paged attention == dense reference");
  const SequenceInfo info0 = OrDie(cache->GetSequence(seq));
  std::printf("turn 1: %lld tokens (100 prompt + 20 decoded), %lld blocks; by tier: %s\n",
              static_cast<long long>(n), static_cast<long long>(info0.num_blocks),
              PerTier(info0.blocks_by_tier).c_str());

  // The agent calls a tool: pause, while three other requests fill HBM (56 blocks each) and
  // release. Their blocks and the paused sequence's HBM copies are evicted and demoted.
  OrDie(cache->Pause(seq, absl::Seconds(30)));
  for (uint64_t r = 0; r < 3; ++r) {
    const SequenceId other(100 + r);
    const std::vector<int32_t> filler = RandomTokens(rng, 56 * g.tokens_per_block());
    OrDie(cache->CreateSequence(other));
    OrDie(cache->Append(other, filler).status());
    Forward(*cache, other, g, filler, 0, false);
    OrDie(cache->Release(other));
  }
  OrDie(cache->WaitIdle());
  const KvCacheStats paused_stats = cache->stats();
  const SequenceInfo info1 = OrDie(cache->GetSequence(seq));
  const PrefixLookup where = OrDie(cache->Lookup(tokens));
  std::printf("paused: sequence's blocks by tier: %s\n        its full blocks' fastest copy: %s\n",
              PerTier(info1.blocks_by_tier).c_str(), PerTier(where.blocks_by_tier).c_str());
  PrintStats("while paused", paused_stats);
  Check(info1.paused, "the sequence reports paused");
  Check(info1.blocks_by_tier[TierIndex(Tier::kHbm)] < info1.num_blocks,
        "some of the paused sequence's blocks are no longer referenced in HBM");
  Check(where.matched_tokens == full_blocks * g.tokens_per_block(),
        "every full block of the paused sequence is still cached somewhere");
  Check(where.blocks_by_tier[TierIndex(Tier::kHbm)] < full_blocks,
        "some of the paused sequence's blocks were evicted from HBM");
  Check(paused_stats.tiers[TierIndex(Tier::kHbm)].evictions > 0, "HBM evicted blocks");
  Check(paused_stats.tiers[TierIndex(Tier::kDram)].stored > 0, "blocks were stored in DRAM");
  Check(paused_stats.tiers[TierIndex(Tier::kNvme)].stored > 0, "blocks went on to NVMe");

  // The tool answered: resume, onboard, and attend over the new block table.
  OrDie(OrDie(cache->Resume(seq)).Wait());
  const std::vector<float> after = Forward(*cache, seq, g, tokens, n, true);
  const KvCacheStats resumed_stats = cache->stats();
  const SequenceInfo info2 = OrDie(cache->GetSequence(seq));
  const int64_t onboarded = resumed_stats.tiers[TierIndex(Tier::kHbm)].bytes_in -
                            paused_stats.tiers[TierIndex(Tier::kHbm)].bytes_in;
  std::printf("resume: %lld KiB onboarded into HBM; sequence's blocks by tier: %s\n",
              static_cast<long long>(onboarded >> 10), PerTier(info2.blocks_by_tier).c_str());
  Check(!info2.paused, "the sequence is no longer paused");
  Check(onboarded > 0, "resume copied blocks back into HBM");
  Check(SameBits(after, before), "attention after resume is bit-identical to before the pause");

  // Turn 2: the conversation so far plus a new user message, as a new sequence.
  OrDie(cache->Release(seq));
  const SequenceId seq2(2);
  std::vector<int32_t> turn2 = tokens;
  for (int32_t t : RandomTokens(rng, 30)) turn2.push_back(t);
  OrDie(cache->CreateSequence(seq2));
  const AttachResult attach = OrDie(cache->AttachPrefix(seq2, turn2));
  OrDie(cache->Append(seq2, absl::MakeConstSpan(turn2).subspan(attach.attached_tokens)).status());
  const std::vector<float> out2 = Forward(*cache, seq2, g, turn2, attach.attached_tokens, true);
  std::printf("turn 2: %zu prompt tokens, %lld matched, %lld attached (blocks from %s)\n",
              turn2.size(), static_cast<long long>(attach.matched_tokens),
              static_cast<long long>(attach.attached_tokens),
              PerTier(attach.attached_blocks_by_tier).c_str());
  Check(attach.attached_tokens > 0, "turn 2 reuses the cached conversation");
  Check(attach.matched_tokens == full_blocks * g.tokens_per_block(),
        "turn 2 matches every full block of turn 1");
  Check(SameBits(out2, DenseReference(g, turn2)), "turn 2 attention == dense reference");
  OrDie(cache->Release(seq2));

  OrDie(cache->WaitIdle());
  const KvCacheStats end = cache->stats();
  PrintStats("at the end", end);
  std::printf("  attach queries %lld, query tokens %lld, matched %lld, attached %lld\n",
              static_cast<long long>(end.attach_queries), static_cast<long long>(end.query_tokens),
              static_cast<long long>(end.matched_tokens),
              static_cast<long long>(end.attached_tokens));
  Check(end.live_sequences == 0 && end.open_tickets == 0, "no sequence or ticket is left");
  const absl::Status invariants = cache->CheckInvariants();
  if (!invariants.ok()) std::printf("  invariants: %s\n", invariants.ToString().c_str());
  Check(invariants.ok(), "CheckInvariants");

  cache.reset();  // waits for transfers and closes the NVMe file before the directory goes
  RemoveTempDir();
  std::printf("%s\n", g_ok ? "serving_loop: OK" : "serving_loop: FAILED");
  return g_ok ? 0 : 1;
}
