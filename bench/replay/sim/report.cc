// The replay report (report.h): the runs' figures as a table and as JSON.
#include "bench/replay/sim/report.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace kvtier::replay {
namespace {

constexpr const char* kTierKeys[kNumTiers] = {"hbm", "dram", "nvme", "remote"};

nlohmann::json ToJson(const ReplayReport& r) {
  nlohmann::json j;
  j["name"] = r.name;
  j["trace"] = r.trace;
  j["model"] = r.model;
  j["tokens_per_block"] = r.tokens_per_block;
  j["payload"] = r.payload;
  j["hints"] = r.hints;
  j["oracle"] = r.hints == "oracle-idle";
  nlohmann::json cap = nlohmann::json::object();
  nlohmann::json by_tier = nlohmann::json::object();
  for (int t = 0; t < kNumTiers; ++t) {
    cap[kTierKeys[t]] = r.capacity_blocks[t];
    by_tier[kTierKeys[t]] = r.hit_tokens_by_tier[t];
  }
  j["capacity_blocks"] = cap;
  j["requests"] = r.requests;
  j["prompt_tokens"] = r.prompt_tokens;
  j["hit_tokens"] = r.hit_tokens;
  j["hit_tokens_by_tier"] = by_tier;
  j["recomputed_tokens"] = r.recomputed_tokens;
  j["hit_ratio"] = r.hit_ratio;
  // What was served (restored or resident when the kernel ran), apart from what the index
  // matched: a store restarted empty keeps its matches but serves none of them.
  const int64_t served = r.payload == "bound"
                             ? r.hit_tokens  // a bound serves every hit from HBM
                             : r.restore_vs_recompute.restored_blocks * r.tokens_per_block;
  j["served_hit_tokens"] = served;
  j["served_hit_ratio"] =
      r.prompt_tokens > 0 ? static_cast<double>(served) / static_cast<double>(r.prompt_tokens) : 0;
  nlohmann::json moved = nlohmann::json::object();
  for (int from = 0; from < kNumTiers; ++from) {
    for (int to = 0; to < kNumTiers; ++to) {
      if (r.bytes_moved[from][to] != 0) {
        moved[absl::StrCat(kTierKeys[from], "->", kTierKeys[to])] = r.bytes_moved[from][to];
      }
    }
  }
  j["bytes_moved"] = moved;
  j["modeled_ttft_ms"] = {{"p50", r.ttft_p50_ms}, {"p90", r.ttft_p90_ms}, {"p99", r.ttft_p99_ms}};
  j["modeled_prefill_seconds_saved"] = r.prefill_seconds_saved;
  const RestoreVsRecompute& rr = r.restore_vs_recompute;
  j["restore_vs_recompute"] = {{"restored_blocks", rr.restored_blocks},
                               {"restored_blocks_below_hbm", rr.restored_blocks_below_hbm},
                               {"recomputed_although_cached",
                                {{"last_token", rr.last_token},
                                 {"cost_model", rr.cost_model},
                                 {"not_resident", rr.not_resident}}}};
  j["corrupt_blocks"] = r.corrupt_blocks;
  j["failed_loads"] = r.failed_loads;
  {
    nlohmann::json fs = nlohmann::json::object();
    for (int t = 0; t < kNumTiers; ++t) fs[kTierKeys[t]] = r.failed_stores[t];
    j["failed_stores"] = fs;
  }
  j["failed_requests"] = r.failed_requests;
  j["evictions"] = r.evictions;
  j["demotions"] = r.demotions;
  j["policy_shadow_seconds"] = r.policy_shadow_seconds;
  j["policy_leader_changes"] = r.policy_leader_changes;
  j["policy_shadow_accesses"] = r.policy_shadow_accesses;
  j["value_drops"] = r.value_drops;
  j["remote_probes"] = {{"probes", r.remote_probes},
                        {"failures", r.remote_probe_failures},
                        {"blocks_found", r.remote_blocks_found},
                        {"blocks_indexed", r.remote_blocks_indexed}};
  j["wall_seconds"] = r.wall_seconds;
  return j;
}

}  // namespace

std::string ReportJson(const ReplayReport& report) { return ToJson(report).dump(2) + "\n"; }

std::string CompareJson(const std::vector<ReplayReport>& reports) {
  nlohmann::json j;
  j["trace"] = reports.empty() ? "" : reports.front().trace;
  j["runs"] = nlohmann::json::array();
  for (const ReplayReport& r : reports) j["runs"].push_back(ToJson(r));
  return j.dump(2) + "\n";
}

std::string SweepJson(const std::string& tier, const std::vector<int64_t>& capacities,
                      const std::vector<std::vector<ReplayReport>>& points) {
  nlohmann::json j;
  j["trace"] = points.empty() || points.front().empty() ? "" : points.front().front().trace;
  j["tier"] = tier;
  j["points"] = nlohmann::json::array();
  for (size_t i = 0; i < points.size() && i < capacities.size(); ++i) {
    nlohmann::json p;
    p["capacity_blocks"] = capacities[i];
    p["runs"] = nlohmann::json::array();
    for (const ReplayReport& r : points[i]) p["runs"].push_back(ToJson(r));
    j["points"].push_back(p);
  }
  return j.dump(2) + "\n";
}

absl::Status CheckWritablePath(const std::string& path) {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory"));
  }
  const std::filesystem::path parent = p.has_parent_path() ? p.parent_path() : ".";
  if (!std::filesystem::is_directory(parent, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": folder ", parent.string(), " does not exist"));
  }
  if (access(parent.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": folder ", parent.string(), " is not writable"));
  }
  if (std::filesystem::exists(p, ec) && access(p.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not writable"));
  }
  return absl::OkStatus();
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f %s", bytes, kUnits[u])
                : absl::StrFormat("%.1f %s", bytes, kUnits[u]);
}

std::string ReportTable(const std::vector<ReplayReport>& reports) {
  std::string out =
      absl::StrFormat("%-14s %7s %7s %7s %7s %7s %10s %10s %10s %12s %10s %10s %7s %8s\n", "run",
                      "hit", "hbm", "dram", "nvme", "remote", "ttft p50", "ttft p90", "ttft p99",
                      "prefill", "onboarded", "offloaded", "corrupt", "wall");
  out += absl::StrFormat("%-14s %7s %7s %7s %7s %7s %10s %10s %10s %12s %10s %10s %7s %8s\n", "",
                         "ratio", "%", "%", "%", "%", "ms", "ms", "ms", "s saved", "bytes", "bytes",
                         "blocks", "s");
  for (const ReplayReport& r : reports) {
    auto pct = [&](int t) {
      return r.prompt_tokens > 0 ? 100.0 * static_cast<double>(r.hit_tokens_by_tier[t]) /
                                       static_cast<double>(r.prompt_tokens)
                                 : 0.0;
    };
    double onboarded = 0;
    double offloaded = 0;
    for (int from = 0; from < kNumTiers; ++from) {
      for (int to = 0; to < kNumTiers; ++to) {
        (to < from ? onboarded : offloaded) += static_cast<double>(r.bytes_moved[from][to]);
      }
    }
    const bool bound = r.payload == "bound";
    out += absl::StrFormat(
        "%-14s %7.4f %7.2f %7s %7s %7s %10.1f %10.1f %10.1f %12.1f %10s %10s %7s %8.2f\n", r.name,
        r.hit_ratio, pct(0), bound ? "-" : absl::StrFormat("%.2f", pct(1)),
        bound ? "-" : absl::StrFormat("%.2f", pct(2)),
        bound ? "-" : absl::StrFormat("%.2f", pct(3)), r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms,
        r.prefill_seconds_saved, bound ? "-" : FormatBytes(onboarded),
        bound ? "-" : FormatBytes(offloaded), bound ? "-" : absl::StrCat(r.corrupt_blocks),
        r.wall_seconds);
  }
  for (const ReplayReport& r : reports) {
    if (r.hints != "oracle-idle") continue;
    out +=
        "+oracle: the run was told each session's true time to its next request "
        "(--hints oracle-idle), which no engine knows: a bound on what an idle estimate is "
        "worth, not a policy's figure\n";
    break;
  }
  // Stores that failed (a full disk, a store refusing writes): the run went on, those blocks
  // became misses; say so, or a hit ratio lower than it should be goes unexplained.
  for (const ReplayReport& r : reports) {
    for (int t = 0; t < kNumTiers; ++t) {
      if (r.failed_stores[t] == 0) continue;
      out += absl::StrFormat(
          "warning (%s): %d copies into the %s tier failed (a full disk under the NVMe file or "
          "the directory store, or a store refusing writes); those blocks were not kept there "
          "and later requests missed them\n",
          r.name, r.failed_stores[t], kTierKeys[t]);
    }
  }
  // Matched blocks that were not served (their loads failed or came too late).
  for (const ReplayReport& r : reports) {
    const int64_t lost = r.restore_vs_recompute.not_resident * r.tokens_per_block;
    if (lost == 0 || r.prompt_tokens == 0) continue;
    const double served =
        static_cast<double>(r.restore_vs_recompute.restored_blocks * r.tokens_per_block) /
        static_cast<double>(r.prompt_tokens);
    out += absl::StrFormat(
        "note (%s): %d matched tokens were not served: their loads failed or were late (a store "
        "restarted empty, a failing tier)%s, and they were recomputed; served hit ratio %.4f, "
        "against %.4f matched\n",
        r.name, lost,
        r.failed_requests > 0 ? absl::StrCat(", or their request found no room in HBM (",
                                             r.failed_requests, " requests failed)")
                              : std::string(),
        served, r.hit_ratio);
  }
  // Remote discovery, for runs whose cache probed the store (none in payload none).
  for (const ReplayReport& r : reports) {
    if (r.remote_probes == 0) continue;
    out += absl::StrFormat(
        "remote probes (%s): %d, %d failed or late; %d blocks found in the store, %d indexed\n",
        r.name, r.remote_probes, r.remote_probe_failures, r.remote_blocks_found,
        r.remote_blocks_indexed);
  }
  return out;
}

absl::StatusOr<TierCapacity> ParseTierSize(const std::string& text, int64_t block_bytes) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "unlimited") return TierCapacity::Unlimited();
  if (t == "0" || t == "none") return TierCapacity::Absent();
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size \"", text, "\": ", why,
        " (expected e.g. 80GiB, 2TiB, 512MB, 5000blocks, unlimited, or 0 for no tier)"));
  };
  size_t split = 0;
  while (split < t.size() &&
         (absl::ascii_isdigit(t[split]) || t[split] == '.' || t[split] == 'e' || t[split] == '+')) {
    ++split;
  }
  double value = 0;
  if (split == 0 || !absl::SimpleAtod(t.substr(0, split), &value) || !std::isfinite(value) ||
      value <= 0) {
    return bad("not a positive number");
  }
  const std::string unit(absl::StripAsciiWhitespace(t.substr(split)));
  if (unit == "blocks" || unit == "block") {
    if (value != std::floor(value) || value > 9e15) return bad("not a whole number of blocks");
    return TierCapacity::Blocks(static_cast<int64_t>(value));
  }
  struct Unit {
    const char* name;
    double factor;
  };
  static constexpr Unit kUnits[] = {{"", 1},         {"b", 1},        {"kib", 0x1p10},
                                    {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40},
                                    {"pib", 0x1p50}, {"kb", 1e3},     {"mb", 1e6},
                                    {"gb", 1e9},     {"tb", 1e12},    {"pb", 1e15}};
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    const double blocks = std::floor(value * u.factor / static_cast<double>(block_bytes));
    if (blocks < 1) return bad(absl::StrCat("smaller than one block of ", block_bytes, " bytes"));
    if (blocks > 9e15) return bad("too large");
    return TierCapacity::Blocks(static_cast<int64_t>(blocks));
  }
  return bad(absl::StrCat("unknown unit \"", unit, "\""));
}

}  // namespace kvtier::replay
