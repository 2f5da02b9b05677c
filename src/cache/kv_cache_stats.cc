// KvCacheStats: KvCache::stats(), the snapshot of the cache's counters and its tiers' slot
// counts, and RenderPrometheus, its text exposition. Owns no state.
#include "kvtier/kv_cache_stats.h"

#include <array>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/kv_cache_impl.h"
#include "internal/mutex.h"
#include "internal/strings.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/kv_cache.h"

namespace kvtier {
namespace {

using internal::ToAbsl;

struct TierField {
  const char* name;
  const char* type;  // "gauge" or "counter"
  const char* help;
  int64_t KvTierStats::*field;
};

constexpr TierField kTierFields[] = {
    {"capacity_blocks", "gauge", "Slots of the tier.", &KvTierStats::capacity_blocks},
    {"free_blocks", "gauge", "Slots holding nothing.", &KvTierStats::free_blocks},
    {"locked_blocks", "gauge",
     "Blocks pinned by residency tickets or by kernel writes not yet completed.",
     &KvTierStats::locked_blocks},
    {"held_blocks", "gauge", "Blocks referenced by sequences or transfers, not locked.",
     &KvTierStats::held_blocks},
    {"droppable_blocks", "gauge", "Cached blocks nobody references (evictable).",
     &KvTierStats::droppable_blocks},
    {"in_flight_blocks", "gauge", "Slots a transfer is writing.", &KvTierStats::in_flight_blocks},
    {"quarantined_blocks", "gauge", "Slots a failed transfer might still write.",
     &KvTierStats::quarantined_blocks},
    {"hits_total", "counter", "Attached blocks served from this tier.", &KvTierStats::hits},
    {"misses_total", "counter", "Queried blocks found neither here nor in a faster tier.",
     &KvTierStats::misses},
    {"bytes_in_total", "counter", "Bytes of blocks copied into the tier.", &KvTierStats::bytes_in},
    {"bytes_out_total", "counter", "Bytes of blocks copied out of the tier.",
     &KvTierStats::bytes_out},
    {"stored_total", "counter", "Block copies that became readable in the tier.",
     &KvTierStats::stored},
    {"evictions_total", "counter", "Block copies dropped to make room.", &KvTierStats::evictions},
    {"demotions_total", "counter", "Evictions that first copied the block one tier down.",
     &KvTierStats::demotions},
    {"failed_loads_total", "counter", "Copies out of the tier that failed.",
     &KvTierStats::failed_loads},
    {"corrupt_reads_total", "counter", "Reads that found wrong or damaged bytes.",
     &KvTierStats::corrupt_reads},
    {"missing_reads_total", "counter", "Reads of a copy the tier no longer had.",
     &KvTierStats::missing_reads},
    {"failed_stores_total", "counter", "Copies into the tier that failed.",
     &KvTierStats::failed_stores},
    {"value_drops_total", "counter",
     "Victims dropped rather than demoted: not worth restoring later.", &KvTierStats::value_drops},
    {"policy_shadow_us_total", "counter",
     "Microseconds the learned policy spent in its shadow caches.", &KvTierStats::policy_shadow_us},
    {"policy_leader_changes_total", "counter",
     "Times the learned policy switched the candidate policy it follows.",
     &KvTierStats::policy_leader_changes},
    {"policy_shadow_accesses_total", "counter",
     "Prompt blocks the learned policy's shadow caches simulated.",
     &KvTierStats::policy_shadow_accesses},
};

void Family(std::string& out, absl::string_view name, const char* type, const char* help) {
  absl::StrAppend(&out, "# HELP kvtier_", name, " ", help, "\n# TYPE kvtier_", name, " ", type,
                  "\n");
}

void Scalar(std::string& out, absl::string_view name, const char* type, const char* help,
            int64_t value) {
  Family(out, name, type, help);
  absl::StrAppend(&out, "kvtier_", name, " ", value, "\n");
}

}  // namespace

std::string RenderPrometheus(const KvCacheStats& stats) {
  std::string out;
  for (const TierField& f : kTierFields) {
    Family(out, absl::StrCat("tier_", f.name), f.type, f.help);
    for (int t = 0; t < kNumTiers; ++t) {
      const KvTierStats& s = stats.tiers[static_cast<size_t>(t)];
      if (!s.present) continue;
      absl::StrAppend(&out, "kvtier_tier_", f.name, "{tier=\"",
                      ToAbsl(TierName(static_cast<Tier>(t))), "\"} ", s.*(f.field), "\n");
    }
  }
  Scalar(out, "live_sequences", "gauge", "Sequences created and not released.",
         stats.live_sequences);
  Scalar(out, "open_tickets", "gauge", "Residency tickets not released.", stats.open_tickets);
  Scalar(out, "indexed_blocks", "gauge", "Blocks with a copy in some tier.", stats.indexed_blocks);
  Scalar(out, "attach_queries_total", "counter", "AttachPrefix calls.", stats.attach_queries);
  Scalar(out, "query_tokens_total", "counter", "Prompt tokens of attach queries.",
         stats.query_tokens);
  Scalar(out, "matched_tokens_total", "counter", "Prompt tokens in the longest cached prefix.",
         stats.matched_tokens);
  Scalar(out, "attached_tokens_total", "counter", "Prompt tokens restored instead of recomputed.",
         stats.attached_tokens);
  Scalar(out, "cached_but_recomputed_blocks_total", "counter",
         "Matched blocks the cost model chose to recompute.", stats.cached_but_recomputed_blocks);
  Scalar(out, "preemptions_total", "counter",
         "Releases and swap-outs (pauses) of requests the scheduler preempted.", stats.preemptions);
  Scalar(out, "readmitted_blocks_total", "counter",
         "Blocks attached by readmissions of preempted requests (not hits).",
         stats.readmitted_blocks);
  const RemoteProbeStats& p = stats.remote_probe;
  Scalar(out, "remote_probes_total", "counter",
         "Existence probes of the remote store after a local match ended.", p.probes);
  Scalar(out, "remote_probe_failures_total", "counter",
         "Remote probes that failed or timed out (the match ended there).", p.failures);
  Scalar(out, "remote_probe_keys_total", "counter", "Block keys asked about by remote probes.",
         p.keys_probed);
  Scalar(out, "remote_probe_blocks_found_total", "counter",
         "Blocks remote probes found that extended a match.", p.blocks_found);
  Scalar(out, "remote_probe_blocks_indexed_total", "counter",
         "Blocks found by remote probes and indexed as remote copies.", p.blocks_indexed);
  Scalar(out, "remote_probe_latency_microseconds_total", "counter",
         "Wall time spent in remote probes, microseconds.", p.latency_us_total);
  Scalar(out, "remote_probe_latency_microseconds_max", "gauge",
         "The slowest remote probe, microseconds.", p.latency_us_max);
  Scalar(out, "last_event_sequence", "counter", "Sequence number of the last cache event.",
         static_cast<int64_t>(stats.last_event_sequence));
  return out;
}

KvCacheStats KvCache::stats() const {
  Impl& I = *impl_;
  Impl::CacheLock lock(I);
  KvCacheStats s = I.counters;
  s.live_sequences = static_cast<int64_t>(I.seqs.size());
  s.open_tickets = static_cast<int64_t>(I.tickets.size());
  s.indexed_blocks = I.indexed_blocks;
  s.last_event_sequence = I.next_event - 1;
  std::array<SlotCounts, kNumTiers> counts{};
  int64_t locked_cached = 0;
  // The lambda runs under I.mu (held here); the analysis cannot see that through the call.
  const std::vector<uint32_t>* ticket_refs = &I.ticket_refs;
  const int64_t locked_now = I.locked;
  (void)I.engine->WithAllocators([&](const std::array<BlockAllocator*, kNumTiers>& a) {
    for (int t = 0; t < kNumTiers; ++t) {
      if (a[t] != nullptr) counts[t] = a[t]->counts();
    }
    if (locked_now > 0) {
      for (size_t slot = 0; slot < ticket_refs->size(); ++slot) {
        if ((*ticket_refs)[slot] == 0) continue;
        auto st = a[0]->state(SlotId(static_cast<uint32_t>(slot)));
        if (st.ok() && *st == SlotState::kCached) ++locked_cached;
      }
    }
    return absl::OkStatus();
  });
  for (int t = 0; t < kNumTiers; ++t) {
    KvTierStats& ts = s.tiers[t];
    if (!ts.present) continue;
    const SlotCounts& c = counts[t];
    const int64_t locked = t == 0 ? I.locked : 0;
    const int64_t lc = t == 0 ? locked_cached : 0;
    ts.capacity_blocks = c.total();
    ts.free_blocks = c.free;
    ts.locked_blocks = locked;
    ts.held_blocks = c.held() - (locked - lc);
    ts.droppable_blocks = c.cached - lc;
    ts.in_flight_blocks = c.in_flight;
    ts.quarantined_blocks = c.quarantined;
    if (I.policy[t] != nullptr) {
      const FollowBestStats f = FollowBestStatsOf(*I.policy[t]);
      ts.policy_shadow_us = static_cast<int64_t>(f.shadow_seconds * 1e6);
      ts.policy_leader_changes = f.leader_changes;
      ts.policy_shadow_accesses = f.sampled_accesses;
    }
    for (int o = 0; o < kNumTiers; ++o) {
      if (o == t || I.tiers[o] == nullptr) continue;
      const TransferStats in = I.engine->stats(static_cast<Tier>(o), static_cast<Tier>(t));
      ts.bytes_in += in.bytes;
      ts.bytes_out += I.engine->stats(static_cast<Tier>(t), static_cast<Tier>(o)).bytes;
      s.blocks_moved[o][t] = in.blocks;
    }
  }
  return s;
}

}  // namespace kvtier
