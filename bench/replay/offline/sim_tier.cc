// SimTier (sim_tier.h): one simulated tier under KvCache's candidacy rule.
#include "bench/replay/offline/sim_tier.h"

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvtier/eviction_candidacy.h"

namespace kvtier::replay {
namespace {

// What KvCache knows of a block, as the simulators have it: no retention priority.
CandidateFacts FactsOf(const SimBlock& b) {
  return CandidateFacts{.uses = b.uses,
                        .parent = b.parent == kSimNoParent ? kRootBlockKey : SimBlockKey(b.parent),
                        .last_use = b.last_use};
}

}  // namespace

BlockKey SimBlockKey(uint32_t key) {
  uint64_t z = key + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return BlockKey{key, z ^ (z >> 31)};
}

absl::Status SimTier::Cache(uint32_t key) {
  SimBlock& b = blocks_[key];
  b.cached = true;
  ++cached_;
  if (b.parent == kSimNoParent) return absl::OkStatus();
  ++blocks_[b.parent].cached_children;
  return Update(b.parent);
}

absl::Status SimTier::Update(uint32_t key) {
  SimBlock& b = blocks_[key];
  const CopyFacts copy{.ready = b.cached, .child_copies = b.cached_children};
  const bool candidate = IsEvictionCandidate(copy, [&b] { return b.pinned; });
  return SyncCandidacy(
      policy_, SimBlockKey(key), candidate, FactsOf(b), block_bytes_,
      [this](const BlockKey& k) -> std::optional<CandidateFacts> {
        return FactsOf(blocks_[static_cast<uint32_t>(k.hi)]);
      },
      &b.registered);
}

absl::StatusOr<uint32_t> SimTier::EvictOne(absl::Time now) {
  const std::optional<BlockKey> victim = policy_.Victim(now);
  if (!victim.has_value()) return absl::InternalError("no victim in a full cache");
  if (victim->hi >= blocks_.size() || *victim != SimBlockKey(static_cast<uint32_t>(victim->hi)) ||
      !blocks_[victim->hi].registered) {
    return absl::InternalError(absl::StrCat("victim ", victim->ToHex(), " is not a candidate"));
  }
  const uint32_t key = static_cast<uint32_t>(victim->hi);
  SimBlock& b = blocks_[key];
  b.cached = false;
  --cached_;
  if (absl::Status s = Update(key); !s.ok()) return s;
  if (b.parent != kSimNoParent) {
    --blocks_[b.parent].cached_children;
    if (absl::Status s = Update(b.parent); !s.ok()) return s;
  }
  return key;
}

}  // namespace kvtier::replay
