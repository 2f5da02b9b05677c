// KvCache, the facade: checks each call's arguments and calls into the part of KvCache::Impl
// (kv_cache_impl.h) that holds the concept, taking the cache lock, or a CacheScope where deferred
// work may follow. Create assembles the Impl from validated options. Owns no state of its own.
#include "kvtier/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/kv_cache_impl.h"
#include "cache/ticket_state.h"
#include "internal/interned_string.h"
#include "internal/mutex.h"
#include "internal/status_macros.h"
#include "kvtier/block_index.h"
#include "kvtier/transfer_engine.h"

namespace kvtier {

using internal::ExtrasOf;
using internal::SameIdentity;

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const CacheNamespace& ns,
                                                         KvCacheOptions options) {
  const KvGeometry& g = ns.geometry();
  TierBackend* hbm = options.tiers[0].get();
  KVTIER_RETURN_IF_ERROR(Impl::ValidateOptions(ns, options));
  KVTIER_ASSIGN_OR_RETURN(std::optional<PrefillCostModel> cost, Impl::MakeCostModel(ns, options));
  KVTIER_ASSIGN_OR_RETURN(Impl::Policies policies, Impl::MakePolicies(options));
  KVTIER_ASSIGN_OR_RETURN(PrefixHasher hasher, PrefixHasher::Create(ns, options.hash));

  auto impl = std::make_unique<Impl>(ns, std::move(hasher));
  impl->block_tokens = g.tokens_per_block();
  impl->block_bytes = g.bytes_per_block();
  impl->pool = *hbm->device_pool();
  TransferEngineOptions engine_options;
  for (int t = 0; t < kNumTiers; ++t) engine_options.tiers[t] = options.tiers[t].get();
  engine_options.bounce_buffers = options.bounce_buffers;
  KVTIER_ASSIGN_OR_RETURN(impl->engine, TransferEngine::Create(engine_options));
  impl->tiers = std::move(options.tiers);
  impl->write_policy = options.write_policy;
  impl->inclusion = options.inclusion;
  impl->admit_after_uses = options.admit_after_uses;
  impl->demote_on_evict = options.demote_on_evict;
  impl->demote_by_value = options.demote_by_value;
  impl->publish_to_remote = options.publish_to_remote;
  impl->cost = cost;
  impl->links = options.links;
  impl->measure_bandwidth = options.measure_bandwidth;
  impl->clock = std::move(options.clock);
  impl->event_buffer = static_cast<size_t>(options.event_buffer);
  impl->worker_id = impl->strings->Intern(options.worker_id);
  impl->room_wait = options.room_wait;
  impl->remote_probe_window = options.remote_probe_window_blocks;
  impl->remote_probe_timeout = options.remote_probe_timeout;
  {
    Impl::CacheLock lock(*impl);
    impl->policy = std::move(policies);
    for (int t = 0; t < kNumTiers; ++t) {
      if (impl->tiers[t] == nullptr) continue;
      impl->owner[t].resize(static_cast<size_t>(impl->tiers[t]->info().capacity_blocks));
      impl->counters.tiers[t].present = true;
    }
    impl->ticket_refs.assign(static_cast<size_t>(impl->tiers[0]->info().capacity_blocks), 0);
    impl->seq_refs.assign(impl->ticket_refs.size(), 0);
    impl->AdoptRecoveredBlocks();
  }
  impl->lifeline->Set(impl.get());
  return std::unique_ptr<KvCache>(new KvCache(std::move(impl)));
}

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvCache::~KvCache() {
  (void)WaitIdle();
  {
    // Blocks waiting for a kernel's write that has not landed (its `ready` may never fire now):
    // their tickets complete, not resident, rather than never.
    Impl::CacheScope scope(*impl_);
    impl_->FailWriteWaiters(scope.deferred());
  }
  impl_->lifeline->Close();  // later callbacks (e.g. a ReportWritten completion) do nothing
  impl_->timer.reset();
  impl_->engine.reset();  // waits for anything still in flight, before the tiers go
}

const CacheNamespace& KvCache::cache_namespace() const { return impl_->ns; }
const PrefixHasher& KvCache::hasher() const { return impl_->hasher; }

// ---- Sequences --------------------------------------------------------------------------------

absl::Status KvCache::CreateSequence(SequenceId id, const SequenceOptions& options) {
  if (!id.valid()) return absl::InvalidArgumentError("CreateSequence: an invalid sequence id");
  if (!(options.retention_priority >= 0) || !std::isfinite(options.retention_priority)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateSequence: retention_priority = ", options.retention_priority,
                     " must be finite and >= 0"));
  }
  if (options.retention < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateSequence: retention = ", absl::FormatDuration(options.retention),
                     " must not be negative"));
  }
  auto seq = std::make_unique<Impl::Sequence>();
  seq->id = id;
  seq->options = options;
  seq->extras = ExtrasOf(options);
  // Validates the extras once, so later calls fail only on what they add.
  std::vector<BlockKey> probe;
  KVTIER_RETURN_IF_ERROR(impl_->hasher.AppendBlockKeys(kRootBlockKey, 0, {}, seq->extras, &probe));
  Impl::CacheLock lock(*impl_);
  return impl_->AddSequence(std::move(seq));
}

absl::StatusOr<AttachResult> KvCache::AttachPrefix(SequenceId id,
                                                   absl::Span<const int32_t> prompt) {
  Impl& I = *impl_;
  if (prompt.empty()) return absl::InvalidArgumentError("AttachPrefix: an empty prompt");
  BlockExtras extras;
  uint64_t generation = 0;
  bool caching = true;
  {
    Impl::CacheLock lock(I);
    KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
    extras = seq->extras;
    generation = seq->generation;
    caching = seq->options.enable_caching;
  }
  // Hash outside the lock: it is the expensive part and needs nothing shared.
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys, I.hasher.BlockKeys(prompt, extras));
  if (I.Discovers() && caching) {
    // The last prompt token is always computed, so blocks from (n - 1) / B on are never
    // restored: not worth a question to the store.
    const Impl::RemoteProbe probe =
        I.ProbeAfterMatch(keys, (static_cast<int64_t>(prompt.size()) - 1) / I.block_tokens);
    if (probe.attempted) {
      Impl::CacheScope scope(I);
      I.AdoptDiscovered(id, generation, keys, probe, scope.deferred());
      return I.AttachKeys(id, generation, keys, prompt, &keys);
    }
  }
  Impl::CacheLock lock(I);
  return I.AttachKeys(id, generation, keys, prompt, &keys);
}

absl::StatusOr<AttachResult> KvCache::AttachHashedPrefix(SequenceId id,
                                                         const HashedPrompt& prompt) {
  Impl& I = *impl_;
  if (prompt.tokens_.empty()) {
    return absl::InvalidArgumentError("AttachHashedPrefix: an empty prompt");
  }
  KVTIER_RETURN_IF_ERROR(CheckHashedHere(prompt, "AttachHashedPrefix"));
  uint64_t generation = 0;
  {
    Impl::CacheLock lock(I);
    KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
    if (!SameIdentity(seq->extras, prompt.extras_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("AttachHashedPrefix: the prompt was hashed under another identity (adapter, "
                       "tenant salt or multimodal items) than ",
                       internal::SeqName(id)));
    }
    if (!I.Discovers() || !seq->options.enable_caching) {
      return I.AttachKeys(id, seq->generation, prompt.keys_, prompt.tokens_);
    }
    generation = seq->generation;
  }
  // As AttachPrefix: probe the store where the local match ends, the lock dropped; AttachKeys
  // then finds out whether the sequence is still the one of `generation`.
  const Impl::RemoteProbe probe = I.ProbeAfterMatch(
      prompt.keys_, (static_cast<int64_t>(prompt.tokens_.size()) - 1) / I.block_tokens);
  Impl::CacheScope scope(I);
  if (probe.attempted) I.AdoptDiscovered(id, generation, prompt.keys_, probe, scope.deferred());
  return I.AttachKeys(id, generation, prompt.keys_, prompt.tokens_);
}

absl::StatusOr<KvAppendResult> KvCache::Append(SequenceId id, absl::Span<const int32_t> tokens,
                                               RoomWait wait) {
  Impl& I = *impl_;
  if (tokens.empty()) return absl::InvalidArgumentError("Append: no tokens");
  Impl::CacheScope scope(I);
  return I.AppendTokens(id, tokens, wait, scope.deferred());
}

absl::StatusOr<std::optional<BlockCopy>> KvCache::Truncate(SequenceId id, int64_t num_tokens,
                                                           RoomWait wait) {
  Impl& I = *impl_;
  Impl::CacheScope scope(I);
  return I.TruncateSequence(id, num_tokens, wait, scope.deferred());
}

absl::StatusOr<RoomCheck> KvCache::CheckRoom(SequenceId id, int64_t num_new_tokens) const {
  Impl& I = *impl_;
  if (num_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CheckRoom: ", num_new_tokens, " new tokens (must be >= 0)"));
  }
  Impl::CacheLock lock(I);
  KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
  const int64_t n = static_cast<int64_t>(seq->tokens.size());
  if (num_new_tokens > PrefixHasher::kMaxPosition - n) {
    return absl::InvalidArgumentError(absl::StrCat("CheckRoom: ", internal::SeqName(id),
                                                   " would hold more than ",
                                                   PrefixHasher::kMaxPosition, " tokens"));
  }
  return I.RoomFor(I.geometry.BlocksForTokens(n + num_new_tokens) -
                   static_cast<int64_t>(seq->blocks.size()));
}

absl::StatusOr<RoomCheck> KvCache::CheckRoom(int64_t num_slots) const {
  Impl& I = *impl_;
  if (num_slots < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CheckRoom: ", num_slots, " slots (must be >= 0)"));
  }
  Impl::CacheLock lock(I);
  return I.RoomFor(num_slots);
}

absl::StatusOr<int64_t> KvCache::ResetPrefixCache(std::optional<Tier> tier) {
  Impl& I = *impl_;
  if (tier.has_value() &&
      (TierIndex(*tier) < 0 || TierIndex(*tier) >= kNumTiers || !I.Present(*tier))) {
    return absl::InvalidArgumentError(
        absl::StrCat("ResetPrefixCache: the cache has no tier ", static_cast<int>(*tier)));
  }
  Impl::CacheScope scope(I);
  int64_t dropped = 0;
  for (int t = 0; t < kNumTiers; ++t) {
    const Tier each = static_cast<Tier>(t);
    if (I.Present(each) && (!tier.has_value() || *tier == each)) dropped += I.ResetTier(each);
  }
  return dropped;
}

absl::Status KvCache::ReportWritten(SequenceId id, int64_t num_tokens, Completion ready) {
  Impl& I = *impl_;
  Impl::CacheScope scope(I);
  return I.PublishWritten(id, num_tokens, std::move(ready), scope.deferred());
}

absl::StatusOr<Completion> KvCache::CompletionOfCudaEvent(void* cuda_event) {
  if (cuda_event == nullptr) {
    return absl::InvalidArgumentError("CompletionOfCudaEvent: a null CUDA event");
  }
  // tiers[0] is set at Create and never changes; the backend call is thread-safe.
  return impl_->tiers[0]->CompletionOfDeviceEvent(cuda_event);
}

absl::StatusOr<std::optional<BlockCopy>> KvCache::Fork(SequenceId parent, SequenceId child,
                                                       int64_t num_tokens, RoomWait wait) {
  Impl& I = *impl_;
  if (!child.valid()) return absl::InvalidArgumentError("Fork: an invalid child sequence id");
  Impl::CacheScope scope(I);
  return I.ForkSequence(parent, child, num_tokens, wait, scope.deferred());
}

absl::Status KvCache::Release(SequenceId id) {
  Impl& I = *impl_;
  Impl::CacheLock lock(I);
  return I.ReleaseSequence(id);
}

namespace {

// An expected_idle out of range is not taken (reset); the call goes on with the other hints.
void TakeExpectedIdle(std::optional<absl::Duration>& idle, HintOutcome& outcome) {
  if (!idle.has_value() || (*idle >= absl::ZeroDuration() && *idle != absl::InfiniteDuration())) {
    return;
  }
  outcome.result = HintOutcome::Result::kRejected;
  outcome.reason =
      absl::StrCat("expected_idle = ", absl::FormatDuration(*idle),
                   " must be >= 0 and finite (the other hints are taken where they apply)");
  idle.reset();
}

constexpr std::string_view kNoSession =
    "the sequence has no session (SequenceOptions::session): nothing to tie the hint to";

}  // namespace

absl::StatusOr<HintOutcome> KvCache::Release(SequenceId id, const ReleaseHints& hints) {
  Impl& I = *impl_;
  HintOutcome outcome;
  ReleaseHints taken = hints;
  auto clip = [&](std::string_view reason) {
    if (outcome.result != HintOutcome::Result::kAccepted) return;
    outcome.result = HintOutcome::Result::kClipped;
    outcome.reason = std::string(reason);
  };
  TakeExpectedIdle(taken.expected_idle, outcome);
  // A value past the enum (a newer caller's) reaches no policy: one may index a table by it.
  if (const int stop = static_cast<int>(hints.stop_reason); stop >= kNumStopReasons) {
    taken.stop_reason = StopReason::kUnknown;
    const bool idle_rejected = outcome.result == HintOutcome::Result::kRejected;
    outcome.result = HintOutcome::Result::kRejected;
    outcome.reason =
        absl::StrCat("stop_reason ", stop, " is not a StopReason: released as unknown",
                     idle_rejected ? absl::StrCat("; ", outcome.reason)
                                   : std::string(" (the other hints are taken where they apply)"));
  }
  Impl::CacheLock lock(I);
  KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
  outcome.blocks = I.WrittenFullBlocks(*seq);
  if (seq->options.session == 0) {
    outcome.result = HintOutcome::Result::kRejected;
    outcome.reason = std::string(kNoSession);
  } else if (!seq->options.enable_caching) {
    outcome.result = HintOutcome::Result::kRejected;
    outcome.reason = "the sequence has caching off: its blocks are shared with nobody";
  }
  // last_turn is not used where the session goes on; where it is used, an estimate is not.
  if (hints.last_turn && hints.preempted) {
    taken.last_turn = false;
    clip("last_turn is not used for a preempted request (it comes back)");
  } else if (hints.last_turn && I.Superseded(*seq)) {
    taken.last_turn = false;
    clip(
        "last_turn is not used: a later request of the session is live or let go (the session "
        "goes on)");
  } else if (hints.last_turn && taken.expected_idle.has_value()) {
    taken.expected_idle.reset();
    clip("expected_idle is not used with last_turn (no next request to wait for)");
  }
  KVTIER_RETURN_IF_ERROR(I.ReleaseSequence(id, taken));
  return outcome;
}

// ---- Hints ------------------------------------------------------------------------------------

absl::Status KvCache::Pause(SequenceId id, absl::Duration expected_idle) {
  if (expected_idle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Pause: expected_idle = ", absl::FormatDuration(expected_idle), " must not be negative"));
  }
  return Pause(id, PauseHints{.expected_idle = expected_idle}).status();
}

absl::StatusOr<HintOutcome> KvCache::Pause(SequenceId id, const PauseHints& hints) {
  Impl& I = *impl_;
  HintOutcome outcome;
  PauseHints taken = hints;
  TakeExpectedIdle(taken.expected_idle, outcome);
  Impl::CacheScope scope(I);
  KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
  outcome.blocks = I.WrittenFullBlocks(*seq);
  if (seq->options.session == 0) {
    outcome.result = HintOutcome::Result::kRejected;
    outcome.reason = std::string(kNoSession);
  }
  KVTIER_RETURN_IF_ERROR(I.PauseSequence(id, taken, scope.deferred()));
  return outcome;
}

absl::StatusOr<Completion> KvCache::Resume(SequenceId id) {
  Impl& I = *impl_;
  auto t = std::make_shared<internal::OnboardBatch>();
  {
    Impl::CacheScope scope(I);
    KVTIER_RETURN_IF_ERROR(I.ResumeSequence(id, t, scope.deferred()));
  }
  return t->done;
}

absl::StatusOr<int64_t> KvCache::Prefetch(absl::Span<const int32_t> tokens,
                                          const SequenceOptions& identity) {
  Impl& I = *impl_;
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys,
                          I.hasher.BlockKeys(tokens, ExtrasOf(identity)));
  Impl::CacheScope scope(I);
  return I.PrefetchBlocks(keys, static_cast<int64_t>(tokens.size()), scope.deferred());
}

// ---- ensure-resident --------------------------------------------------------------------------

absl::StatusOr<ResidencyTicket> KvCache::EnsureResident(SequenceId id, int64_t begin_token,
                                                        int64_t end_token,
                                                        const EnsureResidentOptions& options) {
  Impl& I = *impl_;
  if (begin_token < 0 || begin_token > end_token) {
    return absl::InvalidArgumentError(absl::StrCat("EnsureResident: the range [", begin_token, ", ",
                                                   end_token, ") is malformed"));
  }
  if (options.mode != ResidencyMode::kWait && options.mode != ResidencyMode::kBestEffort &&
      options.mode != ResidencyMode::kAsync) {
    return absl::InvalidArgumentError("EnsureResident: unknown mode");
  }
  auto t = std::make_shared<internal::TicketState>();
  {
    Impl::CacheScope scope(I);
    KVTIER_RETURN_IF_ERROR(I.IssueTicket(id, begin_token, end_token, options, t, scope.deferred()));
  }
  I.AwaitTicket(t, options);
  return ResidencyTicket(I.HandOut(std::move(t)));
}

absl::Status KvCache::ReleaseTicket(const ResidencyTicket& ticket) {
  Impl& I = *impl_;
  if (!ticket.valid()) return absl::InvalidArgumentError("ReleaseTicket: an invalid ticket");
  internal::TicketState& t = *ticket.state_;
  if (t.owner != &I) {
    return absl::NotFoundError(
        absl::StrCat("ReleaseTicket: ticket ", t.id, " was issued by another cache"));
  }
  Impl::CacheLock lock(I);
  return I.CloseTicket(ticket.state_);
}

// ---- Lookups, stats, events -------------------------------------------------------------------

absl::StatusOr<HashedPrompt> KvCache::HashPrompt(absl::Span<const int32_t> tokens,
                                                 const SequenceOptions& identity) const {
  const Impl& I = *impl_;
  HashedPrompt p;
  p.extras_ = ExtrasOf(identity);
  KVTIER_ASSIGN_OR_RETURN(p.keys_, I.hasher.BlockKeys(tokens, p.extras_));
  p.tokens_.assign(tokens.begin(), tokens.end());
  p.namespace_digest_ = I.hasher.namespace_digest();
  p.algorithm_ = I.hasher.algorithm();
  return p;
}

absl::Status KvCache::CheckHashedHere(const HashedPrompt& prompt, const char* call) const {
  if (prompt.namespace_digest_ != impl_->hasher.namespace_digest() ||
      prompt.algorithm_ != impl_->hasher.algorithm()) {
    return absl::InvalidArgumentError(
        absl::StrCat(call,
                     ": the prompt was hashed under another namespace or hash algorithm "
                     "than this cache's"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PrefixLookup> KvCache::LookupHashed(const HashedPrompt& prompt) const {
  KVTIER_RETURN_IF_ERROR(CheckHashedHere(prompt, "LookupHashed"));
  return LookupKeys(prompt.keys_, static_cast<int64_t>(prompt.tokens_.size()));
}

absl::StatusOr<PrefixLookup> KvCache::Lookup(absl::Span<const int32_t> tokens,
                                             const SequenceOptions& identity) const {
  const Impl& I = *impl_;
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockKey> keys,
                          I.hasher.BlockKeys(tokens, ExtrasOf(identity)));
  return LookupKeys(keys, static_cast<int64_t>(tokens.size()));
}

absl::StatusOr<PrefixLookup> KvCache::LookupKeys(absl::Span<const BlockKey> keys,
                                                 int64_t num_tokens) const {
  // Not const: the probe counters change (the index does not).
  Impl& I = *impl_;
  Impl::RemoteProbe probe;
  if (I.Discovers()) probe = I.ProbeAfterMatch(keys, num_tokens / I.block_tokens);
  Impl::CacheLock lock(I);
  KVTIER_ASSIGN_OR_RETURN(const PrefixMatch match, I.MatchBlocks(keys, num_tokens));
  PrefixLookup out;
  out.matched_tokens = match.matched_tokens;
  out.blocks_by_tier = match.blocks_by_tier;
  if (!probe.attempted) return out;
  // The index may have changed while the lock was dropped: the blocks found extend the match
  // as it is now, from where it ends, while they run on without a gap.
  int64_t discovered = 0;
  const int64_t probed = static_cast<int64_t>(probe.found.size());
  for (int64_t i = match.matched_blocks;
       probe.status.ok() && i >= probe.first_block && i - probe.first_block < probed &&
       probe.found[static_cast<size_t>(i - probe.first_block)];
       ++i) {
    ++discovered;
  }
  I.NoteProbe(probe, discovered);
  out.discovered_blocks = discovered;
  out.blocks_by_tier[TierIndex(Tier::kRemote)] += discovered;
  out.matched_tokens += discovered * I.block_tokens;
  return out;
}

absl::StatusOr<SequenceInfo> KvCache::GetSequence(SequenceId id) const {
  Impl& I = *impl_;
  Impl::CacheLock lock(I);
  KVTIER_ASSIGN_OR_RETURN(Impl::Sequence * seq, I.FindSeq(id));
  SequenceInfo info;
  info.num_tokens = static_cast<int64_t>(seq->tokens.size());
  info.written_tokens = seq->written;
  info.num_blocks = static_cast<int64_t>(seq->blocks.size());
  for (const auto& b : seq->blocks) ++info.blocks_by_tier[TierIndex(b.tier)];
  info.paused = seq->paused;
  return info;
}

std::vector<CacheEvent> KvCache::PollEvents(uint64_t after_sequence, size_t max_events) const {
  Impl& I = *impl_;
  Impl::CacheLock lock(I);
  std::vector<CacheEvent> out;
  if (I.events.empty()) return out;
  const uint64_t oldest = I.events.front().sequence;
  size_t start = after_sequence < oldest ? 0 : static_cast<size_t>(after_sequence - oldest + 1);
  for (size_t i = start; i < I.events.size() && out.size() < max_events; ++i) {
    out.push_back(I.events[i]);
  }
  return out;
}

absl::StatusOr<EventSubscription> KvCache::SubscribeEvents(CacheEventCallback callback) {
  if (!callback) return absl::InvalidArgumentError("SubscribeEvents: an empty callback");
  Impl& I = *impl_;
  // Under the cache lock: every event numbered `first` or later is made after the subscriber
  // counts, so it is collected for it.
  Impl::CacheLock lock(I);
  const uint64_t first = I.next_event;
  const uint64_t id = I.hub->Add(std::move(callback), first);
  return EventSubscription(I.hub, id, first);
}

absl::Status KvCache::WaitIdle(absl::Time deadline) const {
  Impl& I = *impl_;
  Impl::CacheLock lock(I);
  while (I.moves_in_flight > 0) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("WaitIdle: ", I.moves_in_flight, " transfers still in flight"));
    }
    I.cv.WaitUntil(&I.mu,
                   absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Milliseconds(100))));
  }
  return absl::OkStatus();
}

absl::Status KvCache::CheckInvariants() const {
  Impl& I = *impl_;
  Impl::CacheLock lock(I);
  return I.CheckInvariantsLocked();
}

}  // namespace kvtier
