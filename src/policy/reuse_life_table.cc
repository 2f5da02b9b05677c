// The online censored life table and its reuse index (reuse_life_table.h).
#include "kvtier/reuse_life_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "policy/life_table_math.h"
#include "policy/seconds.h"

namespace kvtier {
namespace {

// Bounds on Create's options that keep the tables' sizes in int and in memory (the index table
// alone is classes x rows doubles; an Advance also walks rows + the longest horizon's steps).
constexpr int kMaxGroups = 1 << 16;
constexpr double kMaxRows = double{1 << 24};
constexpr double kMaxIndexCells = double{1 << 26};

constexpr float kUnknown = std::numeric_limits<float>::infinity();

std::vector<double> DefaultEdges() {
  std::vector<double> e;
  for (int a = 0; a < 120; a += 10) e.push_back(a);
  for (int a = 120; a < 600; a += 30) e.push_back(a);
  for (int a = 600; a < 1800; a += 120) e.push_back(a);
  for (double a : {1800.0, 2400.0, 3600.0}) e.push_back(a);
  return e;
}

}  // namespace

ReuseLifeTableOptions WithReuseLifeTableDefaults(ReuseLifeTableOptions options) {
  if (options.edges_seconds.empty()) options.edges_seconds = DefaultEdges();
  if (options.horizons_seconds.empty()) {
    options.horizons_seconds = {15, 30, 60, 120, 240, 480, 960, 1920};
  }
  return options;
}

absl::StatusOr<ReuseLifeTable> ReuseLifeTable::Create(std::vector<int> group_of_class,
                                                      ReuseLifeTableOptions options) {
  options = WithReuseLifeTableDefaults(std::move(options));
  auto bad = [](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("ReuseLifeTable: ", what));
  };
  if (group_of_class.empty()) return bad("no classes");
  int groups = 0;
  for (int g : group_of_class) {
    if (g < 0) return bad("a negative class group");
    if (g >= kMaxGroups) return bad("a class group of 65536 or more");
    groups = std::max(groups, g + 1);
  }
  const std::vector<double>& e = options.edges_seconds;
  if (e.size() < 2 || e[0] != 0) return bad("edges_seconds must start at 0 and have two or more");
  for (size_t k = 1; k < e.size(); ++k) {
    if (!(e[k] > e[k - 1]) || !std::isfinite(e[k])) {
      return bad("edges_seconds must be finite and strictly increasing");
    }
  }
  if (!(options.prior >= 0) || !std::isfinite(options.prior)) return bad("prior must be >= 0");
  if (options.refresh <= absl::ZeroDuration() || options.refresh == absl::InfiniteDuration()) {
    return bad("refresh must be positive and finite");
  }
  const double grid = options.grid_seconds;
  if (!(grid > 0) || !std::isfinite(grid)) return bad("grid_seconds must be > 0");
  // The index table has a row per grid step to the last edge, per class.
  const double rows = std::floor(e.back() / grid) + 1;
  if (rows > kMaxRows) return bad("edges_seconds / grid_seconds: more than 2^24 index rows");
  if (rows * static_cast<double>(group_of_class.size()) > kMaxIndexCells) {
    return bad("edges_seconds / grid_seconds: classes x index rows above 2^26");
  }
  ReuseLifeTable t;
  for (double h : options.horizons_seconds) {
    const double steps = h / grid;
    if (!(h > 0) || !std::isfinite(h) || steps != std::floor(steps)) {
      return bad("every horizon must be > 0 and a multiple of grid_seconds");
    }
    if (steps > kMaxRows) return bad("a horizon of more than 2^24 grid steps");
    t.horizon_steps_.push_back(static_cast<int>(steps));
  }
  if (t.horizon_steps_.empty()) return bad("no horizons");
  t.group_ = std::move(group_of_class);
  t.num_groups_ = groups;
  t.edges_ = e;
  t.prior_ = options.prior;
  t.refresh_ = absl::ToDoubleSeconds(options.refresh);
  t.grid_ = grid;
  t.rows_ = static_cast<int>(std::floor(e.back() / grid)) + 1;
  const size_t cells = t.group_.size() * (e.size() - 1);
  t.counted_.assign(e.size() - 1, 0);
  t.at_risk_.assign(cells, 0);
  t.events_.assign(cells, 0);
  t.index_.assign(t.group_.size() * static_cast<size_t>(t.rows_), 0.0);
  t.survival_.assign(t.group_.size() * e.size(), 1.0);
  return t;
}

double ReuseLifeTable::Seconds(absl::Time t) {
  // An infinite time is no time on the table's clock: it reads as the latest (and never sets the
  // origin, which would put every finite time at infinity and end all learning).
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) return latest_;
  if (!started_) {
    started_ = true;
    origin_ = t;
    next_refresh_ = 0;
  }
  latest_ = std::max(latest_, internal::FastSeconds(t - origin_));
  return latest_;
}

uint64_t ReuseLifeTable::Birth(int cls, absl::Time now) {
  cls = std::clamp(cls, 0, num_classes() - 1);
  const double s = Seconds(now);
  log_.push_back(
      Life{.time = static_cast<float>(s), .outcome = kUnknown, .cls = static_cast<uint32_t>(cls)});
  return log_base_ + (log_.size() - head_) - 1;
}

void ReuseLifeTable::Reuse(uint64_t birth, absl::Time now) {
  const double s = Seconds(now);
  if (birth < log_base_ || birth >= log_base_ + (log_.size() - head_)) return;
  Life& life = log_[head_ + (birth - log_base_)];
  if (life.outcome == kUnknown) life.outcome = static_cast<float>(s) - life.time;
}

void ReuseLifeTable::Count(double cut) {
  const uint64_t end = log_base_ + (log_.size() - head_);
  const Life* first = log_.data() + head_;  // id log_base_
  for (int k = 0; k < num_buckets(); ++k) {
    const float lo = static_cast<float>(edges_[k]), hi = static_cast<float>(edges_[k + 1]);
    const float limit = static_cast<float>(cut - edges_[k + 1]);
    uint64_t next = counted_[k];
    while (next < end && first[next - log_base_].time <= limit) {
      const Life& life = first[next - log_base_];
      if (life.outcome >= lo) {
        ++at_risk_[Cell(static_cast<int>(life.cls), k)];
        if (life.outcome < hi) ++events_[Cell(static_cast<int>(life.cls), k)];
      }
      ++next;
    }
    counted_[k] = next;
  }
  // The last bucket's edge is the largest, so its count is the furthest behind.
  const uint64_t done = std::min(counted_.back(), end);
  head_ += static_cast<size_t>(done - log_base_);
  log_base_ = done;
  if (head_ > log_.size() / 2) {
    log_.erase(log_.begin(), log_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
}

bool ReuseLifeTable::Advance(absl::Time now) {
  const double s = Seconds(now);
  if (s < next_refresh_) return false;
  const double point = std::floor(s / refresh_) * refresh_;
  next_refresh_ = point + refresh_;
  Count(point);
  Rebuild();
  return true;
}

void ReuseLifeTable::Rebuild() {
  ++rebuilds_;
  internal::RebuildLifeTable(
      internal::LifeTableShape{.edges = edges_,
                               .group_of_class = group_,
                               .num_groups = num_groups_,
                               .prior = prior_,
                               .grid = grid_,
                               .rows = rows_,
                               .horizon_steps = horizon_steps_},
      at_risk_, events_, absl::MakeSpan(survival_), absl::MakeSpan(index_));
}

double ReuseLifeTable::Index(int cls, absl::Duration age) const {
  cls = std::clamp(cls, 0, num_classes() - 1);
  const double a = std::max(0.0, internal::FastSeconds(age));
  const int i = std::min(rows_ - 1, static_cast<int>(std::min(a / grid_, 1e9)));
  return index_[static_cast<size_t>(cls) * rows_ + i];
}

std::optional<double> ReuseLifeTable::ChanceOfReuse(int cls, double age_seconds,
                                                    double within_seconds,
                                                    int64_t min_lives) const {
  cls = std::clamp(cls, 0, num_classes() - 1);
  return internal::ChanceOfReuseAt(
      edges_,
      absl::MakeConstSpan(&survival_[static_cast<size_t>(cls) * edges_.size()], edges_.size()),
      absl::MakeConstSpan(&at_risk_[Cell(cls, 0)], static_cast<size_t>(num_buckets())),
      age_seconds, within_seconds, min_lives);
}

double ReuseLifeTable::Survival(int cls, double age_seconds) const {
  cls = std::clamp(cls, 0, num_classes() - 1);
  return internal::SurvivalAt(
      edges_, absl::MakeConstSpan(&survival_[static_cast<size_t>(cls) * edges_.size()],
                                  edges_.size()),
      age_seconds);
}

}  // namespace kvtier
