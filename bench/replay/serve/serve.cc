// The serving simulation (serve.h): discrete events on the simulated clock, one continuous-
// batching scheduler per instance over its own KvCache.
#include "bench/replay/serve/serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "bench/replay/serve/link.h"
#include "bench/replay/trace/replay_math.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/kv_cache.h"
#include "kvtier/metadata_store.h"
#include "kvtier/tier_stack.h"

namespace kvtier::replay {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kHbm = 0, kDram = 1, kNvme = 2, kRemote = 3;

// The token a request produces at position `position` of its sequence: a fixed hash, so a
// readmission's prompt carries the same tokens it had produced.
int32_t DecodeToken(int64_t request, int64_t position) {
  return static_cast<int32_t>(SplitMix64(SplitMix64(static_cast<uint64_t>(request) ^ 0x5eedULL) +
                                         static_cast<uint64_t>(position)) %
                              2147483647u);
}

// The links of one instance, by what crosses them.
enum LinkIndex { kPcieH2d = 0, kPcieD2h = 1, kNvmeLink = 2, kNetwork = 3, kNumLinks = 4 };
constexpr const char* kLinkNames[kNumLinks] = {"pcie_h2d", "pcie_d2h", "nvme", "network"};

// The link a copy from tier `from` to tier `to` is limited by: its slowest hop.
int LinkFor(int from, int to) {
  if (from == kRemote || to == kRemote) return kNetwork;
  if (from == kNvme || to == kNvme) return kNvmeLink;
  return to == kHbm ? kPcieH2d : kPcieD2h;
}

enum class Phase : uint8_t { kPending, kQueued, kOnboarding, kPrefill, kDecode, kDone, kFailed };

// One request's state in the simulation.
struct Live {
  Phase phase = Phase::kPending;
  int instance = -1;
  SequenceId seq;
  double arrival = 0;
  int64_t prompt = 0;     // tokens to have in the sequence before decoding (grows on readmission)
  int64_t output = 1;     // tokens to produce, >= 1 (the first comes from prefill)
  int64_t computed = 0;   // tokens of `prompt` in the sequence's KV (attached or prefilled)
  int64_t emitted = 0;    // output tokens produced
  int64_t kv_tokens = 0;  // tokens of the sequence whose KV is computed (or attached)
  int64_t reported = 0;   // tokens ReportWritten
  double first_token = -1;
  double last_token = 0;
  double itl_sum = 0;
  bool readmission = false;
  bool swapped = false;       // preempted by swap: paused in the cache, waiting to swap in
  bool overlap = false;       // layer-wise: computing while its onboarding transfers land
  bool counted = false;       // prompt and matches counted (once, at the first admission)
  bool hits_counted = false;  // served hits count (first admission only)
  // Onboarding in flight: (link, transfer id, blocks, source tier).
  struct Transfer {
    int link;
    int64_t id;
    int64_t blocks;
    int tier;
  };
  std::vector<Transfer> transfers;
  std::vector<Transfer> prefetch;  // started at arrival (kvtier); waited for at admission
  int64_t deadline_version = 0;
  // The prompt hashed once while it waits (a head that does not fit yet is tried every step).
  std::optional<HashedPrompt> hashed;
};

struct Event {
  double time;
  uint64_t order;  // ties in insertion order
  enum Kind : uint8_t { kArrival, kStepDone, kDeadline } kind;
  int instance;
  int64_t request;
  int64_t version;
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : order > o.order; }
};

struct BatchItem {
  int64_t request;
  int64_t tokens;  // prefill chunk, or 1 for decode
  bool decode;
};

struct Instance {
  std::unique_ptr<KvCache> cache;
  std::vector<Link> links;
  std::deque<int64_t> waiting;
  std::vector<int64_t> running;  // admitted, in admission order
  bool stepping = false;
  std::vector<BatchItem> batch;
  double step_seconds = 0;          // the roofline's time of the step in flight
  bool waiting_for_layers = false;  // its compute is done, a layer-wise onboarding is not
  KvCacheStats last_stats;
  int64_t queued_prompt_tokens = 0;
  // Occupancy integrals (block-seconds) since the last sample.
  double last_sample = 0;
  int64_t held = 0;
  int64_t cached = 0;
};

bool UsesTier(ServeProfile p, int tier) {
  switch (p) {
    case ServeProfile::kRecompute:
    case ServeProfile::kHbmLru:
      return tier == kHbm;
    case ServeProfile::kDramLru:
      return tier == kHbm || tier == kDram;
    case ServeProfile::kHicache:
      return tier != kNvme;
    case ServeProfile::kKvtier:
      return true;
  }
  return false;
}

class Simulation {
 public:
  Simulation(const Trace& trace, const ServeOptions& o, Roofline roofline)
      : trace_(trace), o_(o), roofline_(std::move(roofline)) {}

  absl::StatusOr<ServeReport> Run();

 private:
  absl::Status BuildInstances();
  void Push(double time, Event::Kind kind, int instance, int64_t request, int64_t version = 0) {
    events_.push({time, order_++, kind, instance, request, version});
  }
  std::vector<int32_t> Tokens(int64_t r) const;
  int Route(int64_t r, const HashedPrompt& prompt);
  // The request's prompt, hashed (the namespace is the fleet's: any instance takes it).
  absl::StatusOr<const HashedPrompt*> Hashed(int64_t r);
  absl::Status OnArrival(int64_t r);
  absl::Status StartStep(int i);
  absl::Status OnStepDone(int i);
  absl::Status OnDeadline(int64_t r);
  absl::Status OnTransferDone(int i, int link, int64_t tag, int64_t id);
  // Admission of the queue's head: kOk admitted; kResourceExhausted no room now (stays queued);
  // kOutOfRange the prompt can never fit (failed).
  absl::Status Admit(int i, int64_t r);
  absl::Status Preempt(int i, int64_t victim);
  // A running request that can never go on (alone, HBM full of its own blocks): released, failed.
  absl::Status FailRunning(int i, int64_t r);
  // Takes `r` out of the running set and this step's batch, its transfers cancelled.
  void StopRunning(int i, int64_t r);
  // Admission of a swapped request: Resume, and its blocks onboard on the links.
  absl::Status SwapIn(int i, int64_t r);
  bool CanSwap(const Live& l) const {
    if (!o_.scheduler.swap || o_.profile == ServeProfile::kRecompute || l.phase != Phase::kDecode) {
      return false;
    }
    for (int t = kDram; t < kNumTiers; ++t) {
      if (capacity_[t] > 0 && UsesTier(o_.profile, t)) return true;
    }
    return false;
  }
  absl::Status Finish(int i, int64_t r);
  void Fail(int64_t r);
  void SessionNext(int64_t r);
  absl::Status Settle(int i);  // waits for the cache's copies; charges background copies
  void SampleOccupancy(int i);
  void ReadyToPrefill(int64_t r);
  // After admission or swap-in with l.transfers set: ready now if none; with layer-wise
  // onboarding and every transfer expected by the deadline, ready now while they land (its
  // steps wait for them, OnStepDone); otherwise it waits for them up to the deadline.
  void BeginOnboarding(int i, int64_t r);
  int LinkOfTier(int tier) const { return LinkFor(tier, kHbm); }

  const Trace& trace_;
  const ServeOptions& o_;
  Roofline roofline_;
  int B_ = 0;
  double block_bytes_ = 0;
  std::array<int64_t, kNumTiers> capacity_{};
  std::shared_ptr<std::atomic<int64_t>> now_ns_ = std::make_shared<std::atomic<int64_t>>(0);
  double now_ = 0;
  std::vector<Instance> inst_;
  std::vector<Live> live_;
  std::vector<int64_t> next_in_session_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t order_ = 0;
  uint64_t next_seq_ = 1;
  int64_t n_ = 0;
  int64_t done_ = 0;
  int rr_ = 0;
  absl::flat_hash_map<uint64_t, int> session_home_;
  std::vector<double> ttft_, itl_, e2e_;
  ServeReport r_;
  double first_arrival_ = kInf;
  double last_finish_ = 0;
  double held_integral_ = 0, cached_integral_ = 0;
  int64_t fleet_held_ = 0, fleet_cached_ = 0;  // summed over instances, as of the last Settle
  double next_occupancy_point_ = 0;            // simulated time of the next series point
  double occupancy_period_ = 1.0;              // seconds between points (doubles when thinned)
};

std::vector<int32_t> Simulation::Tokens(int64_t r) const {
  const TraceRequest& q = trace_.requests[static_cast<size_t>(r)];
  std::vector<int32_t> t = PromptTokens(q, trace_.block_tokens);
  const Live& l = live_[static_cast<size_t>(r)];
  // A readmission's prompt carries the tokens it had produced (deterministic ids).
  for (int64_t k = static_cast<int64_t>(t.size()); k < l.prompt; ++k) {
    t.push_back(DecodeToken(r, k));
  }
  return t;
}

absl::Status Simulation::BuildInstances() {
  auto ns = CacheNamespace::Create(
      o_.geometry,
      {.model_id = absl::StrCat("kvtier-serve/",
                                o_.model_name.empty() ? std::string("model") : o_.model_name),
       .weights_fingerprint = "kvtier-replay-serve"});
  if (!ns.ok()) return ns.status();
  // One store for the fleet's remote tiers (serve.h), when there is a fleet and a remote tier.
  std::shared_ptr<MetadataStore> store;
  if (o_.shared_remote && o_.instances > 1 && capacity_[kRemote] > 0)
    store = std::make_shared<MetadataStore>();
  for (int i = 0; i < o_.instances; ++i) {
    Instance in;
    in.links.emplace_back(absl::StrCat("i", i, ".pcie_h2d"), o_.links.pcie_bytes_per_second,
                          o_.links.pcie_latency_seconds);
    in.links.emplace_back(absl::StrCat("i", i, ".pcie_d2h"), o_.links.pcie_bytes_per_second,
                          o_.links.pcie_latency_seconds);
    in.links.emplace_back(absl::StrCat("i", i, ".nvme"), o_.links.nvme_bytes_per_second,
                          o_.links.nvme_latency_seconds);
    in.links.emplace_back(absl::StrCat("i", i, ".network"), o_.links.network_bytes_per_second,
                          o_.links.network_latency_seconds);
    TierStackOptions stack;
    for (int t = 0; t < kNumTiers; ++t) {
      stack.tiers[t] = {.capacity_blocks = std::max<int64_t>(capacity_[t], 0),
                        .kind = TierBackendKind::kMetadata};
    }
    stack.metadata_store = store;
    auto tiers = BuildTierStack(*ns, stack);
    if (!tiers.ok()) return tiers.status();
    KvCacheOptions co;
    co.tiers = *std::move(tiers);
    co.bounce_buffers = 1;
    co.room_wait = absl::Seconds(10);
    co.event_buffer = 1;
    co.measure_bandwidth = false;
    // The store answers at once, so the probe may cover a whole prompt (its largest window).
    if (store != nullptr) co.remote_probe_window_blocks = 4096;
    // kvtier publishes every computed block to a fleet store at once (the others find it there);
    // hicache reaches its L3 by write-through and eviction, as SGLang's does.
    co.publish_to_remote = store != nullptr && o_.profile == ServeProfile::kKvtier;
    co.links[kDram] = {absl::Seconds(o_.links.pcie_latency_seconds),
                       o_.links.pcie_bytes_per_second};
    co.links[kNvme] = {absl::Seconds(o_.links.nvme_latency_seconds),
                       o_.links.nvme_bytes_per_second};
    co.links[kRemote] = {absl::Seconds(o_.links.network_latency_seconds),
                         o_.links.network_bytes_per_second};
    const bool kvtier = o_.profile == ServeProfile::kKvtier;
    co.eviction_policy = kvtier ? o_.kvtier_policy : "lru";
    co.demote_by_value = !kvtier || o_.kvtier_demote_by_value;  // lru has no estimate: moot
    co.write_policy = (o_.profile == ServeProfile::kDramLru || o_.profile == ServeProfile::kHicache)
                          ? WritePolicy::kWriteThrough
                          : WritePolicy::kWriteBack;
    if (kvtier) {
      // The cost model at the instance's sustained prefill rate; the peers restore every
      // matched block (the namespace's model id is not in the known table, so they have none).
      PrefillCostOptions cost = o_.cost;
      cost.flops_per_second =
          o_.roofline.tensor_parallel * o_.roofline.gpu.peak_flops * o_.roofline.mfu;
      co.prefill_cost = cost;
      co.prefill_flops_per_second = cost.flops_per_second;
    }
    auto now = now_ns_;
    co.clock = [now] { return absl::UnixEpoch() + absl::Nanoseconds(now->load()); };
    auto cache = KvCache::Create(*ns, std::move(co));
    if (!cache.ok()) return cache.status();
    in.cache = std::move(*cache);
    in.last_stats = in.cache->stats();
    inst_.push_back(std::move(in));
  }
  return absl::OkStatus();
}

absl::StatusOr<const HashedPrompt*> Simulation::Hashed(int64_t r) {
  Live& l = live_[static_cast<size_t>(r)];
  if (!l.hashed.has_value()) {
    auto h = inst_.front().cache->HashPrompt(Tokens(r));
    if (!h.ok()) return h.status();
    l.hashed = *std::move(h);
  }
  return &*l.hashed;
}

int Simulation::Route(int64_t r, const HashedPrompt& prompt) {
  const int n = static_cast<int>(inst_.size());
  if (n == 1) return 0;
  auto least_loaded = [&] {
    int best = 0;
    for (int i = 1; i < n; ++i) {
      const auto load = [&](int k) { return inst_[k].waiting.size() + inst_[k].running.size(); };
      if (load(i) < load(best)) best = i;
    }
    return best;
  };
  const TraceRequest& q = trace_.requests[static_cast<size_t>(r)];
  switch (o_.router) {
    case RouterKind::kRoundRobin:
      return rr_++ % n;
    case RouterKind::kLeastLoaded:
      return least_loaded();
    case RouterKind::kSession: {
      if (q.session == 0) return least_loaded();
      auto [it, inserted] = session_home_.try_emplace(q.session, 0);
      if (inserted) it->second = least_loaded();
      return it->second;
    }
    case RouterKind::kKvAware: {
      int best = 0;
      double best_cost = kInf;
      for (int i = 0; i < n; ++i) {
        auto found = inst_[i].cache->LookupHashed(prompt);
        const int64_t hit = found.ok() ? found->matched_tokens : 0;
        const double cost = static_cast<double>(static_cast<int64_t>(prompt.tokens().size()) - hit +
                                                inst_[i].queued_prompt_tokens);
        if (cost < best_cost) {
          best_cost = cost;
          best = i;
        }
      }
      return best;
    }
  }
  return 0;
}

absl::Status Simulation::OnArrival(int64_t r) {
  Live& l = live_[static_cast<size_t>(r)];
  const TraceRequest& q = trace_.requests[static_cast<size_t>(r)];
  l.arrival = now_;
  l.prompt = q.input_tokens;
  l.output = std::max<int64_t>(1, q.output_tokens);
  first_arrival_ = std::min(first_arrival_, now_);
  r_.requests++;
  int i = 0;
  if (inst_.size() > 1 && o_.router == RouterKind::kKvAware) {
    auto hashed = Hashed(r);
    if (!hashed.ok()) return hashed.status();
    i = Route(r, **hashed);
  } else {
    i = Route(r, HashedPrompt());
  }
  l.instance = i;
  l.phase = Phase::kQueued;
  Instance& in = inst_[static_cast<size_t>(i)];
  in.waiting.push_back(r);
  in.queued_prompt_tokens += l.prompt;
  if (o_.profile == ServeProfile::kKvtier && !in.waiting.empty() &&
      (in.stepping || in.waiting.size() > 1)) {
    // Prefetch while it waits: its prefix's blocks below HBM start moving up now.
    auto hashed = Hashed(r);
    if (!hashed.ok()) return hashed.status();
    auto where = in.cache->LookupHashed(**hashed);
    if (where.ok()) {
      auto started = in.cache->Prefetch((*hashed)->tokens(), {.session = q.session});
      if (started.ok() && *started > 0) {
        int64_t left = *started;
        for (int t = kDram; t < kNumTiers && left > 0; ++t) {
          const int64_t blocks = std::min(left, where->blocks_by_tier[t]);
          if (blocks == 0) continue;
          left -= blocks;
          const int link = LinkOfTier(t);
          const int64_t id =
              in.links[link].Start(now_, static_cast<double>(blocks) * block_bytes_, r * 2 + 1);
          l.prefetch.push_back({link, id, blocks, t});
        }
      }
      if (absl::Status s = Settle(i); !s.ok()) return s;
    }
  }
  if (!in.stepping) return StartStep(i);
  return absl::OkStatus();
}

absl::Status Simulation::Settle(int i) {
  SampleOccupancy(i);  // the interval before this moment at the occupancy it had
  Instance& in = inst_[static_cast<size_t>(i)];
  if (absl::Status s = in.cache->WaitIdle(); !s.ok()) return s;
  const KvCacheStats st = in.cache->stats();
  // Copies the cache made on its own (demotions, write-through, pauses): every move not into
  // HBM (onboarding is charged to its request).
  for (int from = 0; from < kNumTiers; ++from) {
    for (int to = 1; to < kNumTiers; ++to) {
      const int64_t moved = st.blocks_moved[from][to] - in.last_stats.blocks_moved[from][to];
      if (moved > 0) {
        in.links[LinkFor(from, to)].Start(now_, static_cast<double>(moved) * block_bytes_, -1);
      }
    }
  }
  const int64_t held = st.tiers[kHbm].held_blocks + st.tiers[kHbm].locked_blocks;
  const int64_t cached = st.tiers[kHbm].droppable_blocks;
  fleet_held_ += held - in.held;
  fleet_cached_ += cached - in.cached;
  in.held = held;
  in.cached = cached;
  r_.hbm_running_blocks_max = std::max(r_.hbm_running_blocks_max, fleet_held_);
  in.last_stats = st;
  return absl::OkStatus();
}

void Simulation::SampleOccupancy(int i) {
  Instance& in = inst_[static_cast<size_t>(i)];
  const double dt = now_ - in.last_sample;
  if (dt > 0) {
    held_integral_ += dt * static_cast<double>(in.held);
    cached_integral_ += dt * static_cast<double>(in.cached);
  }
  in.last_sample = now_;
  // The fleet's state as it was up to now, at each sample time passed.
  constexpr size_t kMaxPoints = 4096;
  std::vector<ServeReport::OccupancyPoint>& series = r_.hbm_occupancy;
  if (first_arrival_ < kInf)
    next_occupancy_point_ = std::max(next_occupancy_point_, first_arrival_);
  while (first_arrival_ < kInf && now_ >= next_occupancy_point_) {
    series.push_back({next_occupancy_point_ - first_arrival_, fleet_held_, fleet_cached_});
    next_occupancy_point_ += occupancy_period_;
    if (series.size() >= kMaxPoints) {
      for (size_t k = 0; 2 * k < series.size(); ++k) series[k] = series[2 * k];
      series.resize((series.size() + 1) / 2);
      occupancy_period_ *= 2;
      next_occupancy_point_ = first_arrival_ + series.back().seconds + occupancy_period_;
    }
  }
}

void Simulation::BeginOnboarding(int i, int64_t r) {
  Live& l = live_[static_cast<size_t>(r)];
  if (l.transfers.empty()) {
    ReadyToPrefill(r);
    return;
  }
  if (o_.layerwise_onboard) {
    const Instance& in = inst_[static_cast<size_t>(i)];
    double landing = now_;
    for (const Live::Transfer& t : l.transfers) {
      landing = std::max(landing, in.links[t.link].EstimatedCompletion(t.id));
    }
    if (landing - now_ <= o_.onboard_deadline_seconds) {
      l.overlap = true;
      ReadyToPrefill(r);
      return;
    }
  }
  l.phase = Phase::kOnboarding;
  l.deadline_version++;
  Push(now_ + o_.onboard_deadline_seconds, Event::kDeadline, i, r, l.deadline_version);
}

void Simulation::ReadyToPrefill(int64_t r) {
  Live& l = live_[static_cast<size_t>(r)];
  l.phase = l.computed >= l.prompt ? Phase::kDecode : Phase::kPrefill;
  l.deadline_version++;
}

absl::Status Simulation::Admit(int i, int64_t r) {
  if (live_[static_cast<size_t>(r)].swapped) return SwapIn(i, r);
  Instance& in = inst_[static_cast<size_t>(i)];
  Live& l = live_[static_cast<size_t>(r)];
  const TraceRequest& q = trace_.requests[static_cast<size_t>(r)];
  KvCache& cache = *in.cache;
  auto prompt = Hashed(r);
  if (!prompt.ok()) return prompt.status();
  const HashedPrompt& hashed = **prompt;
  {
    // Room first, from counters: the head of a queue is tried every step until it fits.
    int64_t hbm_hits = 0;
    if (o_.profile != ServeProfile::kRecompute) {
      auto where = cache.LookupHashed(hashed);
      if (!where.ok()) return where.status();
      hbm_hits = where->blocks_by_tier[kHbm];
    }
    // One slot of headroom for the first decode token while others run; alone, exactly the
    // prompt's blocks decide whether it can ever fit.
    const int64_t needed = (l.prompt + B_ - 1) / B_ - hbm_hits + (in.running.empty() ? 0 : 1);
    auto room = cache.CheckRoom(needed);
    if (!room.ok()) return room.status();
    if (!room->fits_after_evictions) {
      if (in.running.empty()) return absl::OutOfRangeError("the prompt does not fit an empty HBM");
      return absl::ResourceExhaustedError("no room yet");
    }
  }
  const SequenceId id(next_seq_++);
  const bool caching = o_.profile != ServeProfile::kRecompute;
  if (absl::Status s = cache.CreateSequence(
          id, {.session = q.session, .enable_caching = caching, .readmission = l.readmission});
      !s.ok()) {
    return s;
  }
  const absl::Span<const int32_t> tokens = hashed.tokens();
  auto attach = cache.AttachHashedPrefix(id, hashed);
  if (!attach.ok()) return attach.status();
  auto undo = [&](absl::Status why) {
    (void)cache.Release(id);
    return why;
  };
  const int64_t attached = attach->attached_tokens;
  auto append = cache.Append(id, tokens.subspan(static_cast<size_t>(attached)));
  if (!append.ok()) {
    if (!absl::IsResourceExhausted(append.status())) return undo(append.status());
    (void)undo(append.status());
    if (absl::Status s = Settle(i); !s.ok()) return s;
    if (in.running.empty()) {
      return absl::OutOfRangeError("the prompt does not fit an empty HBM");
    }
    return append.status();
  }
  int64_t below = 0;
  for (int t = kDram; t < kNumTiers; ++t) below += attach->attached_blocks_by_tier[t];
  if (below > 0 || attach->attached_blocks_by_tier[kHbm] > 0) {
    // The cache onboards its blocks now (metadata tiers: at once); their time is the links'.
    auto ticket = cache.EnsureResident(id, 0, attached, {.mode = ResidencyMode::kWait});
    if (!ticket.ok()) {
      if (!absl::IsResourceExhausted(ticket.status())) return undo(ticket.status());
      (void)undo(ticket.status());
      if (absl::Status s = Settle(i); !s.ok()) return s;
      if (in.running.empty()) {
        return absl::OutOfRangeError("the prompt does not fit an empty HBM");
      }
      return ticket.status();
    }
    if (absl::Status s = cache.ReleaseTicket(*ticket); !s.ok()) return s;
  }
  if (absl::Status s = Settle(i); !s.ok()) return s;

  in.waiting.pop_front();
  in.queued_prompt_tokens -= live_[static_cast<size_t>(r)].prompt;
  in.running.push_back(r);
  l.hashed.reset();
  l.seq = id;
  l.computed = attached;
  l.kv_tokens = attached;
  l.reported = attached;  // the cache counts attached tokens as written
  if (!l.counted) {
    l.counted = true;
    l.hits_counted = true;
    r_.prompt_tokens += q.input_tokens;
    r_.matched_tokens += attach->matched_tokens;
    const int64_t last_token_blocks =
        std::max<int64_t>(0, attach->matched_tokens / B_ - (q.input_tokens - 1) / B_);
    r_.cost_model_recomputed_tokens += attach->matched_tokens - attached - last_token_blocks * B_;
  }
  // Blocks a prefetch is still moving are in HBM for the cache, not yet for the simulation:
  // they are this request's onboarding (at most as many as it attached from HBM).
  int64_t hbm_now = attach->attached_blocks_by_tier[kHbm];
  for (Live::Transfer& p : l.prefetch) {
    p.blocks = std::min(p.blocks, hbm_now);
    hbm_now -= p.blocks;
  }
  if (l.hits_counted && !l.readmission) {
    // Hits from HBM are served now; the rest when their transfers land (OnTransferDone).
    r_.served_hit_tokens += hbm_now * B_;
    r_.served_hit_tokens_by_tier[kHbm] += hbm_now * B_;
  }
  // Onboarding: one transfer per source tier, plus the prefetch still in flight.
  l.transfers.clear();
  for (int t = kDram; t < kNumTiers; ++t) {
    const int64_t blocks = attach->attached_blocks_by_tier[t];
    if (blocks == 0) continue;
    const int link = LinkOfTier(t);
    const int64_t tid =
        in.links[link].Start(now_, static_cast<double>(blocks) * block_bytes_, r * 2);
    l.transfers.push_back({link, tid, blocks, t});
  }
  // Prefetches clipped to nothing (their blocks were evicted again) go on as background copies.
  for (const Live::Transfer& p : l.prefetch) {
    if (p.blocks > 0) l.transfers.push_back(p);
  }
  l.prefetch.clear();
  BeginOnboarding(i, r);
  return absl::OkStatus();
}

absl::Status Simulation::OnTransferDone(int i, int link, int64_t tag, int64_t id) {
  if (tag < 0) return absl::OkStatus();  // a background copy
  const int64_t r = tag / 2;
  Live& l = live_[static_cast<size_t>(r)];
  for (auto* list : {&l.transfers, &l.prefetch}) {
    for (auto it = list->begin(); it != list->end(); ++it) {
      if (it->id != id || it->link != link) continue;  // ids are per link
      // A prefetch landing before admission is an HBM hit there; after, the onboarding's.
      if (list == &l.transfers && !l.readmission) {
        r_.served_hit_tokens += it->blocks * B_;
        r_.served_hit_tokens_by_tier[it->tier] += it->blocks * B_;
      }
      list->erase(it);
      break;
    }
  }
  if (l.phase == Phase::kOnboarding && l.transfers.empty()) {
    ReadyToPrefill(r);
    if (!inst_[static_cast<size_t>(i)].stepping) return StartStep(i);
  }
  if (l.overlap && l.transfers.empty()) {
    l.overlap = false;
    Instance& in = inst_[static_cast<size_t>(i)];
    if (in.waiting_for_layers) {
      bool pending = false;
      for (const BatchItem& b : in.batch) {
        const Live& o = live_[static_cast<size_t>(b.request)];
        pending = pending || (o.overlap && !o.transfers.empty());
      }
      if (!pending) {
        in.waiting_for_layers = false;
        const int layers = std::max(1, o_.geometry.num_layers());
        Push(now_ + in.step_seconds / layers, Event::kStepDone, i, -1);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Simulation::OnDeadline(int64_t r) {
  Live& l = live_[static_cast<size_t>(r)];
  if (l.phase != Phase::kOnboarding) return absl::OkStatus();
  Instance& in = inst_[static_cast<size_t>(l.instance)];
  int64_t lost = 0;
  for (const Live::Transfer& t : l.transfers) {
    const double fraction = in.links[t.link].Cancel(t.id, now_);
    const int64_t landed =
        static_cast<int64_t>(std::floor(std::max(0.0, fraction) * static_cast<double>(t.blocks)));
    if (!l.readmission) {
      r_.served_hit_tokens += landed * B_;
      r_.served_hit_tokens_by_tier[t.tier] += landed * B_;
    }
    lost += t.blocks - landed;
  }
  l.transfers.clear();
  // What did not land is recomputed (the prefix is shortened by as many blocks).
  l.computed = std::max<int64_t>(0, l.computed - lost * B_);
  l.kv_tokens = l.computed;
  if (!l.readmission) r_.late_tokens += lost * B_;
  ReadyToPrefill(r);
  if (!in.stepping) return StartStep(l.instance);
  return absl::OkStatus();
}

void Simulation::StopRunning(int i, int64_t r) {
  Instance& in = inst_[static_cast<size_t>(i)];
  Live& l = live_[static_cast<size_t>(r)];
  for (const Live::Transfer& t : l.transfers) (void)in.links[t.link].Cancel(t.id, now_);
  l.transfers.clear();
  l.overlap = false;
  in.running.erase(std::find(in.running.begin(), in.running.end(), r));
  in.batch.erase(std::remove_if(in.batch.begin(), in.batch.end(),
                                [&](const BatchItem& b) { return b.request == r; }),
                 in.batch.end());
}

absl::Status Simulation::Preempt(int i, int64_t victim) {
  Instance& in = inst_[static_cast<size_t>(i)];
  Live& v = live_[static_cast<size_t>(victim)];
  auto leave_running = [&] {
    StopRunning(i, victim);
    in.waiting.push_front(victim);
  };
  if (CanSwap(v) && in.cache->Pause(v.seq, PauseHints{.preempted = true}).ok()) {
    // Swapped out: its KV stays, one tier down; it comes back to decode, not to prefill.
    r_.preemptions++;
    r_.swap_preemptions++;
    v.swapped = true;
    v.readmission = true;  // what it restores is its own, not a hit
    // Everything in its KV is "prompt" now: a block that misses the swap-in deadline is
    // recomputed, then it decodes on.
    v.prompt = v.kv_tokens;
    v.computed = v.kv_tokens;
    v.phase = Phase::kQueued;
    v.deadline_version++;
    leave_running();
    return absl::OkStatus();
  }
  auto released = in.cache->Release(v.seq, ReleaseHints{.preempted = true});
  if (!released.ok()) return released.status();
  r_.preemptions++;
  // It comes back with what it had: the prompt and the tokens produced so far.
  v.prompt = trace_.requests[static_cast<size_t>(victim)].input_tokens + v.emitted;
  v.computed = 0;
  v.readmission = true;
  v.hashed.reset();  // its prompt grew
  v.phase = Phase::kQueued;
  v.deadline_version++;
  leave_running();
  in.queued_prompt_tokens += v.prompt;
  return absl::OkStatus();
}

absl::Status Simulation::FailRunning(int i, int64_t r) {
  // Its transfers stop before its sequence goes (Preempt's order).
  StopRunning(i, r);
  if (absl::Status s = inst_[static_cast<size_t>(i)].cache->Release(live_[static_cast<size_t>(r)].seq);
      !s.ok()) {
    return s;
  }
  Fail(r);
  return absl::OkStatus();
}

absl::Status Simulation::SwapIn(int i, int64_t r) {
  Instance& in = inst_[static_cast<size_t>(i)];
  Live& l = live_[static_cast<size_t>(r)];
  KvCache& cache = *in.cache;
  // Room from counters first, as Admit: its blocks plus the next token's slot (its own HBM
  // copies, droppable while paused, count as room).
  auto room = cache.CheckRoom((l.kv_tokens + B_) / B_ + 1);
  if (!room.ok()) return room.status();
  if (!room->fits_after_evictions) {
    if (in.running.empty()) return absl::OutOfRangeError("the request no longer fits HBM");
    return absl::ResourceExhaustedError("no room yet");
  }
  if (absl::Status s = Settle(i); !s.ok()) return s;
  const KvCacheStats before = in.last_stats;
  auto resumed = cache.Resume(l.seq);
  if (!resumed.ok()) return resumed.status();
  if (absl::Status s = cache.WaitIdle(); !s.ok()) return s;
  if (!resumed->Wait().ok()) {
    // Not all of it could come back (HBM full of held blocks): down again, try later; with
    // nothing else running there is no later.
    if (auto s = cache.Pause(l.seq, PauseHints{.preempted = true}); !s.ok()) return s.status();
    if (absl::Status s = Settle(i); !s.ok()) return s;
    if (in.running.empty()) return absl::OutOfRangeError("the request no longer fits HBM");
    return absl::ResourceExhaustedError("no room yet");
  }
  const KvCacheStats after = cache.stats();
  if (absl::Status s = Settle(i); !s.ok()) return s;
  in.waiting.pop_front();
  in.running.push_back(r);
  l.swapped = false;
  // Its blocks cross the links as an onboarding (charged to it, with its deadline).
  l.transfers.clear();
  for (int t = kDram; t < kNumTiers; ++t) {
    const int64_t blocks = after.blocks_moved[t][kHbm] - before.blocks_moved[t][kHbm];
    if (blocks <= 0) continue;
    const int link = LinkOfTier(t);
    const int64_t tid =
        in.links[link].Start(now_, static_cast<double>(blocks) * block_bytes_, r * 2);
    l.transfers.push_back({link, tid, blocks, t});
  }
  BeginOnboarding(i, r);
  return absl::OkStatus();
}

void Simulation::SessionNext(int64_t r) {
  const int64_t next = next_in_session_[static_cast<size_t>(r)];
  if (next < 0) return;
  const double think = trace_.requests[static_cast<size_t>(next)].think_seconds;
  Push(now_ + std::max(0.0, think), Event::kArrival, -1, next);
}

void Simulation::Fail(int64_t r) {
  Live& l = live_[static_cast<size_t>(r)];
  l.phase = Phase::kFailed;
  r_.failed++;
  r_.failed_prompt_exceeds_hbm++;
  last_finish_ = std::max(last_finish_, now_);
  done_++;
  if (o_.progress && (done_ % 64 == 0 || done_ == n_)) o_.progress(done_, n_);
  if (o_.closed_loop) SessionNext(r);
}

absl::Status Simulation::Finish(int i, int64_t r) {
  Instance& in = inst_[static_cast<size_t>(i)];
  Live& l = live_[static_cast<size_t>(r)];
  const TraceRequest& q = trace_.requests[static_cast<size_t>(r)];
  KvCache& cache = *in.cache;
  ReleaseHints hints;
  if (o_.profile == ServeProfile::kKvtier && q.session != 0 &&
      o_.kvtier_hints != ServeHints::kNone) {
    hints.stop_reason = ToCacheStopReason(q.stop);
    hints.last_turn = q.last_turn;
    const int64_t next = next_in_session_[static_cast<size_t>(r)];
    if (o_.kvtier_hints == ServeHints::kOracleIdle && next >= 0) {
      // When the session's next request arrives: its think time after this finish (closed
      // loop), or its trace arrival (open loop).
      const TraceRequest& n = trace_.requests[static_cast<size_t>(next)];
      const double idle = o_.closed_loop ? n.think_seconds : n.arrival_seconds - now_;
      hints.expected_idle = absl::Seconds(std::max(0.0, idle));
      r_.oracle_idle_releases++;
    }
  }
  auto released = cache.Release(l.seq, hints);
  if (!released.ok()) return released.status();
  in.running.erase(std::find(in.running.begin(), in.running.end(), r));
  l.phase = Phase::kDone;
  r_.finished++;
  r_.output_tokens += l.emitted;
  ttft_.push_back((l.first_token - l.arrival) * 1e3);
  e2e_.push_back(now_ - l.arrival);
  const double tpot = l.emitted > 1 ? l.itl_sum / static_cast<double>(l.emitted - 1) : 0;
  if (l.first_token - l.arrival <= o_.slo_ttft_seconds && tpot <= o_.slo_itl_seconds) {
    r_.slo_met++;
  }
  last_finish_ = std::max(last_finish_, now_);
  done_++;
  if (o_.progress && (done_ % 64 == 0 || done_ == n_)) o_.progress(done_, n_);
  if (o_.closed_loop) SessionNext(r);
  return absl::OkStatus();
}

absl::Status Simulation::StartStep(int i) {
  Instance& in = inst_[static_cast<size_t>(i)];
  KvCache& cache = *in.cache;
  SampleOccupancy(i);
  in.batch.clear();
  int64_t budget = o_.scheduler.max_batched_tokens;
  // 1. Decodes: a slot for each one's next token; preempt from the back when HBM is full.
  const std::vector<int64_t> running = in.running;
  const int64_t preemptions_before = r_.preemptions;
  for (int64_t r : running) {
    Live& l = live_[static_cast<size_t>(r)];
    if (l.phase != Phase::kDecode || budget < 1) continue;
    while (true) {
      const int32_t token = DecodeToken(r, l.kv_tokens);
      auto appended = cache.Append(l.seq, {&token, 1});
      if (appended.ok()) break;
      if (!absl::IsResourceExhausted(appended.status())) return appended.status();
      if (in.running.size() == 1) {
        // Alone, and its next token has no slot: preempted it would only come back to the same
        // wall (and with nothing else running no step would ever be scheduled again).
        if (absl::Status s = FailRunning(i, r); !s.ok()) return s;
        break;
      }
      const int64_t victim = in.running.back();
      if (absl::Status s = Preempt(i, victim); !s.ok()) return s;
      if (victim == r) break;
    }
    if (l.phase != Phase::kDecode) continue;  // it was the victim, or failed
    in.batch.push_back({r, 1, true});
    budget -= 1;
  }
  // 2. Prefills under way.
  for (int64_t r : in.running) {
    Live& l = live_[static_cast<size_t>(r)];
    if (l.phase != Phase::kPrefill || budget < 1) continue;
    const int64_t chunk = std::min(budget, l.prompt - l.computed);
    in.batch.push_back({r, chunk, false});
    budget -= chunk;
  }
  // 3. Admissions while budget and running slots last.
  // Not in a step that preempted (vLLM V1 likewise): the victim would come straight back.
  while (r_.preemptions == preemptions_before && budget > 0 && !in.waiting.empty() &&
         static_cast<int>(in.running.size()) < o_.scheduler.max_running) {
    const int64_t r = in.waiting.front();
    absl::Status s = Admit(i, r);
    if (absl::IsResourceExhausted(s)) break;
    if (absl::IsOutOfRange(s)) {
      in.waiting.pop_front();
      Live& failed = live_[static_cast<size_t>(r)];
      if (failed.swapped) {
        // Paused in the cache, never to come back: its blocks go.
        if (absl::Status released = in.cache->Release(failed.seq); !released.ok()) {
          return released;
        }
        failed.swapped = false;
      } else {
        in.queued_prompt_tokens -= failed.prompt;
      }
      Fail(r);
      continue;
    }
    if (!s.ok()) return s;
    Live& l = live_[static_cast<size_t>(r)];
    if (l.phase == Phase::kPrefill) {
      const int64_t chunk = std::min(budget, l.prompt - l.computed);
      in.batch.push_back({r, chunk, false});
      budget -= chunk;
    }
  }
  if (absl::Status s = Settle(i); !s.ok()) return s;
  if (in.batch.empty()) {
    in.stepping = false;
    return absl::OkStatus();
  }
  StepWork work;
  for (const BatchItem& b : in.batch) {
    const Live& l = live_[static_cast<size_t>(b.request)];
    if (b.decode) {
      roofline_.AddDecode(work, l.kv_tokens);
    } else {
      roofline_.AddPrefill(work, l.computed, b.tokens);
    }
  }
  in.stepping = true;
  r_.steps++;
  in.step_seconds = roofline_.StepSeconds(work);
  Push(now_ + in.step_seconds, Event::kStepDone, i, -1);
  return absl::OkStatus();
}

absl::Status Simulation::OnStepDone(int i) {
  Instance& in = inst_[static_cast<size_t>(i)];
  KvCache& cache = *in.cache;
  // Layer-wise onboarding: the step's last layer cannot finish before that layer's KV of every
  // overlapped request in it has landed. Its end is then the last landing plus one layer's
  // compute (OnTransferDone), so a step lasts max(compute, transfer + compute / layers).
  for (const BatchItem& b : in.batch) {
    const Live& l = live_[static_cast<size_t>(b.request)];
    if (l.overlap && !l.transfers.empty()) {
      in.waiting_for_layers = true;
      return absl::OkStatus();
    }
  }
  const std::vector<BatchItem> batch = std::move(in.batch);
  in.batch.clear();
  for (const BatchItem& b : batch) {
    Live& l = live_[static_cast<size_t>(b.request)];
    if (b.decode) {
      if (l.phase != Phase::kDecode) continue;
      l.kv_tokens++;
      l.emitted++;
      l.itl_sum += now_ - l.last_token;
      itl_.push_back((now_ - l.last_token) * 1e3);
      l.last_token = now_;
    } else {
      if (l.phase != Phase::kPrefill) continue;
      l.computed += b.tokens;
      l.kv_tokens = l.computed;
      r_.prefilled_tokens += b.tokens;
      if (l.readmission) r_.recomputed_after_preemption_tokens += b.tokens;
      if (l.computed < l.prompt) continue;
      // The step that ends a prefill samples a token: the first, or after a readmission the
      // next one.
      l.phase = Phase::kDecode;
      if (l.first_token < 0) {
        l.first_token = now_;
      } else {
        l.itl_sum += now_ - l.last_token;
        itl_.push_back((now_ - l.last_token) * 1e3);
      }
      l.emitted++;
      l.last_token = now_;
    }
    // The KV written this step: its full blocks become shareable.
    if (l.kv_tokens / B_ > l.reported / B_) {
      if (absl::Status s = cache.ReportWritten(l.seq, l.kv_tokens); !s.ok()) return s;
      l.reported = l.kv_tokens;
    }
    if (l.emitted >= l.output) {
      if (absl::Status s = Finish(i, b.request); !s.ok()) return s;
    }
  }
  return StartStep(i);
}

absl::StatusOr<ServeReport> Simulation::Run() {
  const auto wall_start = std::chrono::steady_clock::now();
  B_ = o_.geometry.tokens_per_block();
  block_bytes_ = static_cast<double>(o_.geometry.bytes_per_block());
  capacity_ = o_.capacity_blocks;
  if (capacity_[kHbm] <= 0) {
    capacity_[kHbm] = static_cast<int64_t>(roofline_.KvPoolBytes() / block_bytes_);
    if (capacity_[kHbm] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model's weights (", roofline_.model().weight_bytes / 1e9,
                       " GB) leave no HBM for "
                       "KV on ",
                       o_.roofline.tensor_parallel, " x ", std::string(o_.roofline.gpu.name)));
    }
  }
  for (int t = 1; t < kNumTiers; ++t) {
    if (!UsesTier(o_.profile, t) || capacity_[t] <= 0) capacity_[t] = 0;
  }
  if (absl::Status s = BuildInstances(); !s.ok()) return s;

  n_ = o_.max_requests < 0 ? static_cast<int64_t>(trace_.requests.size())
                           : std::min<int64_t>(o_.max_requests, trace_.requests.size());
  live_.assign(static_cast<size_t>(n_), Live{});
  next_in_session_.assign(static_cast<size_t>(n_), -1);
  absl::flat_hash_map<uint64_t, int64_t> latest;
  for (int64_t k = 0; k < n_; ++k) {
    const TraceRequest& q = trace_.requests[static_cast<size_t>(k)];
    // Each session's next request, in both loops: the oracle's idle time reads it (open loop:
    // its arrival). Closed loop, only a session's first request arrives by the trace's clock.
    bool first = true;
    if (q.session != 0) {
      auto [it, inserted] = latest.try_emplace(q.session, k);
      if (!inserted) {
        next_in_session_[static_cast<size_t>(it->second)] = k;
        it->second = k;
        first = false;
      }
    }
    if (first || !o_.closed_loop) Push(q.arrival_seconds, Event::kArrival, -1, k);
  }

  while (true) {
    double link_time = kInf;
    int link_instance = -1, link_index = -1;
    for (size_t i = 0; i < inst_.size(); ++i) {
      for (int k = 0; k < kNumLinks; ++k) {
        const double t = inst_[i].links[static_cast<size_t>(k)].NextCompletion();
        if (t < link_time) {
          link_time = t;
          link_instance = static_cast<int>(i);
          link_index = k;
        }
      }
    }
    const double event_time = events_.empty() ? kInf : events_.top().time;
    if (link_time == kInf && event_time == kInf) break;
    if (link_time <= event_time) {
      now_ = link_time;
      now_ns_->store(static_cast<int64_t>(std::llround(now_ * 1e9)));
      for (const Link::Done& d : inst_[static_cast<size_t>(link_instance)]
                                     .links[static_cast<size_t>(link_index)]
                                     .AdvanceTo(now_)) {
        if (absl::Status s = OnTransferDone(link_instance, link_index, d.tag, d.id); !s.ok())
          return s;
      }
      continue;
    }
    const Event e = events_.top();
    events_.pop();
    now_ = e.time;
    now_ns_->store(static_cast<int64_t>(std::llround(now_ * 1e9)));
    absl::Status s;
    switch (e.kind) {
      case Event::kArrival:
        s = OnArrival(e.request);
        break;
      case Event::kStepDone:
        s = OnStepDone(e.instance);
        break;
      case Event::kDeadline:
        if (live_[static_cast<size_t>(e.request)].deadline_version == e.version) {
          s = OnDeadline(e.request);
        }
        break;
    }
    if (!s.ok()) return s;
  }
  // Occupancy is integrated up to the last finish; copies may drain after it.
  const double end = now_;
  const double start = first_arrival_ < kInf ? first_arrival_ : 0;
  now_ = std::max(last_finish_, start);
  for (size_t i = 0; i < inst_.size(); ++i) {
    SampleOccupancy(static_cast<int>(i));
    if (absl::Status s = inst_[i].cache->WaitIdle(); !s.ok()) return s;
  }

  r_.profile = ServeProfileName(o_.profile);
  if (o_.profile == ServeProfile::kKvtier &&
      (o_.kvtier_policy != "learned" || o_.kvtier_hints != ServeHints::kStopReason ||
       !o_.kvtier_demote_by_value)) {
    absl::StrAppend(&r_.profile, "(", o_.kvtier_policy, ", ", ServeHintsName(o_.kvtier_hints),
                    o_.kvtier_demote_by_value ? "" : ", demote all", ")");
  }
  if (o_.profile == ServeProfile::kKvtier && o_.kvtier_hints == ServeHints::kOracleIdle) {
    absl::StrAppend(&r_.profile, "+oracle");
  }
  r_.trace = trace_.name;
  r_.model = o_.model_name;
  r_.gpu = std::string(o_.roofline.gpu.name);
  r_.tensor_parallel = o_.roofline.tensor_parallel;
  r_.instances = o_.instances;
  r_.router = RouterName(o_.router);
  r_.shared_remote = o_.shared_remote && o_.instances > 1 && capacity_[kRemote] > 0;
  for (const Instance& in : inst_) {
    r_.remote_discovered_blocks += in.cache->stats().remote_probe.blocks_indexed;
  }
  for (int t = 0; t < kNumTiers; ++t) r_.capacity_blocks[t] = capacity_[t] > 0 ? capacity_[t] : -1;
  r_.ttft_p50_ms = Percentile(ttft_, 0.50);
  r_.ttft_p90_ms = Percentile(ttft_, 0.90);
  r_.ttft_p99_ms = Percentile(ttft_, 0.99);
  if (!ttft_.empty()) {
    std::vector<double> sorted = ttft_;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    for (size_t k = 0; k <= 100; ++k) {
      const size_t rank = (k * n + 99) / 100;  // ceil(k n / 100), in integers
      r_.ttft_percentiles_ms.push_back(sorted[rank == 0 ? 0 : rank - 1]);
    }
  }
  r_.itl_p50_ms = Percentile(itl_, 0.50);
  r_.itl_p99_ms = Percentile(itl_, 0.99);
  r_.e2e_p50_s = Percentile(e2e_, 0.50);
  r_.e2e_p99_s = Percentile(e2e_, 0.99);
  r_.simulated_seconds = first_arrival_ < kInf ? last_finish_ - first_arrival_ : 0;
  r_.output_tokens_per_second =
      r_.simulated_seconds > 0 ? static_cast<double>(r_.output_tokens) / r_.simulated_seconds : 0;
  r_.slo_attainment =
      r_.requests > 0 ? static_cast<double>(r_.slo_met) / static_cast<double>(r_.requests) : 0;
  const double span = std::max(last_finish_ - start, 1e-9);
  const double link_span = std::max(end - start, 1e-9);
  r_.hbm_running_blocks_mean = held_integral_ / span;
  r_.hbm_cached_blocks_mean = cached_integral_ / span;
  for (const Instance& in : inst_) {
    for (const Link& link : in.links) {
      r_.links.push_back({link.name(), link.bytes_moved(), link.busy_seconds() / link_span});
    }
  }
  r_.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return r_;
}

absl::Status Validate(const Trace& trace, const ServeOptions& o) {
  const int b = o.geometry.tokens_per_block();
  if (trace.block_tokens <= 0 || b <= 0 || trace.block_tokens % b != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens per block ", b, " must divide the trace's block size ", trace.block_tokens));
  }
  if (o.instances < 1 || o.instances > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("instances ", o.instances, " must be in [1, 64]"));
  }
  if (!(o.onboard_deadline_seconds > 0) || !std::isfinite(o.onboard_deadline_seconds)) {
    return absl::InvalidArgumentError("the onboard deadline must be > 0 and finite");
  }
  if (!(o.slo_ttft_seconds > 0) || !(o.slo_itl_seconds > 0)) {
    return absl::InvalidArgumentError("the SLOs must be > 0");
  }
  if (o.scheduler.max_batched_tokens < 1 || o.scheduler.max_running < 1) {
    return absl::InvalidArgumentError("max batched tokens and max running must be >= 1");
  }
  for (int t = 0; t < kNumTiers; ++t) {
    if (o.capacity_blocks[t] < 0) {
      return absl::InvalidArgumentError("tier capacities must be >= 0 blocks");
    }
  }
  const double links[] = {o.links.pcie_bytes_per_second, o.links.nvme_bytes_per_second,
                          o.links.network_bytes_per_second};
  const double latencies[] = {o.links.pcie_latency_seconds, o.links.nvme_latency_seconds,
                              o.links.network_latency_seconds};
  for (int k = 0; k < 3; ++k) {
    if (!(links[k] > 0) || !std::isfinite(links[k]) || !(latencies[k] >= 0) ||
        !std::isfinite(latencies[k])) {
      return absl::InvalidArgumentError(
          "link bandwidths must be > 0 and finite, latencies >= 0 and finite");
    }
  }
  for (const TraceRequest& q : trace.requests) {
    if (q.input_tokens < 1 ||
        static_cast<int64_t>(q.block_ids.size()) * trace.block_tokens < q.input_tokens) {
      return absl::InvalidArgumentError("a request's block ids do not cover its prompt");
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* ServeProfileName(ServeProfile p) {
  switch (p) {
    case ServeProfile::kRecompute:
      return "recompute";
    case ServeProfile::kHbmLru:
      return "hbm_lru";
    case ServeProfile::kDramLru:
      return "dram_lru";
    case ServeProfile::kHicache:
      return "hicache";
    case ServeProfile::kKvtier:
      return "kvtier";
  }
  return "kvtier";
}

const char* ServeHintsName(ServeHints hints) {
  switch (hints) {
    case ServeHints::kNone:
      return "none";
    case ServeHints::kStopReason:
      return "stop-reason";
    case ServeHints::kOracleIdle:
      return "oracle-idle";
  }
  return "stop-reason";
}

absl::StatusOr<ServeHints> ParseServeHints(std::string_view name) {
  for (ServeHints h : {ServeHints::kNone, ServeHints::kStopReason, ServeHints::kOracleIdle}) {
    if (name == ServeHintsName(h)) return h;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("hints ", std::string(name),
                   ": serve takes none, stop-reason or oracle-idle (pause is cache mode's)"));
}

absl::StatusOr<ServeProfile> ParseServeProfile(std::string_view name) {
  for (ServeProfile p : kAllServeProfiles) {
    if (name == ServeProfileName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "profile ", std::string(name), ": expected recompute, hbm_lru, dram_lru, hicache or kvtier"));
}

const char* RouterName(RouterKind r) {
  switch (r) {
    case RouterKind::kRoundRobin:
      return "round_robin";
    case RouterKind::kLeastLoaded:
      return "least_loaded";
    case RouterKind::kSession:
      return "session";
    case RouterKind::kKvAware:
      return "kv_aware";
  }
  return "round_robin";
}

absl::StatusOr<RouterKind> ParseRouter(std::string_view name) {
  for (RouterKind r : {RouterKind::kRoundRobin, RouterKind::kLeastLoaded, RouterKind::kSession,
                       RouterKind::kKvAware}) {
    if (name == RouterName(r)) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "router ", std::string(name), ": expected round_robin, least_loaded, session or kv_aware"));
}

absl::StatusOr<ServeReport> RunServe(const Trace& trace, const ServeOptions& options) {
  if (absl::Status s = Validate(trace, options); !s.ok()) return s;
  const ServingModel model = MakeServingModel(options.geometry, options.cost);
  auto roofline = Roofline::Create(options.roofline, model);
  if (!roofline.ok()) return roofline.status();
  Simulation sim(trace, options, *std::move(roofline));
  return sim.Run();
}

}  // namespace kvtier::replay
