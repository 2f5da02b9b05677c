// EventHub (event_hub.h) and the subscription handle it backs (kv_cache.h EventSubscription).
#include "cache/event_hub.h"

#include <algorithm>
#include <utility>

#include "kvtier/kv_cache.h"

namespace kvtier {
namespace internal {
namespace {

// The hubs whose callbacks this thread is running, innermost last (a callback of one cache may
// call into another cache that delivers too).
thread_local std::vector<const EventHub*> t_delivering;

// Marks this thread as delivering `hub` for a scope.
class DeliveringScope {
 public:
  explicit DeliveringScope(const EventHub* hub) { t_delivering.push_back(hub); }
  ~DeliveringScope() { t_delivering.pop_back(); }
  DeliveringScope(const DeliveringScope&) = delete;
  DeliveringScope& operator=(const DeliveringScope&) = delete;
};

}  // namespace

bool EventHub::DeliveringHere() const {
  return std::find(t_delivering.begin(), t_delivering.end(), this) != t_delivering.end();
}

uint64_t EventHub::Add(Callback callback, uint64_t first_sequence) {
  auto s = std::make_shared<Subscriber>();
  s->first_sequence = first_sequence;
  s->callback = std::move(callback);
  MutexLock lock(&subs_mu_);
  s->id = next_id_++;
  subs_.push_back(s);
  subscribers_.fetch_add(1, std::memory_order_acq_rel);
  return s->id;
}

void EventHub::Remove(uint64_t id) {
  std::shared_ptr<Subscriber> gone;
  {
    MutexLock lock(&subs_mu_);
    auto it = std::find_if(subs_.begin(), subs_.end(),
                           [id](const std::shared_ptr<Subscriber>& s) { return s->id == id; });
    if (it == subs_.end()) return;
    gone = std::move(*it);
    subs_.erase(it);
  }
  gone->active.store(false, std::memory_order_release);
  subscribers_.fetch_sub(1, std::memory_order_acq_rel);
  // A delivery that read the subscriber list before the erase may still be calling it: it runs
  // under deliver_mu_, so taking that waits it out (later ones see `active` false).
  if (!DeliveringHere()) MutexLock wait(&deliver_mu_);
}

void EventHub::Enqueue(std::vector<CacheEvent> batch) {
  if (batch.empty()) return;
  MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(batch));
}

void EventHub::Deliver() {
  if (DeliveringHere()) return;  // the loop this thread is inside delivers it
  MutexLock lock(&deliver_mu_);
  DeliveringScope delivering(this);
  for (;;) {
    std::deque<std::vector<CacheEvent>> batches;
    {
      MutexLock q(&queue_mu_);
      batches.swap(queue_);
    }
    if (batches.empty()) break;
    std::vector<std::shared_ptr<Subscriber>> subs;
    {
      MutexLock s(&subs_mu_);
      subs = subs_;
    }
    for (const std::vector<CacheEvent>& batch : batches) {
      for (const std::shared_ptr<Subscriber>& s : subs) {
        if (!s->active.load(std::memory_order_acquire)) continue;
        // Events before the subscription (queued, not yet delivered, when it was made) are not
        // its own. Batches are runs of consecutive numbers.
        absl::Span<const CacheEvent> mine(batch);
        size_t skip = 0;
        while (skip < mine.size() && mine[skip].sequence < s->first_sequence) ++skip;
        mine.remove_prefix(skip);
        if (!mine.empty()) s->callback(mine);
      }
    }
  }
}

}  // namespace internal

EventSubscription::EventSubscription(std::shared_ptr<internal::EventHub> hub, uint64_t id,
                                     uint64_t first_sequence)
    : hub_(std::move(hub)), id_(id), first_sequence_(first_sequence) {}

EventSubscription::EventSubscription(EventSubscription&& other) noexcept
    : hub_(std::move(other.hub_)), id_(other.id_), first_sequence_(other.first_sequence_) {
  other.id_ = 0;
}

EventSubscription& EventSubscription::operator=(EventSubscription&& other) noexcept {
  if (this != &other) {
    Unsubscribe();
    hub_ = std::move(other.hub_);
    id_ = other.id_;
    first_sequence_ = other.first_sequence_;
    other.id_ = 0;
  }
  return *this;
}

EventSubscription::~EventSubscription() { Unsubscribe(); }

void EventSubscription::Unsubscribe() {
  if (hub_ == nullptr) return;
  hub_->Remove(id_);
  hub_.reset();
  id_ = 0;
}

}  // namespace kvtier
