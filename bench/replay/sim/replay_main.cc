// kvtier-replay: replays a request trace (Mooncake JSON Lines, Claude Code sessions, or the
// embedded agentic workload) through a real KvCache and reports hits, bytes moved and the
// prefill time saved, beside baselines and offline bounds. docs/replay.md is the manual.
//
// Exit codes: 0 done; 2 bad flags or a malformed trace (nothing written); 1 anything else.
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/replay/offline/bounds.h"
#include "bench/replay/sim/model_table.h"
#include "bench/replay/sim/replay.h"
#include "bench/replay/sim/report.h"
#include "bench/replay/sim/serve_command.h"
#include "bench/replay/trace/agentic_workload.h"
#include "bench/replay/trace/azure_trace.h"
#include "bench/replay/trace/claude_code_trace.h"
#include "bench/replay/trace/mooncake_trace.h"

namespace kvtier::replay {
namespace {

constexpr const char* kTierKeys[kNumTiers] = {"hbm", "dram", "nvme", "remote"};
constexpr const char* kSizeFlag[kNumTiers] = {"--hbm", "--dram", "--nvme", "--remote-size"};

struct Flags {
  bool demote_by_value = true;
  std::string mode = "serve";
  std::string workload = "agentic";
  std::string trace;
  std::string format = "auto";
  std::string model;  // default: Llama-3.1-70B (cache), Llama-3.1-8B (serve)
  std::string geometry_csv;
  int tokens_per_block = 0;
  double active_params = 0;
  std::array<std::string, kNumTiers> size = {"80GiB", "512GiB", "2TiB", "8TiB"};
  std::string nvme_path;
  std::string keep_state;
  std::string remote;
  std::string policy = "lru";
  bool compare = false;
  std::string sweep;
  std::string plot;
  std::string payload = "none";
  int payload_bytes_per_token = 4;
  std::string hints = "pause";
  // One prefill instance: 8 x H200 (tensor parallel) at 989 TFLOP/s bf16 dense and ~40% MFU.
  double prefill_flops = 8 * 4e14;
  int prefill_instances = 1;
  // H200 server links: PCIe Gen5 x16 pinned copies, one NVMe Gen4 drive, a 100 Gb/s network.
  std::array<double, kNumTiers> bandwidth = {0, 50e9, 6e9, 12.5e9};
  std::array<double, kNumTiers> latency_us = {0, 10, 100, 500};
  std::string json;
  int64_t max_requests = -1;
  bool quiet = false;
  ServeFlags serve;
};

// Set by SIGINT and SIGTERM: the run stops after its current request, so its scratch directory
// (payload scaled: an NVMe file and a directory store) is removed on the way out. A signal
// handler can only reach a flag like this; it is the program's one piece of global state.
volatile sig_atomic_t stop_requested = 0;
void RequestStop(int) { stop_requested = 1; }
void InstallStopHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = RequestStop;
  sa.sa_flags = SA_RESETHAND;  // a second signal kills at once
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Exit code 2: the user's input is wrong.
struct InputError {
  absl::Status status;
};

absl::StatusOr<Trace> LoadTrace(const Flags& f) {
  if (f.trace.empty()) {
    if (f.workload != "agentic") {
      return absl::InvalidArgumentError(
          absl::StrCat("--workload ", f.workload, ": the only embedded workload is agentic"));
    }
    return GenerateAgenticWorkload(AgenticOptions{});
  }
  std::string format = f.format;
  if (format == "auto") {
    std::error_code ec;
    const bool dir = std::filesystem::is_directory(f.trace, ec);
    format = dir || absl::EndsWith(f.trace, ".json") ? "claude-code"
             : absl::EndsWith(f.trace, ".csv")               ? "azure"
                                                             : "mooncake";
  }
  if (format == "azure") return LoadAzureTrace(f.trace);
  if (format == "mooncake") return LoadMooncakeTrace(f.trace);
  if (format == "claude-code") return LoadClaudeCodeTraces(f.trace);
  return absl::InvalidArgumentError(
      absl::StrCat("--format ", format, ": expected auto, mooncake, claude-code or azure"));
}

// Writes `text` to `path` through a temporary file and a rename: a reader never sees half.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return absl::UnavailableError(absl::StrCat("cannot rename to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// Progress on stderr: on a terminal a bar redrawn in place (requests done, rate, ETA); in a pipe
// or a log, a line every 5 s, so a slow run is never silent.
class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {}
  std::function<void(int64_t, int64_t)> Callback(std::string label) {
    if (!enabled_) return nullptr;
    const auto start = std::chrono::steady_clock::now();
    return [this, label = std::move(label), start, last = int64_t{-1}, last_line = start](
               int64_t done, int64_t total) mutable {
      const auto now = std::chrono::steady_clock::now();
      const double s = std::chrono::duration<double>(now - start).count();
      const double rate = s > 0 ? static_cast<double>(done) / s : 0;
      const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
      if (!tty_) {
        if (std::chrono::duration<double>(now - last_line).count() < 5 && done != total) return;
        last_line = now;
        std::fprintf(stderr, "kvtier-replay: %s %lld/%lld requests, %.0f s, ETA %.0f s\n",
                     label.c_str(), static_cast<long long>(done), static_cast<long long>(total), s,
                     eta);
        return;
      }
      const int64_t step = std::max<int64_t>(1, total / 200);
      if (done != total && last >= 0 && done - last < step) return;
      last = done;
      const int width = 30;
      const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
      std::fprintf(stderr, "\r%-14s [%s%s] %lld/%lld  %.0f req/s  ETA %.0f s ", label.c_str(),
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   static_cast<long long>(done), static_cast<long long>(total), rate, eta);
      if (done == total) std::fprintf(stderr, "\r%*s\r", 100, "");
      std::fflush(stderr);
    };
  }

 private:
  bool enabled_;
  bool tty_;
};

int64_t TotalBlocks(const std::array<int64_t, kNumTiers>& c) {
  int64_t total = 0;
  for (int64_t b : c) total += b > 0 ? b : 0;
  return total;
}

// The runs of one configuration: the policy, or with --compare both policies, the bounds and
// the recompute_all baseline.
absl::StatusOr<std::vector<ReplayReport>> RunAll(const Trace& trace, const ReplayOptions& base,
                                                 bool compare, Progress& progress) {
  std::vector<ReplayReport> out;
  const std::vector<std::string> policies =
      compare ? std::vector<std::string>{"lru", "cost_aware", "reuse_index", "learned"}
              : std::vector<std::string>{base.policy};
  for (const std::string& policy : policies) {
    ReplayOptions o = base;
    o.policy = policy;
    o.label = policy;
    o.progress = progress.Callback(policy);
    auto r = RunReplay(trace, o);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  if (!compare) return out;
  const int b = base.geometry.tokens_per_block();
  auto unlimited = UnlimitedBound(trace, b);
  if (!unlimited.ok()) return unlimited.status();
  bool any_unlimited = false;
  for (const TierCapacity& c : base.capacity) {
    any_unlimited = any_unlimited || c.kind == TierCapacity::Kind::kUnlimited;
  }
  // Optimal at the sum of the tiers' blocks: a cache of that many blocks anywhere can hit no
  // more (with unlimited tiers, the unlimited bound).
  std::optional<BoundResult> optimal;
  if (!any_unlimited) {
    auto o = OptimalBound(trace, b, TotalBlocks(out.front().capacity_blocks));
    if (!o.ok()) return o.status();
    optimal = *std::move(o);
  }
  const std::vector<int64_t> none(trace.requests.size(), 0);
  for (auto [name, hits] : {std::pair<std::string, const std::vector<int64_t>*>{
                                "unlimited", &unlimited->hit_tokens_per_request},
                            {"optimal", optimal.has_value() ? &optimal->hit_tokens_per_request
                                                            : &unlimited->hit_tokens_per_request},
                            {"recompute_all", &none}}) {
    auto r = BoundReport(trace, base, name, *hits);
    if (!r.ok()) return r.status();
    r->capacity_blocks = out.front().capacity_blocks;
    if (name == "unlimited") r->capacity_blocks = {-1, -1, -1, -1};
    out.push_back(*std::move(r));
  }
  return out;
}

// The learned policy's miniature simulations, measured inside the run (issue 14 asks them to
// cost at most 5% of the replay's time).
void PrintShadowCost(const std::vector<ReplayReport>& reports) {
  for (const ReplayReport& r : reports) {
    if (r.value_drops > 0) {
      std::printf("%s: %lld victims dropped rather than demoted (not worth restoring)\n",
                  r.name.c_str(), static_cast<long long>(r.value_drops));
    }
    if (r.policy_shadow_seconds <= 0 || r.wall_seconds <= 0) continue;
    std::printf(
        "%s: shadow caches %.3f s of %.2f s wall (%.1f%%), %lld leader changes, %lld prompt "
        "blocks simulated\n",
        r.name.c_str(), r.policy_shadow_seconds, r.wall_seconds,
        100.0 * r.policy_shadow_seconds / r.wall_seconds,
        static_cast<long long>(r.policy_leader_changes),
        static_cast<long long>(r.policy_shadow_accesses));
  }
}

absl::Status Plot(const std::string& path, const std::string& tier,
                  const std::vector<int64_t>& capacities,
                  const std::vector<std::vector<ReplayReport>>& points) {
  if (points.empty()) return absl::OkStatus();
  const std::string data = path + ".dat";
  {
    std::ofstream out(data);
    out << "# capacity_blocks";
    for (const ReplayReport& r : points.front())
      out << " " << r.name << "_hit " << r.name << "_ttft_p50_ms";
    out << "\n";
    for (size_t i = 0; i < points.size(); ++i) {
      out << capacities[i];
      for (const ReplayReport& r : points[i]) out << " " << r.hit_ratio << " " << r.ttft_p50_ms;
      out << "\n";
    }
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", data));
  }
  std::string script =
      absl::StrCat("set terminal pngcairo noenhanced size 1100,450; set output '", path, "';",
                   "set multiplot layout 1,2 title '", points.front().front().trace, "';",
                   "set key bottom right; set grid; set xlabel '", tier, " capacity (blocks)';",
                   "set ylabel 'hit ratio'; plot ");
  for (size_t k = 0; k < points.front().size(); ++k) {
    absl::StrAppend(&script, k ? ", " : "", "'", data, "' using 1:", 2 + 2 * k,
                    " with linespoints title '", points.front()[k].name, "'");
  }
  absl::StrAppend(&script,
                  "; set key top right; set logscale y; set ylabel 'modeled TTFT p50 (ms)'; plot ");
  for (size_t k = 0; k < points.front().size(); ++k) {
    absl::StrAppend(&script, k ? ", " : "", "'", data, "' using 1:", 3 + 2 * k,
                    " with linespoints title '", points.front()[k].name, "'");
  }
  absl::StrAppend(&script, "; unset multiplot\n");
  const std::string script_path = path + ".gp";
  if (absl::Status s = WriteFileAtomically(script_path, script); !s.ok()) return s;
  // The only shell word is the script's path, single-quoted.
  std::string quoted = "'";
  for (char c : script_path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string cmd = absl::StrCat("gnuplot ", quoted);
  if (std::system(cmd.c_str()) != 0) {
    return absl::UnavailableError("gnuplot failed (is gnuplot-nox installed?)");
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Flags f;
  CLI::App app{"kvtier-replay: replay a request trace through a real KvCache (docs/replay.md)"};
  app.add_option("--mode", f.mode,
                 "serve (default: a serving simulation, every profile side by side) or cache "
                 "(the sequential cache replay against the offline bounds)");
  app.add_option("--workload", f.workload, "embedded workload when no --trace: agentic");
  app.add_option("--trace", f.trace,
                 "Mooncake JSON Lines file, or a Claude Code session file or folder");
  app.add_option("--format", f.format, "auto (by extension: .jsonl, .json or a folder, .csv), mooncake, claude-code or azure");
  app.add_option("--model", f.model, "model geometry and prefill cost, e.g. Llama-3.1-70B");
  app.add_option("--geometry-csv", f.geometry_csv,
                 "more models, columns as shared/models/kv_geometry.csv");
  app.add_option("--active-params", f.active_params,
                 "active parameters for the prefill cost model (models from --geometry-csv)");
  app.add_option("--tokens-per-block", f.tokens_per_block,
                 "cache block size in tokens (default: the trace's block size)");
  app.add_option("--hbm", f.size[0], "HBM for KV: bytes (80GiB), Nblocks, unlimited");
  app.add_option("--dram", f.size[1], "pinned DRAM tier size, 0 for none");
  app.add_option("--nvme", f.size[2], "NVMe tier size, 0 for none");
  app.add_option("--remote-size", f.size[3], "remote tier size, 0 for none");
  app.add_option("--nvme-path", f.nvme_path,
                 "directory for the NVMe file and remote directory store (payload scaled)");
  app.add_option("--keep-state", f.keep_state,
                 "payload scaled: keep the NVMe file and the directory store in this directory "
                 "between runs (the next run starts with them); not with --compare or --sweep");
  app.add_option("--remote", f.remote,
                 "remote store: redis://[[user]:password@]host:port[/db] or "
                 "redis-cluster://h:p,... (payload scaled; default a directory)");
  app.add_option("--policy", f.policy,
                 "eviction policy: lru, cost_aware, reuse_index or learned (serve: the kvtier "
                 "profile's, default learned)");
  app.add_flag("--compare", f.compare,
               "run lru, cost_aware, reuse_index and learned, the unlimited and optimal bounds, "
               "and recompute_all");
  app.add_option("--sweep", f.sweep,
                 "capacity sweep, TIER=SIZE,SIZE,... e.g. hbm=2000blocks,5000blocks");
  app.add_option("--plot", f.plot,
                 "draw to this PNG (gnuplot): cache mode, with --sweep: hit ratio and TTFT; "
                 "serve: the TTFT CDF, or with a sweep TTFT p50/p90 and output tokens/s");
  app.add_option("--payload", f.payload, "none (metadata only) or scaled (real, verified bytes)");
  app.add_option("--payload-bytes-per-token", f.payload_bytes_per_token,
                 "payload scaled: bytes per token, multiple of 4");
  app.add_option("--demote-by-value", f.demote_by_value,
                 "true (default): demote a victim only if worth restoring later "
                 "(KvCacheOptions::demote_by_value); false: demote every victim (serve: the "
                 "kvtier profile's)");
  app.add_option("--hints", f.hints,
                 "none, pause (Pause after tool_use, Resume on return), stop-reason (Release with "
                 "the stop reason), or oracle-idle (stop reason and the true time to the "
                 "session's next request: an oracle); serve: the kvtier profile's, none, "
                 "stop-reason (default) or oracle-idle");
  app.add_option("--prefill-flops", f.prefill_flops,
                 "sustained FLOP/s of one prefill instance (default 8 x H200 at 40% MFU)");
  app.add_option("--prefill-instances", f.prefill_instances, "prefill instances serving the queue");
  app.add_option("--dram-bandwidth", f.bandwidth[1], "DRAM->HBM bytes/s");
  app.add_option("--nvme-bandwidth", f.bandwidth[2], "NVMe->HBM bytes/s");
  app.add_option("--remote-bandwidth", f.bandwidth[3], "remote->HBM bytes/s");
  app.add_option("--dram-latency-us", f.latency_us[1], "DRAM restore latency, us");
  app.add_option("--nvme-latency-us", f.latency_us[2], "NVMe restore latency, us");
  app.add_option("--remote-latency-us", f.latency_us[3], "remote restore latency, us");
  app.add_option("--json", f.json, "write the report as JSON to this file");
  app.add_option("--max-requests", f.max_requests, "replay only the first N requests");
  app.add_flag("--quiet", f.quiet, "no progress bar");
  // --mode serve
  ServeFlags& sf = f.serve;
  std::vector<CLI::Option*> serve_only;
  serve_only.push_back(app.add_option("--gpu", sf.gpu, "serve: GPU kind, H100, H200 or B200"));
  serve_only.push_back(
      app.add_option("--tp", sf.tensor_parallel, "serve: tensor-parallel GPUs per instance"));
  serve_only.push_back(
      app.add_option("--instances", sf.instances, "serve: instances in the fleet"));
  serve_only.push_back(app.add_option("--router", sf.router,
                                      "serve: round_robin, least_loaded, session or kv_aware"));
  serve_only.push_back(app.add_option(
      "--shared-remote", sf.shared_remote,
      "serve: the instances' remote tiers share one store (true, the default) or not (false)"));
  serve_only.push_back(app.add_option(
      "--profile", sf.profile,
      "serve: one profile (recompute, hbm_lru, dram_lru, hicache, kvtier) instead of all"));
  serve_only.push_back(app.add_option(
      "--onboard-deadline-ms", sf.onboard_deadline_ms,
      "serve: how long an admitted request waits for its prefix to land before recomputing it"));
  serve_only.push_back(app.add_flag(
      "--layerwise-onboard", sf.layerwise_onboard,
      "serve: a restoring request computes while its later layers land (layer-wise overlap)"));
  serve_only.push_back(
      app.add_flag("--open-loop", sf.open_loop,
                   "serve: sessions' requests at their trace times (not closed-loop)"));
  serve_only.push_back(app.add_option("--slo-ttft", sf.slo_ttft_ms, "serve: TTFT SLO, ms"));
  serve_only.push_back(
      app.add_option("--slo-itl", sf.slo_itl_ms, "serve: mean inter-token latency SLO, ms"));
  serve_only.push_back(app.add_option("--max-batched-tokens", sf.max_batched_tokens,
                                      "serve: token budget per step"));
  serve_only.push_back(
      app.add_option("--max-running", sf.max_running, "serve: running requests per instance"));
  serve_only.push_back(app.add_option(
      "--preemption", sf.preemption,
      "serve: recompute (the default) or swap (a decoding victim's KV goes one tier down)"));
  serve_only.push_back(app.add_option("--mfu", sf.mfu, "serve: matmul efficiency, (0, 1]"));
  serve_only.push_back(app.add_option("--pcie-bandwidth", sf.pcie_bandwidth,
                                      "serve: PCIe bytes/s per direction per instance"));
  serve_only.push_back(app.add_option("--network-bandwidth", sf.network_bandwidth,
                                      "serve: network bytes/s to the remote store per instance"));
  serve_only.push_back(app.add_option(
      "--rate-scale", sf.rate_scale,
      "serve: load sweep X,Y,...: the runs again with arrivals and think times divided by each"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  auto fail = [](const absl::Status& s, int code) {
    std::fprintf(stderr, "kvtier-replay: %s\n", s.ToString().c_str());
    return code;
  };
  if (f.mode != "serve" && f.mode != "cache") {
    return fail(absl::InvalidArgumentError(absl::StrCat("--mode ", f.mode, ": serve or cache")), 2);
  }
  const bool serve = f.mode == "serve";
  // A flag of the other mode is refused, not ignored.
  static constexpr const char* kCacheOnly[] = {
      "--payload",         "--payload-bytes-per-token",
      "--prefill-flops",   "--prefill-instances",
      "--keep-state",      "--remote",           "--nvme-path",
      "--dram-bandwidth",  "--remote-bandwidth", "--dram-latency-us",
      "--nvme-latency-us", "--remote-latency-us"};
  for (const char* name : kCacheOnly) {
    if (serve && app.count(name) > 0) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
                      name,
                      " belongs to --mode cache (the serving simulation models its own "
                      "hardware: see --help)")),
                  2);
    }
  }
  for (CLI::Option* option : serve_only) {
    if (!serve && option->count() > 0) {
      return fail(
          absl::InvalidArgumentError(absl::StrCat(option->get_name(), " belongs to --mode serve")),
          2);
    }
  }
  if (f.max_requests < -1 || (app.count("--max-requests") > 0 && f.max_requests < 0)) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("--max-requests ", f.max_requests, ": must be >= 0")),
                2);
  }
  if (app.count("--active-params") > 0 && !(f.active_params > 0)) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("--active-params ", f.active_params, ": must be > 0")),
                2);
  }
  if (app.count("--tokens-per-block") > 0 && f.tokens_per_block <= 0) {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat("--tokens-per-block ", f.tokens_per_block, ": must be positive")),
                2);
  }
  if (!serve && !f.plot.empty() && f.sweep.empty()) {
    return fail(absl::InvalidArgumentError("--plot needs --sweep (it draws the sweep's points)"),
                2);
  }
  if (!f.json.empty()) {
    // An unwritable --json path is found now, not after the run.
    if (absl::Status s = CheckWritablePath(f.json); !s.ok()) {
      return fail(absl::InvalidArgumentError(absl::StrCat("--json: ", s.message())), 2);
    }
  }
  if (f.model.empty()) f.model = serve ? "Llama-3.1-8B" : "Llama-3.1-70B";

  // The model.
  std::vector<ModelSpec> models = BuiltInModels();
  if (!f.geometry_csv.empty()) {
    auto more = LoadGeometryCsv(f.geometry_csv);
    if (!more.ok()) return fail(more.status(), 2);
    models.insert(models.begin(), more->begin(), more->end());
  }
  auto spec = FindModel(models, f.model);
  if (!spec.ok()) return fail(spec.status(), 2);
  if (f.active_params > 0) {
    if (spec->hidden_size <= 0) {
      return fail(absl::InvalidArgumentError(
                      absl::StrCat("--active-params: model ", spec->name, " has no hidden_size")),
                  2);
    }
    spec->cost = PrefillCostOptions{.params = f.active_params,
                                    .num_layers = spec->geometry.num_layers,
                                    .d_model = spec->hidden_size};
  }
  if (!spec->cost.has_value()) {
    return fail(
        absl::InvalidArgumentError(absl::StrCat(
            "model ", spec->name,
            " has no known active parameter count for the cost model: pass --active-params")),
        2);
  }

  auto trace = LoadTrace(f);
  if (!trace.ok()) return fail(trace.status(), 2);
  // The first N requests are the trace: the bounds must not look past them.
  if (f.max_requests >= 0 && static_cast<size_t>(f.max_requests) < trace->requests.size()) {
    trace->requests.resize(static_cast<size_t>(f.max_requests));
  }
  if (f.tokens_per_block < 0) {
    return fail(absl::InvalidArgumentError("--tokens-per-block must be positive"), 2);
  }

  if (serve) {
    sf.compare = f.compare || app.count("--profile") == 0;
    sf.json = f.json;
    sf.sweep = f.sweep;
    sf.plot = f.plot;
    sf.quiet = f.quiet;
    if (app.count("--policy") > 0) sf.policy = f.policy;
    if (app.count("--hints") > 0) sf.hints = f.hints;
    sf.demote_by_value = f.demote_by_value;
    for (int t = 0; t < kNumTiers; ++t) {
      if (app.count(kSizeFlag[t]) > 0) sf.size[t] = f.size[t];
    }
    if (app.count("--nvme-bandwidth") > 0) sf.nvme_bandwidth = f.bandwidth[2];
    std::printf("kvtier-replay --mode serve: %s, %zu requests, %d-token trace blocks; model %s\n",
                trace->name.c_str(), trace->requests.size(), trace->block_tokens,
                spec->name.c_str());
    Progress progress(!f.quiet);
    absl::Status s = RunServeCommand(
        sf, *spec, f.tokens_per_block > 0 ? f.tokens_per_block : trace->block_tokens, *trace,
        f.max_requests, [&](const std::string& label) { return progress.Callback(label); });
    if (!s.ok()) return fail(s, absl::IsInvalidArgument(s) ? 2 : 1);
    return 0;
  }

  KvGeometryOptions go = spec->geometry;
  go.tokens_per_block = f.tokens_per_block > 0 ? f.tokens_per_block : trace->block_tokens;
  auto geometry = KvGeometry::Create(go);
  if (!geometry.ok()) return fail(geometry.status(), 2);
  ReplayOptions o(*geometry);
  o.model_name = spec->name;
  o.prefill = *spec->cost;
  o.prefill.flops_per_second = f.prefill_flops;
  o.prefill_instances = f.prefill_instances;
  for (int t = 0; t < kNumTiers; ++t) {
    auto c = ParseTierSize(f.size[t], o.geometry.bytes_per_block());
    if (!c.ok())
      return fail(
          absl::InvalidArgumentError(absl::StrCat("--", kTierKeys[t], ": ", c.status().message())),
          2);
    o.capacity[t] = *c;
    o.links[t] = TierLinkCost{absl::Microseconds(f.latency_us[t]), f.bandwidth[t]};
  }
  o.policy = f.policy;
  if (f.payload != "none" && f.payload != "scaled") {
    return fail(absl::InvalidArgumentError("--payload: none or scaled"), 2);
  }
  o.payload = f.payload == "scaled" ? PayloadMode::kScaled : PayloadMode::kNone;
  o.payload_bytes_per_token = f.payload_bytes_per_token;
  o.demote_by_value = f.demote_by_value;
  if (f.hints == "none") {
    o.hints = HintMode::kNone;
  } else if (f.hints == "pause") {
    o.hints = HintMode::kPause;
  } else if (f.hints == "stop-reason") {
    o.hints = HintMode::kStopReason;
  } else if (f.hints == "oracle-idle") {
    o.hints = HintMode::kOracleIdle;
  } else {
    return fail(absl::InvalidArgumentError("--hints: none, pause, stop-reason or oracle-idle"), 2);
  }
  o.cancelled = [] { return stop_requested != 0; };
  InstallStopHandlers();
  o.work_dir = f.nvme_path;
  o.remote_url = f.remote;
  o.keep_state_dir = f.keep_state;
  if (!f.keep_state.empty() && (f.compare || !f.sweep.empty())) {
    // Every run of a comparison or sweep would start from the one before it.
    return fail(absl::InvalidArgumentError("--keep-state: one run at a time (not with --compare "
                                           "or --sweep)"),
                2);
  }

  std::printf(
      "kvtier-replay: %s, %zu requests, %d-token trace blocks; model %s (%s per %d-token block), "
      "payload %s, hints %s\n",
      trace->name.c_str(), trace->requests.size(), trace->block_tokens, spec->name.c_str(),
      FormatBytes(static_cast<double>(o.geometry.bytes_per_block())).c_str(),
      o.geometry.tokens_per_block(), f.payload.c_str(), f.hints.c_str());
  Progress progress(!f.quiet);

  if (f.sweep.empty()) {
    auto reports = RunAll(*trace, o, f.compare, progress);
    if (!reports.ok()) {
      return fail(reports.status(), absl::IsInvalidArgument(reports.status()) ? 2 : 1);
    }
    const ReplayReport& first = reports->front();
    std::printf("tiers (blocks): hbm %lld, dram %lld, nvme %lld, remote %lld\n",
                static_cast<long long>(first.capacity_blocks[0]),
                static_cast<long long>(first.capacity_blocks[1]),
                static_cast<long long>(first.capacity_blocks[2]),
                static_cast<long long>(first.capacity_blocks[3]));
    std::printf("%s", ReportTable(*reports).c_str());
    PrintShadowCost(*reports);
    if (!f.json.empty()) {
      const std::string text = f.compare ? CompareJson(*reports) : ReportJson(reports->front());
      if (absl::Status s = WriteFileAtomically(f.json, text); !s.ok()) return fail(s, 1);
    }
    return 0;
  }

  // --sweep TIER=SIZES
  const std::vector<std::string> parts = absl::StrSplit(f.sweep, absl::MaxSplits('=', 1));
  int tier = -1;
  for (int t = 0; t < kNumTiers; ++t) {
    if (parts.size() == 2 && parts[0] == kTierKeys[t]) tier = t;
  }
  if (tier < 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
                    "--sweep ", f.sweep,
                    ": expected TIER=SIZE,SIZE,... with TIER hbm, dram, nvme or remote")),
                2);
  }
  std::vector<TierCapacity> sizes;
  for (absl::string_view s : absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
    auto c = ParseTierSize(std::string(s), o.geometry.bytes_per_block());
    if (!c.ok()) return fail(c.status(), 2);
    if (c->kind == TierCapacity::Kind::kAbsent && tier == 0) {
      return fail(absl::InvalidArgumentError("--sweep: HBM cannot be 0"), 2);
    }
    sizes.push_back(*c);
  }
  if (sizes.empty()) {
    return fail(absl::InvalidArgumentError(absl::StrCat("--sweep ", f.sweep, ": no sizes")), 2);
  }
  std::vector<int64_t> capacities;
  std::vector<std::vector<ReplayReport>> points;
  for (const TierCapacity& c : sizes) {
    ReplayOptions po = o;
    po.capacity[tier] = c;
    auto reports = RunAll(*trace, po, f.compare, progress);
    if (!reports.ok()) {
      return fail(reports.status(), absl::IsInvalidArgument(reports.status()) ? 2 : 1);
    }
    capacities.push_back(reports->front().capacity_blocks[tier]);
    std::printf("%s = %lld blocks\n%s", kTierKeys[tier], static_cast<long long>(capacities.back()),
                ReportTable(*reports).c_str());
    if (f.compare) {
      double lru = 0, opt = 0;
      for (const ReplayReport& r : *reports) {
        if (absl::StartsWith(r.name, "lru")) lru = r.hit_ratio;
        if (r.name == "optimal") opt = r.hit_ratio;
      }
      for (const ReplayReport& r : *reports) {
        if (opt > lru &&
            (absl::StartsWith(r.name, "cost_aware") || absl::StartsWith(r.name, "reuse_index") ||
             absl::StartsWith(r.name, "learned"))) {
          std::printf("gap closed by %s: %.1f%% of (optimal - lru)\n", r.name.c_str(),
                      100.0 * (r.hit_ratio - lru) / (opt - lru));
        }
      }
    }
    PrintShadowCost(*reports);
    std::fflush(stdout);
    points.push_back(*std::move(reports));
  }
  if (!f.json.empty()) {
    if (absl::Status s =
            WriteFileAtomically(f.json, SweepJson(kTierKeys[tier], capacities, points));
        !s.ok()) {
      return fail(s, 1);
    }
  }
  if (!f.plot.empty()) {
    if (absl::Status s = Plot(f.plot, kTierKeys[tier], capacities, points); !s.ok()) {
      return fail(s, 1);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::replay

int main(int argc, char** argv) { return kvtier::replay::Main(argc, argv); }
