// kvtier-policy-sim: the shipped eviction policies on a trace under the single-tier model of the
// offline bounds (policy_sim.h), beside LRU and the optimum, as hit ratio and share of the
// LRU-to-optimum gap closed. The yardstick ../shared/policy/README.md asks a policy to meet
// before the richer replay is trusted. Usage:
//   kvtier-policy-sim --trace FILE_OR_DIR [--format auto|mooncake|claude-code]
//       [--tokens-per-block 512] [--caps 2000,5000,10000] [--policies lru,cost_aware,reuse_index]
//   kvtier-policy-sim --release-workload FILE [--caps ...] [--policies ...]
//       [--hints stop-reason,none]
// The second form is policy_lab_agentic.py's release model on the workload that script builds
// (release_model.h; export_release_workload.py writes FILE), each policy once per --hints value:
// stop-reason passes each release's stop reason and last_turn, none passes kUnknown and no
// last_turn (the script's hint-g-nostop control).
// Exit code 2 for bad input, 1 for a failed simulation.
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/replay/offline/bounds.h"
#include "bench/replay/offline/policy_sim.h"
#include "bench/replay/offline/release_model.h"
#include "bench/replay/trace/claude_code_trace.h"
#include "bench/replay/trace/mooncake_trace.h"
#include "kvtier/eviction_policy.h"

namespace kvtier::replay {
namespace {

absl::StatusOr<Trace> Load(const std::string& path, std::string format) {
  if (format == "auto") {
    std::error_code ec;
    const bool dir = std::filesystem::is_directory(path, ec);
    format = dir || absl::EndsWith(path, ".json") ? "claude-code" : "mooncake";
  }
  if (format == "mooncake") return LoadMooncakeTrace(path);
  if (format == "claude-code") return LoadClaudeCodeTraces(path);
  return absl::InvalidArgumentError("--format: expected auto, mooncake or claude-code");
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakePolicy(const std::string& name, int64_t cap,
                                                           const ReuseIndexOptions& reuse) {
  if (name == "reuse_index") return MakeReuseIndexPolicy(reuse);
  if (name == "learned") return MakeLearnedPolicy(cap, reuse);
  return MakeEvictionPolicy(name);
}

std::string GapClosed(double ratio, double lru_ratio, double optimal_ratio) {
  if (lru_ratio < 0 || optimal_ratio <= lru_ratio) return "";
  return absl::StrFormat("  gap closed %5.1f%%",
                         100 * (ratio - lru_ratio) / (optimal_ratio - lru_ratio));
}

// The release model (release_model.h) on `path`. Exit codes as Run's.
int RunRelease(const std::string& path, const std::vector<int64_t>& caps,
               const std::vector<std::string>& policies, const std::vector<std::string>& hints,
               const ReuseIndexOptions& reuse) {
  if (hints.empty()) {
    std::cerr << "--hints: give stop-reason, none or both\n";
    return 2;
  }
  for (const std::string& h : hints) {
    if (h != "stop-reason" && h != "none") {
      std::cerr << "--hints: expected stop-reason or none, got " << h << "\n";
      return 2;
    }
  }
  absl::StatusOr<ReleaseModelWorkload> workload = LoadReleaseModelWorkload(path);
  if (!workload.ok()) {
    std::cerr << workload.status() << "\n";
    return 2;
  }
  std::cout << absl::StrFormat("release model: requests %d\n", workload->trace.requests.size());
  for (int64_t cap : caps) {
    absl::StatusOr<BoundResult> optimal = ReleaseModelOptimum(*workload, cap);
    if (!optimal.ok()) {
      std::cerr << optimal.status() << "\n";
      return optimal.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    std::cout << absl::StrFormat("cap %d: optimal %.4f\n", cap, optimal->hit_ratio);
    double lru_ratio = -1;
    for (const std::string& name : policies) {
      for (const std::string& h : hints) {
        if (name == "lru" && h != hints.front()) continue;  // reads no hint
        absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = MakePolicy(name, cap, reuse);
        if (!policy.ok()) {
          std::cerr << policy.status() << "\n";
          return 2;
        }
        const absl::Time start = absl::Now();
        absl::StatusOr<BoundResult> r = SimulateReleaseModel(
            *workload, **policy, {.capacity_blocks = cap, .stop_reasons = h == "stop-reason"});
        if (!r.ok()) {
          std::cerr << r.status() << "\n";
          return 1;
        }
        if (name == "lru") lru_ratio = r->hit_ratio;
        const std::string label = name == "lru" ? name : absl::StrCat(name, " (", h, ")");
        std::cout << absl::StrFormat("  %-26s hit %.4f%s  (%.1f s)\n", label, r->hit_ratio,
                                     GapClosed(r->hit_ratio, lru_ratio, optimal->hit_ratio),
                                     absl::ToDoubleSeconds(absl::Now() - start));
      }
    }
  }
  return 0;
}

int Run(int argc, char** argv) {
  CLI::App app{"kvtier-policy-sim: eviction policies on a trace, single-tier model"};
  std::string trace_path, format = "auto";
  int tokens_per_block = 512;
  std::vector<int64_t> caps = {2000, 5000, 10000};
  std::vector<std::string> policies = {"lru", "cost_aware", "reuse_index", "learned"};
  std::string release_path;
  std::vector<std::string> hints = {"stop-reason", "none"};
  CLI::Option* trace_option = app.add_option(
      "--trace", trace_path, "Mooncake JSON Lines, or Claude Code file or folder");
  CLI::Option* release_option = app.add_option(
      "--release-workload", release_path,
      "policy_lab_agentic.py's workload (export_release_workload.py): its release model");
  trace_option->excludes(release_option);
  app.add_option("--hints", hints, "release model: stop-reason and/or none")
      ->delimiter(',')
      ->needs(release_option);
  app.add_option("--format", format, "auto, mooncake or claude-code")->excludes(release_option);
  app.add_option("--tokens-per-block", tokens_per_block, "cache block size in tokens")
      ->excludes(release_option);
  app.add_option("--caps", caps, "capacities in blocks")->delimiter(',');
  app.add_option("--policies", policies, "policies (eviction_policy.h names)")->delimiter(',');
  ReuseIndexOptions reuse;
  app.add_option("--reuse-sample", reuse.sample_size,
                 "reuse_index: candidates ranked per victim (0: all)");
  app.add_option("--reuse-session-grid", reuse.session_table.grid_seconds,
                 "reuse_index: session-return index resolution, seconds "
                 "(policy_lab_agentic.py: 1)");
  std::string ties = "access";
  app.add_option("--reuse-ties", ties,
                 "reuse_index: equal ranks go by last access (access) or by release (release: "
                 "policy_lab_agentic.py's order)")
      ->check(CLI::IsMember({"access", "release"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  reuse.ties_by_release = ties == "release";
  if (!release_path.empty()) return RunRelease(release_path, caps, policies, hints, reuse);
  if (trace_path.empty()) {
    std::cerr << "one of --trace or --release-workload is required\n";
    return 2;
  }
  absl::StatusOr<Trace> trace = Load(trace_path, format);
  if (!trace.ok()) {
    std::cerr << trace.status() << "\n";
    return 2;
  }
  absl::StatusOr<BoundResult> unlimited = UnlimitedBound(*trace, tokens_per_block);
  if (!unlimited.ok()) {
    std::cerr << unlimited.status() << "\n";
    return 2;
  }
  std::cout << absl::StrFormat("requests %d  unlimited hit ratio %.4f\n", trace->requests.size(),
                               unlimited->hit_ratio);
  for (int64_t cap : caps) {
    absl::StatusOr<BoundResult> optimal = OptimalBound(*trace, tokens_per_block, cap);
    if (!optimal.ok()) {
      std::cerr << optimal.status() << "\n";
      return 2;
    }
    PolicySimOptions options{.tokens_per_block = tokens_per_block, .capacity_blocks = cap};
    double lru_ratio = -1;
    std::cout << absl::StrFormat("cap %d: optimal %.4f\n", cap, optimal->hit_ratio);
    for (const std::string& name : policies) {
      absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = MakePolicy(name, cap, reuse);
      if (!policy.ok()) {
        std::cerr << policy.status() << "\n";
        return 2;
      }
      const absl::Time start = absl::Now();
      absl::StatusOr<BoundResult> r = SimulatePolicy(*trace, **policy, options);
      if (!r.ok()) {
        std::cerr << r.status() << "\n";
        return 1;
      }
      if (name == "lru") lru_ratio = r->hit_ratio;
      std::cout << absl::StrFormat("  %-12s hit %.4f%s  (%.1f s)\n", name, r->hit_ratio,
                                   GapClosed(r->hit_ratio, lru_ratio, optimal->hit_ratio),
                                   absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::replay

int main(int argc, char** argv) { return kvtier::replay::Run(argc, argv); }
