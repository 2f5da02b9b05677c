// kvtier-replay --mode serve (serve_command.h).
#include "bench/replay/sim/serve_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/replay/serve/serve_report.h"
#include "bench/replay/sim/report.h"
#include "bench/replay/trace/rate_scale.h"

namespace kvtier::replay {
namespace {

constexpr const char* kSizeFlags[kNumTiers] = {"--hbm", "--dram", "--nvme", "--remote-size"};

absl::Status Positive(const char* flag, double v) {
  if (!std::isfinite(v) || v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", v, ": must be > 0"));
  }
  return absl::OkStatus();
}

constexpr const char* kTierKeys[kNumTiers] = {"hbm", "dram", "nvme", "remote"};
constexpr int kHbm = TierIndex(Tier::kHbm);

// Blocks per instance of tier `t` from its size text: "auto" (HBM only: 0, the KV pool the
// roofline leaves), a byte size, Nblocks, or 0 (absent; not HBM). Errors: kInvalidArgument
// without the flag's name (the caller adds it).
absl::StatusOr<int64_t> TierBlocks(int t, const std::string& size, int64_t bytes_per_block) {
  if (t == kHbm && size == "auto") return 0;
  auto c = ParseTierSize(size, bytes_per_block);
  if (!c.ok()) return c.status();
  if (c->kind == TierCapacity::Kind::kUnlimited) {
    return absl::InvalidArgumentError(absl::StrCat(size, ": --mode serve needs a finite size"));
  }
  if (t == kHbm && c->kind == TierCapacity::Kind::kAbsent) {
    return absl::InvalidArgumentError("HBM cannot be 0");
  }
  return c->kind == TierCapacity::Kind::kBlocks ? c->blocks : 0;
}

// --sweep TIER=SIZE,...: the points, in the order typed.
absl::StatusOr<std::vector<ServeSweepPoint>> ParseTierSweep(const std::string& text,
                                                            int64_t bytes_per_block) {
  const std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits('=', 1));
  int tier = -1;
  for (int t = 0; t < kNumTiers; ++t) {
    if (parts.size() == 2 && parts[0] == kTierKeys[t]) tier = t;
  }
  if (tier < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sweep ", text, ": expected TIER=SIZE,SIZE,... with TIER hbm, dram, nvme or remote"));
  }
  std::vector<ServeSweepPoint> points;
  for (absl::string_view piece : absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
    auto blocks = TierBlocks(tier, std::string(piece), bytes_per_block);
    if (!blocks.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sweep ", text, ": ", blocks.status().message()));
    }
    points.push_back({.kind = ServeSweepPoint::Kind::kTier, .tier = tier, .blocks = *blocks});
  }
  if (points.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--sweep ", text, ": no sizes"));
  }
  return points;
}

// --rate-scale X,Y,...: the points, in the order typed.
absl::StatusOr<std::vector<ServeSweepPoint>> ParseRateScales(const std::string& text) {
  std::vector<ServeSweepPoint> points;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    double x = 0;
    if (!absl::SimpleAtod(piece, &x) || !std::isfinite(x) || x <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rate-scale ", text, ": \"", std::string(piece), "\" is not a finite number > 0"));
    }
    points.push_back({.kind = ServeSweepPoint::Kind::kRateScale, .rate_scale = x});
  }
  return points;
}

// Single-quoted for a shell word.
std::string ShellQuoted(const std::string& s) {
  std::string quoted = "'";
  for (char c : s) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Single-quoted for a gnuplot string (a quote inside is doubled; no escapes are read).
std::string GnuplotQuoted(const std::string& s) {
  std::string quoted = "'";
  for (char c : s) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  return quoted + "'";
}

// --plot: writes PATH.dat (the points) and PATH.gp (the script) and runs gnuplot. Without a
// sweep, the TTFT CDF of each profile; in one, TTFT p50, p90 and output tokens/s against the
// swept value, a line per profile. Errors: kUnavailable when a file cannot be written or gnuplot
// fails; kFailedPrecondition when no run finished a request.
absl::Status Plot(const std::string& path, const std::vector<ServeRun>& runs) {
  if (runs.empty()) return absl::OkStatus();
  const ServeSweepPoint::Kind kind = runs.front().point.kind;
  // The profiles in their order of appearance; each is one gnuplot data set (index).
  std::vector<std::string> profiles;
  for (const ServeRun& run : runs) {
    if (std::find(profiles.begin(), profiles.end(), run.report.profile) == profiles.end()) {
      profiles.push_back(run.report.profile);
    }
  }
  std::vector<std::string> plotted;  // the profiles with data, in `profiles` order
  const std::string data = path + ".dat";
  {
    std::ofstream out(data, std::ios::binary | std::ios::trunc);
    for (const std::string& profile : profiles) {
      std::string block;
      if (kind == ServeSweepPoint::Kind::kNone) {
        block = "# ttft_ms fraction_of_finished_requests\n";
        for (const ServeRun& run : runs) {
          if (run.report.profile != profile) continue;
          const std::vector<double>& p = run.report.ttft_percentiles_ms;
          for (size_t k = 0; k < p.size(); ++k) {
            absl::StrAppend(&block, p[k], " ", static_cast<double>(k) / 100, "\n");
          }
        }
      } else {
        block = "# swept_value ttft_p50_ms ttft_p90_ms output_tokens_per_second\n";
        for (const ServeRun& run : runs) {
          if (run.report.profile != profile || run.report.finished == 0) continue;
          absl::StrAppend(&block, SweepValue(run.point), " ", run.report.ttft_p50_ms, " ",
                          run.report.ttft_p90_ms, " ", run.report.output_tokens_per_second, "\n");
        }
      }
      if (block.find('\n') == block.size() - 1) continue;  // the header only: nothing finished
      out << "# " << profile << "\n" << block << "\n\n";   // two blank lines end a data set
      plotted.push_back(profile);
    }
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", data));
  }
  if (plotted.empty()) {
    return absl::FailedPreconditionError("--plot: no run finished a request, nothing to draw");
  }
  const std::string d = GnuplotQuoted(data);
  auto lines = [&](int column) {
    std::string s;
    for (size_t k = 0; k < plotted.size(); ++k) {
      absl::StrAppend(&s, k ? ", " : "", d, " index ", k, " using 1:", column,
                      " with linespoints title ", GnuplotQuoted(plotted[k]));
    }
    return s;
  };
  const std::string& trace = runs.front().report.trace;
  std::string script;
  if (kind == ServeSweepPoint::Kind::kNone) {
    script = absl::StrCat("set terminal pngcairo noenhanced size 800,500; set output ",
                          GnuplotQuoted(path), ";", "set title ",
                          GnuplotQuoted(absl::StrCat(trace, ": TTFT CDF")), ";",
                          "set key bottom right; set grid; set logscale x; set xlabel 'TTFT (ms)';",
                          "set ylabel 'fraction of finished requests'; set yrange [0:1]; plot ");
    for (size_t k = 0; k < plotted.size(); ++k) {
      absl::StrAppend(&script, k ? ", " : "", d, " index ", k, " using 1:2 with lines title ",
                      GnuplotQuoted(plotted[k]));
    }
    absl::StrAppend(&script, "\n");
  } else {
    const std::string xlabel =
        kind == ServeSweepPoint::Kind::kTier
            ? absl::StrCat(kTierKeys[runs.front().point.tier], " per instance (blocks)")
            : std::string("offered load (x the trace's rate)");
    script = absl::StrCat("set terminal pngcairo noenhanced size 1500,450; set output ",
                          GnuplotQuoted(path), ";", "set multiplot layout 1,3 title ",
                          GnuplotQuoted(trace), ";", "set key top left; set grid; set xlabel ",
                          GnuplotQuoted(xlabel), ";",
                          kind == ServeSweepPoint::Kind::kRateScale ? "set logscale x 2;" : "",
                          "set logscale y; set ylabel 'TTFT p50 (ms)'; plot ", lines(2), ";",
                          "set ylabel 'TTFT p90 (ms)'; plot ", lines(3), ";",
                          "unset logscale y; set yrange [0:*]; set ylabel 'output tokens/s'; plot ",
                          lines(4), ";", "unset multiplot\n");
  }
  const std::string script_path = path + ".gp";
  {
    std::ofstream out(script_path, std::ios::binary | std::ios::trunc);
    out << script;
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", script_path));
  }
  // The only shell word is the script's path, single-quoted.
  const std::string cmd = absl::StrCat("gnuplot ", ShellQuoted(script_path));
  if (std::system(cmd.c_str()) != 0) {
    return absl::UnavailableError("gnuplot failed (is gnuplot-nox installed?)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunServeCommand(
    const ServeFlags& f, const ModelSpec& model, int tokens_per_block, const Trace& trace,
    int64_t max_requests,
    const std::function<std::function<void(int64_t, int64_t)>(const std::string&)>& progress) {
  KvGeometryOptions go = model.geometry;
  go.tokens_per_block = tokens_per_block;
  auto geometry = KvGeometry::Create(go);
  if (!geometry.ok()) return geometry.status();
  ServeOptions o(*geometry);
  o.model_name = model.name;
  o.cost = *model.cost;
  auto gpu = FindGpu(f.gpu);
  if (!gpu.ok()) return absl::InvalidArgumentError(absl::StrCat("--gpu: ", gpu.status().message()));
  o.roofline.gpu = *gpu;
  if (f.tensor_parallel < 1 || f.tensor_parallel > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp ", f.tensor_parallel, ": must be in [1, 64]"));
  }
  o.roofline.tensor_parallel = f.tensor_parallel;
  if (!(f.mfu > 0 && f.mfu <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--mfu ", f.mfu, ": must be in (0, 1]"));
  }
  o.roofline.mfu = f.mfu;
  if (f.instances < 1 || f.instances > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--instances ", f.instances, ": must be in [1, 64]"));
  }
  o.instances = f.instances;
  o.shared_remote = f.shared_remote;
  auto router = ParseRouter(f.router);
  if (!router.ok())
    return absl::InvalidArgumentError(absl::StrCat("--router: ", router.status().message()));
  o.router = *router;
  for (auto [flag, v] :
       {std::pair<const char*, double>{"--onboard-deadline-ms", f.onboard_deadline_ms},
        {"--slo-ttft", f.slo_ttft_ms},
        {"--slo-itl", f.slo_itl_ms},
        {"--pcie-bandwidth", f.pcie_bandwidth},
        {"--nvme-bandwidth", f.nvme_bandwidth},
        {"--network-bandwidth", f.network_bandwidth}}) {
    if (absl::Status s = Positive(flag, v); !s.ok()) return s;
  }
  o.onboard_deadline_seconds = f.onboard_deadline_ms / 1e3;
  o.layerwise_onboard = f.layerwise_onboard;
  o.slo_ttft_seconds = f.slo_ttft_ms / 1e3;
  o.slo_itl_seconds = f.slo_itl_ms / 1e3;
  o.closed_loop = !f.open_loop;
  if (f.max_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-batched-tokens ", f.max_batched_tokens, ": must be >= 1"));
  }
  if (f.max_running < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-running ", f.max_running, ": must be >= 1"));
  }
  if (f.preemption != "recompute" && f.preemption != "swap") {
    return absl::InvalidArgumentError(
        absl::StrCat("--preemption ", f.preemption, ": must be recompute or swap"));
  }
  if (f.policy != "lru" && f.policy != "cost_aware" && f.policy != "reuse_index" &&
      f.policy != "learned") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--policy ", f.policy, ": must be lru, cost_aware, reuse_index or learned"));
  }
  o.kvtier_policy = f.policy;
  auto hints = ParseServeHints(f.hints);
  if (!hints.ok())
    return absl::InvalidArgumentError(absl::StrCat("--", hints.status().message()));
  o.kvtier_hints = *hints;
  o.kvtier_demote_by_value = f.demote_by_value;
  o.scheduler = {.max_batched_tokens = f.max_batched_tokens,
                 .max_running = f.max_running,
                 .swap = f.preemption == "swap"};
  o.links.pcie_bytes_per_second = f.pcie_bandwidth;
  o.links.nvme_bytes_per_second = f.nvme_bandwidth;
  o.links.network_bytes_per_second = f.network_bandwidth;
  o.max_requests = max_requests;
  for (int t = 0; t < kNumTiers; ++t) {
    auto blocks = TierBlocks(t, f.size[t], geometry->bytes_per_block());
    if (!blocks.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kSizeFlags[t], ": ", blocks.status().message()));
    }
    o.capacity_blocks[t] = *blocks;
  }
  // The sweep's points; without one, one point (kNone) at the flags' values.
  if (!f.sweep.empty() && !f.rate_scale.empty()) {
    // A grid of both would multiply the runs; one sweep at a time keeps each figure readable.
    return absl::InvalidArgumentError(absl::StrCat("--sweep ", f.sweep, " and --rate-scale ",
                                                   f.rate_scale, ": one sweep at a time"));
  }
  std::vector<ServeSweepPoint> points = {ServeSweepPoint{}};
  if (!f.sweep.empty()) {
    auto p = ParseTierSweep(f.sweep, geometry->bytes_per_block());
    if (!p.ok()) return p.status();
    points = *std::move(p);
  } else if (!f.rate_scale.empty()) {
    auto p = ParseRateScales(f.rate_scale);
    if (!p.ok()) return p.status();
    points = *std::move(p);
  }
  std::vector<ServeProfile> profiles;
  if (f.compare) {
    profiles.assign(std::begin(kAllServeProfiles), std::end(kAllServeProfiles));
  } else {
    auto p = ParseServeProfile(f.profile);
    if (!p.ok())
      return absl::InvalidArgumentError(absl::StrCat("--profile: ", p.status().message()));
    profiles.push_back(*p);
  }
  // Unwritable --json and --plot paths are found before the runs, not after them.
  for (auto [flag, path] :
       {std::pair<const char*, const std::string&>{"--json", f.json}, {"--plot", f.plot}}) {
    if (path.empty()) continue;
    if (absl::Status s = CheckWritablePath(path); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
    }
  }
  std::vector<ServeRun> runs;
  for (ServeSweepPoint& point : points) {
    ServeOptions po = o;
    // The scaled trace lives for this point's runs only: at most one copy beside the input.
    std::optional<Trace> scaled;
    std::string label_suffix;
    if (point.kind == ServeSweepPoint::Kind::kTier) {
      po.capacity_blocks[point.tier] = point.blocks;
      label_suffix =
          absl::StrCat(" ", kTierKeys[point.tier], "=",
                       point.tier == kHbm && point.blocks == 0 ? std::string("auto")
                                                               : absl::StrCat(point.blocks));
    } else if (point.kind == ServeSweepPoint::Kind::kRateScale) {
      auto t = ScaleRate(trace, point.rate_scale);
      if (!t.ok()) return t.status();
      scaled = *std::move(t);
      label_suffix = absl::StrCat(" x", point.rate_scale);
    }
    for (ServeProfile p : profiles) {
      po.profile = p;
      if (progress) po.progress = progress(absl::StrCat(ServeProfileName(p), label_suffix));
      auto r = RunServe(scaled.has_value() ? *scaled : trace, po);
      if (!r.ok()) return r.status();
      // HBM "auto" is sized by the run: the point reports the blocks it got.
      if (point.kind == ServeSweepPoint::Kind::kTier && point.tier == kHbm) {
        point.blocks = r->capacity_blocks[kHbm];
      }
      runs.push_back({*std::move(r), point});
    }
  }
  const ServeReport& first = runs[profiles.size() - 1].report;  // the last profile has every tier
  std::string sweep;
  if (!f.sweep.empty()) sweep = absl::StrCat("; sweep ", f.sweep);
  if (!f.rate_scale.empty()) sweep = absl::StrCat("; load x ", f.rate_scale);
  std::printf(
      "serving: %d x %s (tp %d), router %s; tiers per instance (blocks): hbm %lld, dram "
      "%lld, nvme %lld, remote %lld%s; %s%s\n",
      first.instances, first.gpu.c_str(), first.tensor_parallel, first.router.c_str(),
      static_cast<long long>(first.capacity_blocks[0]),
      static_cast<long long>(first.capacity_blocks[1]),
      static_cast<long long>(first.capacity_blocks[2]),
      static_cast<long long>(first.capacity_blocks[3]),
      first.shared_remote ? " (one store for the fleet)" : "",
      o.closed_loop ? "sessions closed-loop" : "open-loop", sweep.c_str());
  std::printf("%s", ServeTable(runs).c_str());
  if (!f.json.empty()) {
    std::ofstream out(f.json, std::ios::binary | std::ios::trunc);
    out << ServeJson(runs);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", f.json));
  }
  if (!f.plot.empty()) {
    if (absl::Status s = Plot(f.plot, runs); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace kvtier::replay
