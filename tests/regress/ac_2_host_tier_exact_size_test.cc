// AC-2: a host tier configured for N bytes uses N bytes plus metadata, not a power-of-two
// rounding of N.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/dram_tier.h"
#include "kvtier/emulated_hbm.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

// Sanitizers map shadow memory for the bytes a program touches (ThreadSanitizer several times
// them, AddressSanitizer an eighth), so resident memory says nothing exact about the tier there.
constexpr bool kResidentMemoryIsMeaningful = !testing::kUnderSanitizer;

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return resident_pages * sysconf(_SC_PAGESIZE);
}

TEST(Regress_AC_2, DramTierUsesTheBudgetNotAPowerOfTwo) {
  const KvGeometry g = testing::Llama8B(16);  // 2 MiB blocks
  const int64_t block = g.bytes_per_block();
  const int64_t budget = 21 * block / 2;  // 10.5 blocks = 21 MiB; next power of two is 32 MiB
  const std::vector<std::byte> data(static_cast<size_t>(block), std::byte{0x5a});  // resident now
  const int64_t before = ResidentBytes();
  KVTIER_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<DramTier> dram,
      DramTier::Create(g, {.capacity_bytes = budget, .try_huge_pages = false}));
  EXPECT_EQ(dram->info().capacity_blocks, 10);
  EXPECT_EQ(dram->info().capacity_bytes, 10 * block);
  EXPECT_EQ(dram->mapped_bytes(), 10 * block);  // block bytes are page multiples here: exact
  EXPECT_LE(dram->info().capacity_bytes + dram->info().metadata_bytes, budget);
  EXPECT_LE(dram->info().metadata_bytes, 10 * 64);

  // Touch every block: resident memory grows by the blocks, not by a rounded-up region.
  for (uint32_t i = 0; i < 10; ++i) {
    KVTIER_ASSERT_OK(dram->WriteBlock(SlotId(i), BlockKey{1, i}, data).Wait());
  }
  if (!kResidentMemoryIsMeaningful) return;
  const int64_t grown = ResidentBytes() - before;
  EXPECT_GE(grown, 10 * block - (1 << 20));
  EXPECT_LE(grown, 10 * block + (2 << 20)) << "resident memory grew past the budget";
}

TEST(Regress_AC_2, OddBlockSizesRoundToOnePageAtMost) {
  // 6144-byte blocks: the mapping rounds the 13 blocks up to a page, never further.
  const KvGeometry g = *KvGeometry::Create(
      {.num_layers = 3, .num_kv_heads = 2, .head_dim = 32, .tokens_per_block = 8});
  KVTIER_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<DramTier> dram,
      DramTier::Create(g, {.capacity_bytes = 13 * 6144 + 100, .try_huge_pages = false}));
  EXPECT_EQ(dram->info().capacity_blocks, 13);
  const int64_t page = sysconf(_SC_PAGESIZE);
  EXPECT_EQ(dram->mapped_bytes(), (13 * 6144 + page - 1) / page * page);
}

TEST(Regress_AC_2, EmulatedHbmPoolIsExactlyItsBlocks) {
  const KvGeometry g = testing::Llama8B(16);
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<EmulatedHbm> hbm,
                              EmulatedHbm::Create(g, {.capacity_blocks = 5}));
  EXPECT_EQ(hbm->info().capacity_bytes, 5 * g.bytes_per_block());
  // Layer-first: layer l's pool starts l * 5 blocks' worth of one layer after layer 0.
  EXPECT_EQ(hbm->LayerBase(1) - hbm->LayerBase(0), 5 * g.bytes_per_block_per_layer());
  EXPECT_EQ(hbm->LayerBase(31) - hbm->LayerBase(0), 31 * 5 * g.bytes_per_block_per_layer());
  EXPECT_EQ(hbm->LayerBase(32), nullptr);
}

TEST(Regress_AC_2, BudgetBeyondAvailableMemoryIsAClearError) {
  const KvGeometry g = testing::Llama8B(16);
  // 1 PiB: refused at once, before any per-slot bookkeeping is allocated for it.
  auto huge = DramTier::Create(g, {.capacity_bytes = int64_t{1} << 50});
  EXPECT_THAT(huge, testing::IsError(absl::StatusCode::kResourceExhausted, "MemAvailable"));
  EXPECT_THAT(EmulatedHbm::Create(g, {.capacity_blocks = int64_t{1} << 29}),
              testing::IsError(absl::StatusCode::kResourceExhausted, "MemAvailable"));
  EXPECT_THAT(DramTier::Create(g, {.capacity_bytes = g.bytes_per_block() - 1}),
              testing::IsError(absl::StatusCode::kInvalidArgument, "holds no whole block"));
}

}  // namespace
}  // namespace kvtier
