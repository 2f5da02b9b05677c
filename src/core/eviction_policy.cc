#include "kvtier/eviction_policy.h"

#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/strings.h"

namespace kvtier {
namespace {

absl::Status CheckTraits(const BlockTraits& t) {
  auto finite_at_least = [](double v, double low) { return std::isfinite(v) && v >= low; };
  if (!finite_at_least(t.expected_reuse, 0) || t.expected_reuse == 0 ||
      !finite_at_least(t.recompute_seconds, 0) || t.bytes <= 0 ||
      !finite_at_least(t.retention_priority, 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction policy: traits out of range (expected_reuse ", t.expected_reuse,
                     " > 0, recompute_seconds ", t.recompute_seconds, " >= 0, bytes ", t.bytes,
                     " > 0, retention_priority ", t.retention_priority, " >= 0)"));
  }
  return absl::OkStatus();
}

double SinceEpoch(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

// A policy whose order is a fixed key per candidate (smallest evicted first, ties in the order
// the blocks were added or touched), re-keyed only when touched or when a priority ends.
class KeyedPolicy : public EvictionPolicy {
 public:
  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    if (absl::Status s = CheckTraits(traits); !s.ok()) return s;
    if (entries_.contains(key)) {
      return absl::AlreadyExistsError(
          absl::StrCat("eviction policy: block ", key.ToHex(), " is a candidate already"));
    }
    Insert(key, Entry{.traits = traits, .touched = now}, now);
    return absl::OkStatus();
  }

  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    if (absl::Status s = CheckTraits(traits); !s.ok()) return s;
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotACandidate(key);
    Entry entry = it->second;
    Erase(key, entry);
    entry.traits = traits;
    entry.touched = now;
    Insert(key, entry, now);
    return absl::OkStatus();
  }

  absl::Status Remove(const BlockKey& key) override {
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotACandidate(key);
    Erase(key, it->second);
    return absl::OkStatus();
  }

  std::optional<BlockKey> Victim(absl::Time now) override {
    // Priorities that have ended give their blocks their plain keys back.
    while (!expiries_.empty() && expiries_.begin()->first <= now) {
      const BlockKey key = expiries_.begin()->second;
      Entry entry = entries_.at(key);
      Erase(key, entry);
      Insert(key, entry, now);
    }
    if (order_.empty()) return std::nullopt;
    return std::get<2>(*order_.begin());
  }

  int64_t size() const override { return static_cast<int64_t>(entries_.size()); }

 protected:
  // The block's key while `boosted` (its retention priority applies) or not.
  virtual double Key(const BlockTraits& traits, absl::Time touched, bool boosted) const = 0;

 private:
  struct Entry {
    BlockTraits traits;
    absl::Time touched;
    double key = 0;
    uint64_t seq = 0;
    bool boosted = false;
  };

  static absl::Status NotACandidate(const BlockKey& key) {
    return absl::NotFoundError(
        absl::StrCat("eviction policy: block ", key.ToHex(), " is not a candidate"));
  }

  void Insert(const BlockKey& key, Entry entry, absl::Time now) {
    entry.boosted = entry.traits.retention_priority > 0 && now < entry.traits.priority_until;
    entry.key = Key(entry.traits, entry.touched, entry.boosted);
    entry.seq = next_seq_++;
    order_.emplace(entry.key, entry.seq, key);
    if (entry.boosted) expiries_.emplace(entry.traits.priority_until, key);
    entries_[key] = entry;
  }

  void Erase(const BlockKey& key, const Entry& entry) {
    order_.erase({entry.key, entry.seq, key});
    if (entry.boosted) expiries_.erase({entry.traits.priority_until, key});
    entries_.erase(key);
  }

  absl::flat_hash_map<BlockKey, Entry> entries_;
  std::set<std::tuple<double, uint64_t, BlockKey>> order_;
  std::set<std::pair<absl::Time, BlockKey>> expiries_;
  uint64_t next_seq_ = 0;
};

class LruPolicy final : public KeyedPolicy {
 public:
  std::string_view name() const override { return "lru"; }

 protected:
  double Key(const BlockTraits& traits, absl::Time touched, bool boosted) const override {
    // A retention priority keeps the block as if touched `priority` half-hours later: LRU has no
    // value to scale, so the boost is a shift in time while it lasts.
    return SinceEpoch(touched) + (boosted ? traits.retention_priority * 1800.0 : 0.0);
  }
};

class CostAwarePolicy final : public KeyedPolicy {
 public:
  explicit CostAwarePolicy(absl::Duration half_life)
      : decay_per_second_(std::log(2.0) / absl::ToDoubleSeconds(half_life)) {}
  std::string_view name() const override { return "cost_aware"; }

 protected:
  double Key(const BlockTraits& t, absl::Time touched, bool boosted) const override {
    // ln(score(now)) = ln(value) + decay * touched - decay * now; the last term is the same for
    // every block, so the rest is the key. A block saving nothing has key -infinity.
    const double value = t.expected_reuse * t.recompute_seconds / static_cast<double>(t.bytes) *
                         (boosted ? 1.0 + t.retention_priority : 1.0);
    return std::log(value) + decay_per_second_ * SinceEpoch(touched);
  }

 private:
  double decay_per_second_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeCostAwarePolicy(
    const CostAwareOptions& options) {
  if (options.half_life <= absl::ZeroDuration() || options.half_life == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost_aware: half_life = ", absl::FormatDuration(options.half_life),
                     " must be positive and finite"));
  }
  return std::make_unique<CostAwarePolicy>(options.half_life);
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name) {
  if (name == "lru") return MakeLruPolicy();
  if (name == "cost_aware") return MakeCostAwarePolicy();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy \"", internal::ToAbsl(name), "\" (lru, cost_aware)"));
}

}  // namespace kvtier
