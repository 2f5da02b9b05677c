// The arithmetic shared by the policy's life tables (kvtier/reuse_life_table.h has the model):
// from per class x bucket counts of lives at risk and reuses, the shrunk hazards, the survival at
// the bucket edges and the Gittins-style reuse index on a grid of ages. Ages are in whatever unit
// the table measures them in (seconds, or multiples of a birth's own scale).
#ifndef KVTIER_SRC_POLICY_LIFE_TABLE_MATH_H_
#define KVTIER_SRC_POLICY_LIFE_TABLE_MATH_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"

namespace kvtier::internal {

struct LifeTableShape {
  absl::Span<const double> edges;          // bucket edges, the first 0, strictly increasing
  absl::Span<const int> group_of_class;    // each class's shrinkage group, in [0, num_groups)
  int num_groups = 1;
  double prior = 20;                       // pseudo-count of the shrinkage
  double grid = 1;                         // index resolution
  int rows = 1;                            // index entries per class: ages 0, grid, ...
  absl::Span<const int> horizon_steps;     // horizons, in grid steps, each >= 1
};

// Rebuilds `survival` (class x edges.size(): S at the edges) and `index` (class x rows) from
// `at_risk` and `events` (class x buckets), as reuse_life_table.h describes.
void RebuildLifeTable(const LifeTableShape& shape, absl::Span<const int64_t> at_risk,
                      absl::Span<const int64_t> events, absl::Span<double> survival,
                      absl::Span<double> index);

// S(x) of one class from its survival at the edges, linear between them, flat after the last.
double SurvivalAt(absl::Span<const double> edges, absl::Span<const double> edge_survival,
                  double x);

// One class's chance of a reuse within `within` after age x (both >= 0 are taken; within may be
// +infinity: as far as the last edge), given no reuse by x: (S(x) - S(x + within)) / S(x) in
// [0, 1]. nullopt when its bucket of x has fewer than `min_lives` at risk (`at_risk`: the class's
// counts per bucket), or S(x) is 0.
std::optional<double> ChanceOfReuseAt(absl::Span<const double> edges,
                                      absl::Span<const double> edge_survival,
                                      absl::Span<const int64_t> at_risk, double x, double within,
                                      int64_t min_lives);

}  // namespace kvtier::internal

#endif  // KVTIER_SRC_POLICY_LIFE_TABLE_MATH_H_
