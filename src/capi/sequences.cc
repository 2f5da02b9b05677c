// The C ABI's sequence calls (create, attach, append, report written, fork, truncate, check
// room, release, pause, resume, get) and the prefix calls without a sequence (prefetch, retain,
// invalidate, lookup, reset).
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "capi/handles.h"

using namespace kvtier;  // NOLINT: the C entry points below spell every kvtier type
using kvtier::capi::Guard;
using kvtier::capi::Null;

namespace {

// The C room-wait mode as the C++ one; kInvalidArgument naming the call outside the enum.
absl::StatusOr<RoomWait> ToRoomWait(const char* call, const kvtier_room_wait& wait) {
  const int raw = capi::RawEnum(wait);
  if (raw < KVTIER_ROOM_WAIT || raw > KVTIER_ROOM_NEVER) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": wait ", raw, " is not one of 0..1"));
  }
  return static_cast<RoomWait>(raw);
}

// A Fork's or Truncate's copy into its C form (needed false and zeros for none).
void ToBlockCopy(const std::optional<BlockCopy>& in, kvtier_block_copy* out) {
  if (out == nullptr) return;
  *out = kvtier_block_copy{};
  if (!in.has_value()) return;
  out->needed = true;
  out->src_slot = static_cast<int32_t>(in->src.value());
  out->dst_slot = static_cast<int32_t>(in->dst.value());
  out->num_tokens = in->num_tokens;
}

void ToRoomCheck(const RoomCheck& in, kvtier_room_check* out) {
  out->needed_slots = in.needed_slots;
  out->free_slots = in.free_slots;
  out->evictable_slots = in.evictable_slots;
  out->demotions_in_flight = in.demotions_in_flight;
  out->fits_now = in.fits_now;
  out->fits_after_evictions = in.fits_after_evictions;
  out->missing_slots = in.missing_slots;
}

}  // namespace

extern "C" {

kvtier_status_code kvtier_sequence_create(kvtier_cache* cache, uint64_t id,
                                          const kvtier_sequence_options* options,
                                          kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_sequence_create", "cache");
    absl::StatusOr<SequenceOptions> o = capi::ToSequenceOptions(options);
    if (!o.ok()) return o.status();
    return cache->cache->CreateSequence(SequenceId(id), *o);
  });
}

kvtier_status_code kvtier_attach_prefix(kvtier_cache* cache, uint64_t id, const int32_t* prompt,
                                        size_t num_tokens, kvtier_attach_result* out,
                                        kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_attach_prefix";
    if (cache == nullptr) return Null(kCall, "cache");
    if (out == nullptr) return Null(kCall, "out");
    absl::StatusOr<absl::Span<const int32_t>> tokens = capi::Tokens(kCall, prompt, num_tokens);
    if (!tokens.ok()) return tokens.status();
    absl::StatusOr<AttachResult> r = cache->cache->AttachPrefix(SequenceId(id), *tokens);
    if (!r.ok()) return r.status();
    out->matched_tokens = r->matched_tokens;
    out->attached_tokens = r->attached_tokens;
    for (int t = 0; t < kNumTiers; ++t) {
      out->attached_blocks_by_tier[t] = r->attached_blocks_by_tier[t];
    }
    out->restore_blocks = r->plan.restore_blocks;
    out->recompute_from_token = r->plan.recompute_from_token;
    out->cached_but_recomputed_blocks = r->plan.cached_but_recomputed;
    out->restore_time_ns = absl::ToInt64Nanoseconds(r->plan.restore_time);
    out->recompute_time_ns = absl::ToInt64Nanoseconds(r->plan.recompute_time);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_append(kvtier_cache* cache, uint64_t id, const int32_t* tokens,
                                 size_t num_tokens, kvtier_room_wait wait,
                                 kvtier_append_result* out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_append";
    if (cache == nullptr) return Null(kCall, "cache");
    absl::StatusOr<absl::Span<const int32_t>> span = capi::Tokens(kCall, tokens, num_tokens);
    if (!span.ok()) return span.status();
    absl::StatusOr<RoomWait> w = ToRoomWait(kCall, wait);
    if (!w.ok()) return w.status();
    absl::StatusOr<KvAppendResult> r = cache->cache->Append(SequenceId(id), *span, *w);
    if (!r.ok()) return r.status();
    if (out != nullptr) {
      out->first_sealed_block = r->first_sealed_block;
      out->num_sealed_blocks = r->num_sealed_blocks;
      out->num_new_slots = r->num_new_slots;
    }
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_report_written(kvtier_cache* cache, uint64_t id, int64_t num_tokens,
                                         const kvtier_completion* ready, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_report_written", "cache");
    return cache->cache->ReportWritten(
        SequenceId(id), num_tokens,
        ready == nullptr ? Completion::Done(absl::OkStatus()) : ready->completion);
  });
}

kvtier_status_code kvtier_fork(kvtier_cache* cache, uint64_t parent, uint64_t child,
                               int64_t num_tokens, kvtier_room_wait wait, kvtier_block_copy* copy,
                               kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_fork";
    if (cache == nullptr) return Null(kCall, "cache");
    absl::StatusOr<RoomWait> w = ToRoomWait(kCall, wait);
    if (!w.ok()) return w.status();
    absl::StatusOr<std::optional<BlockCopy>> r =
        cache->cache->Fork(SequenceId(parent), SequenceId(child), num_tokens, *w);
    if (!r.ok()) return r.status();
    ToBlockCopy(*r, copy);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_truncate(kvtier_cache* cache, uint64_t id, int64_t num_tokens,
                                   kvtier_room_wait wait, kvtier_block_copy* copy,
                                   kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_truncate";
    if (cache == nullptr) return Null(kCall, "cache");
    absl::StatusOr<RoomWait> w = ToRoomWait(kCall, wait);
    if (!w.ok()) return w.status();
    absl::StatusOr<std::optional<BlockCopy>> r =
        cache->cache->Truncate(SequenceId(id), num_tokens, *w);
    if (!r.ok()) return r.status();
    ToBlockCopy(*r, copy);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_check_room(const kvtier_cache* cache, uint64_t id, int64_t num_new_tokens,
                                     kvtier_room_check* out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_check_room";
    if (cache == nullptr) return Null(kCall, "cache");
    if (out == nullptr) return Null(kCall, "out");
    absl::StatusOr<RoomCheck> r = cache->cache->CheckRoom(SequenceId(id), num_new_tokens);
    if (!r.ok()) return r.status();
    ToRoomCheck(*r, out);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_check_room_for_slots(const kvtier_cache* cache, int64_t num_slots,
                                               kvtier_room_check* out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_check_room_for_slots";
    if (cache == nullptr) return Null(kCall, "cache");
    if (out == nullptr) return Null(kCall, "out");
    absl::StatusOr<RoomCheck> r = cache->cache->CheckRoom(num_slots);
    if (!r.ok()) return r.status();
    ToRoomCheck(*r, out);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_release(kvtier_cache* cache, uint64_t id, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_release", "cache");
    return cache->cache->Release(SequenceId(id));
  });
}

kvtier_status_code kvtier_release_with_hints(kvtier_cache* cache, uint64_t id,
                                             const kvtier_release_hints* hints,
                                             kvtier_hint_outcome* outcome, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_release_with_hints";
    if (cache == nullptr) return Null(kCall, "cache");
    if (hints == nullptr) return Null(kCall, "hints");
    // The release happens whatever the hints are (the header): a stop reason this build does
    // not know (a newer caller's, say) goes on to Release, which answers it kRejected. One
    // outside the C++ enum's byte is passed as 255, never wrapped onto a known reason.
    const int stop_reason = capi::RawEnum(hints->stop_reason);
    ReleaseHints h;
    h.stop_reason =
        static_cast<StopReason>(stop_reason >= 0 && stop_reason <= 255 ? stop_reason : 255);
    if (hints->has_expected_idle) h.expected_idle = absl::Nanoseconds(hints->expected_idle_ns);
    h.preempted = hints->preempted;
    h.last_turn = hints->last_turn;
    absl::StatusOr<HintOutcome> r = cache->cache->Release(SequenceId(id), h);
    if (!r.ok()) return r.status();
    capi::ToHintOutcome(*r, outcome);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_pause(kvtier_cache* cache, uint64_t id, int64_t expected_idle_ns,
                                kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_pause", "cache");
    return cache->cache->Pause(SequenceId(id), absl::Nanoseconds(expected_idle_ns));
  });
}

kvtier_status_code kvtier_pause_with_hints(kvtier_cache* cache, uint64_t id,
                                           const kvtier_pause_hints* hints,
                                           kvtier_hint_outcome* outcome, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_pause_with_hints", "cache");
    if (hints == nullptr) return Null("kvtier_pause_with_hints", "hints");
    PauseHints h;
    if (hints->has_expected_idle) h.expected_idle = absl::Nanoseconds(hints->expected_idle_ns);
    h.preempted = hints->preempted;
    absl::StatusOr<HintOutcome> r = cache->cache->Pause(SequenceId(id), h);
    if (!r.ok()) return r.status();
    capi::ToHintOutcome(*r, outcome);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_resume(kvtier_cache* cache, uint64_t id, kvtier_completion** onboarded,
                                 kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_resume", "cache");
    // Allocated first: an allocation failure after the resume would report an error for a
    // sequence already resumed ("On error nothing changes").
    std::unique_ptr<kvtier_completion> handle;
    if (onboarded != nullptr) handle = std::make_unique<kvtier_completion>();
    absl::StatusOr<Completion> c = cache->cache->Resume(SequenceId(id));
    if (!c.ok()) return c.status();
    if (onboarded != nullptr) {
      handle->completion = std::move(*c);
      *onboarded = handle.release();
    }
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_get_sequence(const kvtier_cache* cache, uint64_t id,
                                       kvtier_sequence_info* out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_get_sequence";
    if (cache == nullptr) return Null(kCall, "cache");
    if (out == nullptr) return Null(kCall, "out");
    absl::StatusOr<SequenceInfo> info = cache->cache->GetSequence(SequenceId(id));
    if (!info.ok()) return info.status();
    out->num_tokens = info->num_tokens;
    out->written_tokens = info->written_tokens;
    out->num_blocks = info->num_blocks;
    for (int t = 0; t < kNumTiers; ++t) out->blocks_by_tier[t] = info->blocks_by_tier[t];
    out->paused = info->paused;
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_prefetch(kvtier_cache* cache, const int32_t* tokens, size_t num_tokens,
                                   const kvtier_sequence_options* identity, int64_t* blocks_started,
                                   kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_prefetch";
    if (cache == nullptr) return Null(kCall, "cache");
    absl::StatusOr<absl::Span<const int32_t>> span = capi::Tokens(kCall, tokens, num_tokens);
    if (!span.ok()) return span.status();
    absl::StatusOr<SequenceOptions> o = capi::ToSequenceOptions(identity);
    if (!o.ok()) return o.status();
    absl::StatusOr<int64_t> started = cache->cache->Prefetch(*span, *o);
    if (!started.ok()) return started.status();
    if (blocks_started != nullptr) *blocks_started = *started;
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_retain_prefix(kvtier_cache* cache, const int32_t* tokens,
                                        size_t num_tokens, double priority, int64_t ttl_ns,
                                        const kvtier_sequence_options* identity,
                                        kvtier_hint_outcome* outcome, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_retain_prefix";
    if (cache == nullptr) return Null(kCall, "cache");
    absl::StatusOr<absl::Span<const int32_t>> span = capi::Tokens(kCall, tokens, num_tokens);
    if (!span.ok()) return span.status();
    absl::StatusOr<SequenceOptions> o = capi::ToSequenceOptions(identity);
    if (!o.ok()) return o.status();
    absl::StatusOr<HintOutcome> r =
        cache->cache->RetainPrefix(*span, priority, absl::Nanoseconds(ttl_ns), *o);
    if (!r.ok()) return r.status();
    capi::ToHintOutcome(*r, outcome);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_invalidate_prefix(kvtier_cache* cache, const int32_t* tokens,
                                            size_t num_tokens, int64_t from_token,
                                            const kvtier_sequence_options* identity,
                                            kvtier_hint_outcome* outcome, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_invalidate_prefix";
    if (cache == nullptr) return Null(kCall, "cache");
    absl::StatusOr<absl::Span<const int32_t>> span = capi::Tokens(kCall, tokens, num_tokens);
    if (!span.ok()) return span.status();
    absl::StatusOr<SequenceOptions> o = capi::ToSequenceOptions(identity);
    if (!o.ok()) return o.status();
    absl::StatusOr<HintOutcome> r = cache->cache->InvalidatePrefix(*span, from_token, *o);
    if (!r.ok()) return r.status();
    capi::ToHintOutcome(*r, outcome);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_retain_session(kvtier_cache* cache, uint64_t session, double priority,
                                         int64_t ttl_ns, kvtier_hint_outcome* outcome,
                                         kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_retain_session", "cache");
    absl::StatusOr<HintOutcome> r =
        cache->cache->RetainSession(session, priority, absl::Nanoseconds(ttl_ns));
    if (!r.ok()) return r.status();
    capi::ToHintOutcome(*r, outcome);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_invalidate_session(kvtier_cache* cache, uint64_t session,
                                             kvtier_hint_outcome* outcome, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    if (cache == nullptr) return Null("kvtier_invalidate_session", "cache");
    absl::StatusOr<HintOutcome> r = cache->cache->InvalidateSession(session);
    if (!r.ok()) return r.status();
    capi::ToHintOutcome(*r, outcome);
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_lookup(const kvtier_cache* cache, const int32_t* tokens,
                                 size_t num_tokens, const kvtier_sequence_options* identity,
                                 kvtier_prefix_lookup* out, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_lookup";
    if (cache == nullptr) return Null(kCall, "cache");
    if (out == nullptr) return Null(kCall, "out");
    absl::StatusOr<absl::Span<const int32_t>> span = capi::Tokens(kCall, tokens, num_tokens);
    if (!span.ok()) return span.status();
    absl::StatusOr<SequenceOptions> o = capi::ToSequenceOptions(identity);
    if (!o.ok()) return o.status();
    absl::StatusOr<PrefixLookup> r = cache->cache->Lookup(*span, *o);
    if (!r.ok()) return r.status();
    out->matched_tokens = r->matched_tokens;
    for (int t = 0; t < kNumTiers; ++t) out->blocks_by_tier[t] = r->blocks_by_tier[t];
    out->discovered_blocks = r->discovered_blocks;
    return absl::OkStatus();
  });
}

kvtier_status_code kvtier_reset_prefix_cache(kvtier_cache* cache, const kvtier_tier* tier,
                                             int64_t* dropped, kvtier_error* error) {
  return Guard(error, [&]() -> absl::Status {
    constexpr char kCall[] = "kvtier_reset_prefix_cache";
    if (cache == nullptr) return Null(kCall, "cache");
    std::optional<Tier> which;
    if (tier != nullptr) {
      const int raw = capi::RawEnum(*tier);
      if (raw < KVTIER_TIER_HBM || raw > KVTIER_TIER_REMOTE) {
        return absl::InvalidArgumentError(
            absl::StrCat(kCall, ": tier ", raw, " is not one of 0..", KVTIER_NUM_TIERS - 1));
      }
      which = static_cast<Tier>(raw);
    }
    absl::StatusOr<int64_t> r = cache->cache->ResetPrefixCache(which);
    if (!r.ok()) return r.status();
    if (dropped != nullptr) *dropped = *r;
    return absl::OkStatus();
  });
}

}  // extern "C"
