// The plain result structs of kv_cache.h, kv_cache_stats.h and session_hints.h as read-only
// Python objects. Per-tier arrays are lists indexed by kvtier.Tier (int(Tier.DRAM) == 1);
// durations are float seconds. Stats also convert to plain dicts (as_dict), for logging.
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "bindings.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_cache_stats.h"
#include "kvtier/session_hints.h"
#include "objects.h"

namespace kvtier::python {
namespace {

py::dict TierStatsDict(const KvTierStats& s) {
  py::dict d;
  d["present"] = s.present;
  d["capacity_blocks"] = s.capacity_blocks;
  d["free_blocks"] = s.free_blocks;
  d["locked_blocks"] = s.locked_blocks;
  d["held_blocks"] = s.held_blocks;
  d["droppable_blocks"] = s.droppable_blocks;
  d["in_flight_blocks"] = s.in_flight_blocks;
  d["quarantined_blocks"] = s.quarantined_blocks;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["bytes_in"] = s.bytes_in;
  d["bytes_out"] = s.bytes_out;
  d["stored"] = s.stored;
  d["evictions"] = s.evictions;
  d["demotions"] = s.demotions;
  d["failed_loads"] = s.failed_loads;
  d["corrupt_reads"] = s.corrupt_reads;
  d["missing_reads"] = s.missing_reads;
  d["failed_stores"] = s.failed_stores;
  d["value_drops"] = s.value_drops;
  d["policy_shadow_us"] = s.policy_shadow_us;
  d["policy_leader_changes"] = s.policy_leader_changes;
  d["policy_shadow_accesses"] = s.policy_shadow_accesses;
  return d;
}

py::dict ProbeStatsDict(const RemoteProbeStats& s) {
  py::dict d;
  d["probes"] = s.probes;
  d["failures"] = s.failures;
  d["keys_probed"] = s.keys_probed;
  d["blocks_found"] = s.blocks_found;
  d["blocks_indexed"] = s.blocks_indexed;
  d["latency_us_total"] = s.latency_us_total;
  d["latency_us_max"] = s.latency_us_max;
  return d;
}

py::dict CacheStatsDict(const KvCacheStats& s) {
  py::dict d;
  py::dict tiers;
  for (int t = 0; t < kNumTiers; ++t) {
    tiers[py::str(std::string(TierName(static_cast<Tier>(t))))] =
        TierStatsDict(s.tiers[static_cast<size_t>(t)]);
  }
  d["tiers"] = tiers;
  d["live_sequences"] = s.live_sequences;
  d["open_tickets"] = s.open_tickets;
  d["attach_queries"] = s.attach_queries;
  d["query_tokens"] = s.query_tokens;
  d["matched_tokens"] = s.matched_tokens;
  d["attached_tokens"] = s.attached_tokens;
  d["cached_but_recomputed_blocks"] = s.cached_but_recomputed_blocks;
  d["indexed_blocks"] = s.indexed_blocks;
  d["preemptions"] = s.preemptions;
  d["readmitted_blocks"] = s.readmitted_blocks;
  d["blocks_moved"] = py::cast(s.blocks_moved);
  d["last_event_sequence"] = s.last_event_sequence;
  d["remote_probe"] = ProbeStatsDict(s.remote_probe);
  return d;
}

}  // namespace

void BindResults(py::module_& m) {
  py::class_<RestorePlan>(m, "RestorePlan", "The cost model's restore-versus-recompute plan.")
      .def_readonly("restore_blocks", &RestorePlan::restore_blocks)
      .def_readonly("recompute_from_token", &RestorePlan::recompute_from_token)
      .def_property_readonly(
          "restore_time_s",
          [](const RestorePlan& p) { return absl::ToDoubleSeconds(p.restore_time); })
      .def_property_readonly(
          "recompute_time_s",
          [](const RestorePlan& p) { return absl::ToDoubleSeconds(p.recompute_time); })
      .def_property_readonly(
          "total_time_s", [](const RestorePlan& p) { return absl::ToDoubleSeconds(p.total_time); })
      .def_readonly("cached_but_recomputed", &RestorePlan::cached_but_recomputed);

  py::class_<AttachResult>(m, "AttachResult")
      .def_readonly("matched_tokens", &AttachResult::matched_tokens)
      .def_readonly("attached_tokens", &AttachResult::attached_tokens)
      .def_readonly("attached_blocks_by_tier", &AttachResult::attached_blocks_by_tier)
      .def_readonly("plan", &AttachResult::plan)
      .def("__repr__", [](const AttachResult& r) {
        return "AttachResult(matched_tokens=" + std::to_string(r.matched_tokens) +
               ", attached_tokens=" + std::to_string(r.attached_tokens) + ")";
      });

  py::class_<KvAppendResult>(m, "AppendResult")
      .def_readonly("first_sealed_block", &KvAppendResult::first_sealed_block)
      .def_readonly("num_sealed_blocks", &KvAppendResult::num_sealed_blocks)
      .def_readonly("num_new_slots", &KvAppendResult::num_new_slots);

  py::class_<BlockCopy>(
      m, "BlockCopy",
      "Fork's and truncate's copy-on-write order: copy the first num_tokens token positions of "
      "HBM slot src into slot dst, every layer, before a kernel reads dst.")
      .def_property_readonly("src", [](const BlockCopy& c) { return c.src.value(); })
      .def_property_readonly("dst", [](const BlockCopy& c) { return c.dst.value(); })
      .def_readonly("num_tokens", &BlockCopy::num_tokens);

  py::class_<RoomCheck>(m, "RoomCheck",
                        "Whether HBM has room for a request now (KvCache.check_room), in HBM "
                        "slots, read from counters without evicting or waiting.")
      .def_readonly("needed_slots", &RoomCheck::needed_slots)
      .def_readonly("free_slots", &RoomCheck::free_slots)
      .def_readonly("evictable_slots", &RoomCheck::evictable_slots)
      .def_readonly("demotions_in_flight", &RoomCheck::demotions_in_flight)
      .def_readonly("fits_now", &RoomCheck::fits_now)
      .def_readonly("fits_after_evictions", &RoomCheck::fits_after_evictions)
      .def_readonly("missing_slots", &RoomCheck::missing_slots)
      .def("__repr__", [](const RoomCheck& r) {
        return "RoomCheck(needed_slots=" + std::to_string(r.needed_slots) +
               ", free_slots=" + std::to_string(r.free_slots) +
               ", evictable_slots=" + std::to_string(r.evictable_slots) +
               ", demotions_in_flight=" + std::to_string(r.demotions_in_flight) +
               ", fits_now=" + (r.fits_now ? "True" : "False") +
               ", fits_after_evictions=" + (r.fits_after_evictions ? "True" : "False") +
               ", missing_slots=" + std::to_string(r.missing_slots) + ")";
      });

  py::class_<SequenceInfo>(m, "SequenceInfo")
      .def_readonly("num_tokens", &SequenceInfo::num_tokens)
      .def_readonly("written_tokens", &SequenceInfo::written_tokens)
      .def_readonly("num_blocks", &SequenceInfo::num_blocks)
      .def_readonly("blocks_by_tier", &SequenceInfo::blocks_by_tier)
      .def_readonly("paused", &SequenceInfo::paused);

  py::class_<PrefixLookup>(m, "PrefixLookup")
      .def_readonly("matched_tokens", &PrefixLookup::matched_tokens)
      .def_readonly("blocks_by_tier", &PrefixLookup::blocks_by_tier)
      .def_readonly("discovered_blocks", &PrefixLookup::discovered_blocks);

  py::class_<HintOutcome>(m, "HintOutcome", "The answer to a hint (session_hints.h).")
      .def_readonly("result", &HintOutcome::result)
      .def_readonly("reason", &HintOutcome::reason)
      .def_readonly("blocks", &HintOutcome::blocks)
      .def("__repr__", [](const HintOutcome& h) {
        static constexpr const char* kNames[] = {"ACCEPTED", "CLIPPED", "REJECTED"};
        return std::string("HintOutcome(") + kNames[static_cast<int>(h.result) % 3] +
               ", blocks=" + std::to_string(h.blocks) + (h.reason.empty() ? "" : ", " + h.reason) +
               ")";
      });

  py::class_<KvTierStats>(m, "TierStats", "One tier's gauges and counters (kv_cache_stats.h).")
      .def_readonly("present", &KvTierStats::present)
      .def_readonly("capacity_blocks", &KvTierStats::capacity_blocks)
      .def_readonly("free_blocks", &KvTierStats::free_blocks)
      .def_readonly("locked_blocks", &KvTierStats::locked_blocks)
      .def_readonly("held_blocks", &KvTierStats::held_blocks)
      .def_readonly("droppable_blocks", &KvTierStats::droppable_blocks)
      .def_readonly("in_flight_blocks", &KvTierStats::in_flight_blocks)
      .def_readonly("quarantined_blocks", &KvTierStats::quarantined_blocks)
      .def_readonly("hits", &KvTierStats::hits)
      .def_readonly("misses", &KvTierStats::misses)
      .def_readonly("bytes_in", &KvTierStats::bytes_in)
      .def_readonly("bytes_out", &KvTierStats::bytes_out)
      .def_readonly("stored", &KvTierStats::stored)
      .def_readonly("evictions", &KvTierStats::evictions)
      .def_readonly("demotions", &KvTierStats::demotions)
      .def_readonly("failed_loads", &KvTierStats::failed_loads)
      .def_readonly("corrupt_reads", &KvTierStats::corrupt_reads)
      .def_readonly("missing_reads", &KvTierStats::missing_reads)
      .def_readonly("failed_stores", &KvTierStats::failed_stores)
      .def_readonly("value_drops", &KvTierStats::value_drops)
      .def_readonly("policy_shadow_us", &KvTierStats::policy_shadow_us)
      .def_readonly("policy_leader_changes", &KvTierStats::policy_leader_changes)
      .def_readonly("policy_shadow_accesses", &KvTierStats::policy_shadow_accesses)
      .def("as_dict", &TierStatsDict);

  py::class_<RemoteProbeStats>(m, "RemoteProbeStats")
      .def_readonly("probes", &RemoteProbeStats::probes)
      .def_readonly("failures", &RemoteProbeStats::failures)
      .def_readonly("keys_probed", &RemoteProbeStats::keys_probed)
      .def_readonly("blocks_found", &RemoteProbeStats::blocks_found)
      .def_readonly("blocks_indexed", &RemoteProbeStats::blocks_indexed)
      .def_readonly("latency_us_total", &RemoteProbeStats::latency_us_total)
      .def_readonly("latency_us_max", &RemoteProbeStats::latency_us_max)
      .def("as_dict", &ProbeStatsDict);

  py::class_<KvCacheStats>(m, "CacheStats",
                           "A snapshot of the cache's counters and gauges (kv_cache_stats.h).")
      .def_readonly("tiers", &KvCacheStats::tiers)
      .def(
          "tier",
          [](const KvCacheStats& s, Tier t) { return s.tiers[static_cast<size_t>(TierIndex(t))]; },
          py::arg("tier"))
      .def_readonly("live_sequences", &KvCacheStats::live_sequences)
      .def_readonly("open_tickets", &KvCacheStats::open_tickets)
      .def_readonly("attach_queries", &KvCacheStats::attach_queries)
      .def_readonly("query_tokens", &KvCacheStats::query_tokens)
      .def_readonly("matched_tokens", &KvCacheStats::matched_tokens)
      .def_readonly("attached_tokens", &KvCacheStats::attached_tokens)
      .def_readonly("cached_but_recomputed_blocks", &KvCacheStats::cached_but_recomputed_blocks)
      .def_readonly("indexed_blocks", &KvCacheStats::indexed_blocks)
      .def_readonly("preemptions", &KvCacheStats::preemptions)
      .def_readonly("readmitted_blocks", &KvCacheStats::readmitted_blocks)
      .def_readonly("blocks_moved", &KvCacheStats::blocks_moved)
      .def(
          "moved",
          [](const KvCacheStats& s, Tier from, Tier to) {
            return s.blocks_moved[static_cast<size_t>(TierIndex(from))]
                                 [static_cast<size_t>(TierIndex(to))];
          },
          py::arg("src"), py::arg("dst"), "Block copies that arrived in dst from src.")
      .def_readonly("last_event_sequence", &KvCacheStats::last_event_sequence)
      .def_readonly("remote_probe", &KvCacheStats::remote_probe)
      .def("as_dict", &CacheStatsDict)
      .def("prometheus", &RenderPrometheus, "The Prometheus text exposition of the snapshot.");

  py::class_<PyCacheEvent>(
      m, "CacheEvent",
      "A block copy became readable in a tier (STORED) or stopped being "
      "readable there (REMOVED), or reset_prefix_cache cleared a tier "
      "(ALL_CLEARED, key: the root key). Owns its strings: it may outlive its cache.")
      .def_property_readonly("sequence", [](const PyCacheEvent& e) { return e.event.sequence; })
      .def_property_readonly("kind", [](const PyCacheEvent& e) { return e.event.kind; })
      .def_property_readonly("key", [](const PyCacheEvent& e) { return e.event.key.ToHex(); })
      .def_property_readonly("tier", [](const PyCacheEvent& e) { return e.event.tier; })
      .def_property_readonly("has_parent", [](const PyCacheEvent& e) { return e.event.has_parent; })
      .def_property_readonly(
          "parent_key",
          [](const PyCacheEvent& e) -> std::optional<std::string> {
            if (!e.event.has_parent) return std::nullopt;
            return e.event.parent_key.ToHex();
          },
          "The parent block's key (hex), None for a first block (and for ALL_CLEARED).")
      .def_property_readonly(
          "num_tokens", [](const PyCacheEvent& e) { return e.event.num_tokens; },
          "Tokens in the block (0: ALL_CLEARED).")
      .def_property_readonly(
          "adapter_id", [](const PyCacheEvent& e) { return e.adapter_id; },
          "The block's adapter id, '' for none.")
      .def_property_readonly(
          "worker_id", [](const PyCacheEvent& e) { return e.worker_id; },
          "The cache's worker_id, '' if unset.")
      .def("__repr__", [](const PyCacheEvent& p) {
        const CacheEvent& e = p.event;
        const char* kind = e.kind == CacheEventKind::kStored    ? ", STORED, "
                           : e.kind == CacheEventKind::kRemoved ? ", REMOVED, "
                                                                : ", ALL_CLEARED, ";
        return "CacheEvent(" + std::to_string(e.sequence) + kind + e.key.ToHex() + ", " +
               std::string(TierName(e.tier)) + ")";
      });
}

}  // namespace kvtier::python
