// The life table over ages in units of each birth's scale (scaled_life_table.h).
#include "policy/scaled_life_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "policy/life_table_math.h"
#include "policy/seconds.h"

namespace kvtier::internal {
namespace {

constexpr double kUnknown = std::numeric_limits<double>::infinity();

}  // namespace

absl::StatusOr<ScaledLifeTable> ScaledLifeTable::Create(int num_classes,
                                                        ScaledLifeTableOptions o) {
  auto bad = [](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("ScaledLifeTable: ", what));
  };
  if (num_classes < 1) return bad("no classes");
  if (o.edges.empty()) {
    o.edges = {0,   0.25, 0.5, 0.7,  0.8, 0.9, 0.95, 1, 1.05, 1.1, 1.2,
               1.35, 1.5, 1.75, 2, 2.5, 3,   4,   6,    8, 12,   16};
  }
  if (o.horizon_steps.empty()) o.horizon_steps = {4, 8, 16, 32, 64, 128, 256, 512};
  const std::vector<double>& e = o.edges;
  if (e.size() < 2 || e[0] != 0) return bad("edges must start at 0 and have two or more");
  for (size_t k = 1; k < e.size(); ++k) {
    if (!(e[k] > e[k - 1]) || !std::isfinite(e[k])) {
      return bad("edges must be finite and strictly increasing");
    }
  }
  if (!(o.grid > 0) || !std::isfinite(o.grid)) return bad("grid must be > 0");
  if (!(o.prior >= 0) || !std::isfinite(o.prior)) return bad("prior must be >= 0");
  for (int steps : o.horizon_steps) {
    if (steps < 1) return bad("every horizon must be at least one grid step");
  }
  if (o.refresh <= absl::ZeroDuration() || o.refresh == absl::InfiniteDuration()) {
    return bad("refresh must be positive and finite");
  }
  if (o.min_scale <= absl::ZeroDuration() || o.max_scale < o.min_scale ||
      o.max_scale == absl::InfiniteDuration()) {
    return bad("scales must satisfy 0 < min_scale <= max_scale < infinity");
  }
  if (o.max_age <= absl::ZeroDuration() || o.max_age == absl::InfiniteDuration()) {
    return bad("max_age must be positive and finite");
  }
  if (e.back() / o.grid >= double{1 << 24}) return bad("edges / grid: too many index rows");
  ScaledLifeTable t;
  t.classes_ = num_classes;
  t.group_.assign(static_cast<size_t>(num_classes), 0);
  t.edges_ = e;
  t.horizon_steps_ = o.horizon_steps;
  t.grid_ = o.grid;
  t.rows_ = static_cast<int>(std::floor(e.back() / o.grid)) + 1;
  t.prior_ = o.prior;
  t.refresh_ = absl::ToDoubleSeconds(o.refresh);
  t.min_scale_ = absl::ToDoubleSeconds(o.min_scale);
  t.max_scale_ = absl::ToDoubleSeconds(o.max_scale);
  t.max_age_ = absl::ToDoubleSeconds(o.max_age);
  const size_t cells = static_cast<size_t>(num_classes) * (e.size() - 1);
  t.at_risk_.assign(cells, 0);
  t.events_.assign(cells, 0);
  t.survival_.assign(static_cast<size_t>(num_classes) * e.size(), 1.0);
  t.index_.assign(static_cast<size_t>(num_classes) * static_cast<size_t>(t.rows_), 0.0);
  return t;
}

double ScaledLifeTable::Seconds(absl::Time t) {
  // An infinite time is no time on the table's clock: it reads as the latest (and never sets the
  // origin, which would put every finite time at infinity and end all learning).
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) return latest_;
  if (!started_) {
    started_ = true;
    origin_ = t;
    next_refresh_ = 0;
  }
  latest_ = std::max(latest_, FastSeconds(t - origin_));
  return latest_;
}

double ScaledLifeTable::ClampScale(absl::Duration scale) const {
  return std::clamp(FastSeconds(scale), min_scale_, max_scale_);
}

uint64_t ScaledLifeTable::Birth(int cls, absl::Time now, absl::Duration scale) {
  const double s = Seconds(now);
  const uint64_t id = next_id_++;
  pending_.emplace(id, Life{.time = s,
                            .scale = ClampScale(scale),
                            .outcome = kUnknown,
                            .cls = static_cast<uint32_t>(std::clamp(cls, 0, classes_ - 1))});
  return id;
}

void ScaledLifeTable::Reuse(uint64_t birth, absl::Time now) {
  const double s = Seconds(now);
  auto it = pending_.find(birth);
  if (it == pending_.end() || it->second.outcome != kUnknown) return;
  it->second.outcome = s - it->second.time;
}

bool ScaledLifeTable::Advance(absl::Time now) {
  const double s = Seconds(now);
  if (s < next_refresh_) return false;
  const double cut = std::floor(s / refresh_) * refresh_;
  next_refresh_ = cut + refresh_;
  const int buckets = num_buckets();
  for (auto it = pending_.begin(); it != pending_.end();) {
    Life& life = it->second;
    const int c = static_cast<int>(life.cls);
    while (life.next_bucket < buckets &&
           life.time + life.scale * edges_[life.next_bucket + 1] <= cut) {
      const int k = life.next_bucket++;
      const double lo = life.scale * edges_[k], hi = life.scale * edges_[k + 1];
      if (life.outcome >= lo) {
        ++at_risk_[Cell(c, k)];
        if (life.outcome < hi) ++events_[Cell(c, k)];
      }
    }
    // Done: every bucket counted, the outcome came before the next one (it adds nothing more),
    // or none can come any more (withdrawn).
    const bool done = life.next_bucket >= buckets ||
                      life.outcome < life.scale * edges_[life.next_bucket] ||
                      (life.outcome == kUnknown && cut - life.time > max_age_);
    if (done) {
      pending_.erase(it++);
    } else {
      ++it;
    }
  }
  Rebuild();
  return true;
}

void ScaledLifeTable::Rebuild() {
  ++rebuilds_;
  RebuildLifeTable(LifeTableShape{.edges = edges_,
                                  .group_of_class = group_,
                                  .num_groups = 1,
                                  .prior = prior_,
                                  .grid = grid_,
                                  .rows = rows_,
                                  .horizon_steps = horizon_steps_},
                   at_risk_, events_, absl::MakeSpan(survival_), absl::MakeSpan(index_));
}

double ScaledLifeTable::Index(int cls, absl::Duration age, absl::Duration scale) const {
  cls = std::clamp(cls, 0, classes_ - 1);
  const double e = ClampScale(scale);
  const double x = std::max(0.0, FastSeconds(age)) / e;
  const int i = std::min(rows_ - 1, static_cast<int>(std::min(x / grid_, 1e9)));
  return index_[static_cast<size_t>(cls) * rows_ + i] / e;
}

std::optional<double> ScaledLifeTable::ChanceOfReuse(int cls, absl::Duration age,
                                                     absl::Duration scale, absl::Duration within,
                                                     int64_t min_lives) const {
  cls = std::clamp(cls, 0, classes_ - 1);
  const double e = ClampScale(scale);
  return ChanceOfReuseAt(
      edges_,
      absl::MakeConstSpan(&survival_[static_cast<size_t>(cls) * edges_.size()], edges_.size()),
      absl::MakeConstSpan(&at_risk_[Cell(cls, 0)], static_cast<size_t>(num_buckets())),
      std::max(0.0, FastSeconds(age)) / e, FastSeconds(within) / e, min_lives);
}

}  // namespace kvtier::internal
