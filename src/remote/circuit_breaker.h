// The health gate of a remote tier (the circuit-breaker pattern, as in Nygard's "Release It!"):
// after `failures_to_open` consecutive failures of the store the breaker opens, and requests are
// refused at once (the tier is bypassed: lookups miss, writes are skipped) instead of each
// waiting for a dead store. After a backoff one request is let through as a probe (half-open):
// its success closes the breaker, its failure opens it again with the backoff doubled, up to
// the maximum. A probe that never reports is given up after the maximum backoff.
//
// What counts: the store not answering (kUnavailable, kDeadlineExceeded) is a failure; any
// answer, including "no such key", a refusal or a corrupt value, is a success; kCancelled and
// argument errors count as neither. A batched request reports once (remote_tier.cc).
// A request that ran out of its own time (kDeadlineExceeded) is the store's failure only if it
// was given at least kPatience times the store's recent answer time; a shorter one (a 20 ms
// discovery probe against a store that answers in 30 ms) is the caller's impatience and counts
// as neither. The recent answer time is an average of answered requests' durations (weight 1/8
// on the newest, as TCP's smoothed round-trip time, RFC 6298); until the store has answered
// once, and once it has answered nothing for backoff_max (a hung store, whatever the callers'
// deadlines), every timeout counts.
//
// Thread-safety: thread-safe.
#ifndef KVTIER_REMOTE_CIRCUIT_BREAKER_H_
#define KVTIER_REMOTE_CIRCUIT_BREAKER_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "internal/mutex.h"

namespace kvtier::internal {

class CircuitBreaker {
 public:
  enum class State : uint8_t { kClosed, kOpen, kHalfOpen };

  // failures_to_open == 0 disables the breaker (always closed).
  CircuitBreaker(int failures_to_open, absl::Duration backoff_min, absl::Duration backoff_max)
      : failures_to_open_(failures_to_open), backoff_min_(backoff_min), backoff_max_(backoff_max) {}

  // OK if a request (of `blocks` blocks, for the bypass count) may go to the store at `now`;
  // kUnavailable saying why not otherwise.
  absl::Status Admit(absl::Time now, int64_t blocks = 1) {
    MutexLock lock(&mu_);
    switch (state_) {
      case State::kClosed:
        return absl::OkStatus();
      case State::kOpen:
        if (now >= probe_at_) {
          state_ = State::kHalfOpen;
          probe_started_ = now;
          ++probes_;
          return absl::OkStatus();  // this request is the probe
        }
        break;
      case State::kHalfOpen:
        if (now - probe_started_ >= backoff_max_) {  // the probe never reported: try another
          probe_started_ = now;
          ++probes_;
          return absl::OkStatus();
        }
        break;
    }
    bypassed_ += blocks;
    return absl::UnavailableError(
        absl::StrCat("remote store bypassed: circuit open after ", consecutive_failures_,
                     " consecutive failures (last: ", last_failure_, ")",
                     state_ == State::kOpen
                         ? absl::StrCat("; next probe in ", absl::FormatDuration(probe_at_ - now))
                         : std::string("; a probe is in flight")));
  }

  // How many times the store's recent answer time a request must have been given for its
  // timeout to count against the store.
  static constexpr int kPatience = 4;

  // Records the outcome of an admitted request (one per request, however many blocks) that was
  // sent at `started` with `deadline` (unknown: the defaults, and a timeout then always counts).
  void Report(const absl::Status& status, absl::Time now, absl::Time started = absl::InfinitePast(),
              absl::Time deadline = absl::InfiniteFuture()) {
    bool failure = absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
    bool neutral = absl::IsCancelled(status) || absl::IsInvalidArgument(status);
    MutexLock lock(&mu_);
    if (absl::IsDeadlineExceeded(status) && answer_time_ > absl::ZeroDuration() &&
        now - last_answer_ < backoff_max_ && started != absl::InfinitePast() &&
        deadline - started < kPatience * answer_time_) {
      failure = false;
      neutral = true;
    }
    if (neutral) {
      // A probe that learned nothing lets the next request probe, at once.
      if (state_ == State::kHalfOpen) {
        state_ = State::kOpen;
        probe_at_ = now;
      }
      return;
    }
    if (!failure) {
      last_answer_ = std::max(last_answer_, now);
      if (started != absl::InfinitePast() && now >= started) {
        const absl::Duration took = std::max(now - started, absl::Microseconds(1));
        answer_time_ =
            answer_time_ == absl::ZeroDuration() ? took : answer_time_ + (took - answer_time_) / 8;
      }
      consecutive_failures_ = 0;
      backoff_ = absl::ZeroDuration();
      state_ = State::kClosed;
      return;
    }
    ++consecutive_failures_;
    last_failure_ = std::string(status.message().substr(0, 200));
    if (failures_to_open_ == 0) return;
    if (state_ == State::kHalfOpen ||
        (state_ == State::kClosed && consecutive_failures_ >= failures_to_open_)) {
      backoff_ =
          backoff_ == absl::ZeroDuration() ? backoff_min_ : std::min(2 * backoff_, backoff_max_);
      probe_at_ = now + backoff_;
      if (state_ == State::kClosed) ++opened_;
      state_ = State::kOpen;
    }
  }

  State state() const {
    MutexLock lock(&mu_);
    return state_;
  }
  int64_t opened() const {
    MutexLock lock(&mu_);
    return opened_;
  }
  int64_t bypassed() const {
    MutexLock lock(&mu_);
    return bypassed_;
  }
  int64_t probes() const {
    MutexLock lock(&mu_);
    return probes_;
  }
  // The store's recent answer time (zero until it has answered a request with a known start).
  absl::Duration answer_time() const {
    MutexLock lock(&mu_);
    return answer_time_;
  }

 private:
  const int failures_to_open_;
  const absl::Duration backoff_min_;
  const absl::Duration backoff_max_;
  mutable Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kClosed;
  int consecutive_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_failure_ ABSL_GUARDED_BY(mu_);
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Time probe_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time probe_started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t opened_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bypassed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t probes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration answer_time_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Time last_answer_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_CIRCUIT_BREAKER_H_
