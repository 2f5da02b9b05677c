// Shrunk hazards, survival and the reuse index from life-table counts (life_table_math.h).
#include "policy/life_table_math.h"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace kvtier::internal {

void RebuildLifeTable(const LifeTableShape& shape, absl::Span<const int64_t> at_risk,
                      absl::Span<const int64_t> events, absl::Span<double> survival,
                      absl::Span<double> index) {
  const int buckets = static_cast<int>(shape.edges.size()) - 1;
  const int classes = static_cast<int>(shape.group_of_class.size());
  auto cell = [buckets](int c, int k) {
    return static_cast<size_t>(c) * static_cast<size_t>(buckets) + static_cast<size_t>(k);
  };
  std::vector<double> pooled_events(buckets, 0), pooled_risk(buckets, 0);
  std::vector<double> group_events(static_cast<size_t>(shape.num_groups) * buckets, 0);
  std::vector<double> group_risk(group_events.size(), 0);
  for (int c = 0; c < classes; ++c) {
    for (int k = 0; k < buckets; ++k) {
      const size_t g = static_cast<size_t>(shape.group_of_class[c]) * buckets + k;
      pooled_events[k] += static_cast<double>(events[cell(c, k)]);
      pooled_risk[k] += static_cast<double>(at_risk[cell(c, k)]);
      group_events[g] += static_cast<double>(events[cell(c, k)]);
      group_risk[g] += static_cast<double>(at_risk[cell(c, k)]);
    }
  }
  const int max_steps = *std::max_element(shape.horizon_steps.begin(), shape.horizon_steps.end());
  const int points = shape.rows + max_steps + 1;
  std::vector<double> s(points), integral(points);
  const double prior = shape.prior;
  for (int c = 0; c < classes; ++c) {
    double* edge_s = &survival[static_cast<size_t>(c) * shape.edges.size()];
    edge_s[0] = 1.0;
    for (int k = 0; k < buckets; ++k) {
      double h = 0;
      if (pooled_risk[k] > 0) {
        const size_t g = static_cast<size_t>(shape.group_of_class[c]) * buckets + k;
        const double pooled = pooled_events[k] / pooled_risk[k];
        const double group = (group_events[g] + prior * pooled) / (group_risk[g] + prior);
        const double risk = static_cast<double>(at_risk[cell(c, k)]);
        const double denom = risk + prior;
        h = denom > 0 ? (static_cast<double>(events[cell(c, k)]) + prior * group) / denom : 0;
      }
      edge_s[k + 1] = edge_s[k] * (1 - h);
    }
    int k = 0;
    for (int i = 0; i < points; ++i) {
      const double x = i * shape.grid;
      while (k < buckets && x >= shape.edges[k + 1]) ++k;
      if (k >= buckets) {
        s[i] = edge_s[buckets];
      } else {
        const double f = (x - shape.edges[k]) / (shape.edges[k + 1] - shape.edges[k]);
        s[i] = edge_s[k] + f * (edge_s[k + 1] - edge_s[k]);
      }
      integral[i] = i == 0 ? 0 : integral[i - 1] + 0.5 * (s[i - 1] + s[i]) * shape.grid;
    }
    double* row = &index[static_cast<size_t>(c) * shape.rows];
    for (int i = 0; i < shape.rows; ++i) {
      double best = 0;
      for (int steps : shape.horizon_steps) {
        const double held = integral[i + steps] - integral[i];
        if (held > 0) best = std::max(best, (s[i] - s[i + steps]) / held);
      }
      row[i] = best;
    }
  }
}

double SurvivalAt(absl::Span<const double> edges, absl::Span<const double> edge_survival,
                  double x) {
  const int buckets = static_cast<int>(edges.size()) - 1;
  if (!(x > 0)) return 1.0;
  for (int k = 0; k < buckets; ++k) {
    if (x < edges[k + 1]) {
      const double f = (x - edges[k]) / (edges[k + 1] - edges[k]);
      return edge_survival[k] + f * (edge_survival[k + 1] - edge_survival[k]);
    }
  }
  return edge_survival[buckets];
}

std::optional<double> ChanceOfReuseAt(absl::Span<const double> edges,
                                      absl::Span<const double> edge_survival,
                                      absl::Span<const int64_t> at_risk, double x, double within,
                                      int64_t min_lives) {
  x = std::max(0.0, x);
  int k = static_cast<int>(edges.size()) - 2;  // the last bucket
  while (k > 0 && x < edges[static_cast<size_t>(k)]) --k;
  if (at_risk[static_cast<size_t>(k)] < min_lives) return std::nullopt;
  const double s_x = SurvivalAt(edges, edge_survival, x);
  if (!(s_x > 0)) return std::nullopt;
  const double end = within == std::numeric_limits<double>::infinity()
                         ? edges.back()
                         : x + std::max(0.0, within);
  return std::clamp((s_x - SurvivalAt(edges, edge_survival, end)) / s_x, 0.0, 1.0);
}

}  // namespace kvtier::internal
