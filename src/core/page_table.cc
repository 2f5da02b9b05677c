#include "kvtier/page_table.h"

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "internal/strings.h"

namespace kvtier {

using internal::ToAbsl;

absl::StatusOr<std::unique_ptr<PageTable>> PageTable::Create(SequenceId sequence,
                                                            BlockAllocator* allocator,
                                                            int tokens_per_block) {
  if (allocator == nullptr) return absl::InvalidArgumentError("PageTable: allocator is null");
  if (!sequence.valid()) return absl::InvalidArgumentError("PageTable: the sequence id is invalid");
  if (tokens_per_block < 1 || tokens_per_block > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("PageTable: tokens_per_block = ",
                                                   tokens_per_block, " is outside [1, 65536]"));
  }
  return std::unique_ptr<PageTable>(new PageTable(sequence, allocator, tokens_per_block));
}

PageTable::~PageTable() {
  if (!released_) (void)Release();
}

absl::Status PageTable::CheckLive() const {
  if (released_) {
    return absl::FailedPreconditionError(
        absl::StrCat("PageTable: sequence ", sequence_.value(), " was already released"));
  }
  return absl::OkStatus();
}

bool PageTable::AliasesTokens(absl::Span<const int32_t> tokens) const {
  const int32_t* begin = tokens_.data();
  const int32_t* end = begin + tokens_.size();
  return !tokens.empty() && std::less_equal<>()(begin, tokens.data()) &&
         std::less<>()(tokens.data(), end);
}

int PageTable::tokens_in_last_block() const {
  if (tokens_.empty()) return 0;
  const int r = static_cast<int>(num_tokens() % tokens_per_block_);
  return r == 0 ? tokens_per_block_ : r;
}

absl::StatusOr<AppendResult> PageTable::Append(absl::Span<const int32_t> tokens) {
  KVTIER_RETURN_IF_ERROR(CheckLive());
  if (AliasesTokens(tokens)) {  // e.g. Append(tokens()): copy before tokens_ may reallocate
    const std::vector<int32_t> copy(tokens.begin(), tokens.end());
    return Append(copy);
  }
  AppendResult result;
  result.first_sealed_block = num_full_blocks();
  if (tokens.empty()) return result;

  const int64_t b = tokens_per_block_;
  const int64_t new_total = num_tokens() + static_cast<int64_t>(tokens.size());
  const int64_t blocks_needed = (new_total + b - 1) / b - num_blocks();
  // Allocate every new slot before changing anything, so a full tier leaves the table as it was.
  std::vector<SlotId> fresh;
  fresh.reserve(static_cast<size_t>(blocks_needed));
  for (int64_t i = 0; i < blocks_needed; ++i) {
    absl::StatusOr<SlotId> slot = allocator_->Allocate();
    if (!slot.ok()) {
      for (SlotId s : fresh) (void)allocator_->Release(s);  // kWritable -> kFree
      return slot.status();
    }
    fresh.push_back(*slot);
  }
  slots_.insert(slots_.end(), fresh.begin(), fresh.end());
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());

  result.num_new_slots = blocks_needed;
  result.num_sealed_blocks = num_full_blocks() - result.first_sealed_block;
  for (int64_t i = 0; i < result.num_sealed_blocks; ++i) {
    const absl::Status s = allocator_->Seal(slots_[result.first_sealed_block + i]);
    // Every block that just filled was the table's own kWritable slot.
    if (!s.ok()) return absl::InternalError(absl::StrCat("PageTable: ", s.message()));
  }
  return result;
}

absl::Status PageTable::AppendCachedBlock(Tier tier, SlotId slot,
                                         absl::Span<const int32_t> tokens) {
  KVTIER_RETURN_IF_ERROR(CheckLive());
  if (tier != allocator_->tier()) {
    // Slot ids are tier-local: slot 7 of DRAM is not slot 7 of this table's tier.
    return absl::InvalidArgumentError(absl::StrCat(
        "PageTable: sequence ", sequence_.value(), " maps ", ToAbsl(TierName(allocator_->tier())),
        " slots; a block cached in ", ToAbsl(TierName(tier)), " must be onboarded first"));
  }
  if (AliasesTokens(tokens)) {
    const std::vector<int32_t> copy(tokens.begin(), tokens.end());
    return AppendCachedBlock(tier, slot, copy);
  }
  if (num_tokens() % tokens_per_block_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PageTable: sequence ", sequence_.value(), " ends in a partial block (", num_tokens(),
        " tokens); a cached block can only follow full blocks"));
  }
  if (static_cast<int64_t>(tokens.size()) != tokens_per_block_) {
    return absl::InvalidArgumentError(absl::StrCat("PageTable: a cached block has ",
                                                   tokens_per_block_, " tokens, not ",
                                                   tokens.size()));
  }
  // Acquire accepts exactly the kSealed and kCached slots a cached block can be in.
  KVTIER_RETURN_IF_ERROR(allocator_->Acquire(slot));
  slots_.push_back(slot);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return absl::OkStatus();
}

absl::StatusOr<ForkResult> PageTable::Fork(SequenceId child, int64_t num_tokens) {
  KVTIER_RETURN_IF_ERROR(CheckLive());
  if (num_tokens < 0 || num_tokens > this->num_tokens()) {
    return absl::OutOfRangeError(absl::StrCat("PageTable: cannot fork sequence ",
                                              sequence_.value(), " at token ", num_tokens,
                                              "; it has ", this->num_tokens(), " tokens"));
  }
  const int64_t full = num_tokens / tokens_per_block_;
  const int partial = static_cast<int>(num_tokens % tokens_per_block_);

  ForkResult result;
  result.child.reset(new PageTable(child, allocator_, tokens_per_block_));
  PageTable& c = *result.child;
  for (int64_t i = 0; i < full; ++i) {
    if (absl::Status s = allocator_->Acquire(slots_[i]); !s.ok()) {
      c.ReleaseBlocksFrom(0);  // undo; the child is destroyed empty
      return s;
    }
    c.slots_.push_back(slots_[i]);
  }
  if (partial > 0) {
    absl::StatusOr<SlotId> dst = allocator_->Allocate();
    if (!dst.ok()) {
      c.ReleaseBlocksFrom(0);
      return dst.status();
    }
    c.slots_.push_back(*dst);
    result.copy = BlockCopy{.src = slots_[full], .dst = *dst, .num_tokens = partial};
  }
  c.tokens_.assign(tokens_.begin(), tokens_.begin() + num_tokens);
  return result;
}

absl::StatusOr<std::optional<BlockCopy>> PageTable::Truncate(int64_t num_tokens) {
  KVTIER_RETURN_IF_ERROR(CheckLive());
  if (num_tokens < 0 || num_tokens > this->num_tokens()) {
    return absl::OutOfRangeError(absl::StrCat("PageTable: cannot truncate sequence ",
                                              sequence_.value(), " to ", num_tokens,
                                              " tokens; it has ", this->num_tokens()));
  }
  const int64_t keep_blocks = (num_tokens + tokens_per_block_ - 1) / tokens_per_block_;
  const int partial = static_cast<int>(num_tokens % tokens_per_block_);
  std::optional<BlockCopy> copy;
  if (partial > 0) {
    const SlotId last = slots_[keep_blocks - 1];
    KVTIER_ASSIGN_OR_RETURN(const SlotState state, allocator_->state(last));
    if (state == SlotState::kSealed) {
      // A sealed block is immutable: the shortened block continues in a private copy. The
      // table's own writable tail, if it is being dropped, serves as the copy's slot, so a
      // truncate never needs more slots than it frees.
      SlotId dst;
      if (num_blocks() > keep_blocks &&
          allocator_->state(slots_.back()).value_or(SlotState::kFree) == SlotState::kWritable) {
        dst = slots_.back();
        slots_.pop_back();
      } else {
        KVTIER_ASSIGN_OR_RETURN(dst, allocator_->Allocate());
      }
      copy = BlockCopy{.src = last, .dst = dst, .num_tokens = partial};
      ReleaseBlocksFrom(keep_blocks - 1);
      slots_.push_back(dst);
    }
  }
  ReleaseBlocksFrom(keep_blocks);
  tokens_.resize(static_cast<size_t>(num_tokens));
  return copy;
}

absl::Status PageTable::Release() {
  KVTIER_RETURN_IF_ERROR(CheckLive());
  ReleaseBlocksFrom(0);
  tokens_.clear();
  released_ = true;
  return absl::OkStatus();
}

void PageTable::ReleaseBlocksFrom(int64_t from) {
  // Last block first: the leaf of the chain becomes evictable before its parents.
  while (num_blocks() > from) {
    // The table holds exactly one reference on each of its slots, so this cannot fail.
    (void)allocator_->Release(slots_.back());
    slots_.pop_back();
  }
}

absl::StatusOr<SlotId> PageTable::SlotForBlock(int64_t block_index) const {
  KVTIER_RETURN_IF_ERROR(CheckLive());
  if (block_index < 0 || block_index >= num_blocks()) {
    return absl::OutOfRangeError(absl::StrCat("PageTable: block ", block_index,
                                              " is outside [0, ", num_blocks(),
                                              ") of sequence ", sequence_.value()));
  }
  return slots_[block_index];
}

}  // namespace kvtier
