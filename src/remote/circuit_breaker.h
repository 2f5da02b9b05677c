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

  // Records the outcome of an admitted request (one per request, however many blocks).
  void Report(const absl::Status& status, absl::Time now) {
    const bool failure = absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
    const bool neutral = absl::IsCancelled(status) || absl::IsInvalidArgument(status);
    if (neutral) return;
    MutexLock lock(&mu_);
    if (!failure) {
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
};

}  // namespace kvtier::internal

#endif  // KVTIER_REMOTE_CIRCUIT_BREAKER_H_
