// Layer-wise onboarding and CUDA events on a real GPU (built only with the CUDA toolkit; skips
// with the CUDA error text where no device answers): CudaHbm's layer-major batch with a fence per
// layer that a stream waits on, a caller's event as a Completion, and a KvCache whose ticket a
// stream waits on, layer by layer, before it reads the onboarded KV back.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/cuda_device.h"
#include "kvtier/cuda_hbm.h"
#include "kvtier/dram_tier.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::kvtier::testing::RandomBytes;

// 4 layers x 8 KV heads x 128, bf16, 16 tokens: 64 KiB per layer, 256 KiB blocks.
KvGeometry Geometry() {
  return *KvGeometry::Create(
      {.num_layers = 4, .num_kv_heads = 8, .head_dim = 128, .tokens_per_block = 16});
}

class CudaLayerwiseTest : public ::testing::TestWithParam<HbmLayout> {
 protected:
  void SetUp() override {
    absl::StatusOr<CudaDeviceInfo> probe = ProbeCudaDevices();
    if (!probe.ok()) GTEST_SKIP() << probe.status().message();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_P(CudaLayerwiseTest, ABatchLandsLayerMajorWithAFencePerLayer) {
  const KvGeometry g = Geometry();
  KVTIER_ASSERT_OK_AND_ASSIGN(auto hbm,
                              CudaHbm::Create(g, {.layout = GetParam(), .capacity_blocks = 4}));
  ASSERT_NE(hbm->info().capabilities & kCapLayerwise, 0u);
  std::mutex mu;
  std::vector<std::pair<int, int>> landed;
  std::vector<std::vector<std::shared_ptr<const DeviceFence>>> fences(3);
  std::vector<std::vector<std::byte>> data;
  std::vector<BlockWrite> writes;
  for (uint32_t i = 0; i < 3; ++i) data.push_back(RandomBytes(g.bytes_per_block(), 40 + i));
  for (uint32_t i = 0; i < 3; ++i) {
    auto progress = std::make_shared<LayerProgress>();
    progress->landed = [&mu, &landed, i](int n) {
      std::lock_guard<std::mutex> lock(mu);
      landed.emplace_back(static_cast<int>(i), n);
    };
    progress->issued = [&mu, &fences, i](int layer, std::shared_ptr<const DeviceFence> f) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(layer, static_cast<int>(fences[i].size()));
      fences[i].push_back(std::move(f));
    };
    writes.push_back(BlockWrite{SlotId(i), BlockKey{9, i}, data[i], progress});
  }
  std::vector<Completion> done = hbm->WriteBlocks(writes);
  {
    // The fences exist once WriteBlocks returns: a stream can wait for the last layer at once.
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& f : fences) ASSERT_EQ(f.size(), static_cast<size_t>(g.num_layers()));
    KVTIER_ASSERT_OK(fences[2].back()->EnqueueWait(stream_));
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  KVTIER_ASSERT_OK(Completion::All(done).WaitFor(absl::Seconds(30)));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(landed.size(), static_cast<size_t>(3 * g.num_layers()));
  for (size_t k = 0; k < landed.size(); ++k) {
    EXPECT_EQ(landed[k], std::make_pair(static_cast<int>(k % 3), static_cast<int>(k / 3) + 1));
  }
  for (uint32_t i = 0; i < 3; ++i) {
    std::vector<std::byte> back(data[i].size());
    KVTIER_ASSERT_OK(hbm->ReadBlock(SlotId(i), BlockKey{9, i}, absl::MakeSpan(back)).Wait());
    EXPECT_TRUE(back == data[i]) << "block " << i;
  }
}

TEST_P(CudaLayerwiseTest, ACallersEventBecomesACompletion) {
  KVTIER_ASSERT_OK_AND_ASSIGN(auto hbm,
                              CudaHbm::Create(Geometry(), {.layout = GetParam(),
                                                           .capacity_blocks = 2}));
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, 64 << 20), cudaSuccess);
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(scratch, 1, 64 << 20, stream_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event, stream_), cudaSuccess);
  KVTIER_ASSERT_OK_AND_ASSIGN(Completion done, hbm->CompletionOfDeviceEvent(event));
  // The caller may reuse its event at once: ours still stands for the memset.
  ASSERT_EQ(cudaEventRecord(event, stream_), cudaSuccess);
  KVTIER_EXPECT_OK(done.WaitFor(absl::Seconds(30)));
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaEventDestroy(event);
  cudaFree(scratch);
}

// The serving loop on a GPU: a block written through the pool with its kernel's event as the
// ReportWritten completion, offloaded to pinned DRAM, dropped from HBM, onboarded again for
// another sequence; a stream waits on the ticket layer by layer and copies each layer back.
TEST_P(CudaLayerwiseTest, AStreamWaitsOnATicketLayerByLayer) {
  const KvGeometry g = Geometry();
  KVTIER_ASSERT_OK_AND_ASSIGN(
      CacheNamespace ns,
      CacheNamespace::Create(g, {.model_id = "kvtier-gpu-test", .weights_fingerprint = "w",
                                 .hbm_layout = GetParam()}));
  KvCacheOptions options;
  KVTIER_ASSERT_OK_AND_ASSIGN(options.tiers[TierIndex(Tier::kHbm)],
                              CudaHbm::Create(g, {.layout = GetParam(), .capacity_blocks = 8}));
  KVTIER_ASSERT_OK_AND_ASSIGN(
      options.tiers[TierIndex(Tier::kDram)],
      DramTier::Create(g, {.capacity_bytes = 16 * g.bytes_per_block()}));
  options.write_policy = WritePolicy::kWriteThrough;
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache, KvCache::Create(ns, std::move(options)));

  const int b = g.tokens_per_block();
  std::vector<int32_t> prompt(2 * b + 1);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i + 5);
  const std::vector<int32_t> first(prompt.begin(), prompt.begin() + 2 * b);
  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(1)));
  KVTIER_ASSERT_OK(cache->Append(SequenceId(1), first).status());
  KVTIER_ASSERT_OK_AND_ASSIGN(ResidencyTicket writer,
                              cache->EnsureResident(SequenceId(1), 0, 2 * b));
  // The "kernel": each layer's K and V of each block copied in from host bytes on our stream.
  const int64_t plane_bytes = g.bytes_per_block_per_layer() / 2;
  std::vector<std::vector<std::byte>> kv;  // [block * layers * 2 + layer * 2 + plane]
  for (size_t i = 0; i < 2; ++i) {
    for (int l = 0; l < g.num_layers(); ++l) {
      for (int p = 0; p < 2; ++p) {
        kv.push_back(RandomBytes(plane_bytes, static_cast<uint32_t>(100 + kv.size())));
        std::byte* dev = KvAddress(writer.block_table().pool, writer.block_table().slots[i], l,
                                   static_cast<KvPlane>(p));
        ASSERT_EQ(cudaMemcpyAsync(dev, kv.back().data(), plane_bytes, cudaMemcpyHostToDevice,
                                  stream_),
                  cudaSuccess);
      }
    }
  }
  cudaEvent_t kernel_done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&kernel_done, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(kernel_done, stream_), cudaSuccess);
  KVTIER_ASSERT_OK_AND_ASSIGN(Completion written, cache->CompletionOfCudaEvent(kernel_done));
  KVTIER_ASSERT_OK(cache->ReportWritten(SequenceId(1), 2 * b, written));
  KVTIER_ASSERT_OK(cache->ReleaseTicket(writer));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(1)));
  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(30)));
  ASSERT_EQ(cache->stats().tiers[TierIndex(Tier::kDram)].stored, 2);
  KVTIER_ASSERT_OK(cache->ResetPrefixCache(Tier::kHbm).status());

  KVTIER_ASSERT_OK(cache->CreateSequence(SequenceId(2)));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult hit, cache->AttachPrefix(SequenceId(2), prompt));
  ASSERT_EQ(hit.attached_tokens, 2 * b);
  KVTIER_ASSERT_OK_AND_ASSIGN(
      ResidencyTicket ticket,
      cache->EnsureResident(SequenceId(2), 0, 2 * b, {.mode = ResidencyMode::kAsync}));
  std::vector<std::byte> back(static_cast<size_t>(plane_bytes));
  for (int l = 0; l < g.num_layers(); ++l) {
    KVTIER_ASSERT_OK(ticket.EnqueueStreamWait(stream_, l, absl::Now() + absl::Seconds(30)));
    KVTIER_ASSERT_OK(ticket.layer_ready(l).WaitFor(absl::Seconds(30)));  // the table is final
    for (size_t i = 0; i < 2; ++i) {
      for (int p = 0; p < 2; ++p) {
        const std::byte* dev = KvAddress(ticket.block_table().pool, ticket.block_table().slots[i],
                                         l, static_cast<KvPlane>(p));
        ASSERT_EQ(cudaMemcpyAsync(back.data(), dev, plane_bytes, cudaMemcpyDeviceToHost, stream_),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        EXPECT_TRUE(back == kv[i * g.num_layers() * 2 + l * 2 + p])
            << "block " << i << " layer " << l << " plane " << p;
      }
    }
  }
  KVTIER_ASSERT_OK(ticket.completion().WaitFor(absl::Seconds(30)));
  KVTIER_ASSERT_OK(cache->ReleaseTicket(ticket));
  KVTIER_ASSERT_OK(cache->Release(SequenceId(2)));
  cudaEventDestroy(kernel_done);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaLayerwiseTest,
                         ::testing::Values(HbmLayout::kLayerFirst, HbmLayout::kBlockFirst,
                                           HbmLayout::kLayerKvSplit),
                         [](const auto& p) {
                           switch (p.param) {
                             case HbmLayout::kBlockFirst:
                               return "BlockFirst";
                             case HbmLayout::kLayerKvSplit:
                               return "LayerKvSplit";
                             default:
                               return "LayerFirst";
                           }
                         });

}  // namespace
}  // namespace kvtier
