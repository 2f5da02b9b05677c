// kvtier-policy-sim: the shipped eviction policies on a trace under the single-tier model of the
// offline bounds (policy_sim.h), beside LRU and the optimum, as hit ratio and share of the
// LRU-to-optimum gap closed. The yardstick ../shared/policy/README.md asks a policy to meet
// before the richer replay is trusted. Usage:
//   kvtier-policy-sim --trace FILE_OR_DIR [--format auto|mooncake|claude-code]
//       [--tokens-per-block 512] [--caps 2000,5000,10000] [--policies lru,cost_aware,reuse_index]
// Exit code 2 for bad input, 1 for a failed simulation.
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/replay/offline/bounds.h"
#include "bench/replay/offline/policy_sim.h"
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

int Run(int argc, char** argv) {
  CLI::App app{"kvtier-policy-sim: eviction policies on a trace, single-tier model"};
  std::string trace_path, format = "auto";
  int tokens_per_block = 512;
  std::vector<int64_t> caps = {2000, 5000, 10000};
  std::vector<std::string> policies = {"lru", "cost_aware", "reuse_index", "learned"};
  app.add_option("--trace", trace_path, "Mooncake JSON Lines, or Claude Code file or folder")
      ->required();
  app.add_option("--format", format, "auto, mooncake or claude-code");
  app.add_option("--tokens-per-block", tokens_per_block, "cache block size in tokens");
  app.add_option("--caps", caps, "capacities in blocks")->delimiter(',');
  app.add_option("--policies", policies, "policies (eviction_policy.h names)")->delimiter(',');
  ReuseIndexOptions reuse;
  app.add_option("--reuse-sample", reuse.sample_size,
                 "reuse_index: candidates ranked per victim (0: all)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
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
      absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy =
          name == "reuse_index" ? MakeReuseIndexPolicy(reuse)
          : name == "learned"   ? MakeLearnedPolicy(cap, reuse)
                                : MakeEvictionPolicy(name);
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
      std::string gap = "";
      if (lru_ratio >= 0 && optimal->hit_ratio > lru_ratio) {
        gap = absl::StrFormat("  gap closed %5.1f%%",
                              100 * (r->hit_ratio - lru_ratio) / (optimal->hit_ratio - lru_ratio));
      }
      std::cout << absl::StrFormat("  %-12s hit %.4f%s  (%.1f s)\n", name, r->hit_ratio, gap,
                                   absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::replay

int main(int argc, char** argv) { return kvtier::replay::Run(argc, argv); }
