// Copy throughput of the tiers through the real path: TierBackend + TransferEngine, many blocks
// in flight per iteration, every completion waited. Beside them, plain memcpy of the same bytes
// (STYLE rule 10: the comparison runs side by side in one binary).
//
// Argument: bytes per block. Blocks are Llama-3.1-8B's layout (32 layers, 8 KV heads of 128,
// bf16), so a 2 MiB block is 16 tokens, and emulated HBM is layer-first: each copy scatters or
// gathers 32 pieces of 64 KiB, as the CUDA tier's batched copies do.
//
// Target (DESIGN section 9): DRAM <-> emulated HBM >= 0.8 x memcpy.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_report.h"
#include "bench/tier_copy_loop.h"
#include "benchmark/benchmark.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/tier_stack.h"
#include "kvtier/transfer_engine.h"

namespace kvtier {
namespace {

using bench::Skip;

constexpr int kBlocks = 64;  // per iteration: 128 MiB at 2 MiB blocks, far beyond the caches

absl::StatusOr<KvGeometry> LlamaGeometry(int64_t block_bytes) {
  constexpr int64_t kBytesPerToken = 131072;
  if (block_bytes % kBytesPerToken != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block bytes ", block_bytes, " is not a whole number of tokens"));
  }
  return KvGeometry::Create({.num_layers = 32,
                             .num_kv_heads = 8,
                             .head_dim = 128,
                             .tokens_per_block = static_cast<int>(block_bytes / kBytesPerToken)});
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<std::byte> src(bytes * kBlocks, std::byte{1}), dst(bytes * kBlocks, std::byte{2});
  for (auto _ : state) {
    for (int i = 0; i < kBlocks; ++i) std::memcpy(&dst[i * bytes], &src[i * bytes], bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBlocks * state.range(0));
}
BENCHMARK(BM_Memcpy)->Arg(2097152)->Unit(benchmark::kMillisecond)->UseRealTime();

// Fills kBlocks cached blocks in `from`, then per iteration copies all of them to `to` through
// the engine, waits, and evicts the copies (timer paused) so the next iteration has room.
void BM_TierCopy(benchmark::State& state, Tier from, Tier to) {
  absl::StatusOr<KvGeometry> g = LlamaGeometry(state.range(0));
  if (!g.ok()) return Skip(state, "geometry", g.status());
  TierStackOptions stack;
  stack.tiers[TierIndex(Tier::kHbm)].capacity_blocks = kBlocks;
  stack.hbm.layout = HbmLayout::kLayerFirst;
  absl::StatusOr<TierBackends> hbm = BuildTierStack(*g, stack);
  if (!hbm.ok()) return Skip(state, "EmulatedHbm::Create", hbm.status());
  bench::RunHbmDramCopies(state, *g, *(*hbm)[TierIndex(Tier::kHbm)], from, to, kBlocks);
}

void BM_DramToEmulatedHbm(benchmark::State& state) { BM_TierCopy(state, Tier::kDram, Tier::kHbm); }
void BM_EmulatedHbmToDram(benchmark::State& state) { BM_TierCopy(state, Tier::kHbm, Tier::kDram); }
BENCHMARK(BM_DramToEmulatedHbm)->Arg(2097152)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EmulatedHbmToDram)->Arg(2097152)->Unit(benchmark::kMillisecond)->UseRealTime();

void PrintRatios(std::FILE* out, const bench::Results& results) {
  const bench::Result* memcpy_run = bench::Find(results, "BM_Memcpy/2097152/real_time");
  std::string ratios, checks;
  for (const char* name :
       {"BM_DramToEmulatedHbm/2097152/real_time", "BM_EmulatedHbmToDram/2097152/real_time"}) {
    const bench::Result* r = bench::Find(results, name);
    if (r == nullptr || memcpy_run == nullptr || !r->bytes_per_second ||
        !memcpy_run->bytes_per_second) {
      continue;
    }
    const double ratio = *r->bytes_per_second / *memcpy_run->bytes_per_second;
    const std::string bare(name);
    const std::string label = absl::StrCat(bare.substr(3, bare.find('/') - 3), " / memcpy");
    ratios += bench::Ratio(label.c_str(), ratio);
    checks += bench::Check(label.c_str(), ratio, "x", 0.8, true);
  }
  bench::PrintSections(out, "throughput over throughput, 2 MiB blocks; 1 = memcpy", ratios, checks);
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  return kvtier::bench::RunAndReport(argc, argv, kvtier::PrintRatios);
}
