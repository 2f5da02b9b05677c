// PageTable: one sequence's map from logical block index to a slot of one tier (PagedAttention's
// block table, Kwon et al., SOSP 2023). It owns one reference on every slot it lists, keeps the
// sequence's token ids (so full blocks can be keyed and forks copied), and follows the slot
// lifecycle of BlockAllocator:
//
//   * every block but the last is full and kSealed (immutable, shareable);
//   * the last block is either full (kSealed) or partial: kWritable, private to this sequence.
//     A partial block goes partial -> sealed exactly once, when its last token is appended.
//
// The table moves no KV bytes. Where a new slot must start as a copy of another (fork or
// truncate into the middle of a block), it returns a BlockCopy the caller performs before the
// attention kernel reads the new slot.
//
// Thread-safety: thread-compatible; one table is used by one thread at a time, and the tables
// sharing an allocator need external synchronization (the allocator is not thread-safe).
// Ownership: the BlockAllocator must outlive every table created on it.
#ifndef KVTIER_PAGE_TABLE_H_
#define KVTIER_PAGE_TABLE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/block_allocator.h"
#include "kvtier/ids.h"

namespace kvtier {

// The caller must copy the KV of the first `num_tokens` token positions of slot `src` into slot
// `dst` (same tier), all layers, before the attention kernel reads `dst`, and must issue it before
// anything that could free `src`: a Release or Truncate of the table holding it, or an Evict
// (the engine enqueues it on its copy stream at once; stream order then protects `src`, as with
// vLLM's copy-on-write pairs).
struct BlockCopy {
  SlotId src;
  SlotId dst;
  int num_tokens = 0;  // in [1, tokens_per_block)
};

// What Append changed. Blocks [first_sealed_block, first_sealed_block + num_sealed_blocks) became
// full and kSealed: the caller keys them (PrefixHasher) and may publish them (BlockIndex).
struct AppendResult {
  int64_t first_sealed_block = 0;
  int64_t num_sealed_blocks = 0;
  int64_t num_new_slots = 0;  // slots allocated by this call
};

class PageTable;

struct ForkResult {
  std::unique_ptr<PageTable> child;
  std::optional<BlockCopy> copy;  // set when the fork point is inside a block
};

class PageTable {
 public:
  // An empty table for `sequence`, allocating from `allocator` (not owned; must outlive it).
  // Errors: kInvalidArgument for a null allocator, an invalid sequence id or tokens_per_block
  // outside [1, 65536].
  static absl::StatusOr<std::unique_ptr<PageTable>> Create(SequenceId sequence,
                                                          BlockAllocator* allocator,
                                                          int tokens_per_block);

  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;
  // Releases every reference still held (as Release()).
  ~PageTable();

  // Appends `tokens` after the last token: fills the partial last block, allocates writable slots
  // for the rest, and seals every block that becomes full. All or nothing.
  // Errors: kFailedPrecondition after Release(); kResourceExhausted when the allocator has fewer
  // free slots than the new blocks need (nothing changes; the caller evicts and retries).
  absl::StatusOr<AppendResult> Append(absl::Span<const int32_t> tokens);

  // Appends one full block that is already cached in `slot` of `tier` (a prefix hit, e.g. a
  // BlockLocation from BlockIndex::Match): takes a reference on it (kCached -> kSealed or one more
  // holder of a kSealed slot). The caller guarantees `tokens` are the block's tokens (its key).
  // Errors: kFailedPrecondition after Release() or while the last block is partial;
  // kInvalidArgument if `tier` is not the allocator's tier (a block cached in a lower tier must
  // be onboarded first) or tokens.size() != tokens_per_block; the allocator's errors for `slot`
  // (kInvalidArgument out of range, kFailedPrecondition if not kSealed or kCached,
  // kResourceExhausted at BlockAllocator::kMaxRefCount holders). On error nothing changes.
  absl::Status AppendCachedBlock(Tier tier, SlotId slot, absl::Span<const int32_t> tokens);

  // A new table `child` holding this table's first `num_tokens` tokens. Full blocks are shared
  // (one more reference each); a partial last block gets a fresh writable slot and a BlockCopy
  // (copy-on-write: appends to either table never change the other's blocks).
  // Errors: kFailedPrecondition after Release(); kOutOfRange if num_tokens < 0 or >
  // num_tokens(); kResourceExhausted if no slot is free for the copy or a shared block is at
  // BlockAllocator::kMaxRefCount holders (nothing changes).
  absl::StatusOr<ForkResult> Fork(SequenceId child, int64_t num_tokens);

  // Drops every token from position `num_tokens` on. Blocks wholly past it are released. If the
  // new last block is partial and was sealed (shared, immutable), it is replaced by a fresh
  // writable slot and the returned BlockCopy; the sealed block stays with its other holders.
  // The copy reuses the table's own partial last block when that block is dropped, so a
  // truncate needs a free slot only when it ends inside the (sealed) last block.
  // Errors: kFailedPrecondition after Release(); kOutOfRange if num_tokens < 0 or >
  // num_tokens(); kResourceExhausted if the copy needs a slot and none is free (nothing changes).
  absl::StatusOr<std::optional<BlockCopy>> Truncate(int64_t num_tokens);

  // Releases every slot reference (last block first) and empties the table. Sealed blocks whose
  // last holder this was become kCached; the private partial block becomes kFree.
  // Errors: kFailedPrecondition on a second call.
  absl::Status Release();

  // The slot of logical block `block_index`.
  // Errors: kFailedPrecondition after Release(); kOutOfRange outside [0, num_blocks()).
  absl::StatusOr<SlotId> SlotForBlock(int64_t block_index) const;

  SequenceId sequence() const { return sequence_; }
  int tokens_per_block() const { return tokens_per_block_; }
  bool released() const { return released_; }
  // Slot of every block, index = logical block index; num_blocks() entries.
  absl::Span<const SlotId> block_table() const { return slots_; }
  absl::Span<const int32_t> tokens() const { return tokens_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_blocks() const { return static_cast<int64_t>(slots_.size()); }
  int64_t num_full_blocks() const { return num_tokens() / tokens_per_block_; }
  // Tokens in the last block, in [1, tokens_per_block]; 0 for an empty table.
  int tokens_in_last_block() const;

 private:
  PageTable(SequenceId sequence, BlockAllocator* allocator, int tokens_per_block)
      : sequence_(sequence), allocator_(allocator), tokens_per_block_(tokens_per_block) {}

  absl::Status CheckLive() const;
  // True if `tokens` points into tokens_ (which an append may reallocate).
  bool AliasesTokens(absl::Span<const int32_t> tokens) const;
  // Releases slots_[from..] (last first) and removes them from the table.
  void ReleaseBlocksFrom(int64_t from);

  SequenceId sequence_;
  BlockAllocator* allocator_;
  int tokens_per_block_;
  bool released_ = false;
  std::vector<SlotId> slots_;
  std::vector<int32_t> tokens_;
};

}  // namespace kvtier

#endif  // KVTIER_PAGE_TABLE_H_
