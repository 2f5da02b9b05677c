// EventHub: delivers a KvCache's events to its subscribers (KvCache::SubscribeEvents), outside the
// cache's lock, in event order, one batch per lock hold that made changes.
//
// The cache appends each event, under its lock, to a batch of its own (KvCache::Impl's
// unpublished events) while anyone is subscribed; when a scope that made changes releases the lock
// it hands the batch over here (Enqueue, still under the cache lock, so batches queue in event
// order) and, once the lock is released, calls Deliver. Deliver runs the callbacks of every queued
// batch under `deliver_mu_`: one thread delivers at a time, in queue order; a thread that finds
// another delivering waits for it (its own batch is then delivered by one of them before its
// cache call returns). A callback that calls back into the cache (PollEvents, stats()) finds its
// own thread delivering and returns at once; the running loop delivers whatever it queued.
//
// Thread-safety: every method is thread-safe. Lock order: the cache's lock before queue_mu_ and
// subs_mu_ (leaves); deliver_mu_ is never taken under the cache's lock. The hub is shared by the
// cache and its subscriptions (EventSubscription), so a subscription may outlive the cache.
#ifndef KVTIER_CACHE_EVENT_HUB_H_
#define KVTIER_CACHE_EVENT_HUB_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/types/span.h"
#include "internal/interned_string.h"
#include "internal/mutex.h"
#include "kvtier/kv_cache_stats.h"

namespace kvtier::internal {

class EventHub {
 public:
  using Callback = std::function<void(absl::Span<const CacheEvent>)>;

  // `strings` holds the strings the events' views point into; the hub keeps it alive.
  explicit EventHub(std::shared_ptr<const StringInterner> strings) : strings_(std::move(strings)) {}

  // Whether anyone is subscribed: the cache collects batches only then.
  bool has_subscribers() const { return subscribers_.load(std::memory_order_acquire) > 0; }

  // Registers `callback` (non-null) for the events numbered first_sequence and later; returns
  // its id. The caller holds the cache's lock, so no event numbered first_sequence or later can
  // be made before the subscriber counts.
  uint64_t Add(Callback callback, uint64_t first_sequence);
  // Unregisters subscriber `id` (nothing if unknown): no call of its callback starts after this
  // returns, and one running on another thread has returned. From inside a callback of this hub
  // it does not wait (the running callback is the caller's own).
  void Remove(uint64_t id);

  // Queues one batch (events in order, numbered on from the previous batch's). Called under the
  // cache's lock.
  void Enqueue(std::vector<CacheEvent> batch);
  // Runs the callbacks of every queued batch (see the file comment). Never under the cache's lock.
  void Deliver();

 private:
  const std::shared_ptr<const StringInterner> strings_;
  struct Subscriber {
    uint64_t id = 0;
    uint64_t first_sequence = 0;
    Callback callback;
    std::atomic<bool> active{true};
  };

  // Whether this thread is inside a callback of this hub.
  bool DeliveringHere() const;

  std::atomic<int> subscribers_{0};
  Mutex subs_mu_;
  std::vector<std::shared_ptr<Subscriber>> subs_ ABSL_GUARDED_BY(subs_mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(subs_mu_) = 1;
  Mutex queue_mu_;
  std::deque<std::vector<CacheEvent>> queue_ ABSL_GUARDED_BY(queue_mu_);
  Mutex deliver_mu_;  // held while callbacks run
};

}  // namespace kvtier::internal

#endif  // KVTIER_CACHE_EVENT_HUB_H_
