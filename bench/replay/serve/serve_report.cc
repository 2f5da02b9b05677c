// The serving simulation's report (serve_report.h).
#include "bench/replay/serve/serve_report.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace kvtier::replay {
namespace {

constexpr const char* kTierKeys[kNumTiers] = {"hbm", "dram", "nvme", "remote"};

nlohmann::json ToJson(const ServeReport& r, bool deterministic) {
  nlohmann::json j;
  j["profile"] = r.profile;
  j["trace"] = r.trace;
  j["model"] = r.model;
  j["gpu"] = r.gpu;
  j["tensor_parallel"] = r.tensor_parallel;
  j["instances"] = r.instances;
  j["router"] = r.router;
  nlohmann::json cap = nlohmann::json::object();
  nlohmann::json by_tier = nlohmann::json::object();
  for (int t = 0; t < kNumTiers; ++t) {
    cap[kTierKeys[t]] = r.capacity_blocks[t];
    by_tier[kTierKeys[t]] = r.served_hit_tokens_by_tier[t];
  }
  j["capacity_blocks"] = cap;
  j["shared_remote"] = r.shared_remote;
  j["remote_discovered_blocks"] = r.remote_discovered_blocks;
  j["requests"] = r.requests;
  j["finished"] = r.finished;
  j["failed"] = r.failed;
  j["failed_prompt_exceeds_hbm"] = r.failed_prompt_exceeds_hbm;
  j["prompt_tokens"] = r.prompt_tokens;
  j["matched_tokens"] = r.matched_tokens;
  j["served_hit_tokens"] = r.served_hit_tokens;
  j["served_hit_tokens_by_tier"] = by_tier;
  j["late_tokens"] = r.late_tokens;
  j["cost_model_recomputed_tokens"] = r.cost_model_recomputed_tokens;
  j["prefilled_tokens"] = r.prefilled_tokens;
  j["recomputed_after_preemption_tokens"] = r.recomputed_after_preemption_tokens;
  j["output_tokens"] = r.output_tokens;
  j["preemptions"] = r.preemptions;
  j["swap_preemptions"] = r.swap_preemptions;
  j["oracle_idle_releases"] = r.oracle_idle_releases;
  j["ttft_ms"] = {{"p50", r.ttft_p50_ms}, {"p90", r.ttft_p90_ms}, {"p99", r.ttft_p99_ms}};
  j["ttft_percentiles_ms"] = r.ttft_percentiles_ms;
  j["itl_ms"] = {{"p50", r.itl_p50_ms}, {"p99", r.itl_p99_ms}};
  j["e2e_s"] = {{"p50", r.e2e_p50_s}, {"p99", r.e2e_p99_s}};
  j["simulated_seconds"] = r.simulated_seconds;
  j["output_tokens_per_second"] = r.output_tokens_per_second;
  j["slo_met"] = r.slo_met;
  j["slo_attainment"] = r.slo_attainment;
  {
    nlohmann::json t = nlohmann::json::array(), run = nlohmann::json::array(),
                   cached = nlohmann::json::array();
    for (const ServeReport::OccupancyPoint& p : r.hbm_occupancy) {
      t.push_back(p.seconds);
      run.push_back(p.running);
      cached.push_back(p.cached);
    }
    j["hbm_occupancy"] = {{"seconds", t}, {"running", run}, {"cached", cached}};
  }
  j["hbm_blocks"] = {{"running_mean", r.hbm_running_blocks_mean},
                     {"cached_mean", r.hbm_cached_blocks_mean},
                     {"running_max", r.hbm_running_blocks_max}};
  nlohmann::json links = nlohmann::json::array();
  for (const LinkReport& l : r.links) {
    links.push_back({{"name", l.name}, {"bytes", l.bytes}, {"utilization", l.utilization}});
  }
  j["links"] = links;
  j["steps"] = r.steps;
  if (!deterministic) j["wall_seconds"] = r.wall_seconds;
  return j;
}

}  // namespace

double SweepValue(const ServeSweepPoint& point) {
  switch (point.kind) {
    case ServeSweepPoint::Kind::kTier:
      return static_cast<double>(point.blocks);
    case ServeSweepPoint::Kind::kRateScale:
      return point.rate_scale;
    case ServeSweepPoint::Kind::kNone:
      break;
  }
  return 0;
}

std::string ServeJson(const std::vector<ServeRun>& runs, bool deterministic) {
  nlohmann::json j;
  j["mode"] = "serve";
  j["trace"] = runs.empty() ? "" : runs.front().report.trace;
  nlohmann::json list = nlohmann::json::array();
  for (const ServeRun& run : runs) {
    nlohmann::json one = ToJson(run.report, deterministic);
    if (run.point.kind == ServeSweepPoint::Kind::kTier) {
      one["sweep"] = {{"tier", kTierKeys[run.point.tier]}, {"blocks", run.point.blocks}};
    } else if (run.point.kind == ServeSweepPoint::Kind::kRateScale) {
      one["rate_scale"] = run.point.rate_scale;
    }
    list.push_back(std::move(one));
  }
  j["runs"] = list;
  return j.dump(2) + "\n";
}

std::string ServeTable(const std::vector<ServeRun>& runs) {
  // In a sweep, a first column names the point: the tier's blocks, or the load's multiplier.
  const ServeSweepPoint::Kind kind =
      runs.empty() ? ServeSweepPoint::Kind::kNone : runs.front().point.kind;
  auto point_cell = [&](const ServeSweepPoint* p) -> std::string {
    switch (kind) {
      case ServeSweepPoint::Kind::kTier:
        return p ? absl::StrFormat("%10d ", p->blocks) : absl::StrFormat("%10s ", "blocks");
      case ServeSweepPoint::Kind::kRateScale:
        return p ? absl::StrFormat("%10s ", absl::StrCat("x", p->rate_scale))
                 : absl::StrFormat("%10s ", "");
      case ServeSweepPoint::Kind::kNone:
        break;
    }
    return "";
  };
  std::string out;
  if (kind == ServeSweepPoint::Kind::kTier) {
    absl::StrAppend(&out, absl::StrFormat("%10s ", kTierKeys[runs.front().point.tier]));
  } else if (kind == ServeSweepPoint::Kind::kRateScale) {
    absl::StrAppend(&out, absl::StrFormat("%10s ", "rate_scale"));
  }
  absl::StrAppend(
      &out,
      absl::StrFormat("%-10s %6s %5s %6s %9s %9s %9s %7s %7s %9s %6s %6s %9s %9s\n", "profile",
                      "done", "fail", "hit", "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50",
                      "itl_p99", "out_tok/s", "slo", "preempt", "hbm_run", "hbm_cache"));
  absl::StrAppend(
      &out, point_cell(nullptr),
      absl::StrFormat("%-10s %6s %5s %6s %9s %9s %9s %7s %7s %9s %6s %6s %9s %9s\n", "", "", "", "",
                      "ms", "ms", "ms", "ms", "ms", "", "", "", "blocks", "blocks"));
  for (const ServeRun& run : runs) {
    const ServeReport& r = run.report;
    const double hit = r.prompt_tokens > 0 ? static_cast<double>(r.served_hit_tokens) /
                                                 static_cast<double>(r.prompt_tokens)
                                           : 0;
    absl::StrAppend(&out, point_cell(&run.point),
                    absl::StrFormat("%-10s %6d %5d %6.3f %9.0f %9.0f %9.0f %7.1f %7.1f %9.0f %6.3f "
                                    "%6d %9.0f %9.0f\n",
                                    r.profile, r.finished, r.failed, hit, r.ttft_p50_ms,
                                    r.ttft_p90_ms, r.ttft_p99_ms, r.itl_p50_ms, r.itl_p99_ms,
                                    r.output_tokens_per_second, r.slo_attainment, r.preemptions,
                                    r.hbm_running_blocks_mean, r.hbm_cached_blocks_mean));
  }
  // A run's label: its profile, in a sweep with the point ("kvtier x2", "hbm_lru hbm=2000").
  std::vector<std::string> labels;
  int label_width = 10;
  for (const ServeRun& run : runs) {
    std::string label = run.report.profile;
    if (kind == ServeSweepPoint::Kind::kTier) {
      absl::StrAppend(&label, " ", kTierKeys[run.point.tier], "=", run.point.blocks);
    } else if (kind == ServeSweepPoint::Kind::kRateScale) {
      absl::StrAppend(&label, " x", run.point.rate_scale);
    }
    label_width = std::max(label_width, static_cast<int>(label.size()));
    labels.push_back(std::move(label));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const ServeReport& r = runs[i].report;
    const LinkReport* busiest = nullptr;
    for (const LinkReport& l : r.links) {
      if (busiest == nullptr || l.utilization > busiest->utilization) busiest = &l;
    }
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  %-*s hits by tier (tokens) hbm %d dram %d nvme %d remote %d; late %d; "
            "busiest link %s %.1f%%;%s %.1f s wall\n",
            label_width, labels[i], r.served_hit_tokens_by_tier[0], r.served_hit_tokens_by_tier[1],
            r.served_hit_tokens_by_tier[2], r.served_hit_tokens_by_tier[3], r.late_tokens,
            busiest ? busiest->name : "-", busiest ? 100 * busiest->utilization : 0.0,
            absl::StrCat(
                r.shared_remote ? absl::StrCat(" shared store: ", r.remote_discovered_blocks,
                                               " blocks discovered;")
                                : std::string(),
                r.swap_preemptions > 0 ? absl::StrCat(" swapped ", r.swap_preemptions, " of ",
                                                      r.preemptions, " preemptions;")
                                       : std::string()),
            r.wall_seconds));
  }
  return out;
}

}  // namespace kvtier::replay
