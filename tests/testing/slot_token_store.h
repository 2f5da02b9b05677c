// A stand-in for KV bytes in tests: the "kernel" (WriteTokens) stores, at each token position of
// a sequence's HBM blocks, that token's id in the emulated HBM pool (in every layer, plane and
// head, as one token's real KV spans them all), addressed through a ticket's device block table
// as device_block_table.h says; ReadBack reads them the same way. KvCache never writes these
// bytes itself, so a slot shared by mistake shows up as one sequence reading another's tokens,
// and a BlockCopy done wrong (wrong slots, too few tokens) as wrong tokens.
//
// Thread-safety: stateless; the caller holds a ticket on every block it touches (and, for Copy,
// performs the copy before anything could free the source, as kv_cache.h's Fork requires).
#ifndef KVTIER_TESTS_TESTING_SLOT_TOKEN_STORE_H_
#define KVTIER_TESTS_TESTING_SLOT_TOKEN_STORE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kvtier/device_block_table.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_geometry.h"

namespace kvtier::testing {

class SlotTokenStore {
 public:
  static constexpr int32_t kUnreadable = -1;  // a non-resident block, or a position outside it
  // The layers, planes or heads of one token position disagree (a partial copy or write).
  static constexpr int32_t kMixed = -2;

  explicit SlotTokenStore(const KvGeometry& geometry) : geometry_(geometry) {}

  // The token id stored at position `offset` of HBM slot `slot`.
  int32_t At(const DevicePoolView& pool, int32_t slot, int offset) const {
    int32_t first = 0;
    bool have = false;
    for (std::byte* p : Addresses(pool, slot, offset)) {
      int32_t v;
      std::memcpy(&v, p, sizeof(v));
      if (!have) first = v;
      if (have && v != first) return kMixed;
      have = true;
    }
    return have ? first : kUnreadable;
  }

  // What the engine does with a BlockCopy: the KV of token positions [0, num_tokens) of slot
  // `src` into slot `dst`, every layer, plane and head.
  void Copy(const DevicePoolView& pool, const BlockCopy& c) const {
    ASSERT_TRUE(pool.host_accessible);
    const size_t head_bytes = static_cast<size_t>(geometry_.head_dim()) *
                              static_cast<size_t>(KvDtypeBytes(geometry_.dtype()));
    for (int t = 0; t < c.num_tokens; ++t) {
      const std::vector<std::byte*> from = Addresses(pool, static_cast<int32_t>(c.src.value()), t);
      const std::vector<std::byte*> to = Addresses(pool, static_cast<int32_t>(c.dst.value()), t);
      for (size_t i = 0; i < from.size(); ++i) std::memcpy(to[i], from[i], head_bytes);
    }
  }

  // What the attention kernel does for positions [from, tokens.size()) of a sequence whose
  // tokens are `tokens`: writes each token's "KV" into the slot `table` maps its block to.
  // `table` must cover those positions (a ticket's range), every block resident.
  void WriteTokens(const DeviceBlockTable& table, absl::Span<const int32_t> tokens,
                   int64_t from) const {
    ASSERT_TRUE(table.pool.host_accessible);
    for (int64_t p = from; p < static_cast<int64_t>(tokens.size()); ++p) {
      const int32_t slot = SlotOf(table, p);
      ASSERT_GE(slot, 0) << "position " << p << " is not in a resident block of the table";
      for (std::byte* a : Addresses(table.pool, slot, Offset(p))) {
        std::memcpy(a, &tokens[static_cast<size_t>(p)], sizeof(int32_t));
      }
    }
  }

  // The token ids the table's slots hold for positions [first_block * B, num_tokens).
  std::vector<int32_t> ReadBack(const DeviceBlockTable& table, int64_t num_tokens) const {
    std::vector<int32_t> out;
    for (int64_t p = int64_t{table.first_block} * geometry_.tokens_per_block(); p < num_tokens;
         ++p) {
      const int32_t slot = SlotOf(table, p);
      out.push_back(slot < 0 ? kUnreadable : At(table.pool, slot, Offset(p)));
    }
    return out;
  }

 private:
  int Offset(int64_t position) const {
    return static_cast<int>(position % geometry_.tokens_per_block());
  }

  // The table's slot for sequence position `p`; -1 if outside the table or not resident.
  int32_t SlotOf(const DeviceBlockTable& table, int64_t p) const {
    const int64_t i = p / geometry_.tokens_per_block() - table.first_block;
    if (i < 0 || i >= static_cast<int64_t>(table.slots.size())) return -1;
    return table.slots[static_cast<size_t>(i)];
  }

  // The first byte of every (layer, plane, head) run of position `offset` of `slot`.
  std::vector<std::byte*> Addresses(const DevicePoolView& pool, int32_t slot, int offset) const {
    std::vector<std::byte*> out;
    if (!pool.host_accessible || slot < 0) return out;
    const int heads = pool.head_stride_bytes == 0 ? 1 : geometry_.num_kv_heads();
    for (KvPlane plane : {KvPlane::kK, KvPlane::kV}) {
      const size_t layers = (plane == KvPlane::kK ? pool.k_base : pool.v_base).size();
      for (size_t l = 0; l < layers; ++l) {
        for (int h = 0; h < heads; ++h) {
          out.push_back(KvAddress(pool, slot, static_cast<int>(l), plane, offset, h));
        }
      }
    }
    return out;
  }

  KvGeometry geometry_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_SLOT_TOKEN_STORE_H_
