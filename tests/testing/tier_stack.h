// Emulated HBM, DRAM and an NVMe file (built by the tier stack builder), each behind a
// FaultInjectingTier, and a TransferEngine over them: the fixture for transfer and lifetime tests.
#ifndef KVTIER_TESTS_TESTING_TIER_STACK_H_
#define KVTIER_TESTS_TESTING_TIER_STACK_H_

#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kvtier/tier_stack.h"
#include "kvtier/transfer_engine.h"
#include "tests/testing/fault_injecting_tier.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/temp_dir.h"

namespace kvtier::testing {

class TierStack {
 public:
  // 3 layers x 2 heads x 32 x 8 tokens, bf16: 6144-byte blocks.
  static KvGeometry Geometry() {
    return *KvGeometry::Create({.num_layers = 3, .num_kv_heads = 2, .head_dim = 32,
                                .tokens_per_block = 8});
  }
  static std::vector<std::byte> Block(uint32_t seed) {
    return RandomBytes(Geometry().bytes_per_block(), seed);
  }
  static BlockKey Key(uint64_t i) { return BlockKey{0x7472616e, i}; }

  explicit TierStack(int64_t slots_per_tier = 4) {
    TierStackOptions stack;
    for (Tier t : {Tier::kHbm, Tier::kDram, Tier::kNvme}) {
      stack.tiers[TierIndex(t)].capacity_blocks = slots_per_tier;
    }
    stack.nvme.path = dir.File("nvme.bin");
    stack.nvme.queue_depth = 4;
    stack.wrap = [this](Tier t, std::unique_ptr<TierBackend> backend) {
      auto wrapped = std::make_unique<FaultInjectingTier>(std::move(backend));
      (t == Tier::kHbm ? hbm : t == Tier::kDram ? dram : nvme) = wrapped.get();
      return std::unique_ptr<TierBackend>(std::move(wrapped));
    };
    absl::StatusOr<TierBackends> tiers = BuildTierStack(Geometry(), stack);
    EXPECT_TRUE(tiers.ok()) << tiers.status();
    if (tiers.ok()) owned_ = *std::move(tiers);
    TransferEngineOptions options;
    options.tiers[TierIndex(Tier::kHbm)] = hbm;
    options.tiers[TierIndex(Tier::kDram)] = dram;
    options.tiers[TierIndex(Tier::kNvme)] = nvme;
    auto e = TransferEngine::Create(options);
    EXPECT_TRUE(e.ok()) << e.status();
    if (e.ok()) engine = std::move(*e);
  }
  ~TierStack() { engine.reset(); }  // drain before the tiers go

  FaultInjectingTier* tier(Tier t) {
    return t == Tier::kHbm ? hbm : t == Tier::kDram ? dram : nvme;
  }

  // Stores `data` as block `key` in a fresh slot of `t`, left kCached, as a finished sequence
  // leaves it. Returns the slot.
  SlotId Put(Tier t, const BlockKey& key, const std::vector<std::byte>& data) {
    SlotId slot;
    EXPECT_TRUE(engine->WithAllocator(t, [&](BlockAllocator& a) -> absl::Status {
      auto s = a.Allocate();
      if (!s.ok()) return s.status();
      slot = *s;
      return absl::OkStatus();
    }).ok());
    EXPECT_TRUE(tier(t)->WriteBlock(slot, key, data).Wait().ok());
    EXPECT_TRUE(engine->WithAllocator(t, [&](BlockAllocator& a) {
      absl::Status s = a.Seal(slot);
      return s.ok() ? a.Release(slot) : s;
    }).ok());
    return slot;
  }

  absl::StatusOr<std::vector<std::byte>> Get(Tier t, SlotId slot, const BlockKey& key) {
    std::vector<std::byte> out(static_cast<size_t>(Geometry().bytes_per_block()));
    absl::Status s = tier(t)->ReadBlock(slot, key, absl::MakeSpan(out)).Wait();
    if (!s.ok()) return s;
    return out;
  }

  SlotState StateOf(Tier t, SlotId slot) {
    SlotState state = SlotState::kFree;
    EXPECT_TRUE(engine
                    ->WithAllocator(t,
                                    [&](BlockAllocator& a) -> absl::Status {
                                      auto s = a.state(slot);
                                      if (s.ok()) state = *s;
                                      return s.status();
                                    })
                    .ok());
    return state;
  }

  TempDir dir;
  FaultInjectingTier* hbm = nullptr;  // owned by owned_
  FaultInjectingTier* dram = nullptr;
  FaultInjectingTier* nvme = nullptr;
  std::unique_ptr<TransferEngine> engine;

 private:
  TierBackends owned_;  // the FaultInjectingTiers, index TierIndex
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_TIER_STACK_H_
