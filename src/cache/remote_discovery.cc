// Remote discovery: where a prompt's local match ends, the cache asks the remote store whether it
// holds the next blocks of the chain (one batched existence probe of a window of keys, under a
// deadline, with the cache lock released), and AttachPrefix indexes the leading blocks found as
// ready remote copies, so they are attached and onboarded like any other tier's. Remote keys
// depend only on the namespace and the block key (RemoteBlockKey), so what another process of
// the namespace, or this one before a restart, wrote is found. A probe that fails or is late
// ends the match; it never fails the call. Owns no state of its own: it changes the index
// (through AddCopy), remote slots and counters.remote_probe.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"

namespace kvtier {

KvCache::Impl::RemoteProbe KvCache::Impl::ProbeAfterMatch(absl::Span<const BlockKey> keys,
                                                          int64_t limit_blocks) {
  RemoteProbe probe;
  limit_blocks = std::min<int64_t>(limit_blocks, static_cast<int64_t>(keys.size()));
  {
    CacheLock lock(*this);
    absl::StatusOr<PrefixMatch> match =
        MatchBlocks(keys, static_cast<int64_t>(keys.size()) * block_tokens);
    if (!match.ok() || match->matched_blocks >= limit_blocks) return probe;
    probe.first_block = match->matched_blocks;
  }
  const int64_t end = std::min<int64_t>(limit_blocks, probe.first_block + remote_probe_window);
  const absl::Span<const BlockKey> window = keys.subspan(
      static_cast<size_t>(probe.first_block), static_cast<size_t>(end - probe.first_block));
  probe.attempted = true;
  const absl::Time start = absl::Now();
  // The tier pointer is immutable after Create; ProbeBlocks is thread-safe.
  absl::StatusOr<std::vector<bool>> found =
      tiers[TierIndex(Tier::kRemote)]->ProbeBlocks(window, start + remote_probe_timeout);
  probe.latency = absl::Now() - start;
  if (found.ok() && found->size() == window.size()) {
    probe.found = *std::move(found);
  } else {
    probe.status = found.ok() ? absl::InternalError("the probe answered the wrong number of keys")
                              : found.status();
  }
  // Keys asked about, kept in the size of `found` even when it failed.
  if (!probe.status.ok()) probe.found.assign(window.size(), false);
  return probe;
}

void KvCache::Impl::NoteProbe(const RemoteProbe& probe, int64_t found_blocks) {
  RemoteProbeStats& s = counters.remote_probe;
  ++s.probes;
  if (!probe.status.ok()) ++s.failures;
  s.keys_probed += static_cast<int64_t>(probe.found.size());
  s.blocks_found += found_blocks;
  const int64_t us = absl::ToInt64Microseconds(probe.latency);
  s.latency_us_total += us;
  s.latency_us_max = std::max(s.latency_us_max, us);
}

void KvCache::Impl::AdoptDiscovered(SequenceId id, uint64_t generation,
                                    absl::Span<const BlockKey> keys, const RemoteProbe& probe,
                                    Deferred& d) {
  const int64_t run = probe.status.ok() ? probe.LeadingFound() : 0;
  NoteProbe(probe, run);
  if (run == 0) return;
  // On error AttachPrefix changes nothing (AttachKeys reports it): nothing is adopted for a
  // sequence released, re-created or filled while the lock was dropped.
  absl::StatusOr<Sequence*> seq = FindSeq(id);
  if (!seq.ok() || (*seq)->generation != generation || !(*seq)->tokens.empty()) return;
  constexpr Tier kR = Tier::kRemote;
  std::vector<BlockKey> added;
  for (int64_t j = 0; j < run; ++j) {
    const int64_t i = probe.first_block + j;
    const BlockKey& key = keys[static_cast<size_t>(i)];
    // Indexed meanwhile (another request computed, onboarded or discovered it): the chain goes
    // on through that copy if it is ready; a block only being written still ends the match.
    if (const std::optional<BlockRecord> rec = IndexedCopies(key); rec.has_value()) {
      if (rec->state(kR) != CopyState::kPending && rec->fastest_ready_tier().has_value()) continue;
      break;
    }
    // This worker's budget of remote blocks: a free slot, or one the tier's eviction frees now
    // (a droppable leaf; the blocks added here are not candidates yet, so never that).
    if (!RoomBelowNow(kR, d)) break;
    SlotId slot;
    if (!Alloc(kR, [&](BlockAllocator& a) {
           absl::StatusOr<SlotId> s = a.AllocateForTransfer();
           if (!s.ok()) return s.status();
           slot = *s;
           return a.CompleteTransfer(slot);  // kCached: readable, held by nobody
         }).ok()) {
      break;
    }
    const BlockKey parent = i == 0 ? kRootBlockKey : keys[static_cast<size_t>(i - 1)];
    if (!tiers[TierIndex(kR)]->AdoptStoredBlock(slot, key).ok() ||
        !AddCopy(key, kR, slot, CopyState::kReady, parent, (*seq)->adapter).ok()) {
      (void)Alloc(kR, [&](BlockAllocator& a) { return a.Evict(slot); });
      break;
    }
    added.push_back(key);
  }
  for (const BlockKey& key : added) UpdateCandidate(key, kR);
  counters.remote_probe.blocks_indexed += static_cast<int64_t>(added.size());
}

}  // namespace kvtier
