// The reuse_index eviction policy (eviction_policy.h): per-block access history, classes after
// ../shared/policy/README.md, an online life table (reuse_life_table.h) and sampled victims with
// the parent-follows rule.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/reuse_life_table.h"
#include "policy/scaled_life_table.h"
#include "policy/seconds.h"
#include "policy/splitmix.h"
#include "policy/traits_check.h"

namespace kvtier {
namespace {

// Classes: the root, a block no request named, then turn x prior accesses x delta.
constexpr int kRootClass = 0;
constexpr int kUnnamedClass = 1;
constexpr int kTurnBuckets = 5, kAccessBuckets = 3, kDeltaBuckets = 2;
constexpr int kNumClasses = 2 + kTurnBuckets * kAccessBuckets * kDeltaBuckets;

int TurnBucket(uint32_t turn) {
  return turn <= 1 ? 0 : turn == 2 ? 1 : turn == 3 ? 2 : turn <= 5 ? 3 : 4;
}
int AccessBucket(uint32_t prior) { return prior == 0 ? 0 : prior <= 2 ? 1 : 2; }

int ClassOf(size_t depth, uint32_t turn, uint32_t prior_accesses, size_t delta) {
  if (depth == 0) return kRootClass;
  return 2 + (TurnBucket(turn) * kAccessBuckets + AccessBucket(prior_accesses)) * kDeltaBuckets +
         (delta > 4 ? 1 : 0);
}

// Each class's hazard shrinks towards its group's: the root, unnamed blocks, and the rest.
std::vector<int> ClassGroups() {
  std::vector<int> g(kNumClasses, 2);
  g[kRootClass] = 0;
  g[kUnnamedClass] = 1;
  return g;
}

// The scaled table's clamp of an idle estimate, seconds: a zero estimate would divide by zero.
constexpr double kMinScaleSeconds = 1, kMaxScaleSeconds = 86400;

// Session-return classes: the stop reason. A release without an idle estimate is a birth in the
// session table; one with an estimate in the estimated table (both in seconds) and in the scaled
// table (ages in units of the estimate), where exact estimates order returns as their true times
// would. EstimateHelps picks which of the last two ranks.
int SessionClassOf(StopReason stop) {
  return static_cast<int>(stop) < kNumStopReasons ? static_cast<int>(stop) : 0;
}

ReuseLifeTableOptions SessionTableDefaults(ReuseLifeTableOptions o) {
  if (o.edges_seconds.empty()) {
    o.edges_seconds = {0,   5,   10,  15,  20,   30,   45,   60,   90,   120,  180,   240,
                       300, 450, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200, 10800, 14400};
  }
  if (o.horizons_seconds.empty()) {
    for (double h = 5; h <= 5120; h *= 2) o.horizons_seconds.push_back(h);
  }
  return o;
}

class ReuseIndexPolicy final : public EvictionPolicy {
 public:
  ReuseIndexPolicy(const ReuseIndexOptions& options, ReuseLifeTable table,
                   ReuseLifeTable session_table, ReuseLifeTable estimated_table,
                   internal::ScaledLifeTable scaled_table)
      : options_(options),
        rng_(options.seed),
        table_(std::move(table)),
        session_table_(std::move(session_table)),
        estimated_table_(std::move(estimated_table)),
        scaled_table_(std::move(scaled_table)) {}

  std::string_view name() const override { return "reuse_index"; }
  bool reads_run_blocks() const override { return false; }
  bool observes_requests() const override { return true; }

  void ObserveRequest(const RequestObservation& request) override {
    const absl::Span<const BlockKey> blocks = request.blocks;
    const absl::Time now = Clock(request.now);
    Prune(now);
    AdvanceTables(now);
    if (request.session != 0) {
      Session& s = Touch(request.session, now);
      if (s.released) Returned(s, now, /*came_back=*/true);
      s.released = false;
      // A resumed sequence reads what it holds: no sign the session moved on from any block.
      if (request.resumed) return;
      s.last_request = now;
    }
    // h: the leading blocks an earlier request named; the predecessor holds block h-1.
    size_t seen = 0;
    while (seen < blocks.size() && records_.contains(blocks[seen])) ++seen;
    uint32_t turn = 1;
    if (seen > 1) turn = records_.find(blocks[seen - 1])->second.turn + 1;
    const size_t delta = blocks.size() - seen;
    for (size_t d = 0; d < blocks.size(); ++d) {
      auto [it, inserted] = records_.try_emplace(blocks[d]);
      Record& r = it->second;
      if (!inserted) table_.Reuse(r.birth, now);
      r.cls = static_cast<uint8_t>(ClassOf(d, turn, r.accesses, delta));
      r.turn = turn;
      r.named = true;
      ++r.accesses;
      Access(*it, now);
    }
  }

  void ObserveRelease(const ReleaseObservation& release) override {
    if (release.session == 0) return;
    const absl::Time now = Clock(release.now);
    Prune(now);
    AdvanceTables(now);
    Session& s = Touch(release.session, now);
    const int cls = SessionClassOf(release.stop_reason);
    const std::optional<absl::Duration>& idle = release.expected_idle;
    // One return per request: a release of an earlier request, after a later one started,
    // waits for no return of its own; nor does a preempted one, which comes back as a
    // readmission no ObserveRequest announces. Their blocks wait for the session's return.
    const bool own_return = !release.superseded && !release.preempted;
    // The session is not ending while it goes on, whatever it says.
    const bool ends = release.last_turn && own_return;
    const bool scaled = !ends && idle.has_value() && *idle >= absl::ZeroDuration() &&
                        *idle < absl::InfiniteDuration();
    if (own_return && s.released) {
      Returned(s, now, /*came_back=*/false);  // released again, no request between
    }
    if (ends) {
      // No return to wait for, and none to learn: its blocks go first (MovedOn).
      s.released = false;
      s.ended_at = now;
    } else if (own_return) {
      // A release with an estimate is a birth in the estimated and the scaled tables, so either
      // can rank it (EstimateHelps decides which); one without, in the session table.
      s.release_birth = (scaled ? estimated_table_ : session_table_).Birth(cls, now);
      s.scaled = scaled;
      if (scaled) s.scaled_birth = scaled_table_.Birth(cls, now, *idle);
      s.release_cls = static_cast<uint8_t>(cls);
      s.released_at = now;
      s.idle = scaled ? *idle : absl::ZeroDuration();
      s.released = true;
    }
    const Claim mine{.session = release.session,
                     .released_at = now,
                     .idle_scale = scaled ? *idle : absl::ZeroDuration(),
                     .session_cls = static_cast<uint8_t>(cls),
                     .scaled = scaled};
    for (const BlockKey& key : release.blocks) {
      auto [it, inserted] = records_.try_emplace(key);
      Record& r = it->second;
      if (inserted) {
        r.cls = kUnnamedClass;
        r.accesses = 1;
        Access(*it, now);
      }
      if (!ends) {
        // Another session's claim is kept for later while that session may still come back
        // (a dead one would push out a live earlier claim).
        if (r.claim.session != release.session && Waiting(r.claim)) r.earlier = r.claim;
        r.claim = mine;
        continue;
      }
      // The session ends. A block another session let go too (a shared prefix) waits for that
      // one's return: the latest such claim stays, or comes back if that session has neither
      // ended nor moved on since.
      if (r.earlier.session == release.session) r.earlier = Claim{};
      if (r.claim.session != 0 && r.claim.session != release.session) continue;
      const Claim earlier = std::exchange(r.earlier, Claim{});
      r.claim = Waiting(earlier) ? earlier : mine;
    }
  }

  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    now = Clock(now);
    if (absl::Status s = internal::CheckTraits(traits); !s.ok()) return s;
    auto [it, inserted] = records_.try_emplace(key);
    Record& r = it->second;
    if (r.candidate >= 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("reuse_index: block ", key.ToHex(), " is a candidate already"));
    }
    if (inserted) {  // never named by a request: its own class, born now
      r.cls = kUnnamedClass;
      r.accesses = 1;
      Access(*it, now);
    }
    r.parent = traits.parent;
    r.retention_priority = traits.retention_priority;
    r.priority_until = traits.priority_until;
    r.candidate = static_cast<int64_t>(candidates_.size());
    candidates_.push_back(&*it);
    return absl::OkStatus();
  }

  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    now = Clock(now);
    if (absl::Status s = internal::CheckTraits(traits); !s.ok()) return s;
    auto it = records_.find(key);
    if (it == records_.end() || it->second.candidate < 0) return NotACandidate(key);
    Record& r = it->second;
    r.retention_priority = traits.retention_priority;
    r.priority_until = traits.priority_until;
    // For a block requests name, the requests are its accesses: a Touch (KvCache touches the
    // lower copies of a block a sequence releases, after the request that read it) is none.
    // A block no request names has only Touches to learn from.
    if (!r.named && now > r.last_access) {
      table_.Reuse(r.birth, now);
      ++r.accesses;
      Access(*it, now);
    }
    return absl::OkStatus();
  }

  absl::Status Remove(const BlockKey& key) override {
    auto it = records_.find(key);
    if (it == records_.end() || it->second.candidate < 0) return NotACandidate(key);
    const int64_t pos = it->second.candidate;
    candidates_[pos] = candidates_.back();
    candidates_[pos]->second.candidate = pos;
    candidates_.pop_back();
    it->second.candidate = -1;
    // Prune passed it by while it was a candidate: the next Prune forgets it unless it is a
    // candidate again by then (unregistered for a moment: a transfer reading its copy, say).
    if (it->second.last_access < forgotten_before_) lapsed_.push_back(key);
    return absl::OkStatus();
  }

  std::optional<BlockKey> Victim(absl::Time now) override {
    now = Clock(now);
    if (candidates_.empty()) return std::nullopt;
    AdvanceTables(now);
    latest_now_ = std::max(latest_now_, now);
    if (follow_ && follow_->time == now && follow_->parent != kRootBlockKey) {
      auto it = records_.find(follow_->parent);
      if (it != records_.end() && it->second.candidate >= 0 &&
          Rank(it->second, now) <= follow_->rank) {
        follow_->parent = it->second.parent;  // and its parent after it, at the same bar
        return it->first;
      }
    }
    const Entry* best = nullptr;
    double best_rank = 0;
    auto consider = [&](const Entry* e) {
      const double rank = Rank(e->second, now);
      if (best == nullptr || rank < best_rank ||
          (rank == best_rank && Older(e->second, best->second))) {
        best = e;
        best_rank = rank;
      }
    };
    const size_t n = candidates_.size();
    if (options_.sample_size == 0 || n <= static_cast<size_t>(options_.sample_size)) {
      for (const Entry* e : candidates_) consider(e);
    } else {
      for (int i = 0; i < options_.sample_size; ++i) consider(candidates_[rng_.Next() % n]);
    }
    follow_ = Follow{.time = now, .parent = best->second.parent, .rank = best_rank};
    return best->first;
  }

  int64_t size() const override { return static_cast<int64_t>(candidates_.size()); }
  ReuseIndexStats stats() const {
    return {.tracked_blocks = static_cast<int64_t>(records_.size()),
            .tracked_sessions = static_cast<int64_t>(sessions_.size()),
            .history_entries = history_size_,
            .births_kept = table_.births_kept()};
  }

  std::unique_ptr<EvictionPolicy> MakeSharedShadow() override;

  // None while a retention lasts. A block its session moved on from: 0. Otherwise the life table of
  // how it was last let go (the session-return table for a block a session released, the block
  // table else), once kMinLives outcomes of its class at its age are in.
  std::optional<double> ReuseChance(const BlockKey& key, absl::Duration within,
                                    absl::Time now) const override {
    now = Mapped(now);
    auto it = records_.find(key);
    if (it == records_.end()) return std::nullopt;
    const Record& r = it->second;
    // A retained block is worth keeping below for as long as the retention lasts, whatever
    // was learned: no estimate (the cache demotes it).
    if (r.retention_priority > 0 && now < r.priority_until) return std::nullopt;
    const double w = within == absl::InfiniteDuration() ? std::numeric_limits<double>::infinity()
                                                        : internal::FastSeconds(within);
    if (r.claim.session != 0) {
      if (MovedOn(r)) return 0.0;
      if (r.claim.scaled && EstimateHelps()) {
        return scaled_table_.ChanceOfReuse(r.claim.session_cls, now - r.claim.released_at,
                                           r.claim.idle_scale, within, kMinLives);
      }
      return UnscaledTable(r).ChanceOfReuse(
          r.claim.session_cls, internal::FastSeconds(now - r.claim.released_at), w, kMinLives);
    }
    return table_.ChanceOfReuse(r.cls, internal::FastSeconds(now - r.last_access), w, kMinLives);
  }

  // `key`'s rank at `now` by what this policy has learned, and the time that orders it among
  // equal ranks (TieTime): for a shared shadow. A block it no longer remembers (not accessed
  // within `history`) ranks -1, oldest.
  std::pair<double, absl::Time> RankOf(const BlockKey& key, absl::Time now) const {
    now = Mapped(now);  // the shadow's calls carry the caller's times, as the live policy's do
    auto it = records_.find(key);
    if (it == records_.end()) return {-1.0, absl::InfinitePast()};
    return {Rank(it->second, now), TieTime(it->second)};
  }

 private:
  // A session's release of a block (ObserveRelease): what ranks the block while it waits for
  // that session's return.
  struct Claim {
    uint64_t session = 0;  // 0: none
    absl::Time released_at = absl::InfinitePast();
    absl::Duration idle_scale;  // while `scaled`
    uint8_t session_cls = 0;    // the release's stop reason
    bool scaled = false;        // the release had an idle estimate, idle_scale
  };
  struct Record;
  using Entry = std::pair<const BlockKey, Record>;
  struct Record {
    absl::Time last_access = absl::InfinitePast();
    // Its place in the access order (oldest_ ... newest_) while `linked`: Prune forgets from the
    // oldest end. One link per block, however often it is read (a hot prefix is read by every
    // request).
    Entry* older = nullptr;
    Entry* newer = nullptr;
    bool linked = false;
    uint64_t birth = 0;  // in table_, of the last access
    uint32_t accesses = 0;
    uint32_t turn = 1;  // of the latest request that named it
    uint8_t cls = kUnnamedClass;
    bool named = false;      // some ObserveRequest named it
    int64_t candidate = -1;  // position in candidates_, or -1
    BlockKey parent = kRootBlockKey;
    double retention_priority = 0;
    absl::Time priority_until = absl::InfinitePast();
    Claim claim;  // the session that last let it go
    // The claim of another session before `claim`'s (a shared prefix): when `claim`'s session
    // ends (last_turn), the block waits for this one's return again, not for nobody.
    Claim earlier;
  };
  struct Session {
    absl::Time last_request = absl::InfinitePast();
    // Its latest release, while `released`: a birth in session_table_, or with an idle estimate
    // (`scaled`) in estimated_table_ and scaled_table_.
    uint64_t release_birth = 0;
    uint64_t scaled_birth = 0;
    bool released = false;  // released since its last request
    bool scaled = false;
    uint8_t release_cls = 0;
    absl::Time released_at;
    absl::Duration idle;
    absl::Time last_seen;        // its latest request or release
    // Its place in the order of last_seen (ids; 0: none), while `linked`: one link per session,
    // however many requests it sends.
    uint64_t older = 0;
    uint64_t newer = 0;
    bool linked = false;
    absl::Time since;            // when it was first heard of (again, once forgotten)
    // Its latest last_turn release: the blocks it let go then, or before, are not waited for.
    absl::Time ended_at = absl::InfinitePast();
  };
  struct Follow {
    absl::Time time;
    BlockKey parent;
    double rank = 0;
  };

  // Outcomes of a class at an age before ReuseChance trusts its table there (the shrinkage's
  // prior is worth 20: as many of its own).
  static constexpr int64_t kMinLives = 20;

  static absl::Status NotACandidate(const BlockKey& key) {
    return absl::NotFoundError(
        absl::StrCat("reuse_index: block ", key.ToHex(), " is not a candidate"));
  }

  // The time that orders equally ranked candidates, oldest first: the last access, or with
  // ReuseIndexOptions::ties_by_release the release of a block a session let go. One key per
  // block, so the order is a strict weak one (the shared shadow sorts by it).
  absl::Time TieTime(const Record& r) const {
    return options_.ties_by_release && r.claim.session != 0 ? r.claim.released_at : r.last_access;
  }
  bool Older(const Record& a, const Record& b) const { return TieTime(a) < TieTime(b); }

  // The block's session moved on: it sent a request without the block since, or let it go on its
  // last turn and no request (of any session) read it after, or it was not heard of for
  // `history` (forgotten: a return later than that counts as none, and so does the session
  // heard of again under its id, unless a request read the block then or after).
  bool MovedOn(const Record& r) const {
    auto s = sessions_.find(r.claim.session);
    const absl::Time last = std::max(r.claim.released_at, r.last_access);
    return s == sessions_.end() || s->second.since > last ||
           s->second.last_request > r.last_access || s->second.ended_at >= last;
  }

  // The claim's session may still come back for the block: it is remembered, and has sent no
  // request and no last_turn release since the claim (a request naming the block would have
  // claimed it again when it let go).
  bool Waiting(const Claim& c) const {
    if (c.session == 0) return false;
    auto s = sessions_.find(c.session);
    return s != sessions_.end() && s->second.since <= c.released_at &&
           s->second.last_request <= c.released_at && s->second.ended_at < c.released_at;
  }

  double Rank(const Record& r, absl::Time now) const {
    // latest_now_: a priority seen ended stays ended, whatever an earlier `now` says.
    const bool boosted = r.retention_priority > 0 && std::max(now, latest_now_) < r.priority_until;
    double index = 0;
    if (r.claim.session != 0) {
      // A retention is the caller's word, moving on only what the policy infers: a retained
      // block of a session that moved on ranks as index 0 with its priority.
      if (MovedOn(r)) return boosted ? r.retention_priority : -1;
      index = r.claim.scaled && EstimateHelps()
                  ? scaled_table_.Index(r.claim.session_cls, now - r.claim.released_at,
                                        r.claim.idle_scale)
                  : UnscaledTable(r).Index(r.claim.session_cls, now - r.claim.released_at);
    } else {
      index = table_.Index(r.cls, now - r.last_access);
    }
    // Retention lifts a block above itself without it, and above every block without it whose
    // index is below the priority (eviction_policy.h); a session that moved on still goes first.
    return boosted ? index * (1 + r.retention_priority) + r.retention_priority : index;
  }

  void Access(Entry& e, absl::Time now) {
    Record& r = e.second;
    r.birth = table_.Birth(r.cls, now);
    r.last_access = now;
    Unlink(e);
    r.older = newest_;
    r.newer = nullptr;
    (newest_ != nullptr ? newest_->second.newer : oldest_) = &e;
    newest_ = &e;
    r.linked = true;
    ++history_size_;
  }
  void Unlink(Entry& e) {
    Record& r = e.second;
    if (!r.linked) return;
    (r.older != nullptr ? r.older->second.newer : oldest_) = r.newer;
    (r.newer != nullptr ? r.newer->second.older : newest_) = r.older;
    r.older = r.newer = nullptr;
    r.linked = false;
    --history_size_;
  }
  void Forget(absl::node_hash_map<BlockKey, Record>::iterator it) {
    Unlink(*it);
    records_.erase(it);
  }

  void AdvanceTables(absl::Time now) {
    table_.Advance(now);
    session_table_.Advance(now);
    estimated_table_.Advance(now);
    scaled_table_.Advance(now);
  }

  // The session's latest release has its outcome: it came back (or let go again) at `now`.
  void Returned(const Session& s, absl::Time now, bool came_back) {
    (s.scaled ? estimated_table_ : session_table_).Reuse(s.release_birth, now);
    if (!s.scaled) return;
    scaled_table_.Reuse(s.scaled_birth, now);
    if (!came_back) return;
    const double gap = std::max(1.0, internal::FastSeconds(now - s.released_at));
    const double idle = std::clamp(internal::FastSeconds(s.idle), kMinScaleSeconds,
                                   kMaxScaleSeconds);  // as the scaled table takes it
    EstimateFit& f = estimate_fit_[s.release_cls];
    const double log_gap = std::log(gap), log_ratio = std::log(gap / idle);
    ++f.n;
    f.sum_gap += log_gap;
    f.sum_gap2 += log_gap * log_gap;
    f.sum_ratio += log_ratio;
    f.sum_ratio2 += log_ratio * log_ratio;
    // Squared deviations from each stop reason's own mean, summed over the stop reasons: what
    // the stop reason alone leaves unexplained, against what the estimate does.
    int64_t n = 0;
    double ss_gap = 0, ss_ratio = 0;
    for (const EstimateFit& c : estimate_fit_) {
      if (c.n == 0) continue;
      const double k = static_cast<double>(c.n);
      n += c.n;
      ss_gap += c.sum_gap2 - c.sum_gap * c.sum_gap / k;
      ss_ratio += c.sum_ratio2 - c.sum_ratio * c.sum_ratio / k;
    }
    // The estimate is one more input: it must pay for it as BIC charges one more parameter,
    // n log(ss_ratio) + log(n) < n log(ss_gap). An estimate that is the same for every release
    // of a stop reason leaves ss_ratio = ss_gap (up to rounding) and never passes.
    const double k = static_cast<double>(n);
    estimate_helps_ = n >= kMinLives && ss_ratio < ss_gap * std::exp(-std::log(k) / k);
  }

  // Whether the callers' idle estimates tell more about when a session returns than its stop
  // reason alone: over the returns seen after releases with an estimate, log(gap / estimate)
  // deviates less from its mean per stop reason than log(gap) does, by more than BIC's price of
  // one parameter. Until kMinLives returns, no.
  bool EstimateHelps() const { return estimate_helps_; }

  // The table of returns in seconds that ranks block `r` when the scaled one does not: releases
  // with an estimate apart from those without (a caller that gives none may be saying something:
  // an agent's last turn, say), each learning and shrinking on its own.
  const ReuseLifeTable& UnscaledTable(const Record& r) const {
    return r.claim.scaled ? estimated_table_ : session_table_;
  }

  Session& Touch(uint64_t session, absl::Time now) {
    auto [it, inserted] = sessions_.try_emplace(session);
    Session& s = it->second;
    if (inserted) s.since = now;
    s.last_seen = now;
    UnlinkSession(s);
    s.older = newest_session_;
    s.newer = 0;
    if (newest_session_ != 0) {
      sessions_.find(newest_session_)->second.newer = session;
    } else {
      oldest_session_ = session;
    }
    newest_session_ = session;
    s.linked = true;
    return s;
  }
  void UnlinkSession(Session& s) {
    if (!s.linked) return;
    if (s.older != 0) {
      sessions_.find(s.older)->second.newer = s.newer;
    } else {
      oldest_session_ = s.newer;
    }
    if (s.newer != 0) {
      sessions_.find(s.newer)->second.older = s.older;
    } else {
      newest_session_ = s.older;
    }
    s.older = s.newer = 0;
    s.linked = false;
  }

  // Forgets blocks last accessed more than `history` ago that are not candidates (one that was
  // a candidate then, at the first Prune after its Remove), and sessions last heard of that long
  // ago (a return later than that counts as none).
  void Prune(absl::Time now) {
    forgotten_before_ = std::max(forgotten_before_, now - options_.history);
    for (const BlockKey& key : lapsed_) {
      auto it = records_.find(key);
      if (it != records_.end() && it->second.candidate < 0 &&
          it->second.last_access < forgotten_before_) {
        Forget(it);
      }
    }
    lapsed_.clear();
    while (oldest_session_ != 0) {
      auto it = sessions_.find(oldest_session_);
      if (it->second.last_seen >= now - options_.history) break;
      UnlinkSession(it->second);
      sessions_.erase(it);
    }
    while (oldest_ != nullptr && oldest_->second.last_access < now - options_.history) {
      Entry& e = *oldest_;
      Unlink(e);
      if (e.second.candidate < 0) {
        const BlockKey key = e.first;
        records_.erase(key);
      }
    }
  }

  ReuseIndexOptions options_;
  internal::SplitMix64 rng_;
  ReuseLifeTable table_;
  ReuseLifeTable session_table_;    // releases without an idle estimate
  ReuseLifeTable estimated_table_;  // releases with one, in seconds
  internal::ScaledLifeTable scaled_table_;
  // Per stop reason, over returns after releases with an estimate: sums of log(gap) and of
  // log(gap / estimate) and of their squares.
  struct EstimateFit {
    int64_t n = 0;
    double sum_gap = 0, sum_gap2 = 0, sum_ratio = 0, sum_ratio2 = 0;
  };
  EstimateFit estimate_fit_[kNumStopReasons];
  bool estimate_helps_ = false;
  absl::flat_hash_map<uint64_t, Session> sessions_;
  // Sessions by last_seen, oldest first (Session::older / newer).
  uint64_t oldest_session_ = 0;
  uint64_t newest_session_ = 0;
  // Node map: candidates_ points at its elements, which stay put until erased.
  absl::node_hash_map<BlockKey, Record> records_;
  std::vector<Entry*> candidates_;
  absl::Time latest_now_ = absl::InfinitePast();  // the latest Victim's time
  // The latest finite time of any call: what an infinite `now` is taken as (InfinitePast before
  // any finite one: a block or session seen only then is the first to be forgotten).
  absl::Time latest_finite_ = absl::InfinitePast();
  absl::Time Clock(absl::Time now) {
    if (now == absl::InfinitePast() || now == absl::InfiniteFuture()) return latest_finite_;
    latest_finite_ = std::max(latest_finite_, now);
    return now;
  }
  // The same for a call that changes nothing.
  absl::Time Mapped(absl::Time now) const {
    return now == absl::InfinitePast() || now == absl::InfiniteFuture() ? latest_finite_ : now;
  }
  // Blocks by last access, oldest first (Record::older / newer), and how many.
  Entry* oldest_ = nullptr;
  Entry* newest_ = nullptr;
  int64_t history_size_ = 0;
  // Prune's cutoff: a block last accessed before it is forgotten once it is not a candidate.
  absl::Time forgotten_before_ = absl::InfinitePast();
  // Candidates Removed after their history entry passed (Prune forgets them next time).
  std::vector<BlockKey> lapsed_;
  std::optional<Follow> follow_;
};

// A ranking of its own candidates by a live ReuseIndexPolicy's model (MakeSharedShadow).
class ReuseIndexShadow final : public EvictionPolicy {
 public:
  ReuseIndexShadow(const ReuseIndexPolicy* model, int sample_size, uint64_t seed)
      : model_(model), sample_size_(sample_size), rng_(seed) {}

  std::string_view name() const override { return "reuse_index"; }
  bool reads_run_blocks() const override { return false; }

  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    (void)now;
    if (absl::Status s = internal::CheckTraits(traits); !s.ok()) return s;
    auto [it, inserted] = position_.try_emplace(key, static_cast<int64_t>(keys_.size()));
    if (!inserted) {
      return absl::AlreadyExistsError(
          absl::StrCat("reuse_index shadow: block ", key.ToHex(), " is a candidate already"));
    }
    keys_.push_back(key);
    return absl::OkStatus();
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    (void)now;
    if (absl::Status s = internal::CheckTraits(traits); !s.ok()) return s;
    if (!position_.contains(key)) return NotACandidate(key);
    return absl::OkStatus();  // the model learns accesses from the live policy's calls
  }
  absl::Status Remove(const BlockKey& key) override {
    auto it = position_.find(key);
    if (it == position_.end()) return NotACandidate(key);
    const int64_t pos = it->second;
    position_.erase(it);
    if (pos != static_cast<int64_t>(keys_.size()) - 1) {
      keys_[static_cast<size_t>(pos)] = keys_.back();
      position_[keys_[static_cast<size_t>(pos)]] = pos;
    }
    keys_.pop_back();
    return absl::OkStatus();
  }
  // One sample serves up to kBatch victims at the same `now` (a request's evictions come
  // together): the lowest of the sample in order, each still a candidate. The live ranking gets
  // the same effect from its parent-follows rule; here it keeps the shadow's cost to a share of
  // the live one's (docs/performance.md).
  std::optional<BlockKey> Victim(absl::Time now) override {
    if (keys_.empty()) return std::nullopt;
    if (queue_time_ == now) {
      while (!queue_.empty()) {
        const BlockKey key = queue_.back();
        queue_.pop_back();
        if (position_.contains(key)) return key;
      }
    }
    ranked_.clear();
    auto consider = [&](const BlockKey& key) {
      const auto [rank, access] = model_->RankOf(key, now);
      ranked_.push_back(Ranked{rank, access, key});
    };
    const size_t n = keys_.size();
    if (sample_size_ == 0 || n <= static_cast<size_t>(sample_size_)) {
      for (const BlockKey& key : keys_) consider(key);
    } else {
      for (int i = 0; i < sample_size_; ++i) consider(keys_[rng_.Next() % n]);
    }
    const size_t take = std::min(ranked_.size(), kBatch);
    std::partial_sort(ranked_.begin(), ranked_.begin() + static_cast<std::ptrdiff_t>(take),
                      ranked_.end(), [](const Ranked& a, const Ranked& b) {
                        return a.rank < b.rank || (a.rank == b.rank && a.access < b.access);
                      });
    queue_.clear();
    for (size_t i = take; i > 1; --i) queue_.push_back(ranked_[i - 1].key);
    queue_time_ = now;
    return ranked_[0].key;
  }
  int64_t size() const override { return static_cast<int64_t>(keys_.size()); }

 private:
  static absl::Status NotACandidate(const BlockKey& key) {
    return absl::NotFoundError(
        absl::StrCat("reuse_index shadow: block ", key.ToHex(), " is not a candidate"));
  }

  static constexpr size_t kBatch = 16;
  struct Ranked {
    double rank;
    absl::Time access;
    BlockKey key;
  };

  const ReuseIndexPolicy* model_;
  int sample_size_;
  internal::SplitMix64 rng_;
  std::vector<BlockKey> keys_;
  absl::flat_hash_map<BlockKey, int64_t> position_;
  std::vector<Ranked> ranked_;   // scratch
  std::vector<BlockKey> queue_;  // the sample's next lowest, lowest last, valid at queue_time_
  absl::Time queue_time_ = absl::InfinitePast();
};

std::unique_ptr<EvictionPolicy> ReuseIndexPolicy::MakeSharedShadow() {
  // Its own sampling stream, so the live ranking's victims do not depend on the shadow's calls.
  return std::make_unique<ReuseIndexShadow>(this, options_.sample_size,
                                            internal::SplitMix64Mix(options_.seed));
}

}  // namespace

ReuseIndexStats ReuseIndexStatsOf(const EvictionPolicy& policy) {
  const auto* r = dynamic_cast<const ReuseIndexPolicy*>(&policy);
  return r == nullptr ? ReuseIndexStats{} : r->stats();
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeReuseIndexPolicy(
    const ReuseIndexOptions& options) {
  if (options.sample_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reuse_index: sample_size = ", options.sample_size, " must be >= 0"));
  }
  if (options.history <= absl::ZeroDuration() || options.history == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reuse_index: history = ", absl::FormatDuration(options.history),
                     " must be positive and finite"));
  }
  absl::StatusOr<ReuseLifeTable> table = ReuseLifeTable::Create(ClassGroups(), options.table);
  if (!table.ok()) return table.status();
  absl::StatusOr<ReuseLifeTable> sessions = ReuseLifeTable::Create(
      std::vector<int>(kNumStopReasons, 0), SessionTableDefaults(options.session_table));
  if (!sessions.ok()) return sessions.status();
  absl::StatusOr<ReuseLifeTable> estimated = ReuseLifeTable::Create(
      std::vector<int>(kNumStopReasons, 0), SessionTableDefaults(options.session_table));
  if (!estimated.ok()) return estimated.status();
  // A session is forgotten `history` after it was last heard of, and its return with it: a
  // scaled birth older than that can have no outcome any more.
  absl::StatusOr<internal::ScaledLifeTable> scaled = internal::ScaledLifeTable::Create(
      kNumStopReasons, {.min_scale = absl::Seconds(kMinScaleSeconds),
                        .max_scale = absl::Seconds(kMaxScaleSeconds),
                        .max_age = options.history});
  if (!scaled.ok()) return scaled.status();
  return std::make_unique<ReuseIndexPolicy>(options, *std::move(table), *std::move(sessions),
                                            *std::move(estimated), *std::move(scaled));
}

}  // namespace kvtier
