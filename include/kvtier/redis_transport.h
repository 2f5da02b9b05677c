// RedisTransport: a Transport over Redis (one server) or Redis Cluster, with hiredis.
//
// Each key is one Redis string: Put is SET (with PX when a TTL is set), Get is GET, Exists is
// EXISTS, Delete is DEL. A batch is sent pipelined: every command of a round trip is written,
// then every reply read (Redis pipelining, https://redis.io/docs/manual/pipelining/).
//
// Threads and connections: `connections` worker threads, each with at most one connection per
// server, take queued batches (several small batches share one round trip). A connection that
// fails is dropped and made again on the next use; a server that refuses connections is not
// tried again before a backoff (doubling from reconnect_backoff_min up to _max) has passed, and
// requests for it meanwhile fail at once with kUnavailable. Every item completes by its
// deadline: a timer fires kDeadlineExceeded for items still waiting, and a late reply is
// dropped, never written into the caller's buffer after its Completion fired.
//
// Cluster: keys map to the 16384 hash slots by CRC16 of the key (or of its {hash tag}), as the
// Redis Cluster specification defines (https://redis.io/docs/reference/cluster-spec/). The slot
// map comes from CLUSTER SLOTS on a seed node; a MOVED reply updates the slot and refreshes the
// map; an ASK reply sends that one command, after ASKING, to the node named. An item follows at
// most max_redirects redirects.
//
// Exists on a standalone server runs on the calling thread when one of `connections` caller
// connections is free (its caller waits for the answers anyway: a cache's discovery probe), its
// socket waits bounded by the call's deadline; otherwise, and for every other call, on a worker.
//
// Completions fire on worker threads (or on the caller's, for items that fail before they are
// queued and for an Exists run there); callbacks must not block. Thread-safety: thread-safe. The
// destructor fails queued items with kCancelled and waits for round trips in flight (each bounded
// by command_timeout).
#ifndef KVTIER_REDIS_TRANSPORT_H_
#define KVTIER_REDIS_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/transport.h"

namespace kvtier {

struct RedisTransportOptions {
  // "host:port" ("[v6addr]:port" for IPv6). Standalone: exactly one. Cluster: one or more seed
  // nodes; the others are learned from CLUSTER SLOTS.
  std::vector<std::string> endpoints = {"127.0.0.1:6379"};
  bool cluster = false;
  // AUTH on every new connection when a password is set ("AUTH user pass" with a username, for
  // Redis 6 ACL users).
  std::string username;
  std::string password;
  int database = 0;  // SELECT on every new connection; Redis Cluster only has database 0
  // Expiry of every value written (SET ... PX ms); zero: no expiry.
  absl::Duration ttl = absl::ZeroDuration();
  // With a ttl: every Get also restarts the value's expiry (GETEX ... PX ms, Redis >= 6.2), so
  // blocks still being read outlive those nobody reads (a sliding expiry). Needs ttl > 0.
  bool refresh_ttl_on_get = false;
  absl::Duration connect_timeout = absl::Milliseconds(500);
  // Bound on one round trip, besides the caller's deadline (whichever is sooner).
  absl::Duration command_timeout = absl::Seconds(2);
  int connections = 4;  // worker threads, 1..64
  absl::Duration reconnect_backoff_min = absl::Milliseconds(10);
  absl::Duration reconnect_backoff_max = absl::Seconds(1);
  int max_pipeline = 256;  // commands per round trip, 1..4096 (a probe window fits in one)
  int max_redirects = 5;  // MOVED/ASK hops per item, 1..16
};

// Parses "redis://[[user]:password@]host:port[/db]" or
// "redis-cluster://[[user]:password@]host:port[,host:port...]" into options (other fields at
// their defaults). Errors: kInvalidArgument naming what is wrong.
absl::StatusOr<RedisTransportOptions> RedisTransportOptionsFromUrl(std::string_view url);

class RedisTransport final : public Transport {
 public:
  // Counters since creation.
  struct Stats {
    int64_t commands = 0;            // commands sent (ASKING and AUTH not counted)
    int64_t round_trips = 0;         // pipelines written and read
    int64_t moved = 0;               // MOVED replies followed
    int64_t ask = 0;                 // ASK replies followed
    int64_t slot_map_refreshes = 0;  // CLUSTER SLOTS read
    int64_t connects = 0;            // connections made
    int64_t connect_failures = 0;    // connection attempts that failed
    int64_t io_errors = 0;           // round trips cut short by a socket error or timeout
    int64_t deadline_exceeded = 0;   // items completed by the deadline timer
  };

  // Checks the options; connects lazily (a server that is down at creation is not an error: the
  // first requests fail with kUnavailable and later ones reconnect). Errors: kInvalidArgument
  // for a bad option or endpoint.
  static absl::StatusOr<std::unique_ptr<RedisTransport>> Create(
      const RedisTransportOptions& options);
  ~RedisTransport() override;

  // "redis(127.0.0.1:6379)" or "redis-cluster(127.0.0.1:7000,...)".
  std::string name() const override;
  // Errors besides Transport's: kUnavailable with the server's message for an error reply
  // (kResourceExhausted for OOM), or when redirects exceed max_redirects; kCancelled when the
  // transport is destroyed first. Keys are binary-safe, 1..65536 bytes (kInvalidArgument
  // otherwise).
  std::vector<Completion> Put(absl::Span<const TransportPut> items, absl::Time deadline) override;
  std::vector<Completion> Get(absl::Span<const TransportGet> items, absl::Time deadline) override;
  std::vector<Completion> Exists(absl::Span<const std::string> keys, absl::Time deadline) override;
  std::vector<Completion> Delete(absl::Span<const std::string> keys, absl::Time deadline) override;

  Stats stats() const;

 private:
  struct Impl;
  explicit RedisTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_REDIS_TRANSPORT_H_
