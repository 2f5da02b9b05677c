// IO-2: a failed io_uring submit in the middle of a batch: every request of that batch completes
// with an error, the ring stays usable, and no buffer is reused while a request still
// references it.
#include <cerrno>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/random_bytes.h"
#include "kvtier/nvme_tier.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace kvtier {
namespace {

using ::kvtier::testing::RandomBytes;

KvGeometry Geometry() {
  return *KvGeometry::Create({.num_layers = 4, .num_kv_heads = 2, .head_dim = 64,
                              .tokens_per_block = 16});  // 32 KiB blocks
}

std::vector<std::byte> Block(uint32_t seed) {
  return RandomBytes(Geometry().bytes_per_block(), seed);
}

TEST(Regress_IO_2, FailedSubmitFailsWholeBatchAfterDrainingIt) {
  testing::TempDir dir;
  auto tier = NvmeTier::Create(Geometry(), {.path = dir.File("tier.bin"),
                                            .capacity_bytes = 16 * NvmeTier::SlotBytes(Geometry()),
                                            .queue_depth = 8,
                                            .engine = NvmeEngine::kIoUring});
  if (!tier.ok() && absl::IsUnavailable(tier.status())) {
    GTEST_SKIP() << "the io_uring NVMe tier cannot run here: " << tier.status().message();
  }
  ASSERT_TRUE(tier.ok()) << tier.status();
  NvmeTier& t = **tier;

  std::vector<std::vector<std::byte>> data;
  for (uint32_t i = 0; i < 6; ++i) data.push_back(Block(i));
  std::vector<BlockWrite> batch;
  for (uint32_t i = 0; i < 6; ++i) batch.push_back({SlotId(i), BlockKey{1, i}, data[i]});

  // Hold the kernel's answers: until they are processed, nothing of the failed batch may fire
  // and no staging buffer may come back, because the kernel may still be using them.
  t.HoldCompletionsForTest(true);
  t.InjectSubmitFailureForTest(EBUSY);
  std::vector<Completion> failed = t.WriteBlocks(batch);
  ASSERT_EQ(failed.size(), 6u);
  absl::SleepFor(absl::Milliseconds(100));
  for (uint32_t i = 0; i < 6; ++i) EXPECT_FALSE(failed[i].done()) << "block " << i;
  EXPECT_EQ(t.free_staging_buffers(), t.staging_buffers() - 6);
  t.HoldCompletionsForTest(false);
  for (uint32_t i = 0; i < 6; ++i) {
    const absl::Status s = failed[i].Wait();
    EXPECT_FALSE(s.ok()) << "block " << i << " of the failed batch";
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  }
  // Every staging buffer came back, and only after its request's completion arrived (each
  // Completion fires after the buffer is released, which happens on the CQE).
  EXPECT_EQ(t.free_staging_buffers(), t.staging_buffers());
  // Not counted as stored: every block of the failed batch is a miss.
  for (uint32_t i = 0; i < 6; ++i) {
    std::vector<std::byte> back(data[i].size());
    EXPECT_TRUE(absl::IsNotFound(t.ReadBlock(SlotId(i), BlockKey{1, i}, absl::MakeSpan(back)).Wait()));
  }

  // The ring is still usable: the same batch (and one larger than the pool) goes through, and
  // the bytes read back are the ones written (no buffer was reused under a live request).
  for (uint32_t i = 6; i < 12; ++i) data.push_back(Block(i));
  batch.clear();
  for (uint32_t i = 0; i < 12; ++i) batch.push_back({SlotId(i), BlockKey{2, i}, data[i]});
  KVTIER_ASSERT_OK(Completion::All(t.WriteBlocks(batch)).Wait());
  std::vector<std::vector<std::byte>> back(12, std::vector<std::byte>(data[0].size()));
  std::vector<BlockRead> reads;
  for (uint32_t i = 0; i < 12; ++i) reads.push_back({SlotId(i), BlockKey{2, i}, absl::MakeSpan(back[i])});
  KVTIER_ASSERT_OK(Completion::All(t.ReadBlocks(reads)).Wait());
  for (uint32_t i = 0; i < 12; ++i) EXPECT_TRUE(back[i] == data[i]) << "block " << i;
  EXPECT_EQ(t.free_staging_buffers(), t.staging_buffers());
}

}  // namespace
}  // namespace kvtier
