// An LRU policy that logs every call a simulator makes of it, for tests that check a simulator's
// calls one by one (tests/unit/replay/offline).
#ifndef KVTIER_TESTS_TESTING_LOGGING_LRU_H_
#define KVTIER_TESTS_TESTING_LOGGING_LRU_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvtier/block_key.h"
#include "kvtier/eviction_policy.h"

namespace kvtier::testing {

// LRU; `log` gets "add K@T", "touch K", "remove K", "victim K" (K = key.hi, T = seconds since
// the epoch) and, when constructed with observes = true (then observes_requests() is true),
// "request S blocks N" and "release S stop R[ superseded][ last_turn]" (S the session, R the
// StopReason as an int). traits_of_last_add keeps what the last Add was given.
class LoggingLru final : public EvictionPolicy {
 public:
  explicit LoggingLru(bool observes = false) : observes_(observes) {}

  std::string_view name() const override { return "logging_lru"; }
  bool observes_requests() const override { return observes_; }
  void ObserveRequest(const RequestObservation& request) override {
    log.push_back(absl::StrCat("request ", request.session, " blocks ", request.blocks.size()));
  }
  void ObserveRelease(const ReleaseObservation& release) override {
    log.push_back(absl::StrCat(
        "release ", release.session, " stop ", static_cast<int>(release.stop_reason),
        release.superseded ? " superseded" : "", release.last_turn ? " last_turn" : ""));
  }
  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    log.push_back(absl::StrCat("add ", key.hi, "@", absl::ToUnixSeconds(now)));
    traits_of_last_add = traits;
    return lru_->Add(key, traits, now);
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    log.push_back(absl::StrCat("touch ", key.hi));
    return lru_->Touch(key, traits, now);
  }
  absl::Status Remove(const BlockKey& key) override {
    log.push_back(absl::StrCat("remove ", key.hi));
    return lru_->Remove(key);
  }
  std::optional<BlockKey> Victim(absl::Time now) override {
    std::optional<BlockKey> victim = lru_->Victim(now);
    if (victim.has_value()) log.push_back(absl::StrCat("victim ", victim->hi));
    return victim;
  }
  int64_t size() const override { return lru_->size(); }

  std::vector<std::string> log;
  BlockTraits traits_of_last_add;

 private:
  bool observes_;
  std::unique_ptr<EvictionPolicy> lru_ = MakeLruPolicy();
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_LOGGING_LRU_H_
