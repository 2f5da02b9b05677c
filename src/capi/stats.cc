// The C ABI's observability calls: stats (flat), the Prometheus text, events, and the waits and
// checks for tests and shutdown.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capi/handles.h"

using namespace kvtier;  // NOLINT: the C entry points below spell every kvtier type
using kvtier::capi::Guard;
using kvtier::capi::Null;

extern "C" {

kvtier_status_code kvtier_cache_get_stats(const kvtier_cache* cache, kvtier_cache_stats* out,
                                          kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_cache_get_stats";
    if (cache == nullptr) return Null(kCall, "cache");
    if (out == nullptr) return Null(kCall, "out");
    const KvCacheStats s = cache->cache->stats();
    *out = kvtier_cache_stats{};
    for (int t = 0; t < kNumTiers; ++t) {
      const KvTierStats& in = s.tiers[t];
      kvtier_tier_stats& o = out->tiers[t];
      o.present = in.present;
      o.capacity_blocks = in.capacity_blocks;
      o.free_blocks = in.free_blocks;
      o.locked_blocks = in.locked_blocks;
      o.held_blocks = in.held_blocks;
      o.droppable_blocks = in.droppable_blocks;
      o.in_flight_blocks = in.in_flight_blocks;
      o.quarantined_blocks = in.quarantined_blocks;
      o.hits = in.hits;
      o.misses = in.misses;
      o.bytes_in = in.bytes_in;
      o.bytes_out = in.bytes_out;
      o.stored = in.stored;
      o.evictions = in.evictions;
      o.demotions = in.demotions;
      o.failed_loads = in.failed_loads;
      o.corrupt_reads = in.corrupt_reads;
      o.missing_reads = in.missing_reads;
      o.failed_stores = in.failed_stores;
      o.value_drops = in.value_drops;
      o.policy_shadow_us = in.policy_shadow_us;
      o.policy_leader_changes = in.policy_leader_changes;
      o.policy_shadow_accesses = in.policy_shadow_accesses;
      for (int to = 0; to < kNumTiers; ++to) out->blocks_moved[t][to] = s.blocks_moved[t][to];
    }
    out->live_sequences = s.live_sequences;
    out->open_tickets = s.open_tickets;
    out->attach_queries = s.attach_queries;
    out->query_tokens = s.query_tokens;
    out->matched_tokens = s.matched_tokens;
    out->attached_tokens = s.attached_tokens;
    out->cached_but_recomputed_blocks = s.cached_but_recomputed_blocks;
    out->indexed_blocks = s.indexed_blocks;
    out->preemptions = s.preemptions;
    out->readmitted_blocks = s.readmitted_blocks;
    out->last_event_sequence = s.last_event_sequence;
    out->remote_probes = s.remote_probe.probes;
    out->remote_probe_failures = s.remote_probe.failures;
    out->remote_keys_probed = s.remote_probe.keys_probed;
    out->remote_blocks_found = s.remote_probe.blocks_found;
    out->remote_blocks_indexed = s.remote_probe.blocks_indexed;
    out->remote_probe_latency_us_total = s.remote_probe.latency_us_total;
    out->remote_probe_latency_us_max = s.remote_probe.latency_us_max;
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_cache_render_prometheus(const kvtier_cache* cache, char* buf,
                                                  size_t capacity, size_t* needed_bytes,
                                                  kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_cache_render_prometheus";
    if (cache == nullptr) return Null(kCall, "cache");
    const std::string text = RenderPrometheus(cache->cache->stats());
    const size_t needed = text.size() + 1;
    if (needed_bytes != nullptr) *needed_bytes = needed;
    if (buf == nullptr && capacity == 0) return absl::OkStatus();
    if (buf == nullptr) return Null(kCall, "buf");
    if (capacity < needed) {
      return absl::InvalidArgumentError(
          absl::StrCat(kCall, ": capacity ", capacity, " is below the ", needed, " bytes needed"));
    }
    std::memcpy(buf, text.c_str(), needed);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_poll_events(const kvtier_cache* cache, uint64_t after_sequence,
                                      kvtier_event* events, size_t capacity, size_t* num_events,
                                      kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_poll_events";
    if (cache == nullptr) return Null(kCall, "cache");
    if (num_events == nullptr) return Null(kCall, "num_events");
    if (events == nullptr && capacity > 0) return Null(kCall, "events");
    *num_events = 0;
    if (capacity == 0) return absl::OkStatus();
    const std::vector<CacheEvent> got = cache->cache->PollEvents(after_sequence, capacity);
    for (size_t i = 0; i < got.size(); ++i) {
      events[i].sequence = got[i].sequence;
      events[i].kind = static_cast<kvtier_event_kind>(got[i].kind);
      events[i].tier = static_cast<kvtier_tier>(got[i].tier);
      events[i].key_hi = got[i].key.hi;
      events[i].key_lo = got[i].key.lo;
      events[i].has_parent = got[i].has_parent;
      events[i].parent_key_hi = got[i].parent_key.hi;
      events[i].parent_key_lo = got[i].parent_key.lo;
      events[i].num_tokens = got[i].num_tokens;
      // The views are of interned, NUL-terminated strings (kv_cache_stats.h); "" for none.
      events[i].adapter_id = got[i].adapter_id.empty() ? "" : got[i].adapter_id.data();
      events[i].adapter_id_size = got[i].adapter_id.size();
      events[i].worker_id = got[i].worker_id.empty() ? "" : got[i].worker_id.data();
      events[i].worker_id_size = got[i].worker_id.size();
    }
    *num_events = got.size();
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_wait_idle(const kvtier_cache* cache, int64_t timeout_ns,
                                    kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_wait_idle", "cache");
    return cache->cache->WaitIdle(capi::DeadlineAfter(timeout_ns));
  });
}

kvtier_status_code kvtier_check_invariants(const kvtier_cache* cache, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_check_invariants", "cache");
    return cache->cache->CheckInvariants();
  });
}

}  // extern "C"
