// follow_best (eviction_policy.h): candidates ranked live, each with a hash-sampled shadow cache
// that measures it, and the live tier following the best shadow.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/eviction_policy.h"
#include "policy/splitmix.h"
#include "policy/traits_check.h"

namespace kvtier {
namespace {

class Shadow {
 public:
  Shadow(std::unique_ptr<EvictionPolicy> policy, int64_t capacity)
      : policy_(std::move(policy)), capacity_(capacity) {}

  EvictionPolicy& policy() { return *policy_; }
  double hits() const { return hits_; }
  void Decay() { hits_ *= 0.5; }

  // One request's sampled blocks at `now`: hits counted, then all held while the shadow evicts
  // down to its capacity, then all candidates again.
  void Request(absl::Span<const BlockKey> sampled, absl::Time now) {
    for (const BlockKey& key : sampled) {
      if (held_.contains(key)) {
        hits_ += 1;
        (void)policy_->Remove(key);
      } else {
        held_.insert(key);
      }
    }
    while (static_cast<int64_t>(held_.size()) > capacity_) {
      std::optional<BlockKey> v = policy_->Victim(now);
      if (!v.has_value()) break;  // all held by this request
      (void)policy_->Remove(*v);
      held_.erase(*v);
    }
    for (const BlockKey& key : sampled) {
      if (held_.contains(key)) (void)policy_->Add(key, BlockTraits{}, now);
    }
  }

 private:
  std::unique_ptr<EvictionPolicy> policy_;
  int64_t capacity_;
  absl::flat_hash_set<BlockKey> held_;
  double hits_ = 0;
};

class FollowBest final : public EvictionPolicy {
 public:
  FollowBest(std::vector<std::unique_ptr<EvictionPolicy>> live, std::vector<Shadow> shadows,
             const FollowBestOptions& options, double rate)
      : live_(std::move(live)),
        shadows_(std::move(shadows)),
        options_(options),
        // rate x 2^64, saturated (a double of 2^64 does not fit the integer).
        threshold_(rate >= 1 ? ~uint64_t{0} : static_cast<uint64_t>(std::ldexp(rate, 64))) {
    for (const auto& p : live_) {
      run_blocks_ = run_blocks_ || p->reads_run_blocks();
    }
  }

  std::string_view name() const override { return "follow_best"; }
  std::string_view following() const { return live_[leader_]->name(); }
  const FollowBestStats& stats() const { return stats_; }
  bool reads_run_blocks() const override { return run_blocks_; }
  bool observes_requests() const override { return true; }

  void ObserveRequest(const RequestObservation& request) override {
    // A request comes before the pins it makes: the leader's victim, not Removed since, was kept
    // (KvCache: it waits for room below), and a pin's Remove of it is no eviction.
    last_victim_.reset();
    for (auto& p : live_) {
      if (p->observes_requests()) p->ObserveRequest(request);
    }
    const auto start = std::chrono::steady_clock::now();
    sampled_.clear();
    for (const BlockKey& key : request.blocks) {
      // One mix: a cache's keys are content hashes already, a caller's may not be.
      if (internal::SplitMix64Mix(key.lo ^ (key.hi * 0x9e3779b97f4a7c15ULL)) <= threshold_) {
        sampled_.push_back(key);
      }
    }
    for (Shadow& s : shadows_) {
      // A shared shadow (MakeSharedShadow) does not observe: the live candidate learned it above.
      if (s.policy().observes_requests()) s.policy().ObserveRequest(request);
      if (!sampled_.empty()) s.Request(sampled_, request.now);
    }
    accesses_ += static_cast<int64_t>(sampled_.size());
    stats_.sampled_accesses += static_cast<int64_t>(sampled_.size());
    if (accesses_ >= options_.half_life_accesses) {
      accesses_ = 0;
      for (Shadow& s : shadows_) s.Decay();
    }
    size_t best = leader_;
    for (size_t i = 0; i < shadows_.size(); ++i) {
      if (shadows_[i].hits() > shadows_[best].hits()) best = i;
    }
    if (best != leader_ &&
        shadows_[best].hits() > shadows_[leader_].hits() * (1 + options_.hysteresis) + 1 &&
        shadows_[best].hits() - shadows_[leader_].hits() >
            options_.confidence * std::sqrt(shadows_[best].hits() + shadows_[leader_].hits())) {
      leader_ = best;
      ++stats_.leader_changes;
    }
    stats_.shadow_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void ObserveRelease(const ReleaseObservation& release) override {
    for (auto& p : live_) {
      if (p->observes_requests()) p->ObserveRelease(release);
    }
    const auto start = std::chrono::steady_clock::now();
    for (Shadow& s : shadows_) {
      if (s.policy().observes_requests()) s.policy().ObserveRelease(release);
    }
    stats_.shadow_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    last_victim_.reset();
    // All or none: a block some candidates took and one refused would be a victim of the
    // leader although the caller was told it is no candidate.
    if (absl::Status s = internal::CheckTraits(traits); !s.ok()) return s;
    for (size_t i = 0; i < live_.size(); ++i) {
      if (absl::Status s = live_[i]->Add(key, traits, now); !s.ok()) {
        for (size_t j = 0; j < i; ++j) (void)live_[j]->Remove(key);
        return s;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    last_victim_.reset();
    return ForEach([&](EvictionPolicy& p) { return p.Touch(key, traits, now); });
  }
  absl::Status Remove(const BlockKey& key) override {
    // The leader's victim leaving: an eviction to the others too, not a reuse (cost_aware counts
    // a Remove that does not follow its own Victim as one).
    if (last_victim_.has_value() && last_victim_->first == key) {
      const absl::Time when = last_victim_->second;
      last_victim_.reset();
      absl::Status first;
      for (size_t i = 0; i < live_.size(); ++i) {
        absl::Status s = i == leader_ ? live_[i]->Remove(key) : live_[i]->Evicted(key, when);
        if (first.ok() && !s.ok()) first = s;
      }
      return first;
    }
    return ForEach([&](EvictionPolicy& p) { return p.Remove(key); });
  }
  absl::Status Discard(const BlockKey& key) override {
    if (last_victim_.has_value() && last_victim_->first == key) last_victim_.reset();
    return ForEach([&](EvictionPolicy& p) { return p.Discard(key); });
  }
  std::optional<BlockKey> Victim(absl::Time now) override {
    std::optional<BlockKey> victim = live_[leader_]->Victim(now);
    if (victim.has_value()) {
      last_victim_ = std::make_pair(*victim, now);
    } else {
      last_victim_.reset();
    }
    return victim;
  }
  absl::Status Evicted(const BlockKey& key, absl::Time now) override {
    if (last_victim_.has_value() && last_victim_->first == key) last_victim_.reset();
    return ForEach([&](EvictionPolicy& p) { return p.Evicted(key, now); });
  }
  std::optional<double> ReuseChance(const BlockKey& key, absl::Duration within,
                                    absl::Time now) const override {
    return live_[leader_]->ReuseChance(key, within, now);
  }
  int64_t size() const override { return live_[0]->size(); }

 private:
  // Every candidate gets the call (they hold the same candidates); the first error is returned.
  template <typename Fn>
  absl::Status ForEach(Fn fn) {
    absl::Status first;
    for (auto& p : live_) {
      absl::Status s = fn(*p);
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }

  std::vector<std::unique_ptr<EvictionPolicy>> live_;
  std::vector<Shadow> shadows_;  // after live_: a shared shadow reads its live policy's model
  FollowBestOptions options_;
  uint64_t threshold_;
  size_t leader_ = 0;
  int64_t accesses_ = 0;
  bool run_blocks_ = false;
  std::vector<BlockKey> sampled_;
  FollowBestStats stats_;
  // The leader's latest Victim and its time, until that block is Removed.
  std::optional<std::pair<BlockKey, absl::Time>> last_victim_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeFollowBestPolicy(
    std::vector<EvictionPolicyFactory> candidates, const FollowBestOptions& options) {
  if (candidates.empty()) return absl::InvalidArgumentError("follow_best: no candidates");
  if (options.capacity_blocks <= 0 || options.half_life_accesses <= 0 ||
      !(options.hysteresis >= 0) || !(options.confidence >= 0) ||
      !(options.sample_rate >= 0 && options.sample_rate <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "follow_best: capacity_blocks = ", options.capacity_blocks, " and half_life_accesses = ",
        options.half_life_accesses, " must be > 0, hysteresis = ", options.hysteresis,
        " and confidence = ", options.confidence, " >= 0, sample_rate = ", options.sample_rate,
        " in [0, 1]"));
  }
  const double rate =
      options.sample_rate > 0
          ? options.sample_rate
          : std::clamp(512.0 / static_cast<double>(options.capacity_blocks), 0.01, 0.125);
  const int64_t shadow_capacity =
      std::max<int64_t>(1, std::llround(rate * static_cast<double>(options.capacity_blocks)));
  std::vector<std::unique_ptr<EvictionPolicy>> live;
  std::vector<Shadow> shadows;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const EvictionPolicyFactory& make = candidates[i];
    const auto no_policy = [i] {
      return absl::InvalidArgumentError(
          absl::StrCat("follow_best: candidate ", i, "'s factory is empty or made no policy"));
    };
    if (!make) return no_policy();
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> a = make();
    if (!a.ok()) return a.status();
    if (*a == nullptr) return no_policy();
    std::unique_ptr<EvictionPolicy> shadow = (*a)->MakeSharedShadow();
    if (shadow == nullptr) {
      absl::StatusOr<std::unique_ptr<EvictionPolicy>> b = make();
      if (!b.ok()) return b.status();
      if (*b == nullptr) return no_policy();
      shadow = *std::move(b);
    }
    live.push_back(*std::move(a));
    shadows.emplace_back(std::move(shadow), shadow_capacity);
  }
  return std::make_unique<FollowBest>(std::move(live), std::move(shadows), options, rate);
}

std::string_view FollowedPolicy(const EvictionPolicy& policy) {
  const auto* f = dynamic_cast<const FollowBest*>(&policy);
  return f == nullptr ? std::string_view() : f->following();
}

FollowBestStats FollowBestStatsOf(const EvictionPolicy& policy) {
  const auto* f = dynamic_cast<const FollowBest*>(&policy);
  return f == nullptr ? FollowBestStats{} : f->stats();
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeLearnedPolicy(
    int64_t capacity_blocks, const ReuseIndexOptions& reuse_index) {
  // reuse_index leads: with no data yet it is oldest-first, as LRU is, so leading costs nothing
  // at the start; LRU takes over only on significant evidence from the shadows.
  std::vector<EvictionPolicyFactory> candidates;
  candidates.push_back([reuse_index]() { return MakeReuseIndexPolicy(reuse_index); });
  candidates.push_back(
      []() -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> { return MakeLruPolicy(); });
  return MakeFollowBestPolicy(std::move(candidates), {.capacity_blocks = capacity_blocks});
}

}  // namespace kvtier
