// The sequence table: live sequences (seqs) by id, and the memory of recently released ids so
// that a call on one says "released" rather than "unknown".
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cache/kv_cache_impl.h"

namespace kvtier {

namespace {

using internal::SeqName;

}  // namespace

absl::StatusOr<KvCache::Impl::Sequence*> KvCache::Impl::FindSeq(SequenceId id) {
  auto it = seqs.find(id);
  if (it != seqs.end()) return it->second.get();
  if (released_ids.contains(id)) {
    return absl::FailedPreconditionError(absl::StrCat(SeqName(id), " was released"));
  }
  return absl::NotFoundError(absl::StrCat(SeqName(id), " is unknown"));
}

bool KvCache::Impl::RepointBlock(Sequence& seq, int64_t i, Tier t, SlotId slot) {
  if (!AcquireRef(t, slot).ok()) return false;
  const SeqBlock old = seq.blocks[static_cast<size_t>(i)];
  seq.blocks[static_cast<size_t>(i)] = SeqBlock{t, slot};
  DropRef(old);
  return true;
}

}  // namespace kvtier
