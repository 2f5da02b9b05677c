// One suite, every tier backend that can run on this machine (STYLE rule 3; RocksDB's
// env_basic_test). Each backend is also run behind FaultInjectingTier for the fault cases.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/cuda_hbm.h"
#include "kvtier/directory_transport.h"
#include "kvtier/dram_tier.h"
#include "kvtier/emulated_hbm.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/nvme_tier.h"
#include "kvtier/redis_transport.h"
#include "kvtier/remote_tier.h"
#include "kvtier/tier_backend.h"
#include "internal/mutex.h"
#include "tests/testing/fault_injecting_tier.h"
#include "tests/testing/random_bytes.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

constexpr int64_t kSlots = 16;

// 3 layers, 2 KV heads of 32, 8 tokens per block, bf16: 6144-byte blocks (not a multiple of a
// page, so no backend can get away with page-sized assumptions).
KvGeometry SmallGeometry() {
  return *KvGeometry::Create(
      {.num_layers = 3, .num_kv_heads = 2, .head_dim = 32, .tokens_per_block = 8});
}

struct BackendFactory {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<TierBackend>>()> make;
};

template <typename T>
absl::StatusOr<std::unique_ptr<TierBackend>> Upcast(absl::StatusOr<std::unique_ptr<T>> t) {
  if (!t.ok()) return t.status();
  return std::unique_ptr<TierBackend>(std::move(*t));
}

// An NVMe tier on a fresh file under /tmp (ext4 here: O_DIRECT alignment is enforced, unlike
// tmpfs). The file is unlinked at once; the tier's descriptor keeps it until the tier goes.
absl::StatusOr<std::unique_ptr<TierBackend>> MakeNvme(NvmeEngine engine) {
  char dir[] = "/tmp/kvtier_conformance_XXXXXX";
  if (mkdtemp(dir) == nullptr) return absl::UnavailableError("mkdtemp failed");
  const std::string path = std::string(dir) + "/nvme.tier";
  auto tier = NvmeTier::Create(SmallGeometry(),
                               {.path = path,
                                .capacity_bytes = kSlots * NvmeTier::SlotBytes(SmallGeometry()),
                                .queue_depth = 8,
                                .engine = engine});
  std::filesystem::remove_all(dir);
  return Upcast(std::move(tier));
}

CacheNamespace SmallNamespace() {
  return *CacheNamespace::Create(SmallGeometry(),
                                 {.model_id = "conformance", .weights_fingerprint = "w"});
}

absl::StatusOr<std::unique_ptr<TierBackend>> MakeRemote(std::shared_ptr<Transport> transport) {
  return Upcast(RemoteTier::Create(
      SmallNamespace(),
      {.transport = std::move(transport), .capacity_blocks = kSlots, .codec = Codec::kShuffleLz4}));
}

// A remote tier over a real Redis (standalone, or a 3-node cluster) started for this test and
// stopped with the tier: the transport holds the servers alive through a deleter.
absl::StatusOr<std::unique_ptr<TierBackend>> MakeRedisRemote(bool cluster) {
  if (!testing::RedisServerAvailable()) {
    return absl::FailedPreconditionError("redis-server is not installed");
  }
  std::shared_ptr<void> servers;
  RedisTransportOptions options;
  options.cluster = cluster;
  if (cluster) {
    auto c = testing::RedisCluster::Start(3);
    if (!c.ok()) return c.status();
    options.endpoints = {(*c)->node(0).address()};
    servers = std::shared_ptr<testing::RedisCluster>(std::move(*c));
  } else {
    auto server = testing::RedisServer::Start();
    if (!server.ok()) return server.status();
    options.endpoints = {(*server)->address()};
    servers = std::shared_ptr<testing::RedisServer>(std::move(*server));
  }
  auto transport = RedisTransport::Create(options);
  if (!transport.ok()) return transport.status();
  RedisTransport* raw = transport->release();
  // The transport goes first (its connections close), then the servers.
  std::shared_ptr<Transport> shared(raw, [servers](RedisTransport* t) mutable {
    delete t;
    servers.reset();
  });
  return MakeRemote(std::move(shared));
}

std::vector<BackendFactory> Backends() {
  return {
      {"EmulatedHbmLayerFirst",
       [] {
         return Upcast(EmulatedHbm::Create(
             SmallGeometry(), {.layout = HbmLayout::kLayerFirst, .capacity_blocks = kSlots}));
       }},
      {"EmulatedHbmBlockFirst",
       [] {
         return Upcast(EmulatedHbm::Create(
             SmallGeometry(), {.layout = HbmLayout::kBlockFirst, .capacity_blocks = kSlots}));
       }},
      {"EmulatedHbmLayerKvSplit",
       [] {
         return Upcast(EmulatedHbm::Create(
             SmallGeometry(), {.layout = HbmLayout::kLayerKvSplit, .capacity_blocks = kSlots}));
       }},
      {"Dram",
       [] {
         return Upcast(DramTier::Create(
             SmallGeometry(), {.capacity_bytes = kSlots * SmallGeometry().bytes_per_block()}));
       }},
      {"CudaHbmLayerFirst",
       [] {
         return Upcast(CudaHbm::Create(
             SmallGeometry(), {.layout = HbmLayout::kLayerFirst, .capacity_blocks = kSlots}));
       }},
      {"CudaHbmBlockFirst",
       [] {
         return Upcast(CudaHbm::Create(
             SmallGeometry(), {.layout = HbmLayout::kBlockFirst, .capacity_blocks = kSlots}));
       }},
      {"CudaHbmLayerKvSplit",
       [] {
         return Upcast(CudaHbm::Create(
             SmallGeometry(), {.layout = HbmLayout::kLayerKvSplit, .capacity_blocks = kSlots}));
       }},
      {"NvmeIoUring", [] { return MakeNvme(NvmeEngine::kIoUring); }},
      {"NvmeThreadPool", [] { return MakeNvme(NvmeEngine::kThreadPool); }},
      {"RemoteInProcess", [] { return MakeRemote(std::make_shared<InProcessTransport>()); }},
      {"RemoteDirectory",
       []() -> absl::StatusOr<std::unique_ptr<TierBackend>> {
         char dir[] = "/tmp/kvtier_remote_XXXXXX";
         if (mkdtemp(dir) == nullptr) return absl::UnavailableError("mkdtemp failed");
         auto transport = DirectoryTransport::Create({.root = dir});
         if (!transport.ok()) return transport.status();
         // The directory is left for the OS to clean: values are few and small.
         return MakeRemote(std::shared_ptr<Transport>(std::move(*transport)));
       }},
      {"RemoteRedis", [] { return MakeRedisRemote(/*cluster=*/false); }},
      {"RemoteRedisCluster", [] { return MakeRedisRemote(/*cluster=*/true); }},
  };
}

class TierConformanceTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    auto tier = GetParam().make();
    if (!tier.ok() && absl::IsUnavailable(tier.status()) &&
        std::string(tier.status().message()).find("io_uring") != std::string::npos) {
      GTEST_SKIP() << "io_uring is not available here: " << tier.status().message();
    }
    if (!tier.ok() && absl::IsUnavailable(tier.status()) &&
        std::string(tier.status().message()).find("O_DIRECT") != std::string::npos) {
      GTEST_SKIP() << "/tmp does not support O_DIRECT here: " << tier.status().message();
    }
    if (!tier.ok() && GetParam().name.starts_with("CudaHbm") &&
        (absl::IsUnavailable(tier.status()) || absl::IsUnimplemented(tier.status()))) {
      GTEST_SKIP() << "no CUDA device: " << tier.status().message();
    }
    if (!tier.ok() && GetParam().name.starts_with("RemoteRedis") &&
        absl::IsFailedPrecondition(tier.status())) {
      GTEST_SKIP() << tier.status().message();
    }
    ASSERT_TRUE(tier.ok()) << tier.status();
    faulty_ = new testing::FaultInjectingTier(std::move(*tier));
    tier_.reset(faulty_);
    bytes_ = static_cast<size_t>(tier_->info().block_bytes);
  }

  std::vector<std::byte> RandomBlock(uint32_t seed) const {
    return testing::RandomBytes(static_cast<int64_t>(bytes_), seed);
  }
  static BlockKey Key(uint64_t i) { return BlockKey{0x6b6579, i}; }

  absl::Status Write(SlotId slot, const BlockKey& key, const std::vector<std::byte>& data) {
    return tier_->WriteBlock(slot, key, data).Wait();
  }
  absl::StatusOr<std::vector<std::byte>> Read(SlotId slot, const BlockKey& key) {
    std::vector<std::byte> out(bytes_);
    absl::Status s = tier_->ReadBlock(slot, key, absl::MakeSpan(out)).Wait();
    if (!s.ok()) return s;
    return out;
  }

  testing::FaultInjectingTier* faulty_ = nullptr;  // owned by tier_
  std::unique_ptr<TierBackend> tier_;
  size_t bytes_ = 0;
};

TEST_P(TierConformanceTest, InfoIsConsistent) {
  const TierInfo& info = tier_->info();
  EXPECT_EQ(info.capacity_blocks, kSlots);
  EXPECT_EQ(info.block_bytes, SmallGeometry().bytes_per_block());
  EXPECT_EQ(info.capacity_bytes, kSlots * info.block_bytes);
  EXPECT_GT(info.metadata_bytes, 0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_EQ(tier_->allocator().capacity_blocks(), kSlots);
  EXPECT_EQ(tier_->allocator().tier(), info.tier);
  EXPECT_EQ((info.capabilities & kCapHostAddressable) != 0,
            tier_->HostAddress(SlotId(0)) != nullptr);
  EXPECT_EQ(tier_->HostAddress(SlotId(kSlots)), nullptr);
}

TEST_P(TierConformanceTest, RoundTripOfRandomBlocks) {
  for (uint32_t i = 0; i < kSlots; ++i) {
    KVTIER_ASSERT_OK(Write(SlotId(i), Key(i), RandomBlock(i)));
  }
  for (uint32_t i = 0; i < kSlots; ++i) {
    KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, Read(SlotId(i), Key(i)));
    EXPECT_TRUE(back == RandomBlock(i)) << "slot " << i;
  }
}

TEST_P(TierConformanceTest, ManyOperationsInFlight) {
  for (uint32_t round = 0; round < 4; ++round) {
    std::vector<std::vector<std::byte>> data;
    std::vector<Completion> writes;
    for (uint32_t i = 0; i < kSlots; ++i) data.push_back(RandomBlock(100 * round + i));
    for (uint32_t i = 0; i < kSlots; ++i) {
      writes.push_back(tier_->WriteBlock(SlotId(i), Key(100 * round + i), data[i]));
    }
    KVTIER_ASSERT_OK(Completion::All(writes).Wait());
    std::vector<std::vector<std::byte>> back(kSlots, std::vector<std::byte>(bytes_));
    std::vector<Completion> reads;
    for (uint32_t i = 0; i < kSlots; ++i) {
      reads.push_back(tier_->ReadBlock(SlotId(i), Key(100 * round + i), absl::MakeSpan(back[i])));
    }
    KVTIER_ASSERT_OK(Completion::All(reads).Wait());
    for (uint32_t i = 0; i < kSlots; ++i) EXPECT_TRUE(back[i] == data[i]) << round << "/" << i;
  }
}

// kCapLayerwise: a batch lands layer-major, each block announcing layers 1..L in order, every
// block's layer l before any block's layer l + 1, and the bytes are the block's. Other tiers may
// ignore the progress, but must still store the blocks.
TEST_P(TierConformanceTest, LayerwiseBatchLandsLayerMajor) {
  const int layers = SmallGeometry().num_layers();
  internal::Mutex mu;
  std::vector<std::pair<int, int>> landed;  // (block, n) in the order announced
  std::vector<std::vector<std::byte>> data;
  std::vector<BlockWrite> writes;
  for (uint32_t i = 0; i < 3; ++i) data.push_back(RandomBlock(500 + i));
  for (uint32_t i = 0; i < 3; ++i) {
    auto progress = std::make_shared<LayerProgress>();
    progress->landed = [&mu, &landed, i](int n) {
      internal::MutexLock lock(&mu);
      landed.emplace_back(static_cast<int>(i), n);
    };
    writes.push_back(BlockWrite{SlotId(i), Key(500 + i), data[i], progress});
  }
  KVTIER_ASSERT_OK(Completion::All(tier_->WriteBlocks(writes)).Wait());
  for (uint32_t i = 0; i < 3; ++i) {
    KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, Read(SlotId(i), Key(500 + i)));
    EXPECT_TRUE(back == data[i]) << "block " << i;
  }
  internal::MutexLock lock(&mu);
  if ((tier_->info().capabilities & kCapLayerwise) == 0) {
    EXPECT_TRUE(landed.empty()) << "a tier without kCapLayerwise reported layers";
    return;
  }
  ASSERT_EQ(landed.size(), static_cast<size_t>(3 * layers));
  for (size_t k = 0; k < landed.size(); ++k) {
    // Layer-major: the k-th announcement is layer k / 3 + 1 of block k % 3.
    EXPECT_EQ(landed[k], std::make_pair(static_cast<int>(k % 3), static_cast<int>(k / 3) + 1))
        << "announcement " << k;
  }
}

TEST_P(TierConformanceTest, NeverWrittenSlotIsNotFound) {
  EXPECT_THAT(Read(SlotId(3), Key(3)), IsError(StatusCode::kNotFound, "slot 3"));
}

TEST_P(TierConformanceTest, OtherKeyIsDataLossNeverABlock) {
  KVTIER_ASSERT_OK(Write(SlotId(2), Key(7), RandomBlock(7)));
  EXPECT_THAT(Read(SlotId(2), Key(8)), IsError(StatusCode::kDataLoss, Key(7).ToHex()));
  KVTIER_ASSERT_OK(Write(SlotId(2), Key(8), RandomBlock(8)));  // overwrite replaces it
  EXPECT_THAT(Read(SlotId(2), Key(7)), IsError(StatusCode::kDataLoss, "slot 2"));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, Read(SlotId(2), Key(8)));
  EXPECT_TRUE(back == RandomBlock(8));
}

TEST_P(TierConformanceTest, BadArgumentsAreRejected) {
  std::vector<std::byte> ok(bytes_), small(bytes_ - 1);
  EXPECT_THAT(tier_->WriteBlock(SlotId(kSlots), Key(0), ok).Wait(),
              IsError(StatusCode::kInvalidArgument, "slot 16 is outside [0, 16)"));
  EXPECT_THAT(tier_->ReadBlock(SlotId(), Key(0), absl::MakeSpan(ok)).Wait(),
              IsError(StatusCode::kInvalidArgument, "outside"));
  EXPECT_THAT(tier_->WriteBlock(SlotId(0), Key(0), small).Wait(),
              IsError(StatusCode::kInvalidArgument, "a buffer of 6143 bytes for a block of 6144"));
  EXPECT_THAT(tier_->ReadBlock(SlotId(0), Key(0), absl::MakeSpan(small)).Wait(),
              IsError(StatusCode::kInvalidArgument, "6143"));
}

TEST_P(TierConformanceTest, CapacityExhaustion) {
  BlockAllocator& a = tier_->allocator();
  for (int64_t i = 0; i < kSlots; ++i) ASSERT_TRUE(a.Allocate().ok());
  EXPECT_THAT(a.Allocate(), IsError(StatusCode::kResourceExhausted, "all 16 slots"));
  EXPECT_EQ(a.counts().writable, kSlots);
}

TEST_P(TierConformanceTest, OperationPastItsDeadlineDoesNotTouchTheSlot) {
  KVTIER_ASSERT_OK(Write(SlotId(1), Key(1), RandomBlock(1)));
  const BlockIoOptions past{.deadline = absl::Now() - absl::Seconds(1)};
  EXPECT_THAT(tier_->WriteBlock(SlotId(1), Key(2), RandomBlock(2), past).Wait(),
              IsError(StatusCode::kDeadlineExceeded, "slot 1"));
  std::vector<std::byte> out(bytes_);
  EXPECT_THAT(tier_->ReadBlock(SlotId(1), Key(1), absl::MakeSpan(out), past).Wait(),
              IsError(StatusCode::kDeadlineExceeded, "deadline"));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, Read(SlotId(1), Key(1)));
  EXPECT_TRUE(back == RandomBlock(1)) << "a write that never started changed the slot";
}

TEST_P(TierConformanceTest, WaitWithDeadlineOnSlowTier) {
  faulty_->SetDelay(absl::Milliseconds(300));
  const std::vector<std::byte> data = RandomBlock(5);
  Completion write = tier_->WriteBlock(SlotId(5), Key(5), data);
  EXPECT_THAT(write.WaitFor(absl::Milliseconds(10)),
              IsError(StatusCode::kDeadlineExceeded, "deadline"));
  EXPECT_FALSE(write.done());
  KVTIER_EXPECT_OK(write.Wait());  // the operation went on and landed
  faulty_->SetDelay(absl::ZeroDuration());
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, Read(SlotId(5), Key(5)));
  EXPECT_TRUE(back == data);
}

TEST_P(TierConformanceTest, InjectedErrorsSurfaceAndNeverYieldABlock) {
  faulty_->FailNextWrites(1, absl::UnavailableError("injected EIO"));
  EXPECT_THAT(Write(SlotId(4), Key(4), RandomBlock(4)),
              IsError(StatusCode::kUnavailable, "injected EIO"));
  auto after_failed_write = Read(SlotId(4), Key(4));
  EXPECT_FALSE(after_failed_write.ok()) << "a failed write must not read back as a block";
  KVTIER_ASSERT_OK(Write(SlotId(4), Key(4), RandomBlock(4)));
  faulty_->FailNextReads(1, absl::DataLossError("injected bit flip"));
  EXPECT_THAT(Read(SlotId(4), Key(4)), IsError(StatusCode::kDataLoss, "injected bit flip"));
  KVTIER_EXPECT_OK(Read(SlotId(4), Key(4)).status());  // one fault, then the tier serves again
}

// Discovery: a tier with kCapProbe finds a block in its store by key alone, and a slot that never
// held it reads it once adopted for it (what another process of the namespace sees); every
// other tier answers kUnimplemented. Keys unique to this run, as a store may be shared.
TEST_P(TierConformanceTest, ProbeFindsStoredBlocksByKeyOnlyWithCapProbe) {
  const auto run = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  const BlockKey stored{run, 1};
  const BlockKey absent{run, 2};
  const std::vector<BlockKey> keys = {stored, absent, stored};
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  if ((tier_->info().capabilities & kCapProbe) == 0) {
    EXPECT_THAT(tier_->ProbeBlocks(keys, deadline).status(),
                IsError(StatusCode::kUnimplemented, "probe"));
    EXPECT_THAT(tier_->AdoptStoredBlock(SlotId(0), stored),
                IsError(StatusCode::kUnimplemented, "adopt"));
    return;
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<bool> before, tier_->ProbeBlocks(keys, deadline));
  EXPECT_EQ(before, (std::vector<bool>{false, false, false}));
  KVTIER_ASSERT_OK(Write(SlotId(1), stored, RandomBlock(11)));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<bool> found, tier_->ProbeBlocks(keys, deadline));
  EXPECT_EQ(found, (std::vector<bool>{true, false, true}));
  EXPECT_THAT(Read(SlotId(4), stored), IsError(StatusCode::kNotFound, "slot 4"));
  KVTIER_ASSERT_OK(tier_->AdoptStoredBlock(SlotId(4), stored));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, Read(SlotId(4), stored));
  EXPECT_TRUE(back == RandomBlock(11));
  EXPECT_THAT(tier_->AdoptStoredBlock(SlotId(kSlots), stored),
              IsError(StatusCode::kInvalidArgument, "slot"));
  EXPECT_THAT(tier_->ProbeBlocks(keys, absl::Now() - absl::Seconds(1)).status(),
              IsError(StatusCode::kDeadlineExceeded, "deadline"));
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<bool> none, tier_->ProbeBlocks({}, deadline));
  EXPECT_TRUE(none.empty());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, TierConformanceTest, ::testing::ValuesIn(Backends()),
                         [](const auto& p) { return p.param.name; });

}  // namespace
}  // namespace kvtier
