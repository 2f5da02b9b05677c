// The tier stack builder (kvtier/tier_stack.h): which backend each spec gives, with what
// capacity, where the remote tier's store comes from, the wrap hook, and its errors.
#include "kvtier/tier_stack.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/metadata_tier.h"
#include "kvtier/tier_backend.h"
#include "kvtier/transport.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr int kDram = TierIndex(Tier::kDram);
constexpr int kNvme = TierIndex(Tier::kNvme);
constexpr int kRemote = TierIndex(Tier::kRemote);

// 2 layers x 2 KV heads x 8, bf16, 4 tokens a block: 512-byte blocks.
KvGeometry Geometry() {
  return *KvGeometry::Create(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .tokens_per_block = 4});
}

CacheNamespace Namespace() {
  return *CacheNamespace::Create(Geometry(),
                                 {.model_id = "kvtier-test/stack", .weights_fingerprint = "w0"});
}

// Found in review: the builder took hbm.layout as given, even when it was not the layout the
// namespace names: a pool registered in the namespace's layout (vLLM's kv-split tensors) was
// then read with another's strides, and scrambled bytes were offloaded under valid keys.
TEST(TierStackTest, AnHbmLayoutOtherThanTheNamespacesIsRefused) {
  TierStackOptions o;
  o.tiers[kHbm].capacity_blocks = 3;
  o.hbm.layout = HbmLayout::kLayerKvSplit;
  EXPECT_THAT(
      BuildTierStack(Namespace(), o),
      IsError(StatusCode::kInvalidArgument,
              "hbm.layout is layer_kv_split but the namespace's hbm_layout is layer_first"));
  o.tiers[kHbm].kind = TierBackendKind::kMetadata;  // no pool: nothing to read wrongly
  KVTIER_EXPECT_OK(BuildTierStack(Namespace(), o).status());
}

// Found in review: a capacity over what a tier's allocator takes (2^31 blocks) was only refused
// after the backend had tried to reserve it (a DRAM pool of 1 TiB here: kResourceExhausted about
// memory, not naming the field).
TEST(TierStackTest, ACapacityOverTheAllocatorsLimitIsRefusedFirst) {
  TierStackOptions o;
  o.tiers[kDram].capacity_blocks = BlockAllocator::kMaxCapacityBlocks + 1;
  o.dram.pin_for_cuda = false;
  EXPECT_THAT(BuildTierStack(Namespace(), o),
              IsError(StatusCode::kInvalidArgument, "dram capacity_blocks 2147483649 is over"));
}

TEST(TierStackTest, NativeTiersGetTheirBlocks) {
  testing::TempDir dir;
  TierStackOptions o;
  o.tiers[kHbm].capacity_blocks = 3;
  o.tiers[kDram].capacity_blocks = 5;
  o.tiers[kNvme].capacity_blocks = 7;
  o.tiers[kRemote].capacity_blocks = 9;
  o.hbm.layout = HbmLayout::kBlockFirst;
  o.dram.pin_for_cuda = false;
  o.dram.capacity_bytes = 1;  // overwritten from the blocks
  o.nvme.path = dir.File("nvme.bin");
  o.remote.transport = std::make_shared<InProcessTransport>();
  o.remote.key_prefix = "stack-test:";
  const CacheNamespace block_first =
      *CacheNamespace::Create(Geometry(), {.model_id = "kvtier-test/stack",
                                           .weights_fingerprint = "w0",
                                           .hbm_layout = HbmLayout::kBlockFirst});
  KVTIER_ASSERT_OK_AND_ASSIGN(TierBackends tiers, BuildTierStack(block_first, o));
  EXPECT_EQ(o.remote.transport.use_count(), 2);  // shared with the remote tier, not copied
  const KvGeometry g = Geometry();
  ASSERT_NE(tiers[kHbm], nullptr);
  EXPECT_EQ(tiers[kHbm]->info().name, "emulated_hbm(block_first)");
  EXPECT_EQ(tiers[kHbm]->info().capacity_blocks, 3);
  EXPECT_TRUE(tiers[kHbm]->device_pool().has_value());
  ASSERT_NE(tiers[kDram], nullptr);
  EXPECT_EQ(tiers[kDram]->info().name, "dram");
  EXPECT_EQ(tiers[kDram]->info().capacity_blocks, 5);
  EXPECT_EQ(tiers[kDram]->info().capacity_bytes, 5 * g.bytes_per_block());
  ASSERT_NE(tiers[kNvme], nullptr);
  EXPECT_THAT(tiers[kNvme]->info().name, ::testing::StartsWith("nvme("));
  EXPECT_EQ(tiers[kNvme]->info().capacity_blocks, 7);
  ASSERT_NE(tiers[kRemote], nullptr);
  EXPECT_THAT(tiers[kRemote]->info().name, ::testing::StartsWith("remote(in_process"));
  EXPECT_EQ(tiers[kRemote]->info().capacity_blocks, 9);
  for (int t = 0; t < kNumTiers; ++t) EXPECT_EQ(TierIndex(tiers[t]->info().tier), t);
}

TEST(TierStackTest, AbsentTiersStayNull) {
  TierStackOptions o;
  o.tiers[kHbm].capacity_blocks = 2;
  o.tiers[kDram].capacity_blocks = 0;
  KVTIER_ASSERT_OK_AND_ASSIGN(TierBackends tiers, BuildTierStack(Geometry(), o));
  EXPECT_NE(tiers[kHbm], nullptr);
  EXPECT_EQ(tiers[kDram], nullptr);
  EXPECT_EQ(tiers[kNvme], nullptr);  // no path needed for an absent NVMe tier
  EXPECT_EQ(tiers[kRemote], nullptr);
  KVTIER_ASSERT_OK_AND_ASSIGN(TierBackends none, BuildTierStack(Geometry(), TierStackOptions{}));
  for (const auto& t : none) EXPECT_EQ(t, nullptr);
}

TEST(TierStackTest, MetadataTiersStandForTheirLevel) {
  TierStackOptions o;
  for (int t = 0; t < kNumTiers; ++t) {
    o.tiers[t] = {.capacity_blocks = 10 + t, .kind = TierBackendKind::kMetadata};
  }
  // No NVMe path nor remote store: a metadata tier needs neither, nor a namespace.
  KVTIER_ASSERT_OK_AND_ASSIGN(TierBackends tiers, BuildTierStack(Geometry(), o));
  const std::vector<std::string> names = {"metadata(hbm)", "metadata(dram)", "metadata(nvme)",
                                          "metadata(remote)"};
  for (int t = 0; t < kNumTiers; ++t) {
    ASSERT_NE(tiers[t], nullptr);
    EXPECT_EQ(tiers[t]->info().name, names[t]);
    EXPECT_EQ(tiers[t]->info().capacity_blocks, 10 + t);
    EXPECT_EQ(tiers[t]->info().block_bytes, Geometry().bytes_per_block());
    EXPECT_NE(tiers[t]->info().capabilities & kCapInlineIo, 0u);
  }
}

TEST(TierStackTest, RemoteStoreIsATransportADirectoryOrAUrl) {
  testing::TempDir dir;
  TierStackOptions o;
  o.tiers[kRemote].capacity_blocks = 4;
  o.remote_directory = dir.File("store");
  KVTIER_ASSERT_OK_AND_ASSIGN(TierBackends tiers, BuildTierStack(Namespace(), o));
  ASSERT_NE(tiers[kRemote], nullptr);
  EXPECT_THAT(tiers[kRemote]->info().name, ::testing::StartsWith("remote(directory"));
  EXPECT_EQ(tiers[kRemote]->info().capacity_blocks, 4);

  // A URL's transport connects lazily, so a store that is not there builds.
  TierStackOptions url;
  url.tiers[kRemote].capacity_blocks = 4;
  url.remote_url = "redis://127.0.0.1:1";
  KVTIER_ASSERT_OK_AND_ASSIGN(TierBackends redis, BuildTierStack(Namespace(), url));
  ASSERT_NE(redis[kRemote], nullptr);
  EXPECT_THAT(redis[kRemote]->info().name, ::testing::StartsWith("remote(redis(127.0.0.1:1)"));

  TierStackOptions none;
  none.tiers[kRemote].capacity_blocks = 4;
  EXPECT_THAT(BuildTierStack(Namespace(), none).status(),
              IsError(StatusCode::kInvalidArgument, "exactly one store"));
  TierStackOptions two = o;
  two.remote_url = "redis://127.0.0.1:1";
  EXPECT_THAT(BuildTierStack(Namespace(), two).status(),
              IsError(StatusCode::kInvalidArgument, "2 given"));
  TierStackOptions three = two;
  three.remote.transport = std::make_shared<InProcessTransport>();
  EXPECT_THAT(BuildTierStack(Namespace(), three).status(),
              IsError(StatusCode::kInvalidArgument, "3 given"));
  // A metadata remote tier needs no store at all.
  TierStackOptions metadata = none;
  metadata.tiers[kRemote].kind = TierBackendKind::kMetadata;
  KVTIER_ASSERT_OK_AND_ASSIGN(TierBackends stand_in, BuildTierStack(Namespace(), metadata));
  EXPECT_EQ(stand_in[kRemote]->info().name, "metadata(remote)");
  TierStackOptions bad_url = none;
  bad_url.remote_url = "memcached://x:1";
  EXPECT_THAT(BuildTierStack(Namespace(), bad_url).status(),
              IsError(StatusCode::kInvalidArgument, "expected redis://"));
  // Without a namespace there is no native remote tier.
  EXPECT_THAT(BuildTierStack(Geometry(), o).status(),
              IsError(StatusCode::kInvalidArgument, "CacheNamespace"));
}

TEST(TierStackTest, WrapSeesEveryPresentTierInOrderAndItsResultIsKept) {
  TierStackOptions o;
  o.tiers[kHbm].capacity_blocks = 2;
  o.tiers[kNvme] = {.capacity_blocks = 3, .kind = TierBackendKind::kMetadata};
  std::vector<Tier> seen;
  std::vector<const TierBackend*> built;
  o.wrap = [&](Tier t, std::unique_ptr<TierBackend> b) {
    seen.push_back(t);
    built.push_back(b.get());
    // Replace the NVMe stand-in by another one, to see the result is what the stack keeps.
    if (t == Tier::kNvme) {
      return std::unique_ptr<TierBackend>(
          *MetadataTier::Create(Geometry(), {.tier = Tier::kNvme, .capacity_blocks = 5}));
    }
    return b;
  };
  KVTIER_ASSERT_OK_AND_ASSIGN(TierBackends tiers, BuildTierStack(Geometry(), o));
  EXPECT_THAT(seen, ::testing::ElementsAre(Tier::kHbm, Tier::kNvme));
  EXPECT_EQ(tiers[kHbm].get(), built[0]);
  EXPECT_NE(tiers[kNvme].get(), built[1]);
  EXPECT_EQ(tiers[kNvme]->info().capacity_blocks, 5);
}

TEST(TierStackTest, WrapMustReturnABackend) {
  TierStackOptions o;
  o.tiers[kHbm].capacity_blocks = 2;
  o.tiers[kDram].capacity_blocks = 2;
  o.dram.pin_for_cuda = false;
  int calls = 0;
  o.wrap = [&](Tier t, std::unique_ptr<TierBackend> b) -> std::unique_ptr<TierBackend> {
    ++calls;
    if (t == Tier::kDram) return nullptr;
    return b;
  };
  EXPECT_THAT(BuildTierStack(Geometry(), o).status(),
              IsError(StatusCode::kInvalidArgument, "wrap returned no backend for the dram tier"));
  EXPECT_EQ(calls, 2);
}

TEST(TierStackTest, WrapIsNotCalledWhenABackendFails) {
  TierStackOptions o;
  o.tiers[kHbm].capacity_blocks = 2;
  o.tiers[kNvme].capacity_blocks = 2;  // no path: NvmeTier::Create fails after HBM is built
  int calls = 0;
  o.wrap = [&](Tier, std::unique_ptr<TierBackend> b) {
    ++calls;
    return b;
  };
  EXPECT_THAT(BuildTierStack(Geometry(), o).status(), IsError(StatusCode::kInvalidArgument, ""));
  EXPECT_EQ(calls, 0);
}

TEST(TierStackTest, Errors) {
  TierStackOptions negative;
  negative.tiers[kDram].capacity_blocks = -1;
  EXPECT_THAT(BuildTierStack(Geometry(), negative).status(),
              IsError(StatusCode::kInvalidArgument, "negative"));
  TierStackOptions huge;
  huge.tiers[kDram].capacity_blocks = int64_t{1} << 60;
  EXPECT_THAT(BuildTierStack(Geometry(), huge).status(),
              IsError(StatusCode::kInvalidArgument, "is over the 2147483648 blocks"));
  TierStackOptions kind;
  kind.tiers[kHbm] = {.capacity_blocks = 1, .kind = static_cast<TierBackendKind>(7)};
  EXPECT_THAT(BuildTierStack(Geometry(), kind).status(),
              IsError(StatusCode::kInvalidArgument, "unknown backend kind"));
  // A backend's own error comes back as it is: NvmeTier without a path.
  TierStackOptions no_path;
  no_path.tiers[kHbm].capacity_blocks = 1;
  no_path.tiers[kNvme].capacity_blocks = 1;
  EXPECT_THAT(BuildTierStack(Geometry(), no_path).status(),
              IsError(StatusCode::kInvalidArgument, ""));
  TierStackOptions backend;
  backend.tiers[kHbm].capacity_blocks = 1;
  backend.hbm_backend = static_cast<HbmBackend>(9);
  EXPECT_THAT(BuildTierStack(Geometry(), backend).status(),
              IsError(StatusCode::kInvalidArgument, "unknown hbm_backend 9"));
}

// hbm_backend kCuda builds a CudaHbm: on a GPU one with the tier's capacity; here (no GPU, or a
// build without CUDA) CudaHbm's own refusal comes back, and nothing is built.
TEST(TierStackTest, CudaHbmIsBuiltOrSaysWhyNot) {
  TierStackOptions o;
  o.tiers[kHbm].capacity_blocks = 3;
  o.tiers[kDram].capacity_blocks = 2;
  o.hbm_backend = HbmBackend::kCuda;
  o.hbm.layout = HbmLayout::kLayerKvSplit;
  absl::StatusOr<TierBackends> built = BuildTierStack(Geometry(), o);
  if (built.ok()) {
    EXPECT_EQ((*built)[kHbm]->info().name, "cuda_hbm(layer_kv_split)");
    EXPECT_EQ((*built)[kHbm]->info().capacity_blocks, 3);
    return;
  }
  EXPECT_TRUE(absl::IsUnavailable(built.status()) || absl::IsUnimplemented(built.status()))
      << built.status();
  EXPECT_THAT(built.status().message(), ::testing::HasSubstr("CudaHbm"));
}

TEST(RemoteTransportFromUrlTest, BuildsTheTransportTheUrlNames) {
  // Nothing listens on these ports: the transports connect lazily.
  KVTIER_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Transport> one,
                              RemoteTransportFromUrl("redis://127.0.0.1:1"));
  EXPECT_EQ(one->name(), "redis(127.0.0.1:1)");
  KVTIER_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Transport> with_auth,
                              RemoteTransportFromUrl("redis://alice:pw@127.0.0.1:1/3"));
  EXPECT_EQ(with_auth->name(), "redis(127.0.0.1:1)");
  KVTIER_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Transport> cluster,
                              RemoteTransportFromUrl("redis-cluster://127.0.0.1:1,127.0.0.1:2"));
  EXPECT_EQ(cluster->name(), "redis-cluster(127.0.0.1:1,127.0.0.1:2)");
}

TEST(RemoteTransportFromUrlTest, RejectsWhatIsNotARedisUrl) {
  EXPECT_THAT(RemoteTransportFromUrl("").status(),
              IsError(StatusCode::kInvalidArgument, "expected redis://"));
  EXPECT_THAT(RemoteTransportFromUrl("/tmp/store").status(),
              IsError(StatusCode::kInvalidArgument, "expected redis://"));
  EXPECT_THAT(RemoteTransportFromUrl("redis://a:1,b:2").status(),
              IsError(StatusCode::kInvalidArgument, "one host:port"));
  EXPECT_THAT(RemoteTransportFromUrl("redis-cluster://").status(),
              IsError(StatusCode::kInvalidArgument, "host:port"));
  EXPECT_THAT(RemoteTransportFromUrl("redis-cluster://a:1/2").status(),
              IsError(StatusCode::kInvalidArgument, "database"));
}

}  // namespace
}  // namespace kvtier
