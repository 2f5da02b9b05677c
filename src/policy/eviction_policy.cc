// Eviction ranking (eviction_policy.h): lru and cost_aware behind one interface.
#include "kvtier/eviction_policy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/strings.h"
#include "policy/seconds.h"
#include "policy/splitmix.h"
#include "policy/traits_check.h"

namespace kvtier {
namespace {

using internal::CheckTraits;
using internal::FastSeconds;

double SinceEpoch(absl::Time t) { return FastSeconds(t - absl::UnixEpoch()); }

// A policy whose order is a fixed key per candidate (smallest evicted first), re-keyed only when
// touched or when a priority ends. Ties go by block key: an order that depends only on what the
// caller told the policy, not on when, so a replay decides the same whatever order its
// transfers landed in (KvCache adds the copies a batch of transfers made as each one lands).
class KeyedPolicy : public EvictionPolicy {
 public:
  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    if (absl::Status s = CheckTraits(traits); !s.ok()) return s;
    if (entries_.contains(key)) {
      return absl::AlreadyExistsError(
          absl::StrCat("eviction policy: block ", key.ToHex(), " is a candidate already"));
    }
    Entry& entry = entries_[key];
    entry = Entry{.retention_priority = traits.retention_priority,
                  .priority_until = traits.priority_until,
                  .touched = now};
    Order(key, entry, now);
    return absl::OkStatus();
  }

  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    if (absl::Status s = CheckTraits(traits); !s.ok()) return s;
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotACandidate(key);
    Entry& entry = it->second;
    Unorder(key, entry);
    entry.retention_priority = traits.retention_priority;
    entry.priority_until = traits.priority_until;
    entry.touched = now;
    Order(key, entry, now);
    return absl::OkStatus();
  }

  absl::Status Remove(const BlockKey& key) override {
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotACandidate(key);
    Unorder(key, it->second);
    entries_.erase(it);
    return absl::OkStatus();
  }

  std::optional<BlockKey> Victim(absl::Time now) override {
    // Priorities that have ended give their blocks their plain keys back.
    while (!expiries_.empty() && expiries_.begin()->first <= now) {
      const BlockKey key = expiries_.begin()->second;
      Entry& entry = entries_.at(key);
      Unorder(key, entry);
      Order(key, entry, now);
    }
    if (order_.empty()) return std::nullopt;
    return order_.begin()->second;
  }

  int64_t size() const override { return static_cast<int64_t>(entries_.size()); }

 protected:
  // The block's key while `boosted` (its retention priority applies) or not.
  virtual double Key(double retention_priority, absl::Time touched, bool boosted) const = 0;

 private:
  // Only what the key needs of the traits: a candidate costs this entry, its order node and
  // (while boosted) an expiry node, not a copy of BlockTraits.
  struct Entry {
    double retention_priority = 0;
    absl::Time priority_until;
    absl::Time touched;
    double key = 0;
    bool boosted = false;
  };

  static absl::Status NotACandidate(const BlockKey& key) {
    return absl::NotFoundError(
        absl::StrCat("eviction policy: block ", key.ToHex(), " is not a candidate"));
  }

  // Puts `key` (whose entry is `entry`) in the order by its key at `now`.
  void Order(const BlockKey& key, Entry& entry, absl::Time now) {
    entry.boosted = entry.retention_priority > 0 && now < entry.priority_until;
    entry.key = Key(entry.retention_priority, entry.touched, entry.boosted);
    order_.emplace(entry.key, key);
    if (entry.boosted) expiries_.emplace(entry.priority_until, key);
  }

  void Unorder(const BlockKey& key, const Entry& entry) {
    order_.erase({entry.key, key});
    if (entry.boosted) expiries_.erase({entry.priority_until, key});
  }

  absl::flat_hash_map<BlockKey, Entry> entries_;
  // B-trees: an LRU's order is updated on every use, and a B-tree's nodes are a few cache lines.
  absl::btree_set<std::pair<double, BlockKey>> order_;
  absl::btree_set<std::pair<absl::Time, BlockKey>> expiries_;
};

class LruPolicy final : public KeyedPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  bool reads_run_blocks() const override { return false; }

 protected:
  double Key(double retention_priority, absl::Time touched, bool boosted) const override {
    // A retention priority keeps the block as if touched `priority` half-hours later: LRU has no
    // value to scale, so the boost is a shift in time while it lasts.
    // An infinite time stays as it is (-inf + inf would be NaN and break the order), and a shift
    // past the largest double is that.
    const double t = SinceEpoch(touched);
    if (!boosted || !std::isfinite(t)) return t;
    return t + std::min(retention_priority * 1800.0, std::numeric_limits<double>::max());
  }
};

// cost_aware: LHD's hit density (eviction_policy.h) over Kaplan-Meier estimates of each class's
// reuse ages.
class HitDensityPolicy final : public EvictionPolicy {
 public:
  explicit HitDensityPolicy(const CostAwareOptions& options)
      : options_(options), rng_(options.seed) {
    // Bin i covers ages [edge_[i], edge_[i + 1]): 1 s wide at first, each 10% wider, so 96 bins
    // reach past a day with a resolution that suits reuse ages of seconds to hours.
    double width = 1;
    for (int i = 1; i <= kBins; ++i) {
      edge_[i] = edge_[i - 1] + width;
      width *= 1.1;
    }
  }

  std::string_view name() const override { return "cost_aware"; }

  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    if (absl::Status s = CheckTraits(traits); !s.ok()) return s;
    if (entries_.contains(key)) {
      return absl::AlreadyExistsError(
          absl::StrCat("eviction policy: block ", key.ToHex(), " is a candidate already"));
    }
    clock_ = std::max(clock_, now);
    // Evicted and back: it was reused at this age, and so was the chain evicted below it.
    if (ghosts_.contains(key)) ResolveGhosts(key, now);
    Entry entry{.traits = traits,
                .touched = now,
                .cls = ClassOf(traits),
                .slot = static_cast<uint32_t>(slots_.size())};
    // Its life as a candidate is observed from this age on: a parent becomes a leaf only when
    // its last child is evicted (Kaplan-Meier with late entry).
    classes_[entry.cls].new_entries[BinOf(Seconds(clock_ - now))] += 1;
    // A leaf again because its child was just evicted: if it is reused, that child's chain
    // (same conversation, next turn) would have been reused too.
    if (last_evicted_.has_value() && last_evicted_->second == key) {
      entry.ghost_child = last_evicted_->first;
    }
    last_evicted_.reset();
    entries_[key] = entry;
    slots_.push_back(key);
    return absl::OkStatus();
  }

  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    if (absl::Status s = CheckTraits(traits); !s.ok()) return s;
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotACandidate(key);
    clock_ = std::max(clock_, now);
    Entry& entry = it->second;
    if (now > entry.touched) {
      // A use in place: one life ends in a hit, the next starts at age 0.
      RecordHit(entry.cls, Seconds(now - entry.touched), now);
      entry.touched = now;
      entry.cls = ClassOf(traits);
      classes_[entry.cls].new_entries[0] += 1;
    }
    entry.traits = traits;
    return absl::OkStatus();
  }

  absl::Status Remove(const BlockKey& key) override {
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotACandidate(key);
    const Entry entry = it->second;
    if (pending_victim_.has_value() && pending_victim_->first == key) {
      // Evicted: not reused before this age (so far; its ghost may tell more).
      const absl::Time when = pending_victim_->second;
      const double age = Seconds(when - entry.touched);
      classes_[entry.cls].new_censored[BinOf(age)] += 1;
      Outcome(when);
      pending_victim_.reset();
      AddGhost(key, entry, age);
      last_evicted_ = std::make_pair(key, entry.traits.parent);
    } else {
      // Not evicted: used again (pinned by a request, which caches children under it), at
      // about the latest time the policy has been told.
      RecordHit(entry.cls, Seconds(clock_ - entry.touched), clock_);
      if (entry.ghost_child.has_value()) ResolveGhosts(*entry.ghost_child, clock_);
    }
    return Erase(it);
  }

  absl::Status Evicted(const BlockKey& key, absl::Time now) override {
    if (!entries_.contains(key)) return NotACandidate(key);
    clock_ = std::max(clock_, now);
    pending_victim_ = std::make_pair(key, now);  // as if Victim had chosen it
    return Remove(key);
  }

  absl::Status Discard(const BlockKey& key) override {
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotACandidate(key);
    // Dropped unused: the life ends without a reuse at its age, as an eviction does, but leaves
    // no ghost (it is not coming back) and no evicted child for its parent.
    const double age = Seconds(clock_ - it->second.touched);
    classes_[it->second.cls].new_censored[BinOf(age)] += 1;
    Outcome(clock_);
    if (pending_victim_.has_value() && pending_victim_->first == key) pending_victim_.reset();
    return Erase(it);
  }

  std::optional<BlockKey> Victim(absl::Time now) override {
    clock_ = std::max(clock_, now);
    if (slots_.empty()) return std::nullopt;
    // LHD's sampling: rank a few random candidates, not all (every candidate when few).
    const size_t n = slots_.size();
    const size_t sample = static_cast<size_t>(options_.sample_size);
    const bool all = n <= sample;
    const size_t draws = all ? n : sample;
    const BlockKey* best = nullptr;
    double best_rank = 0;
    absl::Time best_touched;
    for (size_t d = 0; d < draws; ++d) {
      const BlockKey& key = all ? slots_[d] : slots_[rng_.Next() % n];
      const Entry& e = entries_.at(key);
      const double rank = Rank(e, now);
      // Lowest rank first; equal ranks (a cold start knows no reuse) go least recently used.
      if (best == nullptr || rank < best_rank ||
          (rank == best_rank &&
           (e.touched < best_touched || (e.touched == best_touched && key < *best)))) {
        best = &key;
        best_rank = rank;
        best_touched = e.touched;
      }
    }
    pending_victim_ = std::make_pair(*best, now);
    return *best;
  }

  int64_t size() const override { return static_cast<int64_t>(entries_.size()); }

 private:
  static constexpr int kBins = 96;
  // Classes: uses so far (1; 2 or more) x run_blocks (1, 2-3, 4-7, 8-15, 16-31, 32+).
  static constexpr int kRunBuckets = 6;
  static constexpr int kNumClasses = 2 * kRunBuckets;
  // Prior weight (in lives) of the pooled estimate in each class's hazard.
  static constexpr double kPriorLives = 16;

  struct Entry {
    BlockTraits traits;
    absl::Time touched;
    int cls = 0;
    uint32_t slot = 0;
    std::optional<BlockKey> ghost_child;  // the evicted child whose eviction made it a leaf
  };
  // An evicted block, remembered until it is reused or forgotten. Its eviction was recorded as
  // "not reused before evict_age"; a reuse turns that into a hit, forgetting it into "not reused
  // before" the age then.
  struct Ghost {
    absl::Time touched;
    int cls = 0;
    double evict_age = 0;
    uint64_t seq = 0;               // tells this eviction from a later one of the same block
    std::optional<BlockKey> child;  // its own ghost child, evicted before it
  };
  // Lives of candidates, per age bin where they were first seen (entries) and where they ended
  // (hits, censored = ended without a reuse seen): EWMA over time, plus this interval's counts.
  struct Class {
    std::array<double, kBins> entries{}, hits{}, censored{};
    std::array<double, kBins> new_entries{}, new_hits{}, new_censored{};
    // index[i]: the class's hit density at age edge_[i].
    std::array<double, kBins> index{};
  };

  static absl::Status NotACandidate(const BlockKey& key) {
    return absl::NotFoundError(
        absl::StrCat("eviction policy: block ", key.ToHex(), " is not a candidate"));
  }

  static double Seconds(absl::Duration d) { return std::max(0.0, FastSeconds(d)); }

  // Takes the candidate out of entries_ and slots_.
  absl::Status Erase(absl::flat_hash_map<BlockKey, Entry>::iterator it) {
    const BlockKey key = it->first;
    const uint32_t slot = it->second.slot;
    const BlockKey moved = slots_.back();
    slots_[slot] = moved;
    slots_.pop_back();
    if (moved != key) entries_[moved].slot = slot;
    entries_.erase(it);
    return absl::OkStatus();
  }

  static int ClassOf(const BlockTraits& t) {
    const int r = t.run_blocks;
    const int run = r <= 1 ? 0 : r <= 3 ? 1 : r <= 7 ? 2 : r <= 15 ? 3 : r <= 31 ? 4 : 5;
    return (t.expected_reuse >= 2 ? kRunBuckets : 0) + run;
  }

  int BinOf(double age) const {
    return static_cast<int>(std::upper_bound(edge_.begin(), edge_.end() - 1, age) - edge_.begin()) -
           1;
  }

  void RecordHit(int cls, double age, absl::Time now) {
    classes_[cls].new_hits[BinOf(age)] += 1;
    Outcome(now);
  }

  void AddGhost(const BlockKey& key, const Entry& entry, double age) {
    ghosts_[key] = Ghost{.touched = entry.touched,
                         .cls = entry.cls,
                         .evict_age = age,
                         .seq = ++ghost_seq_,
                         .child = entry.ghost_child};
    ghost_fifo_.emplace_back(key, ghost_seq_);
    const double horizon = absl::ToDoubleSeconds(options_.ghost_horizon);
    while (!ghost_fifo_.empty()) {
      const auto [old, seq] = ghost_fifo_.front();
      auto g = ghosts_.find(old);
      if (g == ghosts_.end() || g->second.seq != seq) {
        ghost_fifo_.pop_front();
        continue;
      }
      if (static_cast<int64_t>(ghosts_.size()) <= options_.max_ghosts &&
          Seconds(clock_ - g->second.touched) <= horizon) {
        break;
      }
      // Forgotten: not reused before the age it has now.
      Class& cl = classes_[g->second.cls];
      cl.new_censored[BinOf(g->second.evict_age)] -= 1;
      cl.new_censored[BinOf(Seconds(clock_ - g->second.touched))] += 1;
      ghosts_.erase(g);
      ghost_fifo_.pop_front();
    }
  }

  // The ghost `key` and the chain of ghosts below it were reused at `when`.
  void ResolveGhosts(BlockKey key, absl::Time when) {
    for (auto g = ghosts_.find(key); g != ghosts_.end(); g = ghosts_.find(key)) {
      const Ghost ghost = g->second;
      ghosts_.erase(g);
      if (when > ghost.touched) {
        classes_[ghost.cls].new_censored[BinOf(ghost.evict_age)] -= 1;
        RecordHit(ghost.cls, Seconds(when - ghost.touched), when);
      }
      if (!ghost.child.has_value()) return;
      key = *ghost.child;
    }
  }

  void Outcome(absl::Time now) {
    if (!last_reconfigure_.has_value()) last_reconfigure_ = now;
    if (++new_outcomes_ >= options_.reconfigure_outcomes) Reconfigure(now);
  }

  // LHD's periodic reconfiguration: ages the histograms by the time since the last one (EWMA
  // with options_.half_life), folds in the new counts and recomputes every class's index.
  void Reconfigure(absl::Time now) {
    const double keep =
        std::exp2(-Seconds(now - *last_reconfigure_) / absl::ToDoubleSeconds(options_.half_life));
    last_reconfigure_ = now;
    new_outcomes_ = 0;
    Class pooled;
    for (Class& cl : classes_) {
      for (int i = 0; i < kBins; ++i) {
        cl.entries[i] = cl.entries[i] * keep + cl.new_entries[i];
        cl.hits[i] = cl.hits[i] * keep + cl.new_hits[i];
        cl.censored[i] = cl.censored[i] * keep + cl.new_censored[i];
        pooled.entries[i] += cl.entries[i];
        pooled.hits[i] += cl.hits[i];
        pooled.censored[i] += cl.censored[i];
      }
      cl.new_entries.fill(0);
      cl.new_hits.fill(0);
      cl.new_censored.fill(0);
    }
    std::array<double, kBins> pooled_hazard{};
    Estimate(pooled, nullptr, pooled_hazard);
    for (Class& cl : classes_) Estimate(cl, &pooled_hazard, pooled_hazard);
  }

  // Kaplan-Meier over the class's lives: the hazard in bin i is its reuses over the lives at
  // risk there (entered at or before it, not ended before it), shrunk towards `prior` (the
  // pooled hazard) by kPriorLives; survival S is their running product (reuses ghosts did not
  // see within the horizon count as none). The index at age a is LHD's hit density with the
  // lifetime charged up to the reuse: P(reused after a | not by a) / E[age at reuse - a |
  // reused after a] = (S(a) - S(end))^2 / (S(a) x integral from a to end of (S - S(end))).
  void Estimate(Class& cl, const std::array<double, kBins>* prior,
                std::array<double, kBins>& hazard_out) const {
    std::array<double, kBins + 1> survival{};
    std::array<double, kBins + 1> integral{};  // of survival from 0
    survival[0] = 1;
    double at_risk = 0;
    for (int i = 0; i < kBins; ++i) {
      at_risk += cl.entries[i];
      const double hits = std::max(0.0, cl.hits[i]);
      double hazard = prior == nullptr ? hits / (at_risk + kPriorLives)
                                       : (hits + kPriorLives * (*prior)[i]) /
                                             (std::max(0.0, at_risk) + kPriorLives);
      hazard = std::clamp(hazard, 0.0, 1.0);
      if (prior == nullptr) hazard_out[i] = hazard;
      at_risk = std::max(0.0, at_risk - hits - std::max(0.0, cl.censored[i]));
      survival[i + 1] = survival[i] * (1 - hazard);
      integral[i + 1] =
          integral[i] + (edge_[i + 1] - edge_[i]) * (survival[i] + survival[i + 1]) / 2;
    }
    const double s_end = survival[kBins];
    for (int i = 0; i < kBins; ++i) {
      const double reused = survival[i] - s_end;
      const double wait = (integral[kBins] - integral[i]) - s_end * (edge_[kBins] - edge_[i]);
      cl.index[i] = reused > 1e-12 && wait > 0 ? reused * reused / (survival[i] * wait) : 0;
    }
  }

  double Rank(const Entry& e, absl::Time now) const {
    const BlockTraits& t = e.traits;
    const bool boosted = t.retention_priority > 0 && now < t.priority_until;
    return classes_[e.cls].index[BinOf(Seconds(now - e.touched))] / static_cast<double>(t.bytes) *
           (boosted ? 1 + t.retention_priority : 1);
  }

  CostAwareOptions options_;
  internal::SplitMix64 rng_;
  std::array<double, kBins + 1> edge_{};
  std::array<Class, kNumClasses> classes_{};
  absl::flat_hash_map<BlockKey, Entry> entries_;
  std::vector<BlockKey> slots_;  // the candidates, for uniform sampling
  absl::flat_hash_map<BlockKey, Ghost> ghosts_;
  std::deque<std::pair<BlockKey, uint64_t>> ghost_fifo_;  // (key, seq), oldest first
  uint64_t ghost_seq_ = 0;
  std::optional<std::pair<BlockKey, BlockKey>> last_evicted_;  // (block, its parent)
  std::optional<std::pair<BlockKey, absl::Time>> pending_victim_;
  std::optional<absl::Time> last_reconfigure_;
  absl::Time clock_ = absl::InfinitePast();  // the latest time any call gave
  int64_t new_outcomes_ = 0;
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
  if (options.sample_size < 1 || options.reconfigure_outcomes < 1 || options.max_ghosts < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost_aware: sample_size = ", options.sample_size, " and reconfigure_outcomes = ",
        options.reconfigure_outcomes, " must be >= 1, max_ghosts = ", options.max_ghosts, " >= 0"));
  }
  if (options.ghost_horizon < absl::ZeroDuration() ||
      options.ghost_horizon == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost_aware: ghost_horizon = ", absl::FormatDuration(options.ghost_horizon),
                     " must be >= 0 and finite"));
  }
  return std::make_unique<HitDensityPolicy>(options);
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name) {
  if (name == "lru") return MakeLruPolicy();
  if (name == "cost_aware") return MakeCostAwarePolicy();
  if (name == "reuse_index") return MakeReuseIndexPolicy();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown eviction policy \"", internal::ToAbsl(name), "\" (lru, cost_aware, reuse_index)"));
}

}  // namespace kvtier
