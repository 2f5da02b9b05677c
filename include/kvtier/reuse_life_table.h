// An online, censored life table of reuse ages per class of block, and the Gittins-style reuse
// index the reuse_index eviction policy ranks by (eviction_policy.h). Source: the recipe of
// ../shared/policy/README.md ("The learned reuse index"), itself the actuarial life table with
// censoring, LHD's hit density (Beckmann et al., NSDI 2018) generalised to several horizons as in
// a Gittins index.
//
// The model. Each access of a block is a birth (time, class); its outcome is the time until the
// block is accessed again (unknown, censored, while it has not been). Ages are cut into buckets
// [edge[k], edge[k+1]). Births enter bucket k's counts once the bucket has ended for them (the
// birth is at least edge[k+1] old), so only outcomes already observed are used:
//   at_risk[c][k] += 1  if the outcome >= edge[k]    (it lived into the bucket)
//   events[c][k]  += 1  if also the outcome < edge[k+1]  (and was reused in it)
// Every `refresh` (on a grid from the first Advance) the tables are rebuilt:
//   pooled hazard  p[k]    = sum_c events / sum_c at_risk                   (0 if no at-risk)
//   group hazard   g[q][k] = (events_q + prior x p[k]) / (at_risk_q + prior)   (q = group of c)
//   class hazard   h[c][k] = (events_c + prior x g[q][k]) / (at_risk_c + prior)
//   survival at the edges   S(edge[0]) = 1, S(edge[k+1]) = S(edge[k]) x (1 - h[c][k]);
//   S is linear between edges and flat after the last; I(a) = integral from 0 to a of S.
//   index(a) = max over horizons H of (S(a) - S(a+H)) / (I(a+H) - I(a))  (0 where I does not grow)
// the expected reuses per block-second from keeping the block H seconds longer, at its best H.
// A bucket no birth has lived through yet has hazard 0. The index is tabulated on a `grid` of
// ages up to the last edge; older ages read the last entry. With no data every index is 0.
//
// Memory: births are kept until every bucket has counted them (the last edge after their time),
// so about (births per second) x (last edge) entries of 24 bytes; counts are per class x bucket.
//
// Thread-safety: not thread-safe; the caller serializes. Times are the caller's clock.
#ifndef KVTIER_REUSE_LIFE_TABLE_H_
#define KVTIER_REUSE_LIFE_TABLE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier {

struct ReuseLifeTableOptions {
  // Bucket edges in seconds: strictly increasing, the first 0, at least two. Default: 10 s wide
  // to 120 s, 30 s to 600 s, 120 s to 1800 s, then 1800-2400 and 2400-3600 (the recipe's).
  std::vector<double> edges_seconds;
  // Horizons H in seconds, each > 0, at least one. Default 15, 30, 60, ..., 1920.
  std::vector<double> horizons_seconds;
  double prior = 20;                           // pseudo-count of the shrinkage, >= 0
  absl::Duration refresh = absl::Seconds(60);  // table rebuild period, > 0
  double grid_seconds = 5;  // index table resolution, > 0; must divide every horizon
};

// The recipe's defaults (edges, horizons) filled in where `options` leaves them empty.
ReuseLifeTableOptions WithReuseLifeTableDefaults(ReuseLifeTableOptions options);

class ReuseLifeTable {
 public:
  // `group_of_class[c]` is class c's group (the parent its hazard shrinks towards), in
  // [0, number of groups); classes are [0, group_of_class.size()).
  // Errors: kInvalidArgument for no classes, a group < 0 or >= 65536, or options out of range
  // (named), which includes tables too large to build: more than 2^24 index rows (last edge /
  // grid_seconds), more than 2^26 index cells (classes x rows), or a horizon of more than 2^24
  // grid steps.
  static absl::StatusOr<ReuseLifeTable> Create(std::vector<int> group_of_class,
                                               ReuseLifeTableOptions options = {});

  // An access of a block of class `cls` (in range: checked by the caller; out of range is
  // clamped: below 0 to class 0, above to the last class) at `now`; returns the birth's id, for Reuse. Times passed to Birth,
  // Reuse and Advance must not go backwards (a smaller time is taken as the latest seen).
  uint64_t Birth(int cls, absl::Time now);
  // The block born as `birth` was accessed again at `now`: its outcome is now - its time. Only
  // the first Reuse of a birth counts; a birth no longer kept (all buckets counted it) is ignored.
  void Reuse(uint64_t birth, absl::Time now);
  // Counts the births whose buckets have ended by the latest refresh point <= `now`, and rebuilds
  // the tables if a refresh point has passed since the last rebuild. Returns whether it rebuilt.
  bool Advance(absl::Time now);

  // The index of a block of class `cls` at `age` (>= 0) from the last rebuild.
  double Index(int cls, absl::Duration age) const;
  // The survival S(age) of class `cls` from the last rebuild (1 at age 0).
  double Survival(int cls, double age_seconds) const;
  // The chance that a block of class `cls` not reused by `age_seconds` is reused within the next
  // `within_seconds` (infinity: ever, as far as the last edge reaches): (S(a) - S(a + w)) / S(a).
  // nullopt when the class has fewer than `min_lives` lives at risk in the bucket of `age` (as of
  // the last Advance): too few to tell "never comes back" from "not seen yet" (S is 1 with no
  // data), or when S(a) is 0.
  std::optional<double> ChanceOfReuse(int cls, double age_seconds, double within_seconds,
                                      int64_t min_lives) const;
  // Counts as of the last Advance (for tests and stats); 0 for a class or bucket out of range.
  int64_t at_risk(int cls, int bucket) const {
    return InRange(cls, bucket) ? at_risk_[Cell(cls, bucket)] : 0;
  }
  int64_t events(int cls, int bucket) const {
    return InRange(cls, bucket) ? events_[Cell(cls, bucket)] : 0;
  }
  int num_classes() const { return static_cast<int>(group_.size()); }
  int num_buckets() const { return static_cast<int>(edges_.size()) - 1; }
  int64_t births_kept() const { return static_cast<int64_t>(log_.size() - head_); }
  int64_t rebuilds() const { return rebuilds_; }

 private:
  // 12 bytes: floats hold seconds since origin_ to about a millisecond over a day, well inside
  // the narrowest bucket.
  struct Life {
    float time = 0;     // of the birth, seconds since origin_
    float outcome = 0;  // seconds to the next access; +inf while unknown
    uint32_t cls = 0;
  };
  ReuseLifeTable() = default;
  bool InRange(int cls, int bucket) const {
    return cls >= 0 && cls < num_classes() && bucket >= 0 && bucket < num_buckets();
  }
  size_t Cell(int cls, int bucket) const {
    return static_cast<size_t>(cls) * static_cast<size_t>(num_buckets()) +
           static_cast<size_t>(bucket);
  }
  double Seconds(absl::Time t);  // since origin_, never decreasing
  void Count(double cut);        // births with time <= cut - edge[k+1] enter bucket k
  void Rebuild();

  std::vector<int> group_;
  int num_groups_ = 0;
  std::vector<double> edges_;
  std::vector<int> horizon_steps_;  // horizons / grid
  double prior_ = 0;
  double refresh_ = 0;
  double grid_ = 0;
  int rows_ = 0;  // index entries per class: ages 0, grid, ..., last edge

  bool started_ = false;
  absl::Time origin_;
  double latest_ = 0;
  double next_refresh_ = 0;
  // Births not yet counted by every bucket: log_[head_, end), the first with id log_base_. A
  // vector with a moving head (compacted when half is dead): scanned once per bucket per
  // refresh, so it is kept contiguous.
  std::vector<Life> log_;
  size_t head_ = 0;
  uint64_t log_base_ = 0;
  std::vector<uint64_t> counted_;  // per bucket: births [base, counted_) are counted there
  std::vector<int64_t> at_risk_, events_;
  std::vector<double> index_;     // class x rows_
  std::vector<double> survival_;  // class x (buckets + 1): S at the edges
  int64_t rebuilds_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_REUSE_LIFE_TABLE_H_
