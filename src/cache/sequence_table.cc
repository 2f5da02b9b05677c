// The sequence table: live sequences (seqs, next_generation) by id, their blocks as they are
// created, grown (Append), written (ReportWritten), forked and released, the twins (blocks two
// sequences computed at once) until they are settled into one HBM copy, and the memory of recently
// released ids (released_ids, released_order, next_release) so that a call on one says "released"
// rather than "unknown".
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "internal/status_macros.h"

namespace kvtier {
namespace {

using internal::SeqName;

// Released ids remembered, so that a call on one is told "released" rather than "unknown".
constexpr size_t kReleasedIdsRemembered = 65536;

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

absl::Status KvCache::Impl::AddSequence(std::unique_ptr<Sequence> seq) {
  const SequenceId id = seq->id;
  if (seqs.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat(SeqName(id), " already exists"));
  }
  InsertSequence(std::move(seq));
  return absl::OkStatus();
}

void KvCache::Impl::InsertSequence(std::unique_ptr<Sequence> seq) {
  const SequenceId id = seq->id;
  released_ids.erase(id);
  seq->generation = next_generation++;
  seq->adapter = AdapterIndex(seq->options.adapter);
  seqs[id] = std::move(seq);
}

absl::StatusOr<KvAppendResult> KvCache::Impl::AppendTokens(SequenceId id,
                                                           absl::Span<const int32_t> tokens,
                                                           RoomWait wait, Deferred& d) {
  const int64_t b_tokens = block_tokens;
  KvAppendResult result;
  for (int round = 0;; ++round) {
    KVTIER_ASSIGN_OR_RETURN(Sequence * seq, FindSeq(id));
    const int64_t old_n = static_cast<int64_t>(seq->tokens.size());
    const int64_t new_n = old_n + static_cast<int64_t>(tokens.size());
    if (new_n > PrefixHasher::kMaxPosition) {
      return absl::InvalidArgumentError(
          absl::StrCat("Append: ", SeqName(id), " would hold ", new_n, " tokens"));
    }
    const int64_t need = geometry.BlocksForTokens(new_n) - static_cast<int64_t>(seq->blocks.size());
    if (need > 0 && FreeBlocks(Tier::kHbm) < need) {
      if (round > 0) {
        // Someone took the room while the lock was dropped; try once more, then give up.
        if (round > 2) {
          return absl::ResourceExhaustedError("Append: HBM room was taken by other calls");
        }
      }
      absl::Status room = MakeHbmRoom(need, absl::Now() + room_wait, d, wait);
      if (!room.ok()) {
        DeferredRelease(d);
        return room;
      }
      continue;  // the lock may have been dropped: look everything up again
    }
    // Key the blocks this append fills before changing anything. Only the partial tail and
    // the new tokens are hashed: a decode step costs one block's hashing, not the sequence's.
    const int64_t have = static_cast<int64_t>(seq->keys.size());
    std::vector<int32_t> tail(seq->tokens.begin() + have * b_tokens, seq->tokens.end());
    tail.insert(tail.end(), tokens.begin(), tokens.end());
    std::vector<BlockKey> added;
    KVTIER_RETURN_IF_ERROR(hasher.AppendBlockKeys(have == 0 ? kRootBlockKey : seq->keys.back(),
                                                  have * b_tokens, tail, seq->extras, &added));
    std::vector<SlotId> fresh;
    absl::Status alloc = Alloc(Tier::kHbm, [&](BlockAllocator& a) -> absl::Status {
      for (int64_t i = 0; i < need; ++i) {
        auto s = a.Allocate();
        if (!s.ok()) {
          for (SlotId f : fresh) (void)a.Release(f);
          fresh.clear();
          return s.status();
        }
        fresh.push_back(*s);
      }
      return absl::OkStatus();
    });
    if (!alloc.ok()) {
      if (round > 2) return alloc;
      continue;
    }
    DropCopySources(*seq);
    for (SlotId s : fresh) {
      tiers[0]->BeginDeviceWrite(s);
      seq->blocks.push_back(SeqBlock{Tier::kHbm, s});
      ++seq_refs[s.value()];
    }
    seq->tokens.insert(seq->tokens.end(), tokens.begin(), tokens.end());
    const int64_t old_full = old_n / b_tokens;
    const int64_t new_full = new_n / b_tokens;
    for (int64_t j = old_full; j < new_full; ++j) {
      const SlotId s = seq->blocks[static_cast<size_t>(j)].slot;
      (void)Alloc(Tier::kHbm, [&](BlockAllocator& a) { return a.Seal(s); });
    }
    seq->keys.insert(seq->keys.end(), added.begin(), added.end());
    result.first_sealed_block = old_full;
    result.num_sealed_blocks = new_full - old_full;
    result.num_new_slots = need > 0 ? need : 0;
    break;
  }
  DeferredRelease(d);
  return result;
}

absl::Status KvCache::Impl::PublishWritten(SequenceId id, int64_t num_tokens, Completion ready,
                                           Deferred& d) {
  KVTIER_ASSIGN_OR_RETURN(Sequence * seq, FindSeq(id));
  const int64_t n = static_cast<int64_t>(seq->tokens.size());
  if (num_tokens > n) {
    return absl::OutOfRangeError(
        absl::StrCat("ReportWritten: ", num_tokens, " tokens of ", SeqName(id), ", which has ", n));
  }
  if (num_tokens < seq->written) {
    return absl::InvalidArgumentError(absl::StrCat("ReportWritten: ", num_tokens, " tokens of ",
                                                   SeqName(id), " after ", seq->written,
                                                   " were reported written"));
  }
  DropCopySources(*seq);
  const int64_t b_tokens = block_tokens;
  // Slots the kernel writes that no index entry will keep until `ready` fires: every block of a
  // sequence with caching off, and the partial last block (full ones become pending copies or
  // twins below). Held as a ticket pins a slot, so a sequence let go right after this call (the
  // serving loop's order) does not free a slot the GPU may still be writing.
  if (num_tokens > seq->written && !ready.done()) {
    const int64_t first =
        seq->options.enable_caching ? num_tokens / b_tokens : seq->written / b_tokens;
    const int64_t last = (num_tokens + b_tokens - 1) / b_tokens;
    std::vector<SlotId> hold;
    for (int64_t j = first; j < last; ++j) {
      const SeqBlock b = seq->blocks[static_cast<size_t>(j)];
      if (b.tier != Tier::kHbm) continue;
      if (ticket_refs[b.slot.value()]++ == 0) ++locked;
      ++kernel_holds[b.slot.value()];
      hold.push_back(b.slot);
    }
    if (!hold.empty()) d.kernel_holds.emplace_back(ready, std::move(hold));
  }
  if (!seq->options.enable_caching) {  // its blocks stay private (freed when let go)
    seq->written = num_tokens;
    return absl::OkStatus();
  }
  std::vector<std::pair<BlockKey, SlotId>> publish;
  for (int64_t j = seq->written / b_tokens; j < num_tokens / b_tokens; ++j) {
    const SeqBlock b = seq->blocks[static_cast<size_t>(j)];
    const BlockKey key = seq->keys[static_cast<size_t>(j)];
    if (b.tier != Tier::kHbm) continue;
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    const BlockKey parent = j == 0 ? kRootBlockKey : seq->keys[static_cast<size_t>(j - 1)];
    if (rec.has_value() && rec->state(Tier::kHbm) != CopyState::kAbsent) {
      // A twin: settled once `ready` fires (TwinWritten). A slot already listed (a fork sharing
      // it reported first) is settled by that report's `ready`.
      std::vector<Twin>& list = twins[key];
      if (rec->slots[0] != b.slot &&
          std::none_of(list.begin(), list.end(), [&](const Twin& x) { return x.slot == b.slot; })) {
        list.push_back(Twin{b.slot, parent, j * b_tokens});
        publish.emplace_back(key, b.slot);
      }
      if (list.empty()) twins.erase(key);
      continue;
    }
    if (AddCopy(key, Tier::kHbm, b.slot, CopyState::kPending, parent, seq->adapter).ok()) {
      publish.emplace_back(key, b.slot);
    }
  }
  seq->written = num_tokens;
  if (!publish.empty()) d.publish.emplace_back(std::move(ready), std::move(publish));
  return absl::OkStatus();
}

bool KvCache::Impl::UnwrittenTwin(SlotId slot) const {
  for (const auto& [key, list] : twins) {
    for (const Twin& tw : list) {
      if (tw.slot == slot && !tw.written) return true;
    }
  }
  return false;
}

void KvCache::Impl::ForgetTwin(SlotId slot) {
  for (auto it = twins.begin(); it != twins.end();) {
    std::vector<Twin>& list = it->second;
    list.erase(
        std::remove_if(list.begin(), list.end(), [&](const Twin& tw) { return tw.slot == slot; }),
        list.end());
    if (list.empty()) {
      twins.erase(it++);
    } else {
      ++it;
    }
  }
}

bool KvCache::Impl::TwinWritten(const BlockKey& key, SlotId slot, const absl::Status& status) {
  auto it = twins.find(key);
  if (it == twins.end()) return false;
  if (const std::optional<BlockRecord> rec = IndexedCopies(key);
      rec.has_value() && rec->state(Tier::kHbm) != CopyState::kAbsent && rec->slots[0] == slot) {
    return false;  // the indexed copy itself
  }
  auto t = std::find_if(it->second.begin(), it->second.end(),
                        [&](const Twin& x) { return x.slot == slot && !x.written; });
  if (t == it->second.end()) return false;
  if (status.ok()) {
    t->written = true;  // its bytes are final
  } else {
    it->second.erase(t);  // not the block's bytes: it stays private
    SettleSlot(Tier::kHbm, slot);  // freed now if its holders let go while it was written
  }
  SettleTwins(key);
  return true;
}

void KvCache::Impl::SettleTwins(const BlockKey& key) {
  auto it = twins.find(key);
  if (it == twins.end()) return;
  std::vector<Twin> list = std::move(it->second);
  twins.erase(it);
  for (const Twin& tw : list) {
    const std::optional<BlockRecord> rec = IndexedCopies(key);
    const bool copy_pending = rec.has_value() && rec->state(Tier::kHbm) == CopyState::kPending;
    if (tw.written && copy_pending && seq_refs[tw.slot.value()] == 0) {
      // Written, and its sequences let go: it can never become the block (only a holder's twin
      // does, below), so it is freed now (or, under a ticket's pin, when that ends), not when
      // the indexed copy lands (it was a slot cached, unindexed and held by nobody meanwhile).
      SettleSlot(Tier::kHbm, tw.slot);
      continue;
    }
    if (!tw.written || copy_pending) {
      twins[key].push_back(tw);  // settled when it (or the indexed copy) is written
      continue;
    }
    const size_t j = static_cast<size_t>(tw.first_token / block_tokens);
    const bool indexed = rec.has_value() && rec->state(Tier::kHbm) == CopyState::kReady;
    for (auto& [id, seq] : seqs) {
      if (j >= seq->keys.size() || seq->keys[j] != key || seq->blocks[j].tier != Tier::kHbm ||
          seq->blocks[j].slot != tw.slot) {
        continue;
      }
      if (!indexed) {  // the first copy failed or is gone: this one is the block now
        if (AddCopy(key, Tier::kHbm, tw.slot, CopyState::kReady, tw.parent, seq->adapter).ok()) {
          tiers[0]->EndDeviceWrite(tw.slot, key);
          AddUse(blocks[key]);
        }
        break;
      }
      (void)RepointBlock(*seq, static_cast<int64_t>(j), Tier::kHbm, rec->slots[0]);
    }
    // Freed now if no holder is left: they let go while it was written (SettleSlot kept it).
    SettleSlot(Tier::kHbm, tw.slot);
  }
}

absl::StatusOr<std::optional<BlockCopy>> KvCache::Impl::ForkSequence(SequenceId parent,
                                                                     SequenceId child,
                                                                     int64_t num_tokens,
                                                                     RoomWait wait, Deferred& d) {
  const int64_t b_tokens = block_tokens;
  std::optional<BlockCopy> copy;
  for (int round = 0;; ++round) {
    KVTIER_ASSIGN_OR_RETURN(Sequence * p, FindSeq(parent));
    if (seqs.contains(child)) {
      return absl::AlreadyExistsError(absl::StrCat("Fork: ", SeqName(child), " already exists"));
    }
    const int64_t n = static_cast<int64_t>(p->tokens.size());
    if (num_tokens < 0 || num_tokens > n) {
      return absl::OutOfRangeError(
          absl::StrCat("Fork: ", num_tokens, " tokens of ", SeqName(parent), ", which has ", n));
    }
    const int64_t full = num_tokens / b_tokens;
    const int64_t rem = num_tokens % b_tokens;
    if (rem != 0 && p->blocks[static_cast<size_t>(full)].tier != Tier::kHbm) {
      return absl::FailedPreconditionError(
          absl::StrCat("Fork: block ", full, " of ", SeqName(parent),
                       " is not in HBM; make it resident before forking inside it"));
    }
    if (rem != 0 && FreeBlocks(Tier::kHbm) < 1) {
      if (round > 2) return absl::ResourceExhaustedError("Fork: no HBM slot for the copy");
      absl::Status room = MakeHbmRoom(1, absl::Now() + room_wait, d, wait);
      if (!room.ok()) {
        DeferredRelease(d);
        return room;
      }
      continue;
    }
    auto c = std::make_unique<Sequence>();
    c->id = child;
    c->options = p->options;
    c->extras = p->extras;
    c->tokens.assign(p->tokens.begin(), p->tokens.begin() + num_tokens);
    c->keys.assign(p->keys.begin(), p->keys.begin() + full);
    c->written = std::min(p->written, num_tokens);
    for (int64_t i = 0; i < full; ++i) {
      const SeqBlock b = p->blocks[static_cast<size_t>(i)];
      if (absl::Status s = AcquireRef(b.tier, b.slot); !s.ok()) {
        for (const auto& got : c->blocks) DropRef(got);
        return s;
      }
      c->blocks.push_back(b);
    }
    if (rem != 0) {
      SlotId dst;
      absl::Status s = Alloc(Tier::kHbm, [&](BlockAllocator& a) -> absl::Status {
        KVTIER_ASSIGN_OR_RETURN(dst, a.Allocate());
        return absl::OkStatus();
      });
      if (!s.ok()) {
        for (const auto& got : c->blocks) DropRef(got);
        if (round > 2) return s;
        continue;
      }
      tiers[0]->BeginDeviceWrite(dst);
      c->blocks.push_back(SeqBlock{Tier::kHbm, dst});
      ++seq_refs[dst.value()];
      const SeqBlock src = p->blocks[static_cast<size_t>(full)];
      copy = BlockCopy{src.slot, dst, static_cast<int>(rem)};
      // A full (sealed) source stays referenced by the child until the copy is issued (its next
      // call, DropCopySources), as Truncate's: the parent may let go of it meanwhile. The
      // parent's own partial block cannot be shared (one writer); the parent keeps it.
      if (AcquireRef(Tier::kHbm, src.slot).ok()) c->copy_sources.push_back(src);
    }
    InsertSequence(std::move(c));
    break;
  }
  DeferredRelease(d);
  return copy;
}

void KvCache::Impl::DropCopySources(Sequence& seq) {
  if (seq.copy_sources.empty()) return;
  const std::vector<SeqBlock> sources = std::move(seq.copy_sources);
  seq.copy_sources.clear();
  for (const SeqBlock& b : sources) DropRef(b);
}

absl::StatusOr<std::optional<BlockCopy>> KvCache::Impl::TruncateSequence(SequenceId id,
                                                                         int64_t num_tokens,
                                                                         RoomWait wait,
                                                                         Deferred& d) {
  const int64_t b_tokens = block_tokens;
  for (int round = 0;; ++round) {
    KVTIER_ASSIGN_OR_RETURN(Sequence * seq, FindSeq(id));
    const int64_t n = static_cast<int64_t>(seq->tokens.size());
    if (num_tokens < 0 || num_tokens > n) {
      return absl::OutOfRangeError(
          absl::StrCat("Truncate: to ", num_tokens, " tokens, but ", SeqName(id), " has ", n));
    }
    const int64_t full = num_tokens / b_tokens;
    const int64_t rem = num_tokens % b_tokens;
    // The cut falls inside a block that is full now (sealed, perhaps shared): its first `rem`
    // positions go to a fresh writable slot, as Fork's copy-on-write.
    const bool copy = rem != 0 && full < static_cast<int64_t>(seq->keys.size());
    if (copy && seq->blocks[static_cast<size_t>(full)].tier != Tier::kHbm) {
      return absl::FailedPreconditionError(
          absl::StrCat("Truncate: block ", full, " of ", SeqName(id),
                       " is not in HBM; make it resident before cutting inside it"));
    }
    if (copy && FreeBlocks(Tier::kHbm) < 1) {
      if (round > 2) return absl::ResourceExhaustedError("Truncate: no HBM slot for the copy");
      absl::Status room = MakeHbmRoom(1, absl::Now() + room_wait, d, wait);
      if (!room.ok()) {
        DeferredRelease(d);
        return room;
      }
      continue;  // the lock may have been dropped: look everything up again
    }
    std::optional<BlockCopy> result;
    SlotId dst;
    if (copy) {
      absl::Status s = Alloc(Tier::kHbm, [&](BlockAllocator& a) -> absl::Status {
        KVTIER_ASSIGN_OR_RETURN(dst, a.Allocate());
        return absl::OkStatus();
      });
      if (!s.ok()) {
        if (round > 2) return s;
        continue;
      }
    }
    DropCopySources(*seq);
    const size_t keep = static_cast<size_t>(geometry.BlocksForTokens(num_tokens) - (copy ? 1 : 0));
    std::vector<SeqBlock> cut(seq->blocks.begin() + static_cast<std::ptrdiff_t>(keep),
                              seq->blocks.end());
    seq->blocks.resize(keep);
    if (copy) {
      const SeqBlock src = cut.front();
      cut.erase(cut.begin());
      seq->copy_sources.push_back(src);  // its reference, kept until the copy is issued
      tiers[0]->BeginDeviceWrite(dst);
      seq->blocks.push_back(SeqBlock{Tier::kHbm, dst});
      ++seq_refs[dst.value()];
      result = BlockCopy{src.slot, dst, static_cast<int>(rem)};
    }
    seq->tokens.resize(static_cast<size_t>(num_tokens));
    seq->keys.resize(static_cast<size_t>(full));
    seq->written = std::min(seq->written, num_tokens);
    for (auto it = cut.rbegin(); it != cut.rend(); ++it) DropRef(*it);  // last block first
    DeferredRelease(d);
    return result;
  }
}

absl::Status KvCache::Impl::ReleaseSequence(SequenceId id, const ReleaseHints& hints) {
  KVTIER_ASSIGN_OR_RETURN(Sequence * seq, FindSeq(id));
  DropCopySources(*seq);
  if (hints.preempted) ++counters.preemptions;
  const absl::Time now = Now();
  ObserveRelease(*seq, hints.stop_reason, hints.expected_idle, now, hints.last_turn,
                 hints.preempted);
  const absl::Time until = seq->options.retention == absl::InfiniteDuration()
                               ? absl::InfiniteFuture()
                               : now + seq->options.retention;
  // Every reference is let go under one acquisition of the engine's lock; then, last block
  // first, each block is touched and its slot settled, in DropRef's order.
  std::vector<std::optional<SlotState>> after(seq->blocks.size());
  ReleaseRefs(seq->blocks, absl::MakeSpan(after));
  // Each block's entry found first, in one tight pass (the cache misses overlap), then used for
  // the touch and the settle: from the slot's owner where the held copy is the indexed one
  // (no lookup), else by key (a private copy).
  std::vector<BlockMap::value_type*> found(seq->keys.size(), nullptr);
  for (size_t i = 0; i < found.size(); ++i) {
    const SeqBlock& b = seq->blocks[i];
    const SlotOwner& o = owner[TierIndex(b.tier)][b.slot.value()];
    if (o.indexed() && o.key == seq->keys[i]) {
      found[i] = o.entry;
    } else if (auto m = blocks.find(seq->keys[i]); m != blocks.end()) {
      found[i] = &*m;
    }
  }
  for (size_t i = seq->blocks.size(); i-- > 0;) {
    BlockMap::value_type* entry = i < found.size() ? found[i] : nullptr;
    // A caching-off sequence read none of the cached blocks its keys name (other requests'):
    // its release neither touches nor retains them.
    if (entry != nullptr && seq->options.enable_caching) {
      BlockEntry& m = entry->second;
      m.set_last_use(now);  // in use until now
      if (seq->options.retention_priority > 0) {
        ColdFields& c = MutableCold(m);
        c.retention_priority = seq->options.retention_priority;
        c.priority_until = until;
      }
      TouchCandidates(*entry);
    }
    if (after[i].has_value()) {
      SettleSlot(seq->blocks[i].tier, seq->blocks[i].slot, *after[i], entry);
    }
  }
  seqs.erase(id);
  const uint64_t serial = next_release++;
  released_ids[id] = serial;
  released_order.emplace_back(id, serial);
  while (released_order.size() > kReleasedIdsRemembered) {
    const auto [old_id, old_serial] = released_order.front();
    auto it = released_ids.find(old_id);
    if (it != released_ids.end() && it->second == old_serial) released_ids.erase(it);
    released_order.pop_front();
  }
  return absl::OkStatus();
}

}  // namespace kvtier
