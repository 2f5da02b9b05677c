// CudaHbm on a real GPU: blocks through pinned DRAM and the transfer engine, both layouts, and
// the device pointers a kernel would be handed. Skips with the CUDA error text without a GPU.
#include "kvtier/cuda_hbm.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/random_bytes.h"
#include "kvtier/cuda_device.h"
#include "kvtier/dram_tier.h"
#include "kvtier/transfer_engine.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::kvtier::testing::RandomBytes;

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

KvGeometry Llama8B() {
  return *KvGeometry::Create({.num_layers = 32, .num_kv_heads = 8, .head_dim = 128,
                              .tokens_per_block = 16});
}

std::vector<std::byte> Block(uint32_t seed) {
  return RandomBytes(Llama8B().bytes_per_block(), seed);
}

class CudaHbmTest : public ::testing::TestWithParam<HbmLayout> {
 protected:
  void SetUp() override {
    absl::StatusOr<CudaDeviceInfo> probe = ProbeCudaDevices();
    if (!probe.ok()) GTEST_SKIP() << probe.status().message();
  }
};

TEST_P(CudaHbmTest, BlocksRoundTripThroughPinnedDramAndTheEngine) {
  KVTIER_ASSERT_OK_AND_ASSIGN(auto hbm, CudaHbm::Create(Llama8B(), {.layout = GetParam(),
                                                                    .capacity_blocks = 8}));
  KVTIER_ASSERT_OK_AND_ASSIGN(auto dram,
                              DramTier::Create(Llama8B(), {.capacity_bytes = 8 * (2 << 20)}));
  EXPECT_NE(dram->info().capabilities & kCapPinnedHost, 0u) << "a device answers: DRAM is pinned";
  EXPECT_NE(hbm->LayerBase(0), nullptr);
  EXPECT_EQ(hbm->LayerBase(32), nullptr);
  TransferEngineOptions options;
  options.tiers[TierIndex(Tier::kHbm)] = hbm.get();
  options.tiers[TierIndex(Tier::kDram)] = dram.get();
  KVTIER_ASSERT_OK_AND_ASSIGN(auto engine, TransferEngine::Create(options));

  for (uint32_t i = 0; i < 8; ++i) {
    SlotId d;
    KVTIER_ASSERT_OK(engine->WithAllocator(Tier::kDram, [&](BlockAllocator& a) -> absl::Status {
      auto s = a.Allocate();
      if (!s.ok()) return s.status();
      d = *s;
      return absl::OkStatus();
    }));
    KVTIER_ASSERT_OK(dram->WriteBlock(d, BlockKey{3, i}, Block(i)).Wait());
    KVTIER_ASSERT_OK(engine->WithAllocator(Tier::kDram, [&](BlockAllocator& a) {
      absl::Status s = a.Seal(d);
      return s.ok() ? a.Release(d) : s;
    }));
    KVTIER_ASSERT_OK_AND_ASSIGN(Transfer up, engine->Copy(BlockKey{3, i}, Tier::kDram, d, Tier::kHbm));
    KVTIER_ASSERT_OK(up.completion.Wait());
    std::vector<std::byte> back(Block(i).size());
    KVTIER_ASSERT_OK(hbm->ReadBlock(up.destination, BlockKey{3, i}, absl::MakeSpan(back)).Wait());
    EXPECT_TRUE(back == Block(i)) << "block " << i;
  }
  EXPECT_GT(engine->stats(Tier::kDram, Tier::kHbm).bandwidth_bytes_per_second, 0);
}

TEST_P(CudaHbmTest, BadOptionsAreRejected) {
  EXPECT_THAT(CudaHbm::Create(Llama8B(), {.layout = GetParam(), .capacity_blocks = 0}),
              IsError(StatusCode::kInvalidArgument, "capacity_blocks = 0 is not usable"));
  EXPECT_THAT(CudaHbm::Create(Llama8B(), {.layout = GetParam(), .capacity_blocks = 1,
                                          .device = 4096}),
              IsError(StatusCode::kInvalidArgument, "device 4096"));
  EXPECT_THAT(CudaHbm::Create(Llama8B(), {.layout = GetParam(), .capacity_blocks = 1,
                                          .external_pool = {nullptr, nullptr}}),
              IsError(StatusCode::kInvalidArgument, "external_pool has 2 pointers"));
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaHbmTest,
                         ::testing::Values(HbmLayout::kLayerFirst, HbmLayout::kBlockFirst,
                                           HbmLayout::kLayerKvSplit),
                         [](const auto& p) {
                           return std::string(HbmLayoutName(p.param));
                         });

TEST(CudaHbmWithoutDevice, SaysWhy) {
  if (ProbeCudaDevices().ok()) GTEST_SKIP() << "a device answers: covered by CudaHbmTest";
  auto hbm = CudaHbm::Create(Llama8B(), {.capacity_blocks = 1});
  ASSERT_FALSE(hbm.ok());
  if (BuiltWithCuda()) {
    EXPECT_THAT(hbm, IsError(StatusCode::kUnavailable, "cudaError"));
  } else {
    EXPECT_THAT(hbm, IsError(StatusCode::kUnimplemented, "built without CUDA"));
  }
}

}  // namespace
}  // namespace kvtier
