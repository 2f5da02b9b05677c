// Which released block of a tier to evict next. A policy ranks candidates only: the caller
// (KvCache, the policy simulator) decides what a candidate is, by the rule of
// eviction_candidacy.h. DESIGN.md section 7: only released blocks (no running request holds
// them) and only leaves (no cached child in the same tier, since a child without its parent can
// never be hit) are candidates; the caller Adds a block when it becomes one and Removes it when
// it stops being one (pinned again, a child cached, evicted).
//
// Three policies behind one interface:
//   lru         the block touched longest ago (what vLLM, SGLang and LMCache ship); a retention
//               priority p counts, while it lasts, as a touch p x 30 minutes later.
//   cost_aware  the block of lowest hit density per byte, after LHD (Beckmann, Chen and Cidon,
//               "LHD: Improving Cache Hit Rate by Maximizing Hit Density", NSDI 2018), with the
//               reuse ages learned online per class of block:
//     - A candidate's age is the time since its last use (Add's or Touch's `now`). Its class is
//       its uses so far (1, or 2 and more: expected_reuse) x its run_blocks (1, 2-3, 4-7, 8-15,
//       16-31, 32+): in a conversation trace, how much the turn that wrote it added.
//     - Each candidate's life ends in a hit (a Remove that does not follow Victim for it, or a
//       Touch at a later time: the block was used again; the age is taken at the latest time
//       any call gave) or an eviction (the Remove of the block Victim returned, or a Discard:
//       dropped unused on the caller's word, which leaves no ghost). An evicted
//       block is remembered as a ghost for ghost_horizon: if it becomes a candidate again, or
//       its parent (BlockTraits::parent), left a leaf by its eviction, is used again, the
//       eviction becomes a hit at that age, so the estimate is not limited to the ages the
//       policy itself lets blocks reach. Per class, the ages are kept as histograms aged by an
//       EWMA (half_life) and, every reconfigure_outcomes lives, turned into a Kaplan-Meier
//       survival S(x) = P(not reused by age x) (lives enter at the age they became candidates
//       and end in a reuse or censored), each class's hazard shrunk towards the pooled one.
//     - hit density at age a = P(reused after a | not by a) / E[age at reuse - a | reused after
//       a] = (S(a) - S(end))^2 / (S(a) x integral from a to end of (S - S(end))): LHD's hits
//       per unit of cache lifetime, with the lifetime charged up to the reuse.
//     - rank = hit density / bytes x (1 + retention_priority while it lasts). Victim ranks
//       sample_size candidates drawn at random (all of them when fewer), as LHD does, and
//       returns the lowest; equal ranks (a cold start, before any outcome) go least recently
//       used. recompute_seconds is not weighed (KvCache and the policy simulator pass 0): tried
//       in the policy simulator on the Mooncake trace, it favoured deep blocks and cost hit ratio
//       at every capacity.
//
//   reuse_index the leaf of lowest learned reuse index (kvtier/reuse_life_table.h), after the
//               recipe of ../shared/policy/README.md. It learns from every request, not only from
//               candidates: the caller hands it each request's blocks (ObserveRequest), and each
//               block's access is a birth in an online censored life table per class, its outcome
//               the time to the block's next access. A block's class at an access: the root (the
//               first block of its chain); otherwise turn {1, 2, 3, 4-5, >=6} x its prior
//               accesses {0, 1-2, >=3} x new blocks the request added {<=4, >4}. Turn: with h the
//               request's leading blocks some earlier request had, 1 if h <= 1, else the turn of
//               the latest request holding block h-1, plus 1. A block a request never named (a
//               decode block, say) is of its own class from its Add, and learns from Touch as
//               an access (for a named block a Touch is not one). Its rank is the index of its
//               class at its age (time since its last access); while a retention priority p
//               lasts, index x (1 + p) + p: above every block without one whose index is
//               below p, and above itself without it (a block of a session that moved on, below,
//               ranks -1, or p while a priority p lasts: a retention outranks what the policy
//               infers). Victim ranks sample_size random
//               candidates (all when fewer, or when 0) and returns the lowest, the oldest on
//               ties; with no data yet it is oldest-first. Parent follows: when the victim's parent
//               becomes a candidate (the caller Added it after Removing the victim) and ranks no
//               higher than the victim did, the next Victim at the same time returns it, so a dead
//               chain goes in one pass. bytes is not weighed (a tier's blocks are all one size).
//               Sessions (ObserveRelease): a block a session let go is ranked by when the session
//               comes back instead: -1 (first to go) once the session has sent a request that did
//               not name it (it moved on: a compaction, a rewrite), was not heard of for
//               `history` (forgotten), or let it go with last_turn
//               and no request read it since (no request follows; ReuseChance 0, and no birth
//               in the tables below, so the stop reasons' return times are learned from
//               sessions that go on; a block another session let go before keeps that one's
//               rank, or gets it back when the last session to let it go ends, if that one has
//               neither ended nor moved on since: a shared prefix); otherwise the index of the
//               release's class at the time since the release, from a life table whose births are
//               releases and whose outcome is the time to the session's next request. Class: the
//               stop reason; releases without an expected idle time learn apart from those with one
//               (giving none may itself say something: an agent's last turn). A release with an
//               expected idle time E is also a birth in a table whose ages are in units of E
//               (src/policy/scaled_life_table.h): an exact E puts every return at age E, and the
//               index there is about 1 / (time left to E), the order of the true next use; a rough
//               one spreads. Which of the two ranks estimated releases is learned: the scaled one
//               once 20 returns show the estimates explain the return times better than the stop
//               reasons do (log(gap / E) spreads less about its mean per stop reason than log(gap),
//               by more than BIC's price of one parameter), the one in seconds before that or when
//               they do not, so a worthless or constant estimate costs nothing. Births with no
//               return after `history` are withdrawn. Source: the hint-g policy of
//               ../shared/policy/policy_lab_agentic.py; the scaled table is kvtier's.
//
// Times are absl::Time (the caller's clock, so a replay can run on trace time). They must not go
// backwards from call to call: an earlier `now` than one seen is not an error, but may be ranked
// as if at the latest (a retention priority seen ended stays ended). An infinite `now` is not an
// error either: reuse_index takes it as the latest finite time it has seen (before any, as
// InfinitePast: what it touched then is the first to be forgotten). Thread-safety:
// not thread-safe; the caller serializes (KvCache holds its lock). Keys must be unique. A policy
// owns only copies of the keys and traits it is given.
#ifndef KVTIER_EVICTION_POLICY_H_
#define KVTIER_EVICTION_POLICY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/block_key.h"
#include "kvtier/reuse_life_table.h"
#include "kvtier/session_hints.h"

namespace kvtier {

// What a policy may weigh about a candidate. LRU reads only the retention priority; cost_aware
// reads expected_reuse, bytes, the priority, parent and run_blocks.
struct BlockTraits {
  double expected_reuse = 1.0;    // expected future hits, > 0
  double recompute_seconds = 0;   // prefill time its presence saves (cost_model.h), >= 0;
                                  // no policy reads it (CandidateTraits gives 0)
  int64_t bytes = 1;              // its size in this tier, > 0
  double retention_priority = 0;  // >= 0: value x (1 + priority) ...
  absl::Time priority_until = absl::InfinitePast();  // ... until then
  BlockKey parent = kRootBlockKey;  // the block before it in its sequence (kRootBlockKey: none)
  // Blocks in the run ending at this one whose use counts equal its own (it and its parents), in
  // [1, 32] (32 = kMaxRunBlocks, eviction_candidacy.h): about how many blocks the request that
  // wrote it added. Checked by every policy, read or not.
  int run_blocks = 1;
};

// One request, as the policy learns from it.
struct RequestObservation {
  // The prompt's full blocks, root first: blocks[i] is the parent of blocks[i+1].
  absl::Span<const BlockKey> blocks;
  absl::Time now;
  uint64_t session = 0;  // the agent session it belongs to; 0: none
  // The session's paused sequence resumed (KvCache::Resume after a tool wait): the session is
  // back, with `blocks` empty. Its sequence reads the blocks it holds, which no request names
  // here: none is accessed, and none counts as one the session moved on from. Otherwise an
  // empty `blocks` is a request naming no full block.
  bool resumed = false;
};

// A request of a session that let its blocks go (KvCache::Release, or Pause: a tool wait, stop
// reason kToolUse; a swap preemption, kUnknown and `preempted`).
struct ReleaseObservation {
  absl::Span<const BlockKey> blocks;  // its written full blocks, root first
  absl::Time now;
  uint64_t session = 0;  // 0: none (then nothing is learned)
  StopReason stop_reason = StopReason::kUnknown;
  // The caller's estimate of the time to the session's next request, if it gave one (>= 0).
  std::optional<absl::Duration> expected_idle;
  // A later request of the session started before this one let go (an agent's resumed turn
  // released once its successor attached): no return of its own to wait for.
  bool superseded = false;
  // The caller says the session sends no further request (ReleaseHints::last_turn); not taken
  // with `superseded` or `preempted`.
  bool last_turn = false;
  // The scheduler preempted the request (ReleaseHints::preempted; or swapped it out,
  // PauseHints::preempted, when it comes back by Resume): it comes back as a
  // readmission, which no ObserveRequest announces. Not the session letting go: reuse_index
  // learns nothing of the session's return from it (as for `superseded`: no return of its own),
  // and its blocks wait for the session's return. last_turn is not taken with it.
  bool preempted = false;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  // Whether Add and Touch read BlockTraits::run_blocks. A caller may leave it at its default
  // (1) for a policy that does not: computing it walks up to 31 parents (lru: false).
  virtual bool reads_run_blocks() const { return true; }

  // Whether the policy learns from ObserveRequest and ObserveRelease (reuse_index: true). A
  // caller may skip the calls (and building their arguments) for a policy that does not.
  virtual bool observes_requests() const { return false; }
  // A request named request.blocks: each is accessed, cached or not. Called once per request
  // (and, with `resumed` and no blocks, once per Resume of a tool wait),
  // before its blocks are Added or Touched at request.now. Default: ignored.
  virtual void ObserveRequest(const RequestObservation& request) { (void)request; }
  // A session's request finished (or paused) and let its blocks go, with what is known of when
  // the session comes back. Called before the released blocks are Added. Default: ignored.
  virtual void ObserveRelease(const ReleaseObservation& release) { (void)release; }

  // `key` became a candidate, last touched (used) at `now`. kAlreadyExists if it is one;
  // kInvalidArgument for traits out of range.
  virtual absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) = 0;
  // `key` was used at `now` (a hit); its traits may have changed. kNotFound if not a candidate;
  // kInvalidArgument for traits out of range.
  virtual absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) = 0;
  // `key` stopped being a candidate. kNotFound if it was not one.
  virtual absl::Status Remove(const BlockKey& key) = 0;
  // `key` stopped being a candidate because the caller dropped it unused, on word that it will
  // not be read again (KvCache::InvalidatePrefix, InvalidateSession): neither a reuse nor an
  // eviction the policy chose. kNotFound if it was not one. Default: Remove (lru and reuse_index
  // learn nothing from a Remove). cost_aware, which counts a Remove not after Victim as a reuse,
  // ends the candidate's life unreused at its age instead, as an eviction without a ghost.
  virtual absl::Status Discard(const BlockKey& key) { return Remove(key); }
  // `key` stopped being a candidate because it was evicted at `now`, by another policy's choice
  // (follow_best tells its candidates that did not lead what the leader's Victim evicted: the
  // victim's Remove when no Add, Touch or ObserveRequest came between).
  // kNotFound if it was not one. Default: Remove. cost_aware ends the life as an eviction at its
  // age, with its ghost, as if its own Victim had chosen the block (a plain Remove would count
  // as a reuse).
  virtual absl::Status Evicted(const BlockKey& key, absl::Time now) {
    (void)now;
    return Remove(key);
  }
  // The candidate to evict at `now` (it stays a candidate until Removed), or nullopt if none.
  // The caller is expected to Remove it before the next Victim call (cost_aware counts that
  // Remove as an eviction, any other as a reuse). cost_aware samples: two calls may differ.
  virtual std::optional<BlockKey> Victim(absl::Time now) = 0;
  virtual int64_t size() const = 0;

  // A second ranking over a candidate set of its own that reads what this policy learned instead
  // of learning again: follow_best's shadow cache of this policy (miniature simulation) costs
  // only its sampled share. It ranks by this policy's model as it stands at each call; its own
  // ObserveRequest / ObserveRelease do nothing (this policy's calls teach both), and it weighs no
  // traits (a shadow passes none). It must not outlive this policy. Null (the default): the
  // policy has nothing to share (lru, cost_aware); the caller makes a second instance.
  virtual std::unique_ptr<EvictionPolicy> MakeSharedShadow() { return nullptr; }

  // The chance, as this policy has learned it, that candidate `key` is used again within
  // `within` of `now` (InfiniteDuration: ever), in [0, 1]; nullopt where the policy has no
  // estimate it trusts (lru and cost_aware never do; reuse_index not before enough outcomes of
  // the block's class at its age, nor while a retention priority lasts; follow_best asks the
  // candidate it follows). KvCache asks it of a victim before demoting it: a copy not worth
  // restoring later is dropped (kv_cache.h).
  virtual std::optional<double> ReuseChance(const BlockKey& key, absl::Duration within,
                                            absl::Time now) const {
    (void)key;
    (void)within;
    (void)now;
    return std::nullopt;
  }
};

std::unique_ptr<EvictionPolicy> MakeLruPolicy();

struct CostAwareOptions {
  // Trace time over which the reuse-age histograms' old outcomes lose half their weight, > 0.
  absl::Duration half_life = absl::Minutes(30);
  int sample_size = 32;            // candidates ranked per Victim call, >= 1
  uint64_t seed = 1;               // of the sampling RNG (splitmix64): runs repeat exactly
  int reconfigure_outcomes = 512;  // lives ended between recomputations of the densities, >= 1
  // How long after its last use an evicted block is remembered (a reuse later than this counts
  // as none), >= 0 and finite, and how many such ghosts at most (about 100 bytes each), >= 0.
  absl::Duration ghost_horizon = absl::Minutes(4);
  int64_t max_ghosts = int64_t{1} << 16;
};
// Errors: kInvalidArgument for a half-life that is not positive and finite, or another option
// out of the range given above (the message names it).
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeCostAwarePolicy(
    const CostAwareOptions& options = {});

struct ReuseIndexOptions {
  int sample_size = 64;  // candidates ranked per Victim call, >= 0; 0: all of them
  uint64_t seed = 1;     // of the sampling RNG (splitmix64): runs repeat exactly
  // How long a block's access history (class, turn, accesses) is kept after its last access while
  // it is not a candidate (a candidate's, until the first prune after its Remove; prunes run
  // at ObserveRequest and ObserveRelease), > 0: bounds the memory to the
  // candidates and the blocks accessed that recently (about 170 bytes each). A request whose
  // predecessor is older than this counts as a first turn. A session not heard of (no request,
  // no release) for this long is forgotten, and the blocks it let go count as moved on from.
  absl::Duration history = absl::Hours(2);
  ReuseLifeTableOptions table;  // empty edges / horizons: the recipe's
  // The session-return tables in seconds (with and without an idle estimate). Empty edges /
  // horizons: the agent recipe's (edges 0, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 300,
  // 450, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200, 10800, 14400 s; horizons 5, 10, 20, ...,
  // 5120 s). The scaled table's options are fixed (src/policy/scaled_life_table.h).
  ReuseLifeTableOptions session_table;
  // Which of two equally ranked candidates goes first: the one accessed longest ago (false), or,
  // when both are blocks a session let go, the one released longest ago (true: the order of
  // hint-g in ../shared/policy/policy_lab_agentic.py, kept to check this policy against that
  // script; in the script's own model the default closed more of the gap at most capacities,
  // docs/performance.md "The policy against the reference scripts").
  bool ties_by_release = false;
};
// Errors: kInvalidArgument for an option out of range (named), or those of ReuseLifeTable::Create.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeReuseIndexPolicy(
    const ReuseIndexOptions& options = {});
// What a reuse_index policy holds, for stats and tests (all zero for another policy, a
// follow_best one included). Its memory is about 170 bytes per tracked block, 100 per session
// and 12 per kept birth: every access is a birth in the life table,
// kept until the table's last edge has passed it (an hour with the recipe's edges), so the
// table's share grows with the accesses per hour, not with the blocks.
struct ReuseIndexStats {
  int64_t tracked_blocks = 0;    // access histories kept (candidates and recent accesses)
  int64_t tracked_sessions = 0;  // sessions heard of within `history`
  // Blocks in the order that forgets them `history` after their last access: one entry per
  // tracked block at most (a candidate leaves it once that time has passed), however often it
  // is read.
  int64_t history_entries = 0;
  int64_t births_kept = 0;  // in the per-block life table
};
ReuseIndexStats ReuseIndexStatsOf(const EvictionPolicy& policy);

// Follows the best of several candidate policies, after miniature simulations (Waldspurger et
// al., "Cache Modeling and Optimization using Miniature Simulations", USENIX ATC 2017) with
// spatially hashed sampling (SHARDS, Waldspurger et al., FAST 2015): every candidate ranks the
// live candidates (each gets every call), and each also runs a shadow cache of
// capacity_blocks x sample_rate blocks over the blocks whose key hash falls in the sample
// (the same blocks for every shadow), fed each request's sampled blocks: a block is a hit if its
// shadow holds it; then the request's sampled blocks are inserted and the shadow's own instance
// of the candidate evicts down to its capacity (each sampled block a leaf of its own). Victim
// asks the leader: the candidate whose shadow has the most hits, decayed by half every
// `half_life_accesses` sampled accesses, once it leads the current one by more than
// `hysteresis` (relative) plus one hit, and by more than `confidence` standard deviations of the
// difference of two Poisson counts, confidence x sqrt(hits + hits): a small shadow's counts are
// noisy, and a switch on noise costs the hits the live tier's contents were kept for. The first
// candidate leads at the start. Shadows see
// ObserveRequest and ObserveRelease whole, so a learning candidate learns as the live one does;
// a candidate that shares its model (EvictionPolicy::MakeSharedShadow: reuse_index) has a shadow
// that reads the live one's model and learns nothing twice. Cost: each candidate's live calls,
// plus its shadow's on the sampled share (measured in docs/performance.md).
struct FollowBestOptions {
  // The capacity the shadows model, > 0: the tier it ranks, or, below other tiers, the stack down
  // to it (KvCache gives a lower tier the sum of the capacities: its evictions decide what the
  // stack keeps).
  int64_t capacity_blocks = 0;
  // Share of block keys sampled, in (0, 1]; 0: automatic, 512 / capacity_blocks clamped to
  // [0.01, 0.125]: a shadow of about 512 blocks where capacity_blocks is large enough, and never
  // more than an eighth of the accesses, so the shadows cost a few percent of the replay's time
  // (docs/performance.md, "Eviction that learns"; FollowBestStatsOf measures it).
  double sample_rate = 0;
  int64_t half_life_accesses = 8192;  // > 0
  double hysteresis = 0.02;           // >= 0
  double confidence = 3;              // >= 0
};
// A factory of one candidate: called once for the live ranking and, unless that ranking has a
// shared shadow (MakeSharedShadow), once more for its shadow.
using EvictionPolicyFactory = std::function<absl::StatusOr<std::unique_ptr<EvictionPolicy>>()>;
// name() is "follow_best"; following() names the leader. Errors: kInvalidArgument for no
// candidates, an empty factory or one that makes a null policy, or an option out of range; a
// factory's error.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeFollowBestPolicy(
    std::vector<EvictionPolicyFactory> candidates, const FollowBestOptions& options);
// The leader of a policy MakeFollowBestPolicy made ("" for any other policy): for tests and stats.
std::string_view FollowedPolicy(const EvictionPolicy& policy);

// What a follow_best policy's miniature simulations cost and decided (all zero for another
// policy). The cost is the wall time (steady clock) spent in the shadow caches: their requests,
// evictions and, for shadows that learn on their own, their observations; the live candidates'
// bookkeeping beside the leader is not in it.
struct FollowBestStats {
  double shadow_seconds = 0;
  int64_t sampled_accesses = 0;  // block accesses the shadows simulated
  int64_t leader_changes = 0;
};
FollowBestStats FollowBestStatsOf(const EvictionPolicy& policy);

// "learned": follow_best over reuse_index (leading at the start: with no data it is oldest-first,
// as lru is) and lru (reuse_index's options as given), so the tier is not run by a learned
// ranking that its shadow shows losing to LRU. capacity_blocks: FollowBestOptions'.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeLearnedPolicy(
    int64_t capacity_blocks, const ReuseIndexOptions& reuse_index = {});

// "lru", "cost_aware" or "reuse_index" with default options. Errors: kInvalidArgument naming the
// choices.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name);

}  // namespace kvtier

#endif  // KVTIER_EVICTION_POLICY_H_
