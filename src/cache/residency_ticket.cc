// ResidencyTicket's accessors (kv_cache.h): read-only views of the shared ticket state.
#include "cache/ticket_state.h"
#include "kvtier/kv_cache.h"

namespace kvtier {

uint64_t ResidencyTicket::id() const { return state_ ? state_->id : 0; }
SequenceId ResidencyTicket::sequence() const { return state_ ? state_->sequence : SequenceId(); }
int64_t ResidencyTicket::begin_token() const { return state_ ? state_->begin : 0; }
int64_t ResidencyTicket::end_token() const { return state_ ? state_->end : 0; }

const DeviceBlockTable& ResidencyTicket::block_table() const {
  static const DeviceBlockTable* const kEmpty = new DeviceBlockTable();
  return state_ ? state_->table : *kEmpty;
}

Completion ResidencyTicket::completion() const {
  return state_ ? state_->done
                : Completion::Done(absl::InvalidArgumentError("an invalid residency ticket"));
}

std::vector<BlockResidency> ResidencyTicket::block_status() const {
  if (!state_) return {};
  internal::MutexLock lock(&state_->mu);
  return state_->status;
}

absl::Status ResidencyTicket::block_error(int64_t index) const {
  if (!state_) return absl::InvalidArgumentError("an invalid residency ticket");
  internal::MutexLock lock(&state_->mu);
  if (index < 0 || index >= static_cast<int64_t>(state_->status.size())) {
    return absl::OutOfRangeError("block index outside the ticket");
  }
  if (state_->status[static_cast<size_t>(index)] == BlockResidency::kResident) {
    return absl::OkStatus();
  }
  auto it = state_->errors.find(index);
  if (it != state_->errors.end()) return it->second;
  return absl::UnavailableError("the block is still being onboarded");
}

int64_t ResidencyTicket::resident_tokens() const {
  if (!state_) return 0;
  internal::MutexLock lock(&state_->mu);
  const int64_t b = state_->table.tokens_per_block;
  int64_t leading = 0;
  while (leading < static_cast<int64_t>(state_->status.size()) &&
         state_->status[static_cast<size_t>(leading)] == BlockResidency::kResident) {
    ++leading;
  }
  const int64_t covered_end = (state_->table.first_block + leading) * b;
  return std::max<int64_t>(0, std::min(covered_end, state_->end) - state_->begin);
}

}  // namespace kvtier
