// Runs callbacks at deadlines on one thread. Callbacks must be short and must not block.
#ifndef KVTIER_INTERNAL_DEADLINE_TIMER_H_
#define KVTIER_INTERNAL_DEADLINE_TIMER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "internal/mutex.h"

namespace kvtier::internal {

class DeadlineTimer {
 public:
  DeadlineTimer() : thread_([this] { Run(); }) {}
  ~DeadlineTimer() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      cv_.SignalAll();
    }
    thread_.join();
  }

  // Calls `fn` at `deadline` unless cancelled first. Returns an id for Cancel.
  uint64_t Schedule(absl::Time deadline, std::function<void()> fn) {
    MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    entries_.emplace(std::make_pair(deadline, id), std::move(fn));
    // Wake the thread only if it sleeps past this deadline: callers that schedule a deadline and
    // cancel it a moment later (every transport call, every transfer) then cost no context switch
    // here. The thread, waking at the time it slept until, re-arms for the earliest entry left.
    if (deadline < sleeping_until_) {
      sleeping_until_ = deadline;
      cv_.SignalAll();
    }
    return id;
  }
  void Cancel(absl::Time deadline, uint64_t id) {
    MutexLock lock(&mu_);
    entries_.erase(std::make_pair(deadline, id));
  }

 private:
  void Run() {
    MutexLock lock(&mu_);
    while (!stopping_) {
      if (entries_.empty()) {
        sleeping_until_ = absl::InfiniteFuture();
        cv_.Wait(&mu_);
        continue;
      }
      const auto first = entries_.begin();
      if (absl::Now() < first->first.first) {
        sleeping_until_ = first->first.first;
        cv_.WaitUntil(&mu_, absl::ToChronoTime(first->first.first));
        continue;
      }
      sleeping_until_ = absl::InfinitePast();  // running callbacks: it looks again before sleeping
      std::function<void()> fn = std::move(first->second);
      entries_.erase(first);
      mu_.Unlock();
      fn();
      mu_.Lock();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // When the thread wakes by itself next (InfiniteFuture while it waits for an entry;
  // InfinitePast while it is awake).
  absl::Time sleeping_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvtier::internal

#endif  // KVTIER_INTERNAL_DEADLINE_TIMER_H_
