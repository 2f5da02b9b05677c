// RedisTransport (redis_transport.h): pipelined batches on worker connections; cluster routing.
#include "kvtier/redis_transport.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <deque>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "internal/deadline_timer.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "internal/strings.h"
#include "remote/redis/key_slot.h"
#include "remote/redis/redis_connection.h"
#include "remote/redis/redis_endpoint.h"
#include "remote/transport_items.h"

namespace kvtier {

using internal::RedisConnection;
using internal::RedisReplyPtr;

namespace {

constexpr size_t kMaxKeyBytes = 65536;
// A round trip carries at most this many value bytes, so a batch of large values does not
// buffer hundreds of MiB in one pipeline.
constexpr int64_t kMaxRoundTripBytes = int64_t{64} << 20;

enum class Op : uint8_t { kSet, kGet, kExists, kDel };

struct Batch;

struct Item {
  Op op = Op::kGet;
  std::string key;
  absl::Span<const std::byte> value_prefix;     // kSet: stored before `value`
  absl::Span<const std::byte> value;            // kSet
  bool if_absent = false;                       // kSet: SET ... NX
  std::vector<std::byte>* out = nullptr;        // kGet, unless `receiver`
  std::shared_ptr<TransportReceiver> receiver;  // kGet
  bool receiving = false;  // owned by the worker: its value is being received (Begin ran)
  int64_t max_bytes = 0;   // kGet
  Completion done;
  Batch* batch = nullptr;
  int redirects = 0;
  int ask_node = -1;       // after ASK: the next attempt goes to this node, after ASKING
  bool retried = false;    // sent again once on a fresh connection after a stale one failed
  bool try_again = false;  // the server said TRYAGAIN

  // Who may complete the item. kFree: whoever claims it first (the deadline timer, or a worker
  // with its reply). kOwned: a worker is touching the caller's buffers (sending a SET's value,
  // receiving a GET's), so the timer leaves it alone and the worker bounds that I/O by the
  // item's deadline itself. kDone: completed. Buffers are therefore never touched after the
  // Completion fired.
  enum State : uint8_t { kFree = 0, kOwned = 1, kDone = 2 };
  std::atomic<uint8_t> state{kFree};

  bool Claim() { return Move(kFree, kDone); }
  bool Own() { return Move(kFree, kOwned); }
  bool Disown() { return Move(kOwned, kFree); }
  bool done_already() const { return state.load(std::memory_order_acquire) == kDone; }

 private:
  bool Move(uint8_t from, uint8_t to) {
    return state.compare_exchange_strong(from, to, std::memory_order_acq_rel);
  }
};

struct Batch {
  absl::Time deadline;
  std::vector<std::unique_ptr<Item>> items;
  std::atomic<int64_t> remaining{0};
  uint64_t timer_id = 0;
};

// Items a worker runs together, and the batches that own them.
struct Work {
  std::vector<std::shared_ptr<Batch>> owners;
  std::vector<Item*> items;
  // One node's share of another worker's items: served whole and alone, so a small group is
  // never merged and split off again behind larger ones (starvation).
  bool handed_off = false;
};

int64_t ValueBytes(const Item& item) {
  return item.op == Op::kSet ? static_cast<int64_t>(item.value_prefix.size() + item.value.size())
                             : 0;
}

// The status of an error reply. A server that is not ready (CLUSTERDOWN, LOADING, MASTERDOWN,
// BUSY, TRYAGAIN) is kUnavailable: the store's health. Any other refusal is an answer from a
// working store and must not read as one that is down: OOM is kResourceExhausted, NOAUTH,
// WRONGPASS and NOPERM kPermissionDenied, the rest (ERR, WRONGTYPE, ...) kInternal.
absl::Status ErrorReplyStatus(const std::string& address, std::string_view error) {
  const absl::string_view e = internal::ToAbsl(error);
  const std::string message = absl::StrCat("redis ", address, ": ", e);
  for (const char* prefix : {"CLUSTERDOWN", "LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN"}) {
    if (absl::StartsWith(e, prefix)) return absl::UnavailableError(message);
  }
  if (absl::StartsWith(e, "OOM")) return absl::ResourceExhaustedError(message);
  for (const char* prefix : {"NOAUTH", "WRONGPASS", "NOPERM"}) {
    if (absl::StartsWith(e, prefix)) return absl::PermissionDeniedError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

struct RedisTransport::Impl {
  struct Node {
    internal::RedisEndpoint endpoint;
    absl::Time retry_after = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
    std::string last_error;
  };

  RedisTransportOptions options;
  std::string ttl_ms;  // "PX" argument, empty for no TTL

  internal::Mutex refresh_mu;  // held while reading CLUSTER SLOTS; taken before topo_mu
  mutable internal::Mutex topo_mu;
  std::vector<Node> nodes ABSL_GUARDED_BY(topo_mu);
  absl::flat_hash_map<std::string, int> node_by_address ABSL_GUARDED_BY(topo_mu);
  std::vector<int> slot_owner ABSL_GUARDED_BY(topo_mu);  // cluster: node index or -1
  absl::Time last_refresh ABSL_GUARDED_BY(topo_mu) = absl::InfinitePast();

  internal::Mutex queue_mu;
  internal::CondVar queue_cv;
  std::deque<Work> queue ABSL_GUARDED_BY(queue_mu);
  bool stopping ABSL_GUARDED_BY(queue_mu) = false;

  struct Counters {
    std::atomic<int64_t> commands{0}, round_trips{0}, moved{0}, ask{0}, slot_map_refreshes{0},
        connects{0}, connect_failures{0}, io_errors{0}, deadline_exceeded{0};
  } counters;

  // Connection sets (one connection, like a worker's) for callers that run an Exists batch
  // themselves (Submit): at most options.connections, each used by one caller at a time.
  using ConnectionSet = std::vector<std::unique_ptr<RedisConnection>>;
  internal::Mutex caller_mu;
  std::vector<ConnectionSet> idle_caller_sets ABSL_GUARDED_BY(caller_mu);
  int caller_sets_made ABSL_GUARDED_BY(caller_mu) = 0;

  internal::DeadlineTimer timer;
  std::vector<std::thread> workers;  // last: started once everything above exists

  // ---- completing items ----
  void Finish(Item* item, absl::Status status) {
    if (!item->Claim()) return;
    item->done.Complete(std::move(status));
    Release(item->batch);
  }
  // Where a GET's value goes, asked before its bytes are read: the item's receiver's buffers or
  // its output vector, so the value moves from the socket straight to them. A value for an item
  // that has completed (deadline) or is refused is skipped. The item is then claimed, and
  // completes in ValueReceived (or in FailReceiving if the connection breaks meanwhile).
  RedisConnection::BulkTarget ValueTarget(Item* item, int64_t length) {
    RedisConnection::BulkTarget skip{.skip = true};
    if (item->max_bytes > 0 && length > item->max_bytes) {
      Finish(item,
             absl::DataLossError(absl::StrCat("redis: value at ", item->key, " is ", length,
                                              " bytes; at most ", item->max_bytes, " expected")));
      return skip;
    }
    if (!item->Own()) return skip;  // completed already: the bytes are dropped
    RedisConnection::BulkTarget target{.deadline = item->batch->deadline};
    if (item->receiver != nullptr) {
      absl::StatusOr<std::vector<absl::Span<std::byte>>> buffers = item->receiver->Begin(length);
      if (!buffers.ok()) {
        Complete(item, buffers.status());
        return skip;
      }
      int64_t total = 0;
      for (const absl::Span<std::byte>& b : *buffers) total += static_cast<int64_t>(b.size());
      if (total != length) {
        Complete(item, absl::InternalError(absl::StrCat("redis: the receiver named ", total,
                                                        " bytes for a value of ", length)));
        return skip;
      }
      target.buffers = *std::move(buffers);
      target.on_bytes = [receiver = item->receiver.get()](absl::Span<const std::byte> piece) {
        receiver->Received(piece);
      };
    } else {
      item->out->resize(static_cast<size_t>(length));
      target.buffers = {absl::MakeSpan(*item->out)};
    }
    item->receiving = true;
    // Its deadline passing mid-value fails it then, and the connection reads on past the rest
    // of the value for the other items of the round trip (before, they failed with it).
    target.on_cut = [this, item](const absl::Status& s) { FailReceiving(item, s); };
    if (length == 0) return skip;  // nothing to read; ValueReceived finishes it
    // Drop empty buffers: an empty list means "keep the bytes" to the reader.
    std::erase_if(target.buffers, [](absl::Span<std::byte> b) { return b.empty(); });
    return target;
  }
  void ValueReceived(Item* item) {
    if (!item->receiving) return;  // skipped: completed elsewhere
    item->receiving = false;
    Complete(item, item->receiver != nullptr ? item->receiver->Finish() : absl::OkStatus());
  }
  void FailReceiving(Item* item, const absl::Status& status) {
    item->receiving = false;
    Complete(item, status);
  }
  // Completes an item this worker owns.
  void Complete(Item* item, absl::Status status) {
    item->state.store(Item::kDone, std::memory_order_release);
    item->done.Complete(std::move(status));
    Release(item->batch);
  }
  void Release(Batch* batch) {
    if (batch->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 && batch->timer_id != 0) {
      timer.Cancel(batch->deadline, batch->timer_id);
    }
  }

  // ---- topology ----
  int NodeIndexLocked(const internal::RedisEndpoint& ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(topo_mu) {
    const std::string address = ep.address();
    auto it = node_by_address.find(address);
    if (it != node_by_address.end()) return it->second;
    nodes.push_back(Node{.endpoint = ep});
    const int index = static_cast<int>(nodes.size()) - 1;
    node_by_address.emplace(address, index);
    return index;
  }
  int NodeIndex(const internal::RedisEndpoint& ep) {
    internal::MutexLock lock(&topo_mu);
    return NodeIndexLocked(ep);
  }
  internal::RedisEndpoint EndpointOf(int node) const {
    internal::MutexLock lock(&topo_mu);
    return nodes[static_cast<size_t>(node)].endpoint;
  }
  // The node a key goes to, or -1 when the slot map has no owner for its slot.
  int Route(std::string_view key) {
    if (!options.cluster) return 0;
    internal::MutexLock lock(&topo_mu);
    return slot_owner[static_cast<size_t>(internal::RedisKeySlot(key))];
  }

  // ---- connections (each worker owns its own, indexed by node) ----
  // A worker (io_bound infinite) connects with connect_timeout whatever the callers' deadlines
  // (the timer enforces those), so a tight deadline never makes a healthy server look down. A
  // caller running its own batch (io_bound: its deadline) connects by that deadline, and its
  // failures leave the node's backoff alone for the same reason.
  absl::StatusOr<RedisConnection*> Connection(int node,
                                              std::vector<std::unique_ptr<RedisConnection>>& conns,
                                              bool* reused, absl::Time io_bound) {
    if (conns.size() <= static_cast<size_t>(node)) conns.resize(static_cast<size_t>(node) + 1);
    std::unique_ptr<RedisConnection>& conn = conns[static_cast<size_t>(node)];
    if (conn != nullptr && !conn->broken()) {
      *reused = true;
      return conn.get();
    }
    conn.reset();
    *reused = false;
    internal::RedisConnectOptions connect;
    {
      internal::MutexLock lock(&topo_mu);
      Node& n = nodes[static_cast<size_t>(node)];
      const absl::Time now = absl::Now();
      if (now < n.retry_after) {
        return absl::UnavailableError(absl::StrCat("redis ", n.endpoint.address(), ": down (",
                                                   n.last_error, "); next connect attempt in ",
                                                   absl::FormatDuration(n.retry_after - now)));
      }
      connect = {.host = n.endpoint.host,
                 .port = n.endpoint.port,
                 .username = options.username,
                 .password = options.password,
                 .database = options.database};
    }
    const absl::Duration timeout = std::min(options.connect_timeout, io_bound - absl::Now());
    if (timeout <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("redis: deadline passed before connecting");
    }
    absl::StatusOr<std::unique_ptr<RedisConnection>> made =
        RedisConnection::Connect(connect, timeout);
    if (!made.ok() && io_bound != absl::InfiniteFuture()) {
      if (absl::Now() < io_bound) {
        counters.connect_failures.fetch_add(1);
        return made.status();
      }
      return absl::DeadlineExceededError(
          absl::StrCat("redis: not connected by the deadline (", made.status().message(), ")"));
    }
    internal::MutexLock lock(&topo_mu);
    Node& n = nodes[static_cast<size_t>(node)];
    if (!made.ok()) {
      counters.connect_failures.fetch_add(1);
      n.backoff = n.backoff == absl::ZeroDuration()
                      ? options.reconnect_backoff_min
                      : std::min(2 * n.backoff, options.reconnect_backoff_max);
      n.retry_after = absl::Now() + n.backoff;
      n.last_error = std::string(made.status().message());
      return made.status();
    }
    counters.connects.fetch_add(1);
    n.backoff = absl::ZeroDuration();
    n.retry_after = absl::InfinitePast();
    conn = *std::move(made);
    return conn.get();
  }

  // Reads CLUSTER SLOTS from the first node that answers (`first` before the others) and
  // replaces the slot map. Rate-limited: at most one refresh per 100 ms unless `force`.
  void RefreshSlotMap(std::vector<std::unique_ptr<RedisConnection>>& conns, int first, bool force,
                      absl::Time deadline);

  // ---- the worker ----
  void WorkerLoop();
  // io_bound: when socket waits give up besides command_timeout (InfiniteFuture on workers,
  // whose callers' deadlines the timer keeps; the caller's deadline when it runs its own batch).
  void Execute(Work work, std::vector<std::unique_ptr<RedisConnection>>& conns,
               absl::Time io_bound = absl::InfiniteFuture());
  void RunOnNode(int node, absl::Span<Item* const> items,
                 std::vector<std::unique_ptr<RedisConnection>>& conns, std::vector<Item*>* retry,
                 bool* refresh, int* refresh_from, absl::Time io_bound);
  // Runs a standalone server's Exists batch on the calling thread (see Submit); false if every
  // caller set is in use.
  bool RunOnCaller(Work work);
  void HandleReply(Item* item, const RedisConnection::Reply& reply, int node,
                   std::vector<Item*>* retry, bool* refresh, int* refresh_from);

  // ---- submitting ----
  std::vector<Completion> Submit(std::shared_ptr<Batch> batch);
};

void RedisTransport::Impl::RefreshSlotMap(std::vector<std::unique_ptr<RedisConnection>>& conns,
                                          int first, bool force, absl::Time deadline) {
  // One refresh at a time: a worker that finds a refresh under way waits for its map (rather than
  // failing its keys for want of one), then skips its own as too recent.
  internal::MutexLock refreshing(&refresh_mu);
  std::vector<int> candidates;
  {
    internal::MutexLock lock(&topo_mu);
    const absl::Time now = absl::Now();
    // At most every 100 ms, or 10 ms when a slot has no known owner at all (forced).
    if (now - last_refresh < (force ? absl::Milliseconds(10) : absl::Milliseconds(100))) return;
    last_refresh = now;
    if (first >= 0) candidates.push_back(first);
    for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
      if (i != first) candidates.push_back(i);
    }
  }
  for (int node : candidates) {
    if (absl::Now() >= deadline) return;
    bool reused = false;
    absl::StatusOr<RedisConnection*> conn =
        Connection(node, conns, &reused, absl::InfiniteFuture());
    if (!conn.ok()) continue;
    (*conn)->Append({"CLUSTER", "SLOTS"});
    std::vector<RedisReplyPtr> replies;
    if (!(*conn)->RoundTrip(options.command_timeout, &replies).ok()) {
      counters.io_errors.fetch_add(1);
      conns[static_cast<size_t>(node)].reset();
      continue;
    }
    const redisReply* r = replies[0].get();
    if (r->type != REDIS_REPLY_ARRAY) continue;
    const std::string queried_host = (*conn)->address().substr(0, (*conn)->address().rfind(':'));
    std::vector<std::pair<std::pair<int64_t, int64_t>, internal::RedisEndpoint>> ranges;
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
          e->element[0]->type != REDIS_REPLY_INTEGER ||
          e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
          e->element[2]->elements < 2) {
        continue;
      }
      const redisReply* master = e->element[2];
      if (master->element[0]->type != REDIS_REPLY_STRING ||
          master->element[1]->type != REDIS_REPLY_INTEGER) {
        continue;
      }
      std::string host(master->element[0]->str, master->element[0]->len);
      // An empty or "?" host means "the address you reached me at" (cluster-spec).
      if (host.empty() || host == "?") host = queried_host;
      ranges.push_back(
          {{e->element[0]->integer, e->element[1]->integer},
           internal::RedisEndpoint{host, static_cast<int>(master->element[1]->integer)}});
    }
    counters.slot_map_refreshes.fetch_add(1);
    internal::MutexLock lock(&topo_mu);
    std::vector<int> owners(internal::kRedisClusterSlots, -1);
    for (const auto& [range, ep] : ranges) {
      const int index = NodeIndexLocked(ep);
      for (int64_t s = std::max<int64_t>(range.first, 0);
           s <= std::min<int64_t>(range.second, internal::kRedisClusterSlots - 1); ++s) {
        owners[static_cast<size_t>(s)] = index;
      }
    }
    slot_owner = std::move(owners);
    return;
  }
}

void RedisTransport::Impl::WorkerLoop() {
  // hiredis writes with plain write(): to a server that died that raises SIGPIPE, whose default
  // action kills the process. All of this transport's socket I/O runs on its workers, so
  // blocking the signal in them (a per-thread mask, not the process's disposition) turns it into
  // the EPIPE error it should be. A blocked SIGPIPE stays pending on this thread, harmlessly.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  std::vector<std::unique_ptr<RedisConnection>> conns;
  while (true) {
    Work work;
    {
      internal::MutexLock lock(&queue_mu);
      while (queue.empty() && !stopping) queue_cv.Wait(&queue_mu);
      if (queue.empty()) return;  // stopping
      // Several small batches share one round trip, up to max_pipeline items.
      if (queue.front().handed_off) {
        work = std::move(queue.front());
        queue.pop_front();
      }
      while (!work.handed_off && !queue.empty() && !queue.front().handed_off &&
             (work.items.empty() || work.items.size() + queue.front().items.size() <=
                                        static_cast<size_t>(options.max_pipeline))) {
        Work& next = queue.front();
        work.items.insert(work.items.end(), next.items.begin(), next.items.end());
        work.owners.insert(work.owners.end(), next.owners.begin(), next.owners.end());
        queue.pop_front();
      }
    }
    Execute(std::move(work), conns);
  }
}

void RedisTransport::Impl::Execute(Work work, std::vector<std::unique_ptr<RedisConnection>>& conns,
                                   absl::Time io_bound) {
  bool map_refreshed = false;
  bool may_hand_off = !work.handed_off;
  std::vector<Item*> items = std::move(work.items);
  while (!items.empty()) {
    // Group by node, in arrival order within a node.
    std::vector<std::vector<Item*>> by_node;
    absl::Time latest = absl::InfinitePast();
    const absl::Time now = absl::Now();  // once per pass: a probe is hundreds of items
    for (Item* item : items) {
      if (item->done_already()) continue;
      if (now > item->batch->deadline) {
        Finish(item, absl::DeadlineExceededError("redis: deadline passed before sending"));
        continue;
      }
      int node = item->ask_node >= 0 ? item->ask_node : Route(item->key);
      if (node < 0 && !map_refreshed) {
        RefreshSlotMap(conns, -1, /*force=*/true, item->batch->deadline);
        map_refreshed = true;
        node = Route(item->key);
      }
      if (node < 0) {
        Finish(item, absl::UnavailableError(absl::StrCat("redis-cluster: no node serves hash slot ",
                                                         internal::RedisKeySlot(item->key),
                                                         " (slot map unavailable)")));
        continue;
      }
      if (by_node.size() <= static_cast<size_t>(node))
        by_node.resize(static_cast<size_t>(node) + 1);
      by_node[static_cast<size_t>(node)].push_back(item);
      latest = std::max(latest, item->batch->deadline);
    }
    // This worker serves the largest group; the others go back to the front of the queue for
    // other workers, so a hung node does not hold up the keys of the healthy ones.
    size_t mine = 0;
    for (size_t node = 0; node < by_node.size(); ++node) {
      if (by_node[node].size() > by_node[mine].size()) mine = node;
    }
    bool handed_off = false;
    size_t groups = 0;
    for (const std::vector<Item*>& g : by_node) groups += g.empty() ? 0 : 1;
    if (groups > 1) {  // one node (always, standalone): nothing to hand off, no queue lock
      internal::MutexLock lock(&queue_mu);
      if (!stopping && may_hand_off) {
        for (size_t node = 0; node < by_node.size(); ++node) {
          if (node == mine || by_node[node].empty()) continue;
          queue.push_front(Work{work.owners, std::move(by_node[node]), /*handed_off=*/true});
          by_node[node].clear();
          handed_off = true;
        }
      }
    }
    if (handed_off) queue_cv.SignalAll();
    std::vector<Item*> retry;
    bool refresh = false;
    int refresh_from = -1;
    for (size_t node = 0; node < by_node.size(); ++node) {
      if (!by_node[node].empty()) {
        RunOnNode(static_cast<int>(node), by_node[node], conns, &retry, &refresh, &refresh_from,
                  io_bound);
      }
    }
    if (refresh) RefreshSlotMap(conns, refresh_from, /*force=*/false, latest);
    // TRYAGAIN (a slot mid-migration) asks for a short wait before the retry.
    bool wait = false;
    for (Item* item : retry) {
      wait = wait || item->try_again;
      item->try_again = false;
    }
    if (wait) absl::SleepFor(absl::Milliseconds(10));
    may_hand_off = true;
    items = std::move(retry);
  }
}

void RedisTransport::Impl::RunOnNode(int node, absl::Span<Item* const> items,
                                     std::vector<std::unique_ptr<RedisConnection>>& conns,
                                     std::vector<Item*>* retry, bool* refresh, int* refresh_from,
                                     absl::Time io_bound) {
  size_t begin = 0;
  while (begin < items.size()) {
    // One round trip: up to max_pipeline items and kMaxRoundTripBytes of values.
    size_t end = begin;
    int64_t bytes = 0;
    while (end < items.size() && end - begin < static_cast<size_t>(options.max_pipeline) &&
           (end == begin || bytes + ValueBytes(*items[end]) <= kMaxRoundTripBytes)) {
      bytes += ValueBytes(*items[end]);
      ++end;
    }
    const absl::Span<Item* const> chunk = items.subspan(begin, end - begin);
    begin = end;

    bool reused = false;
    absl::StatusOr<RedisConnection*> conn = Connection(node, conns, &reused, io_bound);
    if (!conn.ok()) {
      for (Item* item : chunk) Finish(item, conn.status());
      continue;
    }
    // A SET's value is sent from the caller's memory, so the item is owned (the timer cannot
    // complete it) until the send is over, and the send is bounded by its deadline.
    const absl::Time start = absl::Now();
    const absl::Time io_deadline = std::min(start + options.command_timeout, io_bound);
    absl::Time send_deadline = io_deadline;
    std::vector<Item*> sent;        // the items in the pipeline, in order
    std::vector<int> command_item;  // per command: index into `sent`, -1 for an ASKING
    sent.reserve(chunk.size());
    command_item.reserve(chunk.size() + 4);
    for (Item* item : chunk) {
      if (item->op == Op::kSet ? !item->Own() : item->done_already()) continue;  // timed out
      if (item->op == Op::kSet) send_deadline = std::min(send_deadline, item->batch->deadline);
      if (item->ask_node >= 0) {
        item->ask_node = -1;
        (*conn)->Queue({{"ASKING"}});
        command_item.push_back(-1);
      }
      command_item.push_back(static_cast<int>(sent.size()));
      sent.push_back(item);
      const std::string_view key = item->key;
      switch (item->op) {
        case Op::kSet: {
          const RedisConnection::Arg value{
              {reinterpret_cast<const char*>(item->value_prefix.data()), item->value_prefix.size()},
              {reinterpret_cast<const char*>(item->value.data()), item->value.size()}};
          if (ttl_ms.empty()) {
            if (item->if_absent) {
              (*conn)->Queue({{"SET"}, {key}, value, {"NX"}});
            } else {
              (*conn)->Queue({{"SET"}, {key}, value});
            }
          } else if (item->if_absent) {
            (*conn)->Queue({{"SET"}, {key}, value, {"NX"}, {"PX"}, {ttl_ms}});
          } else {
            (*conn)->Queue({{"SET"}, {key}, value, {"PX"}, {ttl_ms}});
          }
          break;
        }
        case Op::kGet:
          if (options.refresh_ttl_on_get) {
            (*conn)->Queue({{"GETEX"}, {key}, {"PX"}, {ttl_ms}});
          } else {
            (*conn)->Queue({{"GET"}, {key}});
          }
          break;
        case Op::kExists:
          (*conn)->Queue({{"EXISTS"}, {key}});
          break;
        case Op::kDel:
          (*conn)->Queue({{"DEL"}, {key}});
          break;
      }
    }
    if (sent.empty()) continue;
    // Once sent, SET values are in the kernel: the items are free for the timer again, and one
    // whose deadline passed during the send completes now.
    bool released = false;
    auto release_sets = [&] {
      released = true;
      const absl::Time now = absl::Now();
      for (Item* item : sent) {
        if (item->op == Op::kSet && item->Disown() && now > item->batch->deadline) {
          Finish(item, absl::DeadlineExceededError("redis: deadline passed while sending"));
        }
      }
    };
    counters.commands.fetch_add(static_cast<int64_t>(sent.size()));
    counters.round_trips.fetch_add(1);
    // Each item completes as its reply arrives, not when the whole pipeline is in. Socket waits
    // are bounded by command_timeout; callers' deadlines are the timer's (and, for a value being
    // received into a caller's buffers, the reader's).
    size_t answered = 0;  // items of `sent` with a reply
    const absl::Status io = (*conn)->RoundTripQueued(
        send_deadline, io_deadline,
        [&](size_t index, int64_t length) -> RedisConnection::BulkTarget {
          const int i = command_item[index];
          Item* item = i < 0 ? nullptr : sent[static_cast<size_t>(i)];
          if (item == nullptr || item->op != Op::kGet) return {};  // kept, then reported
          return ValueTarget(item, length);
        },
        release_sets,
        [&](size_t index, const RedisConnection::Reply& reply) {
          const int i = command_item[index];
          answered = static_cast<size_t>(std::max(i + 1, static_cast<int>(answered)));
          if (i < 0) return;  // ASKING's +OK; an error shows on the command itself
          Item* item = sent[static_cast<size_t>(i)];
          if (reply.delivered || reply.skipped || item->receiving) {
            ValueReceived(item);
            return;
          }
          HandleReply(item, reply, node, retry, refresh, refresh_from);
        });
    if (io.ok()) continue;
    counters.io_errors.fetch_add(1);
    // A broken connection (a command cut mid-way, a reply never read) is closed now, not at its
    // next use: the server must not wait on it, nor keep reading a value the caller gave up.
    if ((*conn)->broken()) conns[static_cast<size_t>(node)].reset();
    if (!released) release_sets();
    for (size_t i = answered; i < sent.size(); ++i) {
      Item* item = sent[i];
      if (item->receiving) {  // its value was cut off mid-way
        FailReceiving(item, io);
        continue;
      }
      // No reply. A connection that had sat idle may have died with a server restart: send once
      // more on a fresh one. A timeout is not retried (the server is slow, not gone).
      if (reused && !item->retried && !absl::IsDeadlineExceeded(io)) {
        item->retried = true;
        retry->push_back(item);
      } else {
        Finish(item, io);
      }
    }
  }
}

void RedisTransport::Impl::HandleReply(Item* item, const RedisConnection::Reply& reply, int node,
                                       std::vector<Item*>* retry, bool* refresh,
                                       int* refresh_from) {
  if (reply.type == REDIS_REPLY_ERROR) {
    const std::string_view error = reply.text;
    const bool moved = absl::StartsWith(internal::ToAbsl(error), "MOVED ");
    const bool ask = absl::StartsWith(internal::ToAbsl(error), "ASK ");
    if (options.cluster && (moved || ask)) {
      // "MOVED <slot> <host>:<port>": an empty host means the node that replied, and an IPv6
      // host comes without brackets, so the port is after the last ':'.
      const size_t space = error.rfind(' ');
      absl::StatusOr<internal::RedisEndpoint> target = internal::ParseRedisEndpoint(
          error.substr(space + 1), EndpointOf(node).host, /*server_supplied=*/true);
      ++item->redirects;
      if (!target.ok() || item->redirects > options.max_redirects) {
        *refresh = true;  // the map is what is wrong; learn it again
        Finish(item, absl::UnavailableError(absl::StrCat(
                         "redis-cluster: gave up on key after ", item->redirects,
                         " redirects; last: ", internal::ToAbsl(error),
                         target.ok() ? "" : absl::StrCat(" (", target.status().message(), ")"))));
        return;
      }
      const int to = NodeIndex(*target);
      if (moved) {
        counters.moved.fetch_add(1);
        int slot = -1;
        const std::string_view slot_text = error.substr(6, space - 6);
        std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), slot);
        if (slot >= 0 && slot < internal::kRedisClusterSlots) {
          internal::MutexLock lock(&topo_mu);
          slot_owner[static_cast<size_t>(slot)] = to;
        }
        *refresh = true;
        *refresh_from = to;
      } else {
        counters.ask.fetch_add(1);
        item->ask_node = to;
      }
      retry->push_back(item);
      return;
    }
    if (options.cluster && absl::StartsWith(internal::ToAbsl(error), "TRYAGAIN") &&
        ++item->redirects <= options.max_redirects) {
      item->try_again = true;  // a slot mid-migration; Redis asks to retry shortly
      retry->push_back(item);
      return;
    }
    Finish(item, ErrorReplyStatus(EndpointOf(node).address(), error));
    return;
  }
  switch (item->op) {
    case Op::kGet:
      // A string reply was delivered through ValueTarget; here only nil or a wrong type.
      if (reply.type == REDIS_REPLY_NIL) {
        Finish(item, absl::NotFoundError(absl::StrCat("redis: no value at ", item->key)));
      } else {
        Finish(item, absl::UnavailableError(absl::StrCat("redis: GET answered with ",
                                                         internal::DescribeReply(reply))));
      }
      return;
    case Op::kSet:
      if (reply.type == REDIS_REPLY_STATUS) {
        Finish(item, absl::OkStatus());
      } else if (reply.type == REDIS_REPLY_NIL && item->if_absent) {  // NX: the key exists
        Finish(item, absl::AlreadyExistsError(absl::StrCat("redis: ", item->key, " exists")));
      } else {
        Finish(item, absl::UnavailableError(absl::StrCat("redis: SET answered with ",
                                                         internal::DescribeReply(reply))));
      }
      return;
    case Op::kExists:
    case Op::kDel:
      if (reply.type != REDIS_REPLY_INTEGER) {
        Finish(item, absl::UnavailableError(
                         absl::StrCat("redis: answered with ", internal::DescribeReply(reply))));
      } else if (reply.integer == 0) {
        Finish(item, absl::NotFoundError(absl::StrCat("redis: no value at ", item->key)));
      } else {
        Finish(item, absl::OkStatus());
      }
      return;
  }
}

std::vector<Completion> RedisTransport::Impl::Submit(std::shared_ptr<Batch> batch) {
  std::vector<Completion> out;
  out.reserve(batch->items.size());
  for (const auto& item : batch->items) out.push_back(item->done);
  // Items that failed validation are claimed already; only the rest are counted and sent.
  int64_t live = 0;
  for (const auto& item : batch->items) live += item->done_already() ? 0 : 1;
  if (live == 0) return out;
  if (absl::Now() > batch->deadline) {
    for (const auto& item : batch->items) {
      if (item->Claim()) {
        item->done.Complete(absl::DeadlineExceededError("redis: deadline passed before the call"));
      }
    }
    return out;
  }
  batch->remaining.store(live);
  // An existence probe is waited for by its caller (a cache matching a prompt), and its replies
  // are a few bytes: on a standalone server the caller runs the round trip itself when a caller
  // set is free, sparing the hand-off to a worker and back (two thread wake-ups, most of a
  // loopback probe's time), and with no deadline timer: its socket waits end by the deadline
  // themselves. Cluster batches (slot map, redirects, other nodes) go to the workers.
  if (!options.cluster && std::all_of(batch->items.begin(), batch->items.end(),
                                      [](const auto& i) { return i->op == Op::kExists; })) {
    Work work;
    for (const auto& item : batch->items) {
      if (!item->done_already()) work.items.push_back(item.get());
    }
    work.owners.push_back(batch);
    if (RunOnCaller(std::move(work))) return out;
  }
  if (batch->deadline != absl::InfiniteFuture()) {
    // Scheduled before the batch is queued, so a worker that finishes it can cancel the entry.
    batch->timer_id = timer.Schedule(batch->deadline, [this, batch] {
      for (const auto& item : batch->items) {
        if (item->Claim()) {
          counters.deadline_exceeded.fetch_add(1);
          item->done.Complete(absl::DeadlineExceededError(
              "redis: no reply by the deadline (server slow, stopped or unreachable)"));
          batch->remaining.fetch_sub(1);
        }
      }
    });
  }
  bool cancelled = false;
  {
    internal::MutexLock lock(&queue_mu);
    cancelled = stopping;
    if (!cancelled) {
      Work work;
      for (const auto& item : batch->items) {
        if (!item->done_already()) work.items.push_back(item.get());
      }
      work.owners.push_back(batch);
      queue.push_back(std::move(work));
    }
  }
  if (cancelled) {  // completed outside the lock: callbacks may submit again
    for (const auto& item : batch->items) {
      Finish(item.get(), absl::CancelledError("redis: transport destroyed"));
    }
    return out;
  }
  queue_cv.Signal();
  return out;
}

bool RedisTransport::Impl::RunOnCaller(Work work) {
  ConnectionSet conns;
  {
    internal::MutexLock lock(&caller_mu);
    if (!idle_caller_sets.empty()) {
      conns = std::move(idle_caller_sets.back());
      idle_caller_sets.pop_back();
    } else if (caller_sets_made < options.connections) {
      ++caller_sets_made;
    } else {
      return false;
    }
  }
  // Data commands are sent with MSG_NOSIGNAL, but a connect's AUTH and SELECT go through
  // hiredis's write(): block SIGPIPE on this thread meanwhile (as the workers do for good), and
  // take a SIGPIPE raised here before restoring the caller's mask.
  // (Only when it may connect: a live connection's commands cannot raise it.)
  const absl::Time bound = work.owners.front()->deadline;
  if (!conns.empty() && conns[0] != nullptr && !conns[0]->broken()) {
    Execute(std::move(work), conns, bound);
  } else {
    sigset_t pipe;
    sigset_t old_mask;
    sigset_t pending_before;
    sigset_t pending_after;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &old_mask);
    sigpending(&pending_before);
    Execute(std::move(work), conns, bound);
    sigpending(&pending_after);
    if (sigismember(&pending_after, SIGPIPE) == 1 && sigismember(&pending_before, SIGPIPE) == 0) {
      const timespec zero{};
      (void)sigtimedwait(&pipe, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  }
  internal::MutexLock lock(&caller_mu);
  idle_caller_sets.push_back(std::move(conns));
  return true;
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RedisTransport>> RedisTransport::Create(
    const RedisTransportOptions& options) {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("RedisTransport: ", parts...));
  };
  if (options.endpoints.empty()) return bad("no endpoint");
  if (!options.cluster && options.endpoints.size() != 1) {
    return bad(options.endpoints.size(), " endpoints; a standalone server takes exactly one");
  }
  if (options.cluster && options.database != 0) {
    return bad("database = ", options.database, "; Redis Cluster has only database 0");
  }
  if (options.database < 0) return bad("database = ", options.database, " must be >= 0");
  if (options.connections < 1 || options.connections > 64) {
    return bad("connections = ", options.connections, " must be in 1..64");
  }
  if (options.max_pipeline < 1 || options.max_pipeline > 4096) {
    return bad("max_pipeline = ", options.max_pipeline, " must be in 1..4096");
  }
  if (options.max_redirects < 1 || options.max_redirects > 16) {
    return bad("max_redirects = ", options.max_redirects, " must be in 1..16");
  }
  if (options.ttl < absl::ZeroDuration() ||
      (options.ttl > absl::ZeroDuration() && options.ttl < absl::Milliseconds(1))) {
    return bad("ttl = ", absl::FormatDuration(options.ttl), "; zero (none) or >= 1ms");
  }
  if (options.refresh_ttl_on_get && options.ttl == absl::ZeroDuration()) {
    return bad("refresh_ttl_on_get needs a ttl");
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.command_timeout <= absl::ZeroDuration()) {
    return bad("connect_timeout and command_timeout must be > 0");
  }
  if (options.reconnect_backoff_min <= absl::ZeroDuration() ||
      options.reconnect_backoff_max < options.reconnect_backoff_min) {
    return bad("reconnect backoff must satisfy 0 < min <= max");
  }
  if (!options.username.empty() && options.password.empty()) {
    return bad("a username without a password");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.ttl > absl::ZeroDuration()) {
    impl->ttl_ms = std::to_string(absl::ToInt64Milliseconds(options.ttl));
  }
  {
    internal::MutexLock lock(&impl->topo_mu);
    for (const std::string& text : options.endpoints) {
      KVTIER_ASSIGN_OR_RETURN(internal::RedisEndpoint ep, internal::ParseRedisEndpoint(text, ""));
      impl->NodeIndexLocked(ep);
    }
    if (options.cluster) impl->slot_owner.assign(internal::kRedisClusterSlots, -1);
  }
  Impl* raw = impl.get();
  for (int i = 0; i < options.connections; ++i)
    raw->workers.emplace_back([raw] { raw->WorkerLoop(); });
  return std::unique_ptr<RedisTransport>(new RedisTransport(std::move(impl)));
}

RedisTransport::RedisTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RedisTransport::~RedisTransport() {
  std::deque<Work> abandoned;
  {
    internal::MutexLock lock(&impl_->queue_mu);
    impl_->stopping = true;
    abandoned.swap(impl_->queue);
  }
  impl_->queue_cv.SignalAll();
  for (const Work& work : abandoned) {
    for (Item* item : work.items) {
      impl_->Finish(item, absl::CancelledError("redis: transport destroyed"));
    }
  }
  for (std::thread& t : impl_->workers) t.join();
}

std::string RedisTransport::name() const {
  std::vector<std::string> seeds;
  seeds.reserve(impl_->options.endpoints.size());
  for (const std::string& e : impl_->options.endpoints) seeds.push_back(e);
  return absl::StrCat(impl_->options.cluster ? "redis-cluster(" : "redis(",
                      absl::StrJoin(seeds, ","), ")");
}

namespace {

std::shared_ptr<Batch> NewBatch(size_t n, absl::Time deadline) {
  auto batch = std::make_shared<Batch>();
  batch->deadline = deadline;
  batch->items.reserve(n);
  return batch;
}

Item* AddItem(Batch& batch, Op op, const std::string& key) {
  auto item = std::make_unique<Item>();
  item->op = op;
  item->key = key;
  item->batch = &batch;
  if (key.empty() || key.size() > kMaxKeyBytes) {
    item->state.store(Item::kDone);
    item->done.Complete(absl::InvalidArgumentError(
        absl::StrCat("redis: a key of ", key.size(), " bytes; 1..", kMaxKeyBytes, " allowed")));
  }
  batch.items.push_back(std::move(item));
  return batch.items.back().get();
}

}  // namespace

std::vector<Completion> RedisTransport::Put(absl::Span<const TransportPut> items,
                                            absl::Time deadline) {
  std::shared_ptr<Batch> batch = NewBatch(items.size(), deadline);
  for (const TransportPut& p : items) {
    Item* item = AddItem(*batch, Op::kSet, p.key);
    item->value_prefix = p.value_prefix;
    item->value = p.value;
    item->if_absent = p.if_absent;
  }
  return impl_->Submit(std::move(batch));
}

std::vector<Completion> RedisTransport::Get(absl::Span<const TransportGet> items,
                                            absl::Time deadline) {
  std::shared_ptr<Batch> batch = NewBatch(items.size(), deadline);
  for (const TransportGet& g : items) {
    Item* item = AddItem(*batch, Op::kGet, g.key);
    item->out = g.value;
    item->receiver = g.receiver;
    item->max_bytes = g.max_bytes;
    if (absl::Status s = internal::CheckGetItem(g, "redis"); !s.ok() && item->Claim()) {
      item->done.Complete(std::move(s));
    }
  }
  return impl_->Submit(std::move(batch));
}

std::vector<Completion> RedisTransport::Exists(absl::Span<const std::string> keys,
                                               absl::Time deadline) {
  std::shared_ptr<Batch> batch = NewBatch(keys.size(), deadline);
  for (const std::string& k : keys) AddItem(*batch, Op::kExists, k);
  return impl_->Submit(std::move(batch));
}

std::vector<Completion> RedisTransport::Delete(absl::Span<const std::string> keys,
                                               absl::Time deadline) {
  std::shared_ptr<Batch> batch = NewBatch(keys.size(), deadline);
  for (const std::string& k : keys) AddItem(*batch, Op::kDel, k);
  return impl_->Submit(std::move(batch));
}

RedisTransport::Stats RedisTransport::stats() const {
  const Impl::Counters& c = impl_->counters;
  return {.commands = c.commands.load(),
          .round_trips = c.round_trips.load(),
          .moved = c.moved.load(),
          .ask = c.ask.load(),
          .slot_map_refreshes = c.slot_map_refreshes.load(),
          .connects = c.connects.load(),
          .connect_failures = c.connect_failures.load(),
          .io_errors = c.io_errors.load(),
          .deadline_exceeded = c.deadline_exceeded.load()};
}

}  // namespace kvtier
