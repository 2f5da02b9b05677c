// A stand-in for KV memory in tests: each slot stores, per token position, the token id whose KV
// it holds. The page table and the "kernel" (WriteNewTokens) never touch each other's data, so a
// slot shared by mistake shows up as one sequence reading another's tokens.
#ifndef KVTIER_TESTS_TESTING_SLOT_TOKEN_STORE_H_
#define KVTIER_TESTS_TESTING_SLOT_TOKEN_STORE_H_

#include <cstdint>
#include <vector>

#include "kvtier/page_table.h"

namespace kvtier::testing {

class SlotTokenStore {
 public:
  static constexpr int32_t kUnwritten = -1;

  SlotTokenStore(int64_t capacity_blocks, int tokens_per_block)
      : tokens_per_block_(tokens_per_block),
        data_(static_cast<size_t>(capacity_blocks * tokens_per_block), kUnwritten) {}

  int32_t& at(SlotId slot, int offset) {
    return data_[static_cast<size_t>(slot.value()) * tokens_per_block_ + offset];
  }

  // What the engine does with a BlockCopy.
  void Copy(const BlockCopy& c) {
    for (int i = 0; i < c.num_tokens; ++i) at(c.dst, i) = at(c.src, i);
  }

  // What the attention kernel does for tokens [from, num_tokens) of a table: write their KV
  // into the slots the table maps them to.
  void WriteTokens(const PageTable& table, int64_t from) {
    for (int64_t p = from; p < table.num_tokens(); ++p) {
      at(table.block_table()[p / tokens_per_block_], static_cast<int>(p % tokens_per_block_)) =
          table.tokens()[p];
    }
  }

  // The token ids the table's slots hold, position by position.
  std::vector<int32_t> ReadBack(const PageTable& table) {
    std::vector<int32_t> out;
    for (int64_t p = 0; p < table.num_tokens(); ++p) {
      out.push_back(at(table.block_table()[p / tokens_per_block_],
                       static_cast<int>(p % tokens_per_block_)));
    }
    return out;
  }

 private:
  int tokens_per_block_;
  std::vector<int32_t> data_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_SLOT_TOKEN_STORE_H_
