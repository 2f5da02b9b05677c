// A life table whose ages are measured in units of each birth's own scale: the caller's estimate
// of when the outcome comes (an agent's expected idle time before its session's next request).
// It learns online how returns fall around estimates: with exact estimates every outcome is at
// age 1, and the index of a birth at age a with estimate E is about 1 / (E - a), the order of
// the true next use; with rough ones the survival spreads and the index says what they are worth.
//
// The model is reuse_life_table.h's with x = age / scale in place of the age: bucket k of a birth
// is counted once x has passed edges[k+1] for it (the real time scale x edges[k+1] after its
// birth), at risk if its outcome reached edges[k], an event if it came inside the bucket. Hazards
// shrink towards the pooled one (one group), are rebuilt every `refresh` of real time, and the
// index, in reuses per unit of x, divided by the scale, is reuses per second: comparable with a
// ReuseLifeTable's index, so blocks ranked by either share one order.
//
// Memory: a birth is kept until its last bucket is counted (scale x the last edge), its outcome
// came before the bucket still to count, or it is max_age old with no outcome; about 48 bytes
// each, so at most (births per second) x max_age of them. Advance walks them all once a refresh.
// Thread-safety: not thread-safe; the caller serializes. Times are the caller's clock.
#ifndef KVTIER_SRC_POLICY_SCALED_LIFE_TABLE_H_
#define KVTIER_SRC_POLICY_SCALED_LIFE_TABLE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::internal {

struct ScaledLifeTableOptions {
  // Bucket edges in units of the scale: the first 0, strictly increasing. Empty: finer around 1
  // (0, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95, 1, 1.05, 1.1, 1.2, 1.35, 1.5, 1.75, 2, 2.5, 3, 4, 6, 8,
  // 12, 16), so an exact estimate places a return within 5%.
  std::vector<double> edges;
  double grid = 1.0 / 64;           // index resolution in units, > 0
  std::vector<int> horizon_steps;   // horizons in grid steps, >= 1; empty: 4, 8, ..., 512
  double prior = 20;                // pseudo-count of the shrinkage, >= 0
  absl::Duration refresh = absl::Seconds(60);  // rebuild period, > 0
  // Scales are clamped into [min_scale, max_scale]: a zero estimate would divide by zero.
  absl::Duration min_scale = absl::Seconds(1);
  absl::Duration max_scale = absl::Hours(24);
  // A birth with no outcome this long after it is withdrawn (censored: its buckets not yet
  // ended are never counted), so memory is bounded by the births of the last max_age, whatever
  // the scales. The caller sets it to how long it can still report an outcome. > 0.
  absl::Duration max_age = absl::Hours(2);
};

class ScaledLifeTable {
 public:
  // Errors: kInvalidArgument for classes < 1 or an option out of range (named).
  static absl::StatusOr<ScaledLifeTable> Create(int num_classes, ScaledLifeTableOptions options = {});

  // A birth of class `cls` (clamped into range) at `now`, expected to end about `scale` later.
  // Returns its id, for Reuse. Times must not go backwards (a smaller one is taken as the latest).
  uint64_t Birth(int cls, absl::Time now, absl::Duration scale);
  // Birth `birth` ended (its session came back) at `now`; only the first Reuse counts, and one of
  // a birth no longer kept is ignored.
  void Reuse(uint64_t birth, absl::Time now);
  // Counts what the latest refresh point <= now has settled and rebuilds if one passed since the
  // last rebuild. Returns whether it rebuilt.
  bool Advance(absl::Time now);

  // Reuses per second of holding a birth of class `cls`, `age` after it, with scale `scale`.
  double Index(int cls, absl::Duration age, absl::Duration scale) const;
  // P(the outcome comes within `within` | not by `age`), as ReuseLifeTable::ChanceOfReuse;
  // nullopt with fewer than `min_lives` at risk in the bucket of age / scale, or S = 0 there.
  std::optional<double> ChanceOfReuse(int cls, absl::Duration age, absl::Duration scale,
                                      absl::Duration within, int64_t min_lives) const;

  int64_t at_risk(int cls, int bucket) const { return at_risk_[Cell(cls, bucket)]; }
  int64_t events(int cls, int bucket) const { return events_[Cell(cls, bucket)]; }
  int num_classes() const { return classes_; }
  int num_buckets() const { return static_cast<int>(edges_.size()) - 1; }
  int64_t births_kept() const { return static_cast<int64_t>(pending_.size()); }
  int64_t rebuilds() const { return rebuilds_; }

 private:
  struct Life {
    double time = 0;   // of the birth, seconds since origin_
    double scale = 1;  // seconds
    double outcome = 0;  // seconds to the outcome; +inf while unknown
    uint32_t cls = 0;
    int next_bucket = 0;  // the first bucket not counted yet
  };
  ScaledLifeTable() = default;
  size_t Cell(int cls, int bucket) const {
    return static_cast<size_t>(cls) * static_cast<size_t>(num_buckets()) +
           static_cast<size_t>(bucket);
  }
  double Seconds(absl::Time t);
  double ClampScale(absl::Duration scale) const;
  void Rebuild();

  int classes_ = 0;
  std::vector<int> group_;  // all 0: one shrinkage group
  std::vector<double> edges_;
  std::vector<int> horizon_steps_;
  double grid_ = 0;
  int rows_ = 0;
  double prior_ = 0;
  double refresh_ = 0;
  double min_scale_ = 1, max_scale_ = 86400;
  double max_age_ = 7200;

  bool started_ = false;
  absl::Time origin_;
  double latest_ = 0;
  double next_refresh_ = 0;
  uint64_t next_id_ = 0;
  absl::flat_hash_map<uint64_t, Life> pending_;
  std::vector<int64_t> at_risk_, events_;
  std::vector<double> survival_;  // class x edges
  std::vector<double> index_;     // class x rows_, per unit of x
  int64_t rebuilds_ = 0;
};

}  // namespace kvtier::internal

#endif  // KVTIER_SRC_POLICY_SCALED_LIFE_TABLE_H_
