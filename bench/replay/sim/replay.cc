// The replay driver (replay.h): a trace, request by request, through a real KvCache.
#include "bench/replay/sim/replay.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/replay/trace/replay_math.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/device_block_table.h"
#include "kvtier/kv_cache.h"
#include "kvtier/nvme_tier.h"
#include "kvtier/tier_stack.h"

namespace kvtier::replay {
namespace {

constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr const char* kTierNames[kNumTiers] = {"hbm", "dram", "nvme", "remote"};

// The bytes of one cache block of the payload: a function of the block's identity (the trace
// block id naming its prefix, its index inside that trace block) and the byte's position.
class BlockPattern {
 public:
  BlockPattern(uint64_t id, int64_t sub) : seed_(SplitMix64(SplitMix64(id) + uint64_t(sub))) {}
  // Fills dst with bytes [offset, offset + dst.size()) of the block.
  void Fill(std::byte* dst, int64_t offset, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) dst[i] = Byte(offset + i);
  }
  // Number of bytes of src differing from bytes [offset, offset + n).
  bool Matches(const std::byte* src, int64_t offset, int64_t n) const {
    for (int64_t i = 0; i < n; ++i) {
      if (src[i] != Byte(offset + i)) return false;
    }
    return true;
  }

 private:
  std::byte Byte(int64_t i) const {
    const uint64_t word = SplitMix64(seed_ + static_cast<uint64_t>(i >> 3));
    return static_cast<std::byte>(word >> ((i & 7) * 8));
  }
  uint64_t seed_;
};

// The cache block `block` of a request (block size B) names trace block (block * B) / T, and is
// its ((block * B) % T) / B-th part.
BlockPattern PatternOf(const TraceRequest& r, int64_t block, int tokens_per_block,
                       int trace_block_tokens) {
  const int64_t first = block * tokens_per_block;
  return BlockPattern(r.block_ids[static_cast<size_t>(first / trace_block_tokens)],
                      (first % trace_block_tokens) / tokens_per_block);
}

// Visits every (address, byte offset, length) run of a block in the pool: per layer, per plane
// (K then V), per token, the plane's bytes of that token.
template <typename Fn>
absl::Status ForEachRun(const KvGeometry& g, const DevicePoolView& pool, int32_t slot, Fn fn) {
  const int planes = g.kv_planes();
  const int64_t run = g.bytes_per_token_per_layer() / planes;
  if (!pool.host_accessible || pool.token_stride_bytes != run ||
      static_cast<int>(pool.k_base.size()) != g.num_layers()) {
    return absl::FailedPreconditionError(
        "payload scaled needs a host-accessible HBM pool with tokens packed per plane");
  }
  int64_t offset = 0;
  for (int l = 0; l < g.num_layers(); ++l) {
    for (int p = 0; p < planes; ++p) {
      for (int t = 0; t < g.tokens_per_block(); ++t) {
        fn(KvAddress(pool, slot, l, static_cast<KvPlane>(p), t), offset, run);
        offset += run;
      }
    }
  }
  return absl::OkStatus();
}

// The modeled prefill queue: `instances` servers, requests served in arrival order by the first
// free one.
class PrefillQueue {
 public:
  explicit PrefillQueue(int instances) {
    for (int i = 0; i < instances; ++i) free_at_.push(0.0);
  }
  // Returns the request's TTFT in seconds.
  double Serve(double arrival, double service) {
    const double start = std::max(arrival, free_at_.top());
    free_at_.pop();
    free_at_.push(start + service);
    return start + service - arrival;
  }

 private:
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at_;
};

absl::Status ValidateOptions(const Trace& trace, const ReplayOptions& o) {
  const int b = o.geometry.tokens_per_block();
  if (trace.block_tokens <= 0 || b <= 0 || trace.block_tokens % b != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens per block ", b, " must divide the trace's block size ", trace.block_tokens));
  }
  if (o.capacity[kHbm].kind == TierCapacity::Kind::kAbsent) {
    return absl::InvalidArgumentError("the HBM tier must be present");
  }
  for (int t = 0; t < kNumTiers; ++t) {
    if (o.capacity[t].kind == TierCapacity::Kind::kBlocks && o.capacity[t].blocks < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(kTierNames[t], " capacity must be at least one block"));
    }
  }
  if (o.prefill_instances < 1) {
    return absl::InvalidArgumentError("prefill_instances must be >= 1");
  }
  if (o.payload_bytes_per_token < 4 || o.payload_bytes_per_token > 65536 ||
      o.payload_bytes_per_token % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("payload_bytes_per_token ",
                                                   o.payload_bytes_per_token,
                                                   " must be a multiple of 4 in [4, 65536]"));
  }
  if (!o.keep_state_dir.empty() && o.payload != PayloadMode::kScaled) {
    return absl::InvalidArgumentError(
        "keep_state_dir needs payload scaled (payload none stores nothing to keep)");
  }
  return PrefillCostModel::Create(o.prefill).status();
}

// A temporary directory removed with everything in it when the object goes.
class ScratchDir {
 public:
  static absl::StatusOr<std::unique_ptr<ScratchDir>> Create(const std::string& parent) {
    std::string pattern =
        (parent.empty() ? std::filesystem::temp_directory_path().string() : parent) +
        "/kvtier_replay_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot create a directory like ", pattern, ": ", std::strerror(errno)));
    }
    return std::unique_ptr<ScratchDir>(new ScratchDir(pattern));
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

int64_t ResolveBlocks(const TierCapacity& c, const TraceFootprint& f) {
  if (c.kind == TierCapacity::Kind::kBlocks) return c.blocks;
  // Every distinct block, one running prompt, and a partial block per paused session.
  return f.distinct_full_blocks + f.max_prompt_blocks + f.sessions + 2;
}

struct Built {
  std::unique_ptr<ScratchDir> scratch;
  std::unique_ptr<KvCache> cache;
  KvGeometry cache_geometry;
};

absl::StatusOr<Built> BuildCache(const ReplayOptions& o, const TraceFootprint& f,
                                 std::function<absl::Time()> clock,
                                 std::array<int64_t, kNumTiers>& blocks) {
  const bool scaled = o.payload == PayloadMode::kScaled;
  KvGeometry g = o.geometry;
  if (scaled) {
    auto sg = KvGeometry::Create({.num_layers = 1,
                                  .num_kv_heads = 1,
                                  .head_dim = o.payload_bytes_per_token / 4,
                                  .dtype = KvDtype::kBf16,
                                  .tokens_per_block = o.geometry.tokens_per_block()});
    if (!sg.ok()) return sg.status();
    g = *sg;
  }
  auto ns = CacheNamespace::Create(g, {.model_id = o.model_name.empty() ? "replay" : o.model_name,
                                       .weights_fingerprint = "kvtier-replay"});
  if (!ns.ok()) return ns.status();

  Built built{.cache_geometry = g};
  KvCacheOptions co;
  for (int t = 0; t < kNumTiers; ++t) {
    blocks[t] =
        o.capacity[t].kind == TierCapacity::Kind::kAbsent ? -1 : ResolveBlocks(o.capacity[t], f);
  }
  TierStackOptions stack;
  for (int t = 0; t < kNumTiers; ++t) {
    stack.tiers[t] = {.capacity_blocks = std::max<int64_t>(blocks[t], 0),
                      .kind = scaled ? TierBackendKind::kNative : TierBackendKind::kMetadata};
  }
  if (scaled) {
    std::string dir = o.keep_state_dir;
    if (dir.empty()) {
      auto scratch = ScratchDir::Create(o.work_dir);
      if (!scratch.ok()) return scratch.status();
      built.scratch = std::move(*scratch);
      dir = built.scratch->path();
    } else {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec || !std::filesystem::is_directory(dir)) {
        return absl::UnavailableError(absl::StrCat("--keep-state: cannot use ", dir, ": ",
                                                   ec ? ec.message() : "not a directory"));
      }
    }
    // The NVMe file is preallocated and a directory store fills up to its capacity: refuse a
    // run whose files would not fit the disk, before writing a byte.
    {
      const double nvme = static_cast<double>(std::max<int64_t>(blocks[2], 0)) *
                          static_cast<double>(NvmeTier::SlotBytes(g));
      const double remote = o.remote_url.empty()
                                ? static_cast<double>(std::max<int64_t>(blocks[3], 0)) *
                                      static_cast<double>(g.bytes_per_block())
                                : 0.0;
      std::error_code ec;
      const std::filesystem::space_info space = std::filesystem::space(dir, ec);
      if (!ec && nvme + remote > static_cast<double>(space.available)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the NVMe file (", static_cast<int64_t>(nvme / 1e6), " MB) and the directory store (",
            static_cast<int64_t>(remote / 1e6), " MB) would not fit the ",
            static_cast<int64_t>(static_cast<double>(space.available) / 1e6), " MB free under ",
            dir,
            ": lower --nvme / --remote-size or --payload-bytes-per-token, "
            "or pick another --nvme-path"));
      }
    }
    stack.dram.try_huge_pages = false;
    stack.dram.prefault = false;
    stack.nvme.path = dir + "/nvme.bin";
    if (o.remote_url.empty()) {
      stack.remote_directory = dir + "/remote";
    } else {
      stack.remote_url = o.remote_url;
    }
    stack.remote.key_prefix = absl::StrCat("kvtier-replay-", ns->DigestHex().substr(0, 8), ":");
    co.bounce_buffers = 4;
  } else {
    co.bounce_buffers = 1;  // never touched (metadata_tier.h)
  }
  stack.wrap = o.wrap_tier;
  auto tiers = BuildTierStack(*ns, stack);
  if (!tiers.ok()) return tiers.status();
  co.tiers = *std::move(tiers);
  // The transfer engine completes copies on its own threads in both modes: Append and
  // onboarding wait for demotions in flight to free HBM rather than fail.
  co.room_wait = absl::Seconds(10);
  co.eviction_policy = o.policy;
  co.demote_by_value = o.demote_by_value;
  co.prefill_cost = o.prefill;
  co.prefill_flops_per_second = o.prefill.flops_per_second;
  // The cost model sees the model's restore times: the configured links (not the emulated
  // tiers' measured speed), scaled by the byte ratio in kScaled.
  co.measure_bandwidth = false;
  const double ratio =
      static_cast<double>(g.bytes_per_block()) / static_cast<double>(o.geometry.bytes_per_block());
  for (int t = 1; t < kNumTiers; ++t) {
    co.links[t] = o.links[t];
    co.links[t].bytes_per_second *= ratio;
  }
  co.clock = std::move(clock);
  co.event_buffer = 1;
  auto cache = KvCache::Create(*ns, std::move(co));
  if (!cache.ok()) return cache.status();
  built.cache = std::move(*cache);
  return built;
}

// Retries `fn` while it fails with kResourceExhausted and a paused sequence can be released to
// make room (oldest pause first).
template <typename Fn>
auto WithRoom(KvCache& cache, std::deque<std::pair<uint64_t, SequenceId>>& paused,
              absl::flat_hash_map<uint64_t, SequenceId>& by_session, Fn fn) -> decltype(fn()) {
  while (true) {
    auto result = fn();
    if (result.ok() || !absl::IsResourceExhausted(result.status()) || paused.empty()) {
      return result;
    }
    const auto [session, id] = paused.front();
    paused.pop_front();
    by_session.erase(session);
    (void)cache.Release(id);
  }
}

// Per request: the seconds to its session's next request, or nullopt (none, or no session).
std::vector<std::optional<double>> TimeToSessionsNextRequest(const Trace& trace) {
  std::vector<std::optional<double>> next(trace.requests.size());
  absl::flat_hash_map<uint64_t, size_t> latest;
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    const TraceRequest& q = trace.requests[i];
    if (q.session == 0) continue;
    auto [it, inserted] = latest.try_emplace(q.session, i);
    if (!inserted) {
      next[it->second] = q.arrival_seconds - trace.requests[it->second].arrival_seconds;
      it->second = i;
    }
  }
  return next;
}

}  // namespace

const char* HintModeName(HintMode mode) {
  switch (mode) {
    case HintMode::kNone:
      return "none";
    case HintMode::kPause:
      return "pause";
    case HintMode::kStopReason:
      return "stop-reason";
    case HintMode::kOracleIdle:
      return "oracle-idle";
  }
  return "none";
}

absl::StatusOr<TraceFootprint> MeasureFootprint(const Trace& trace, int tokens_per_block) {
  if (trace.block_tokens <= 0 || tokens_per_block <= 0 ||
      trace.block_tokens % tokens_per_block != 0) {
    return absl::InvalidArgumentError("tokens per block must divide the trace's block size");
  }
  const int per = trace.block_tokens / tokens_per_block;
  absl::flat_hash_set<std::pair<uint64_t, int>> seen;
  absl::flat_hash_set<uint64_t> sessions;
  TraceFootprint f;
  for (const TraceRequest& r : trace.requests) {
    const int64_t full = r.input_tokens / tokens_per_block;
    f.max_prompt_blocks = std::max(f.max_prompt_blocks, full + 1);
    for (int64_t j = 0; j < full; ++j) {
      const int64_t tb = j / per;
      if (tb >= static_cast<int64_t>(r.block_ids.size())) break;
      seen.insert({r.block_ids[static_cast<size_t>(tb)], static_cast<int>(j % per)});
    }
    if (r.session != 0) sessions.insert(r.session);
  }
  f.distinct_full_blocks = static_cast<int64_t>(seen.size());
  f.sessions = static_cast<int64_t>(sessions.size());
  return f;
}

absl::StatusOr<ReplayReport> BoundReport(const Trace& trace, const ReplayOptions& options,
                                         const std::string& name,
                                         const std::vector<int64_t>& hit_tokens_per_request) {
  if (absl::Status s = ValidateOptions(trace, options); !s.ok()) return s;
  auto model = PrefillCostModel::Create(options.prefill);
  if (!model.ok()) return model.status();
  const int64_t n = options.max_requests < 0
                        ? static_cast<int64_t>(trace.requests.size())
                        : std::min<int64_t>(options.max_requests, trace.requests.size());
  ReplayReport r;
  r.name = name;
  r.trace = trace.name;
  r.model = options.model_name;
  r.tokens_per_block = options.geometry.tokens_per_block();
  r.payload = "bound";
  PrefillQueue queue(options.prefill_instances);
  std::vector<double> ttft;
  ttft.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const TraceRequest& q = trace.requests[static_cast<size_t>(i)];
    const int64_t hit =
        i < static_cast<int64_t>(hit_tokens_per_request.size()) ? hit_tokens_per_request[i] : 0;
    // The bounds count a whole cached prompt as a hit; the block holding the last token is
    // computed anyway (as KvCache's plan does).
    const int64_t b = options.geometry.tokens_per_block();
    const int64_t restored = std::min(hit, (q.input_tokens - 1) / b * b);
    r.requests++;
    r.prompt_tokens += q.input_tokens;
    r.hit_tokens += hit;
    r.hit_tokens_by_tier[kHbm] += hit;
    r.recomputed_tokens += q.input_tokens - restored;
    const double recompute = absl::ToDoubleSeconds(model->RecomputeTime(restored, q.input_tokens));
    r.prefill_seconds_saved +=
        absl::ToDoubleSeconds(model->RecomputeTime(0, q.input_tokens)) - recompute;
    ttft.push_back(queue.Serve(q.arrival_seconds, recompute) * 1e3);
  }
  r.hit_ratio = r.prompt_tokens > 0
                    ? static_cast<double>(r.hit_tokens) / static_cast<double>(r.prompt_tokens)
                    : 0;
  r.ttft_p50_ms = Percentile(ttft, 0.50);
  r.ttft_p90_ms = Percentile(ttft, 0.90);
  r.ttft_p99_ms = Percentile(ttft, 0.99);
  return r;
}

absl::StatusOr<ReplayReport> RunReplay(const Trace& trace, const ReplayOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  if (absl::Status s = ValidateOptions(trace, options); !s.ok()) return s;
  // The bounds' checks: ids that name whole prefixes, lengths that match the ids.
  if (auto u = UnlimitedBound(trace, options.geometry.tokens_per_block()); !u.ok()) {
    return u.status();
  }
  auto footprint = MeasureFootprint(trace, options.geometry.tokens_per_block());
  if (!footprint.ok()) return footprint.status();
  auto model = PrefillCostModel::Create(options.prefill);
  if (!model.ok()) return model.status();

  // The cache's clock is the trace's: the current request's arrival.
  auto now_ns = std::make_shared<std::atomic<int64_t>>(0);
  auto clock = [now_ns] { return absl::UnixEpoch() + absl::Nanoseconds(now_ns->load()); };
  ReplayReport r;
  auto built = BuildCache(options, *footprint, clock, r.capacity_blocks);
  if (!built.ok()) return built.status();
  KvCache& cache = *built->cache;
  const KvGeometry& cg = built->cache_geometry;
  const bool scaled = options.payload == PayloadMode::kScaled;
  const int B = options.geometry.tokens_per_block();
  const double model_block_bytes = static_cast<double>(options.geometry.bytes_per_block());

  r.name = options.label.empty() ? options.policy : options.label;
  r.hints = HintModeName(options.hints);
  // An oracle's figures are never mistaken for a policy's own: the name says so.
  if (options.hints == HintMode::kOracleIdle) absl::StrAppend(&r.name, "+oracle");
  r.trace = trace.name;
  r.model = options.model_name;
  r.tokens_per_block = B;
  r.payload = scaled ? "scaled" : "none";

  const int64_t n = options.max_requests < 0
                        ? static_cast<int64_t>(trace.requests.size())
                        : std::min<int64_t>(options.max_requests, trace.requests.size());
  const std::vector<std::optional<double>> next_in_session =
      options.hints == HintMode::kOracleIdle ? TimeToSessionsNextRequest(trace)
                                             : std::vector<std::optional<double>>();
  PrefillQueue queue(options.prefill_instances);
  std::vector<double> ttft;
  ttft.reserve(static_cast<size_t>(n));
  absl::flat_hash_map<uint64_t, SequenceId> paused_by_session;
  std::deque<std::pair<uint64_t, SequenceId>> paused;  // oldest first
  auto forget_paused = [&](uint64_t session) {
    paused_by_session.erase(session);
    for (auto it = paused.begin(); it != paused.end(); ++it) {
      if (it->first == session) {
        paused.erase(it);
        break;
      }
    }
  };

  for (int64_t i = 0; i < n; ++i) {
    const TraceRequest& q = trace.requests[static_cast<size_t>(i)];
    now_ns->store(static_cast<int64_t>(std::llround(q.arrival_seconds * 1e9)));
    const SequenceId id(static_cast<uint64_t>(i) + 1);
    const std::vector<int32_t> prompt = PromptTokens(q, trace.block_tokens);

    // Hashed once, for the lookup and the attach below.
    absl::StatusOr<HashedPrompt> hashed = cache.HashPrompt(prompt);
    if (!hashed.ok()) return hashed.status();
    // Where the prompt's cached blocks are when the request arrives: the hits by tier, and
    // (after a Resume) what their restore costs.
    auto where = cache.LookupHashed(*hashed);
    if (!where.ok()) return where.status();

    // The session's previous request, paused on a tool call: it comes back now. Resume starts
    // onboarding its blocks; that is this request's restore, charged below from `where`.
    std::optional<SequenceId> resumed;
    if (q.session != 0) {
      auto it = paused_by_session.find(q.session);
      if (it != paused_by_session.end()) {
        resumed = it->second;
        forget_paused(q.session);
        (void)WithRoom(cache, paused, paused_by_session, [&] { return cache.Resume(*resumed); });
        if (absl::Status s = cache.WaitIdle(); !s.ok()) return s;
      }
    }

    if (absl::Status s = cache.CreateSequence(id, {.session = q.session}); !s.ok()) return s;
    auto attach = WithRoom(cache, paused, paused_by_session,
                           [&] { return cache.AttachHashedPrefix(id, *hashed); });
    if (!attach.ok()) return attach.status();
    if (resumed.has_value()) (void)cache.Release(*resumed);

    const int64_t attached_blocks = attach->attached_tokens / B;
    const int64_t matched_blocks = attach->matched_tokens / B;
    for (int t = 0; t < kNumTiers; ++t) r.hit_tokens_by_tier[t] += where->blocks_by_tier[t] * B;
    r.hit_tokens += attach->matched_tokens;
    r.prompt_tokens += q.input_tokens;
    r.requests++;

    bool failed = false;
    int64_t resident_blocks = 0;
    auto append = WithRoom(cache, paused, paused_by_session, [&] {
      return cache.Append(
          id, absl::MakeConstSpan(prompt).subspan(static_cast<size_t>(attach->attached_tokens)));
    });
    if (!append.ok()) {
      if (!absl::IsResourceExhausted(append.status())) return append.status();
      failed = true;
    }
    std::optional<ResidencyTicket> ticket;
    if (!failed) {
      auto t = WithRoom(cache, paused, paused_by_session, [&] {
        return cache.EnsureResident(id, 0, q.input_tokens, {.mode = ResidencyMode::kWait});
      });
      if (!t.ok()) {
        if (!absl::IsResourceExhausted(t.status())) return t.status();
        failed = true;
      } else {
        ticket = *t;
      }
    }
    if (ticket.has_value()) {
      const DeviceBlockTable& table = ticket->block_table();
      const std::vector<BlockResidency> status = ticket->block_status();
      // The leading attached blocks resident now are restored; the first that is not ends the
      // restored prefix (the kernel recomputes from there).
      while (resident_blocks < attached_blocks &&
             status[static_cast<size_t>(resident_blocks)] == BlockResidency::kResident) {
        ++resident_blocks;
      }
      if (scaled) {
        for (int64_t j = 0; j < static_cast<int64_t>(table.slots.size()); ++j) {
          const int32_t slot = table.slots[static_cast<size_t>(j)];
          if (slot < 0) continue;
          const BlockPattern pattern = PatternOf(q, j, B, trace.block_tokens);
          // Every attached block with a slot is checked (one after a not-resident gap is
          // recomputed from the gap on, but its cached bytes are still someone's KV).
          if (j < attached_blocks) {
            bool ok = true;
            absl::Status s =
                ForEachRun(cg, table.pool, slot, [&](std::byte* p, int64_t off, int64_t len) {
                  ok = ok && pattern.Matches(p, off, len);
                });
            if (!s.ok()) return s;
            if (!ok) r.corrupt_blocks++;
          } else {
            absl::Status s = ForEachRun(
                cg, table.pool, slot,
                [&](std::byte* p, int64_t off, int64_t len) { pattern.Fill(p, off, len); });
            if (!s.ok()) return s;
          }
        }
      }
      if (absl::Status s = cache.ReportWritten(id, q.input_tokens); !s.ok()) return s;
      if (absl::Status s = cache.ReleaseTicket(*ticket); !s.ok()) return s;
    }
    if (failed) r.failed_requests++;

    // Restore versus recompute, and the modeled prefill.
    const int64_t last_token_blocks =
        std::max<int64_t>(0, matched_blocks - (q.input_tokens - 1) / B);
    r.restore_vs_recompute.restored_blocks += resident_blocks;
    r.restore_vs_recompute.last_token += last_token_blocks;
    r.restore_vs_recompute.cost_model += matched_blocks - attached_blocks - last_token_blocks;
    r.restore_vs_recompute.not_resident += attached_blocks - resident_blocks;
    // Restore: the attached blocks by the tier they came from. After a Resume the attach found
    // them already onboarded, so the tiers are those at arrival (`where`, all matched blocks),
    // less the blocks left to recompute, taken from the slowest tiers (the deepest blocks).
    std::array<int64_t, kNumTiers> from = attach->attached_blocks_by_tier;
    if (resumed.has_value()) {
      from = where->blocks_by_tier;
      int64_t surplus = matched_blocks - attached_blocks;
      for (int t = kNumTiers - 1; t >= 0 && surplus > 0; --t) {
        const int64_t take = std::min(surplus, from[t]);
        from[t] -= take;
        surplus -= take;
      }
    }
    double restore = 0;
    int64_t below = 0;
    for (int t = 1; t < kNumTiers && !failed; ++t) {
      const int64_t blocks = from[t];
      if (blocks == 0) continue;
      below += blocks;
      restore +=
          absl::ToDoubleSeconds(options.links[t].latency) +
          static_cast<double>(blocks) * model_block_bytes / options.links[t].bytes_per_second;
    }
    r.restore_vs_recompute.restored_blocks_below_hbm += std::min(below, resident_blocks);
    const int64_t restored_tokens = failed ? 0 : resident_blocks * B;
    r.recomputed_tokens += q.input_tokens - restored_tokens;
    const double recompute =
        absl::ToDoubleSeconds(model->RecomputeTime(restored_tokens, q.input_tokens));
    r.prefill_seconds_saved +=
        absl::ToDoubleSeconds(model->RecomputeTime(0, q.input_tokens)) - recompute - restore;
    ttft.push_back(queue.Serve(q.arrival_seconds, restore + recompute) * 1e3);

    // Pause on a tool call (the agent comes back in seconds), else release.
    const bool pause = !failed && options.hints == HintMode::kPause && q.session != 0 &&
                       q.stop == StopReason::kToolUse;
    ReleaseHints release;
    if (options.hints == HintMode::kStopReason || options.hints == HintMode::kOracleIdle) {
      release.stop_reason = ToCacheStopReason(q.stop);
      release.last_turn = q.last_turn;
    }
    if (options.hints == HintMode::kOracleIdle && next_in_session[static_cast<size_t>(i)]) {
      release.expected_idle = absl::Seconds(*next_in_session[static_cast<size_t>(i)]);
    }
    if (pause && cache.Pause(id, absl::Seconds(9)).ok()) {
      paused_by_session[q.session] = id;
      paused.emplace_back(q.session, id);
    } else if (auto s = cache.Release(id, release); !s.ok()) {
      return s.status();
    }
    // Every copy lands before the next request, so runs are deterministic and both payload
    // modes decide alike.
    if (absl::Status s = cache.WaitIdle(); !s.ok()) return s;
    if (options.progress) options.progress(i + 1, n);
    if (options.cancelled && options.cancelled()) {
      return absl::CancelledError(absl::StrCat("stopped after ", i + 1, " of ", n, " requests"));
    }
  }
  for (const auto& [session, id] : paused) (void)cache.Release(id);
  if (absl::Status s = cache.WaitIdle(); !s.ok()) return s;

  const KvCacheStats stats = cache.stats();
  r.remote_probes = stats.remote_probe.probes;
  r.remote_probe_failures = stats.remote_probe.failures;
  r.remote_blocks_found = stats.remote_probe.blocks_found;
  r.remote_blocks_indexed = stats.remote_probe.blocks_indexed;
  for (int from = 0; from < kNumTiers; ++from) {
    const KvTierStats& ts = stats.tiers[from];
    r.failed_loads += ts.failed_loads;
    r.failed_stores[from] = ts.failed_stores;
    r.evictions += ts.evictions;
    r.demotions += ts.demotions;
    r.policy_shadow_seconds += static_cast<double>(ts.policy_shadow_us) * 1e-6;
    r.policy_leader_changes += ts.policy_leader_changes;
    r.policy_shadow_accesses += ts.policy_shadow_accesses;
    r.value_drops += ts.value_drops;
    for (int to = 0; to < kNumTiers; ++to) {
      r.bytes_moved[from][to] = static_cast<int64_t>(
          static_cast<double>(stats.blocks_moved[from][to]) * model_block_bytes);
    }
  }
  r.hit_ratio = r.prompt_tokens > 0
                    ? static_cast<double>(r.hit_tokens) / static_cast<double>(r.prompt_tokens)
                    : 0;
  r.ttft_p50_ms = Percentile(ttft, 0.50);
  r.ttft_p90_ms = Percentile(ttft, 0.90);
  r.ttft_p99_ms = Percentile(ttft, 0.99);
  built->cache.reset();  // drains transfers before the scratch directory goes
  r.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return r;
}

}  // namespace kvtier::replay
