// Completion: the one-shot outcome of an asynchronous operation (a block read, write or
// transfer). It fires exactly once with an absl::Status; any number of threads may wait on it,
// each with its own deadline. A waiter that gives up does not cancel the operation: the
// operation's owner decides what a late completion means (e.g. the destination stays
// quarantined until it fires).
//
// Completion is a cheap, copyable handle to shared state; copies observe the same outcome: the
// status code and message (payloads are not kept).
// Thread-safety: every method is thread-safe.
#ifndef KVTIER_COMPLETION_H_
#define KVTIER_COMPLETION_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvtier {

namespace internal {
struct CompletionState;
}  // namespace internal

class Completion {
 public:
  // A pending completion.
  Completion();
  // A completion that has already fired with `status` (for operations that finish inline).
  static Completion Done(absl::Status status);

  // Fires with `status`. Returns false (and changes nothing) if it had already fired: the first
  // outcome wins. Callbacks registered with OnDone run on this thread, after waiters are woken.
  // Only the operation's owner fires it: a completion a KvCache hands out (a ticket's, a layer's,
  // Resume's) is the cache's to fire, and firing it early ends its waits with blocks still
  // pending (the C ABI refuses it; here it is the caller's error, not checked).
  bool Complete(absl::Status status) const;

  bool done() const;
  // The outcome; kUnavailable("pending") while not done. Never blocks.
  absl::Status status() const;

  // Blocks until fired or `deadline` passes. Returns the outcome, or kDeadlineExceeded if the
  // deadline passed first (the operation itself goes on). absl::InfiniteFuture() waits forever.
  absl::Status WaitUntil(absl::Time deadline) const;
  absl::Status WaitFor(absl::Duration timeout) const { return WaitUntil(absl::Now() + timeout); }
  absl::Status Wait() const { return WaitUntil(absl::InfiniteFuture()); }

  // Runs `callback(status)` once fired: at once on this thread if already done, else on the
  // thread that calls Complete. Callbacks must not block.
  void OnDone(std::function<void(const absl::Status&)> callback) const;

  // Fires when every one of `parts` has fired: OK if all were OK, else the first non-OK status
  // in `parts` order. An empty list fires OK at once.
  static Completion All(const std::vector<Completion>& parts);

 private:
  std::shared_ptr<internal::CompletionState> state_;
};

}  // namespace kvtier

#endif  // KVTIER_COMPLETION_H_
