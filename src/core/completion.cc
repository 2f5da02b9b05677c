// Completion (completion.h): the one-shot outcome, its waiters and callbacks.
#include "kvtier/completion.h"

#include <atomic>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "internal/mutex.h"

namespace kvtier {
namespace internal {

// The outcome is kept as its code and message, and every reader gets a Status of its own. A
// shared absl::Status rep is reference-counted inside Debian's uninstrumented libabsl_status,
// which ThreadSanitizer cannot see, so handing one rep to many threads reads as a data race
// (TOOLCHAIN.md section 2); fresh reps per reader keep the tsan preset meaningful. Payloads are
// not kept: kvtier sets none.
struct CompletionState {
  Mutex mu;
  CondVar cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusCode code ABSL_GUARDED_BY(mu) = absl::StatusCode::kOk;
  std::string message ABSL_GUARDED_BY(mu);

  absl::Status Outcome() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return code == absl::StatusCode::kOk ? absl::OkStatus() : absl::Status(code, message);
  }
  std::vector<std::function<void(const absl::Status&)>> callbacks ABSL_GUARDED_BY(mu);
};

}  // namespace internal

Completion::Completion() : state_(std::make_shared<internal::CompletionState>()) {}

Completion Completion::Done(absl::Status status) {
  Completion c;
  c.Complete(std::move(status));
  return c;
}

bool Completion::Complete(absl::Status status) const {
  std::vector<std::function<void(const absl::Status&)>> callbacks;
  {
    internal::MutexLock lock(&state_->mu);
    if (state_->done) return false;
    state_->done = true;
    state_->code = status.code();
    state_->message = std::string(status.message());
    callbacks.swap(state_->callbacks);
    state_->cv.SignalAll();
  }
  // Outside the lock: a callback may complete other completions or wait on this one.
  for (auto& cb : callbacks) cb(this->status());
  return true;
}

bool Completion::done() const {
  internal::MutexLock lock(&state_->mu);
  return state_->done;
}

absl::Status Completion::status() const {
  internal::MutexLock lock(&state_->mu);
  if (!state_->done) return absl::UnavailableError("pending");
  return state_->Outcome();
}

absl::Status Completion::WaitUntil(absl::Time deadline) const {
  internal::MutexLock lock(&state_->mu);
  if (deadline == absl::InfiniteFuture()) {
    while (!state_->done) state_->cv.Wait(&state_->mu);
    return state_->Outcome();
  }
  const auto chrono_deadline = absl::ToChronoTime(deadline);
  while (!state_->done) {
    if (!state_->cv.WaitUntil(&state_->mu, chrono_deadline) && !state_->done &&
        absl::Now() >= deadline) {
      return absl::DeadlineExceededError("the operation did not complete by its deadline");
    }
  }
  return state_->Outcome();
}

void Completion::OnDone(std::function<void(const absl::Status&)> callback) const {
  absl::Status status;
  {
    internal::MutexLock lock(&state_->mu);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(callback));
      return;
    }
    status = state_->Outcome();
  }
  callback(status);
}

Completion Completion::All(const std::vector<Completion>& parts) {
  if (parts.empty()) return Done(absl::OkStatus());
  Completion all;
  struct Shared {
    std::atomic<size_t> remaining;
    std::vector<Completion> parts;
  };
  auto shared = std::make_shared<Shared>();
  shared->remaining = parts.size();
  shared->parts = parts;
  for (const Completion& part : parts) {
    part.OnDone([shared, all](const absl::Status&) {
      if (shared->remaining.fetch_sub(1) != 1) return;
      for (const Completion& p : shared->parts) {
        absl::Status s = p.status();
        if (!s.ok()) {
          all.Complete(std::move(s));
          return;
        }
      }
      all.Complete(absl::OkStatus());
    });
  }
  return all;
}

}  // namespace kvtier
