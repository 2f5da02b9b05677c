// The measured loop shared by the tier benchmarks (CPU and GPU): fill `n` cached blocks in one
// tier, then per iteration copy all of them to another through the TransferEngine, wait for
// every completion, and evict the copies with the timer paused so the next iteration has room.
#ifndef KVTIER_BENCH_TIER_COPY_LOOP_H_
#define KVTIER_BENCH_TIER_COPY_LOOP_H_

#include <cstddef>
#include <vector>

#include "bench/bench_report.h"
#include "benchmark/benchmark.h"
#include "kvtier/tier_stack.h"
#include "kvtier/transfer_engine.h"

namespace kvtier::bench {

// Copies `n` blocks from `from` (whose backend is `source`) to `to` per iteration.
inline void RunTierCopies(benchmark::State& state, TransferEngine& engine, TierBackend& source,
                          Tier from, Tier to, uint32_t n) {
  const std::vector<std::byte> block(static_cast<size_t>(source.info().block_bytes),
                                     std::byte{7});
  std::vector<SlotId> slots;
  for (uint32_t i = 0; i < n; ++i) {
    absl::Status s = engine.WithAllocator(from, [&](BlockAllocator& a) -> absl::Status {
      auto slot = a.Allocate();
      if (!slot.ok()) return slot.status();
      slots.push_back(*slot);
      return absl::OkStatus();
    });
    if (s.ok()) s = source.WriteBlock(slots.back(), BlockKey{1, i}, block).Wait();
    if (s.ok()) {
      s = engine.WithAllocator(from, [&](BlockAllocator& a) {
        absl::Status sealed = a.Seal(slots.back());
        return sealed.ok() ? a.Release(slots.back()) : sealed;
      });
    }
    if (!s.ok()) return Skip(state, "filling the source tier", s);
  }
  std::vector<Completion> done;
  std::vector<SlotId> copies;
  for (auto _ : state) {
    done.clear();
    copies.clear();
    for (uint32_t i = 0; i < n; ++i) {
      absl::StatusOr<Transfer> t = engine.Copy(BlockKey{1, i}, from, slots[i], to);
      if (!t.ok()) return Skip(state, "Copy", t.status());
      done.push_back(t->completion);
      copies.push_back(t->destination);
    }
    if (absl::Status s = Completion::All(done).Wait(); !s.ok()) return Skip(state, "copy", s);
    state.PauseTiming();
    absl::Status s = engine.WithAllocator(to, [&](BlockAllocator& a) {
      for (SlotId c : copies) {
        if (absl::Status e = a.Evict(c); !e.ok()) return e;
      }
      return absl::OkStatus();
    });
    state.ResumeTiming();
    if (!s.ok()) return Skip(state, "evict", s);
  }
  state.SetBytesProcessed(state.iterations() * n * source.info().block_bytes);
}

// RunTierCopies between `hbm` and a DRAM tier of `n` blocks made here, through a new engine.
inline void RunHbmDramCopies(benchmark::State& state, const KvGeometry& g, TierBackend& hbm,
                             Tier from, Tier to, uint32_t n) {
  TierStackOptions stack;
  stack.tiers[TierIndex(Tier::kDram)].capacity_blocks = n;
  absl::StatusOr<TierBackends> tiers = BuildTierStack(g, stack);
  if (!tiers.ok()) return Skip(state, "DramTier::Create", tiers.status());
  TierBackend& dram = *(*tiers)[TierIndex(Tier::kDram)];
  TransferEngineOptions options;
  options.tiers[TierIndex(Tier::kHbm)] = &hbm;
  options.tiers[TierIndex(Tier::kDram)] = &dram;
  auto engine = TransferEngine::Create(options);
  if (!engine.ok()) return Skip(state, "TransferEngine::Create", engine.status());
  TierBackend& source = from == Tier::kHbm ? hbm : dram;
  RunTierCopies(state, **engine, source, from, to, n);
}

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_TIER_COPY_LOOP_H_
