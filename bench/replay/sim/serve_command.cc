// kvtier-replay --mode serve (serve_command.h).
#include "bench/replay/sim/serve_command.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/replay/serve/serve_report.h"
#include "bench/replay/sim/report.h"

namespace kvtier::replay {
namespace {

constexpr const char* kSizeFlags[kNumTiers] = {"--hbm", "--dram", "--nvme", "--remote-size"};

absl::Status Positive(const char* flag, double v) {
  if (!std::isfinite(v) || v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", v, ": must be > 0"));
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
  o.scheduler = {.max_batched_tokens = f.max_batched_tokens, .max_running = f.max_running};
  o.links.pcie_bytes_per_second = f.pcie_bandwidth;
  o.links.nvme_bytes_per_second = f.nvme_bandwidth;
  o.links.network_bytes_per_second = f.network_bandwidth;
  o.max_requests = max_requests;
  for (int t = 0; t < kNumTiers; ++t) {
    if (t == 0 && f.size[t] == "auto") {
      o.capacity_blocks[t] = 0;
      continue;
    }
    auto c = ParseTierSize(f.size[t], geometry->bytes_per_block());
    if (!c.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(kSizeFlags[t], ": ", c.status().message()));
    }
    if (c->kind == TierCapacity::Kind::kUnlimited) {
      return absl::InvalidArgumentError(
          absl::StrCat(kSizeFlags[t], " ", f.size[t], ": --mode serve needs a finite size"));
    }
    if (t == 0 && c->kind == TierCapacity::Kind::kAbsent) {
      return absl::InvalidArgumentError("--hbm: HBM cannot be 0");
    }
    o.capacity_blocks[t] = c->kind == TierCapacity::Kind::kBlocks ? c->blocks : 0;
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
  // An unwritable --json path is found before the runs, not after them.
  if (!f.json.empty()) {
    if (absl::Status s = CheckWritablePath(f.json); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--json: ", s.message()));
    }
  }
  std::vector<ServeReport> runs;
  for (ServeProfile p : profiles) {
    ServeOptions po = o;
    po.profile = p;
    if (progress) po.progress = progress(ServeProfileName(p));
    auto r = RunServe(trace, po);
    if (!r.ok()) return r.status();
    runs.push_back(*std::move(r));
  }
  const ServeReport& first = runs.back();  // the last profile has every configured tier
  std::printf(
      "serving: %d x %s (tp %d), router %s; tiers per instance (blocks): hbm %lld, dram "
      "%lld, nvme %lld, remote %lld%s; %s\n",
      first.instances, first.gpu.c_str(), first.tensor_parallel, first.router.c_str(),
      static_cast<long long>(first.capacity_blocks[0]),
      static_cast<long long>(first.capacity_blocks[1]),
      static_cast<long long>(first.capacity_blocks[2]),
      static_cast<long long>(first.capacity_blocks[3]),
      first.shared_remote ? " (one store for the fleet)" : "",
      o.closed_loop ? "sessions closed-loop" : "open-loop");
  std::printf("%s", ServeTable(runs).c_str());
  if (!f.json.empty()) {
    std::ofstream out(f.json, std::ios::binary | std::ios::trunc);
    out << ServeJson(runs);
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", f.json));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::replay
