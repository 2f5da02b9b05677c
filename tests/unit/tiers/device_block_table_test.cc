// The address helpers of device_block_table.h and kv_address.h against hand-computed offsets,
// against the stride walk they replace, and against the bytes EmulatedHbm stores for a block, in
// every HbmLayout and for MHA and MLA, and an engine's tensors registered as the pool.
#include "kvtier/device_block_table.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/emulated_hbm.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/kv_address.h"
#include "kvtier/kv_geometry.h"
#include "tests/testing/status_matchers.h"
#include "tiers/device_pool_view.h"

namespace kvtier {
namespace {

using ::kvtier::testing::IsError;
using ::testing::Each;
using ::testing::IsNull;

constexpr HbmLayout kLayouts[] = {HbmLayout::kLayerFirst, HbmLayout::kBlockFirst,
                                  HbmLayout::kLayerKvSplit};
constexpr int64_t kSlots = 5;

// 2 layers x 2 KV heads x head_dim 4, bf16, 3 tokens per block: an 8-byte head, a 16-byte token
// per plane, a 48-byte plane, 96 bytes per block per layer, 192-byte blocks.
KvGeometry Mha() {
  return *KvGeometry::Create(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 4, .tokens_per_block = 3});
}
// 3 layers, latent 4 + rope 2, bf16, 3 tokens per block: 12 bytes per token, 36 per block per
// layer, 108-byte blocks.
KvGeometry Mla() {
  return *KvGeometry::Create({.attention = AttentionKind::kMla,
                              .num_layers = 3,
                              .kv_lora_rank = 4,
                              .qk_rope_head_dim = 2,
                              .tokens_per_block = 3});
}

std::unique_ptr<EmulatedHbm> MakeHbm(const KvGeometry& g, HbmLayout layout) {
  auto hbm = EmulatedHbm::Create(g, {.layout = layout, .capacity_blocks = kSlots});
  EXPECT_TRUE(hbm.ok()) << hbm.status();
  return hbm.ok() ? std::move(*hbm) : nullptr;
}

static_assert(KvOffsetBytes(KvStrides{96, 16, 8}, 0) == 0);
static_assert(KvOffsetBytes(KvStrides{96, 16, 8}, 3, 2, 1) == 3 * 96 + 2 * 16 + 8);
static_assert(KvOffsetBytes(KvStrides{192, 12, 0}, 4, 1) == 4 * 192 + 12);

// Offsets from the pool's first byte (LayerBase(0)), worked out from hbm_layout.h's shapes.
TEST(DeviceBlockTableTest, MhaAddressesAreTheLayoutsOffsets) {
  struct Case {
    HbmLayout layout;
    int64_t slot;
    int layer;
    KvPlane plane;
    int64_t token;
    int64_t head;
    int64_t offset;
  };
  const Case cases[] = {
      // Layer-first: layer l at l * 5 slots * 96; V 48 bytes into a slot; slots 96 apart.
      {HbmLayout::kLayerFirst, 0, 0, KvPlane::kK, 0, 0, 0},
      {HbmLayout::kLayerFirst, 0, 0, KvPlane::kV, 0, 0, 48},
      {HbmLayout::kLayerFirst, 1, 0, KvPlane::kK, 0, 0, 96},
      {HbmLayout::kLayerFirst, 0, 1, KvPlane::kK, 0, 0, 480},
      {HbmLayout::kLayerFirst, 3, 1, KvPlane::kV, 2, 1, 480 + 3 * 96 + 48 + 2 * 16 + 8},
      {HbmLayout::kLayerFirst, 4, 0, KvPlane::kK, 1, 1, 4 * 96 + 16 + 8},
      // Block-first: slots 192 apart; layer l at l * 96 inside the block; V 48 into the layer.
      {HbmLayout::kBlockFirst, 0, 0, KvPlane::kK, 0, 0, 0},
      {HbmLayout::kBlockFirst, 0, 0, KvPlane::kV, 0, 0, 48},
      {HbmLayout::kBlockFirst, 1, 0, KvPlane::kK, 0, 0, 192},
      {HbmLayout::kBlockFirst, 0, 1, KvPlane::kK, 0, 0, 96},
      {HbmLayout::kBlockFirst, 3, 1, KvPlane::kV, 2, 1, 3 * 192 + 96 + 48 + 2 * 16 + 8},
      {HbmLayout::kBlockFirst, 4, 0, KvPlane::kK, 1, 1, 4 * 192 + 16 + 8},
      // K/V split (vLLM FlashAttention): layer l at l * 5 slots * 96, its K plane (5 slots of
      // 48 bytes) first, V 240 bytes in; slots 48 apart within a plane.
      {HbmLayout::kLayerKvSplit, 0, 0, KvPlane::kK, 0, 0, 0},
      {HbmLayout::kLayerKvSplit, 0, 0, KvPlane::kV, 0, 0, 240},
      {HbmLayout::kLayerKvSplit, 1, 0, KvPlane::kK, 0, 0, 48},
      {HbmLayout::kLayerKvSplit, 0, 1, KvPlane::kK, 0, 0, 480},
      {HbmLayout::kLayerKvSplit, 3, 1, KvPlane::kV, 2, 1, 480 + 240 + 3 * 48 + 2 * 16 + 8},
      {HbmLayout::kLayerKvSplit, 4, 0, KvPlane::kK, 1, 1, 4 * 48 + 16 + 8},
  };
  for (HbmLayout layout : kLayouts) {
    std::unique_ptr<EmulatedHbm> hbm = MakeHbm(Mha(), layout);
    ASSERT_NE(hbm, nullptr);
    const DevicePoolView pool = *hbm->device_pool();
    const std::byte* base = hbm->LayerBase(0);
    for (const Case& c : cases) {
      if (c.layout != layout) continue;
      SCOPED_TRACE(absl::StrCat(HbmLayoutName(layout), " slot ", c.slot, " layer ", c.layer,
                                " plane ", static_cast<int>(c.plane), " token ", c.token, " head ",
                                c.head));
      EXPECT_EQ(KvAddress(pool, c.slot, c.layer, c.plane, c.token, c.head) - base, c.offset);
      EXPECT_EQ(KvAddress(pool.ref(), c.slot, c.layer, c.plane, c.token, c.head) - base, c.offset);
    }
  }
}

TEST(DeviceBlockTableTest, MlaAddressesAreTheLayoutsOffsets) {
  for (HbmLayout layout : kLayouts) {
    SCOPED_TRACE(HbmLayoutName(layout));
    std::unique_ptr<EmulatedHbm> hbm = MakeHbm(Mla(), layout);
    ASSERT_NE(hbm, nullptr);
    const DevicePoolView pool = *hbm->device_pool();
    EXPECT_TRUE(pool.v_base.empty());
    EXPECT_EQ(pool.ref().v_base, nullptr);
    const std::byte* base = hbm->LayerBase(0);
    // One plane: the kv-split layout is the layer-first one.
    const bool layer_first = layout != HbmLayout::kBlockFirst;
    // Slot 4, layer 2, token 1: layer-first 2 * 5 * 36 + 4 * 36 + 12, block-first 4 * 108 +
    // 2 * 36 + 12.
    EXPECT_EQ(KvAddress(pool, 4, 2, KvPlane::kK, 1) - base,
              layer_first ? 360 + 144 + 12 : 432 + 72 + 12);
    EXPECT_EQ(KvAddress(pool, 1, 0, KvPlane::kK, 2) - base, layer_first ? 36 + 24 : 108 + 24);
  }
}

// The helper gives what the hand-written walks computed, for every (slot, layer, plane, token,
// head), and those pieces tile the pool: each byte belongs to exactly one.
TEST(DeviceBlockTableTest, AddressesEqualTheStrideWalkAndTileThePool) {
  for (const KvGeometry& g : {Mha(), Mla()}) {
    for (HbmLayout layout : kLayouts) {
      SCOPED_TRACE(absl::StrCat(g.ToString(), " ", HbmLayoutName(layout)));
      std::unique_ptr<EmulatedHbm> hbm = MakeHbm(g, layout);
      ASSERT_NE(hbm, nullptr);
      const DevicePoolView pool = *hbm->device_pool();
      const KvPoolRef ref = pool.ref();
      const std::byte* base = hbm->LayerBase(0);
      const int heads = g.attention() == AttentionKind::kMla ? 1 : g.num_kv_heads();
      const int64_t piece_bytes = pool.token_stride_bytes / heads;
      std::vector<int> covered(static_cast<size_t>(kSlots * g.bytes_per_block()), 0);
      for (int32_t slot = 0; slot < kSlots; ++slot) {
        for (int l = 0; l < g.num_layers(); ++l) {
          for (int p = 0; p < g.kv_planes(); ++p) {
            const KvPlane plane = p == 0 ? KvPlane::kK : KvPlane::kV;
            for (int t = 0; t < g.tokens_per_block(); ++t) {
              for (int h = 0; h < heads; ++h) {
                auto* old = static_cast<std::byte*>(p == 0 ? pool.k_base[l] : pool.v_base[l]) +
                            int64_t{slot} * pool.block_stride_bytes +
                            int64_t{t} * pool.token_stride_bytes +
                            int64_t{h} * pool.head_stride_bytes;
                std::byte* at = KvAddress(pool, slot, l, plane, t, h);
                ASSERT_EQ(at, old) << slot << " " << l << " " << p << " " << t << " " << h;
                ASSERT_EQ(KvAddress(ref, slot, l, plane, t, h), old);
                ASSERT_GE(at - base, 0);
                ASSERT_LE(at - base + piece_bytes, static_cast<int64_t>(covered.size()));
                for (int64_t b = 0; b < piece_bytes; ++b) ++covered[at - base + b];
              }
            }
          }
        }
      }
      EXPECT_THAT(covered, ::testing::Each(1));
    }
  }
}

// The tier's own copy path puts a block's bytes (host order [layer][plane][token][head][dim]) where
// the helper says they are.
TEST(DeviceBlockTableTest, AddressesFindTheBytesTheTierWrote) {
  const KvGeometry g = Mha();
  for (HbmLayout layout : kLayouts) {
    SCOPED_TRACE(HbmLayoutName(layout));
    std::unique_ptr<EmulatedHbm> hbm = MakeHbm(g, layout);
    ASSERT_NE(hbm, nullptr);
    std::vector<std::byte> block(static_cast<size_t>(g.bytes_per_block()));
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<std::byte>(i * 7 + 1);
    const SlotId slot(3);
    KVTIER_ASSERT_OK(hbm->WriteBlock(slot, BlockKey{1, 2}, block).Wait());
    const DevicePoolView pool = *hbm->device_pool();
    const int64_t head_bytes = int64_t{g.head_dim()} * KvDtypeBytes(g.dtype());
    int64_t host = 0;
    for (int l = 0; l < g.num_layers(); ++l) {
      for (KvPlane plane : {KvPlane::kK, KvPlane::kV}) {
        for (int t = 0; t < g.tokens_per_block(); ++t) {
          for (int h = 0; h < g.num_kv_heads(); ++h) {
            const std::byte* at = KvAddress(pool, 3, l, plane, t, h);
            for (int64_t b = 0; b < head_bytes; ++b, ++host) {
              ASSERT_EQ(at[b], block[static_cast<size_t>(host)]) << "host byte " << host;
            }
          }
        }
      }
    }
    EXPECT_EQ(host, g.bytes_per_block());
  }
}

TEST(DeviceBlockTableTest, CheckedAddressIsNullOutsideTheTable) {
  std::unique_ptr<EmulatedHbm> hbm = MakeHbm(Mha(), HbmLayout::kBlockFirst);
  ASSERT_NE(hbm, nullptr);
  DeviceBlockTable table;
  table.slots = {4, -1, 2};
  table.first_block = 1;  // positions [3, 12)
  table.tokens_per_block = 3;
  table.tokens_in_last_block = 3;
  table.pool = *hbm->device_pool();
  const DevicePoolView& pool = table.pool;

  EXPECT_EQ(CheckedKvAddress(table, 3, 0, KvPlane::kK), KvAddress(pool, 4, 0, KvPlane::kK, 0));
  EXPECT_EQ(CheckedKvAddress(table, 5, 1, KvPlane::kV, 1),
            KvAddress(pool, 4, 1, KvPlane::kV, 2, 1));
  EXPECT_EQ(CheckedKvAddress(table, 10, 1, KvPlane::kK, 1),
            KvAddress(pool, 2, 1, KvPlane::kK, 1, 1));
  EXPECT_EQ(CheckedKvAddress(table, -1, 0, KvPlane::kK), nullptr);
  EXPECT_EQ(CheckedKvAddress(table, 2, 0, KvPlane::kK), nullptr) << "before the table";
  EXPECT_EQ(CheckedKvAddress(table, 6, 0, KvPlane::kK), nullptr) << "not resident";
  EXPECT_EQ(CheckedKvAddress(table, 12, 0, KvPlane::kK), nullptr) << "past the table";
  EXPECT_EQ(CheckedKvAddress(table, 3, 2, KvPlane::kK), nullptr) << "layer";
  EXPECT_EQ(CheckedKvAddress(table, 3, -1, KvPlane::kK), nullptr) << "layer";
  EXPECT_EQ(CheckedKvAddress(table, 3, 0, KvPlane::kK, 2), nullptr) << "head";
  EXPECT_EQ(CheckedKvAddress(table, 3, 0, KvPlane::kK, -1), nullptr) << "head";
  table.tokens_per_block = 0;
  EXPECT_EQ(CheckedKvAddress(table, 3, 0, KvPlane::kK), nullptr);

  std::unique_ptr<EmulatedHbm> mla = MakeHbm(Mla(), HbmLayout::kLayerFirst);
  ASSERT_NE(mla, nullptr);
  table.tokens_per_block = 3;
  table.pool = *mla->device_pool();
  EXPECT_EQ(CheckedKvAddress(table, 4, 2, KvPlane::kK),
            KvAddress(table.pool, 4, 2, KvPlane::kK, 1));
  EXPECT_EQ(CheckedKvAddress(table, 4, 2, KvPlane::kV), nullptr) << "MLA has no V";
  EXPECT_EQ(CheckedKvAddress(table, 4, 2, KvPlane::kK, 1), nullptr) << "MLA has one head";
}

// A pool shape with no addresses (what KvCache::Create compares a tier's pool with) keeps null
// bases for K and V: offsetting a null pointer to V's plane is undefined behaviour (UBSan stopped
// the fuzzer at it), and a non-null V of a null K would pass for an address. Its strides are
// those of the pool with addresses.
TEST(DeviceBlockTableTest, APoolViewWithoutAddressesKeepsEveryBaseNull) {
  for (HbmLayout layout : kLayouts) {
    SCOPED_TRACE(HbmLayoutName(layout));
    const KvGeometry g = Mha();
    const DevicePoolView shape = internal::MakeDevicePoolView(
        g, layout, kSlots, [](int) -> void* { return nullptr; }, /*host_accessible=*/false);
    ASSERT_EQ(shape.k_base.size(), 2u);
    ASSERT_EQ(shape.v_base.size(), 2u);
    EXPECT_THAT(shape.k_base, Each(IsNull()));
    EXPECT_THAT(shape.v_base, Each(IsNull()));
    KVTIER_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<EmulatedHbm> real,
        EmulatedHbm::Create(g, {.layout = layout, .capacity_blocks = kSlots}));
    const DevicePoolView pool = *real->device_pool();
    EXPECT_EQ(shape.block_stride_bytes, pool.block_stride_bytes);
    EXPECT_EQ(shape.token_stride_bytes, pool.token_stride_bytes);
    EXPECT_EQ(shape.head_stride_bytes, pool.head_stride_bytes);
  }
}

// An engine's own tensors registered as the pool (EmulatedHbmOptions::external_pool), in every
// layout: a block written through the tier lands in them where the addresses say, and a pool of
// the wrong shape is refused.
TEST(DeviceBlockTableTest, RegisteredTensorsAreThePool) {
  const KvGeometry g = Mha();
  for (HbmLayout layout : kLayouts) {
    SCOPED_TRACE(HbmLayoutName(layout));
    const bool one_tensor = layout == HbmLayout::kBlockFirst;
    const size_t tensors = one_tensor ? 1 : static_cast<size_t>(g.num_layers());
    const int64_t tensor_bytes = one_tensor ? kSlots * g.bytes_per_block()
                                            : kSlots * g.bytes_per_block_per_layer();
    std::vector<std::vector<std::byte>> engine(tensors,
                                               std::vector<std::byte>(tensor_bytes));
    std::vector<void*> pointers;
    for (auto& t : engine) pointers.push_back(t.data());
    auto hbm = EmulatedHbm::Create(
        g, {.layout = layout, .capacity_blocks = kSlots, .external_pool = pointers});
    ASSERT_TRUE(hbm.ok()) << hbm.status();
    std::vector<std::byte> block(static_cast<size_t>(g.bytes_per_block()));
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<std::byte>(i * 5 + 3);
    KVTIER_ASSERT_OK((*hbm)->WriteBlock(SlotId(2), BlockKey{4, 4}, block).Wait());
    const DevicePoolView pool = *(*hbm)->device_pool();
    const int64_t head_bytes = int64_t{g.head_dim()} * KvDtypeBytes(g.dtype());
    int64_t host = 0;
    for (int l = 0; l < g.num_layers(); ++l) {
      const std::vector<std::byte>& tensor = engine[one_tensor ? 0 : static_cast<size_t>(l)];
      for (KvPlane plane : {KvPlane::kK, KvPlane::kV}) {
        for (int t = 0; t < g.tokens_per_block(); ++t) {
          for (int h = 0; h < g.num_kv_heads(); ++h) {
            const std::byte* at = KvAddress(pool, 2, l, plane, t, h);
            ASSERT_GE(at, tensor.data());
            ASSERT_LE(at + head_bytes, tensor.data() + tensor.size());
            for (int64_t b = 0; b < head_bytes; ++b, ++host) {
              ASSERT_EQ(at[b], block[static_cast<size_t>(host)]) << "host byte " << host;
            }
          }
        }
      }
    }
    std::vector<std::byte> back(block.size());
    KVTIER_ASSERT_OK((*hbm)->ReadBlock(SlotId(2), BlockKey{4, 4}, absl::MakeSpan(back)).Wait());
    EXPECT_TRUE(back == block);
    EXPECT_THAT(EmulatedHbm::Create(g, {.layout = layout,
                                        .capacity_blocks = kSlots,
                                        .external_pool = {pointers[0], pointers[0], pointers[0]}}),
                IsError(absl::StatusCode::kInvalidArgument, "external_pool has 3 pointers"));
    std::vector<void*> with_null = pointers;
    with_null.back() = nullptr;
    EXPECT_THAT(EmulatedHbm::Create(
                    g, {.layout = layout, .capacity_blocks = kSlots, .external_pool = with_null}),
                IsError(absl::StatusCode::kInvalidArgument, "is null"));
  }
}

}  // namespace
}  // namespace kvtier
