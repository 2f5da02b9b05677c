// BlockIndex: block key -> where copies of that block live. The
// index is how a new request finds its cached prefix: Match() walks the request's chained keys
// and stops at the first block no tier holds (DESIGN section 4: a gap ends the match, because a
// block without its parent can never be used).
//
// The index knows nothing of bytes; tiers know nothing of keys. A copy is kPending while its
// bytes are being written (it cannot be matched yet) and kReady once they are complete.
//
// Thread-safety: thread-compatible. Const methods (Match, Lookup) may run concurrently with
// each other; anything else needs external synchronization.
#ifndef KVTIER_BLOCK_INDEX_H_
#define KVTIER_BLOCK_INDEX_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kvtier/block_key.h"
#include "kvtier/ids.h"

namespace kvtier {

enum class CopyState : uint8_t {
  kAbsent = 0,   // no copy in this tier
  kPending = 1,  // a slot is reserved and being written; not matchable yet
  kReady = 2,    // the bytes are complete and valid
};

// What the index knows of one block: 20 bytes (36 with its key). Use and recency are the
// caller's (KvCache keeps them with the rest of the block's state).
struct BlockRecord {
  std::array<SlotId, kNumTiers> slots;  // per tier (TierIndex), invalid where absent
  uint8_t pending_tiers = 0;            // bit TierIndex(t): a kPending copy in tier t
  uint8_t ready_tiers = 0;              // bit TierIndex(t): a kReady copy in tier t

  // kAbsent also for a tier value that does not exist. Inline, as the next: every match and
  // every attach and release of a block reads them.
  CopyState state(Tier tier) const {
    const int t = TierIndex(tier);
    if (t < 0 || t >= kNumTiers) return CopyState::kAbsent;
    if ((ready_tiers >> t) & 1) return CopyState::kReady;
    if ((pending_tiers >> t) & 1) return CopyState::kPending;
    return CopyState::kAbsent;
  }
  // The fastest tier (smallest Tier value) with a kReady copy, if any.
  std::optional<Tier> fastest_ready_tier() const {
    if (ready_tiers == 0) return std::nullopt;
    // Lowest set bit = smallest Tier value = fastest tier.
    return static_cast<Tier>(std::countr_zero(ready_tiers));
  }
  // Whether some tier has a copy (pending or ready): a record without one is not indexed.
  bool has_copy() const { return (pending_tiers | ready_tiers) != 0; }

  // The record-level halves of BlockIndex's AddCopy, MarkReady and RemoveCopy, with the same
  // checks and errors (`key` only names the block in messages), for a caller that keeps records
  // in its own map. RemoveCopy leaves an empty record (has_copy() false) to the caller.
  absl::Status AddCopy(const BlockKey& key, Tier tier, SlotId slot, CopyState state);
  absl::Status MarkReady(const BlockKey& key, Tier tier);
  absl::Status RemoveCopy(const BlockKey& key, Tier tier);
};

// A ready copy of one matched block.
struct BlockLocation {
  Tier tier = Tier::kHbm;
  SlotId slot;
};

// The longest cached prefix of a query.
struct PrefixMatch {
  int64_t matched_blocks = 0;
  int64_t matched_tokens = 0;  // matched_blocks * tokens_per_block
  // How many matched blocks have their fastest ready copy in each tier (index TierIndex).
  std::array<int64_t, kNumTiers> blocks_by_tier{};
};

// The walk of BlockIndex::Match over any map of records: `lookup(key)` returns the record of
// `key` as a `const BlockRecord*`, nullptr where there is none. Same clamp, results and errors
// as BlockIndex::Match (whose contract this is); `tokens_per_block` must be >= 1.
template <typename Lookup>
absl::StatusOr<PrefixMatch> MatchPrefix(absl::Span<const BlockKey> keys, int64_t query_tokens,
                                        int tokens_per_block, Lookup&& lookup,
                                        std::vector<BlockLocation>* locations = nullptr) {
  if (query_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("BlockIndex: query_tokens = ", query_tokens, " is negative"));
  }
  const int64_t limit =
      std::min(static_cast<int64_t>(keys.size()), query_tokens / tokens_per_block);
  if (locations != nullptr) locations->clear();
  PrefixMatch match;
  for (int64_t i = 0; i < limit; ++i) {
    const BlockRecord* rec = lookup(keys[i]);
    if (rec == nullptr) break;
    const std::optional<Tier> tier = rec->fastest_ready_tier();
    if (!tier.has_value()) break;  // only pending copies: not usable yet
    ++match.blocks_by_tier[TierIndex(*tier)];
    if (locations != nullptr)
      locations->push_back(BlockLocation{*tier, rec->slots[TierIndex(*tier)]});
    ++match.matched_blocks;
  }
  match.matched_tokens = match.matched_blocks * tokens_per_block;
  return match;
}

class BlockIndex {
 public:
  // Errors: kInvalidArgument if tokens_per_block is outside [1, 65536].
  static absl::StatusOr<std::unique_ptr<BlockIndex>> Create(int tokens_per_block);

  // Records a copy of `key` in `tier` at `slot`, in `state` kPending or kReady.
  // Errors: kInvalidArgument for an invalid slot, an out-of-range tier, or state kAbsent;
  // kAlreadyExists if `tier` already has a copy of `key` (a tier holds at most one).
  absl::Status AddCopy(const BlockKey& key, Tier tier, SlotId slot, CopyState state);
  // kPending -> kReady for the copy in `tier`.
  // Errors: kInvalidArgument for an out-of-range tier; kNotFound if `tier` has no copy of `key`;
  // kFailedPrecondition if it is already ready.
  absl::Status MarkReady(const BlockKey& key, Tier tier);
  // Forgets the copy in `tier`; a block with no copy left leaves the index.
  // Errors: kInvalidArgument for an out-of-range tier; kNotFound if `tier` has no copy of `key`.
  absl::Status RemoveCopy(const BlockKey& key, Tier tier);

  // A copy of the record of `key`, or nullopt if no tier holds it.
  std::optional<BlockRecord> Lookup(const BlockKey& key) const;

  // The longest run keys[0..n) with a ready copy in some tier, clamped to the full blocks of the
  // query: n <= min(keys.size(), query_tokens / tokens_per_block). A partial block never counts
  // (case TR-1). No side effects: routers and schedulers may call it freely.
  // If `locations` is not null it is replaced by the fastest ready copy of each matched block.
  // Errors: kInvalidArgument if query_tokens < 0.
  absl::StatusOr<PrefixMatch> Match(absl::Span<const BlockKey> keys, int64_t query_tokens,
                                    std::vector<BlockLocation>* locations = nullptr) const;

  int tokens_per_block() const { return tokens_per_block_; }
  // Blocks with at least one copy.
  int64_t size() const { return static_cast<int64_t>(records_.size()); }

 private:
  explicit BlockIndex(int tokens_per_block) : tokens_per_block_(tokens_per_block) {}

  int tokens_per_block_;
  absl::flat_hash_map<BlockKey, BlockRecord> records_;
};

}  // namespace kvtier

#endif  // KVTIER_BLOCK_INDEX_H_
