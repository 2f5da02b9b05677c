// The release model (release_model.h): policy_lab_agentic.py's run_release over a shipped policy.
#include "bench/replay/offline/release_model.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/replay/offline/block_chains.h"
#include "bench/replay/offline/sim_tier.h"
#include "bench/replay/trace/json_fields.h"
#include "bench/replay/trace/trace_file.h"
#include "nlohmann/json.hpp"

namespace kvtier::replay {
namespace {

constexpr int64_t kMaxBlockTokens = int64_t{1} << 20;

absl::Time At(double seconds) { return absl::UnixEpoch() + absl::Seconds(seconds); }

bool IsBlank(absl::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

absl::StatusOr<StopReason> ParseStop(const nlohmann::json& record, const std::string& where) {
  absl::StatusOr<std::string> stop = StringField(record, where, "stop");
  if (!stop.ok()) return stop.status();
  if (*stop == "tool_use") return StopReason::kToolUse;
  if (*stop == "end_turn") return StopReason::kEndTurn;
  if (*stop == "unknown") return StopReason::kUnknown;
  return FieldError(where, "stop",
                    absl::StrCat("is \"", *stop, "\": expected tool_use, end_turn or unknown"));
}

// One request line into `w` (request index r, the header's block_tokens).
absl::Status ParseRequest(absl::string_view line, const std::string& where, int64_t block_tokens,
                          ReleaseModelWorkload& w) {
  absl::StatusOr<nlohmann::json> parsed = ParseJson(line, where);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& record = *parsed;
  if (absl::Status s = ExpectObject(record, where); !s.ok()) return s;
  absl::StatusOr<double> arrival = NumberField(record, where, "arrival", 0);
  if (!arrival.ok()) return arrival.status();
  const double previous = w.trace.requests.empty() ? 0 : w.trace.requests.back().arrival_seconds;
  if (*arrival < previous) {
    return FieldError(where, "arrival",
                      absl::StrCat("is ", *arrival, " s, before the request before's ", previous,
                                   " s: requests must be in arrival order"));
  }
  absl::StatusOr<double> finish = NumberField(record, where, "finish", *arrival);
  if (!finish.ok()) return finish.status();
  absl::StatusOr<int64_t> session = IntField(record, where, "session", 1);
  if (!session.ok()) return session.status();
  absl::StatusOr<StopReason> stop = ParseStop(record, where);
  if (!stop.ok()) return stop.status();
  // Optional: files written before the field existed, and by other tools, mean no last turns.
  absl::StatusOr<bool> last_turn = OptionalBoolField(record, where, "last_turn", false);
  if (!last_turn.ok()) return last_turn.status();
  absl::StatusOr<int64_t> input = IntField(record, where, "in", 1, kMaxTraceTokens);
  if (!input.ok()) return input.status();
  absl::StatusOr<std::vector<uint64_t>> ids = IdArrayField(record, where, "ids");
  if (!ids.ok()) return ids.status();
  if (static_cast<int64_t>(ids->size()) != *input / block_tokens) {
    return FieldError(where, "ids",
                      absl::StrCat("has ", ids->size(), " ids, but in ", *input, " needs floor(",
                                   *input, " / ", block_tokens, ") = ", *input / block_tokens));
  }
  for (size_t j = 0; j < ids->size(); ++j) {
    if ((*ids)[j] >= kReleaseTailIdBase) {
      return FieldError(where, "ids", absl::StrCat("[", j, "] is ", (*ids)[j], ", not below 2^62"));
    }
  }
  TraceRequest request;
  request.arrival_seconds = *arrival;
  request.input_tokens = *input;
  request.session = static_cast<uint64_t>(*session);
  request.stop = *stop;
  request.last_turn = *last_turn;
  request.block_ids = *std::move(ids);
  if (*input % block_tokens != 0) {
    request.block_ids.push_back(kReleaseTailIdBase + w.trace.requests.size());
  }
  w.trace.requests.push_back(std::move(request));
  w.finish_seconds.push_back(*finish);
  return absl::OkStatus();
}

// The script's PoolBelady as a policy: the candidate whose next arrival (at or after its Add) is
// furthest, deeper first on ties. A candidate's next arrival cannot change while it is one: an
// arrival that names it pins it first (a Remove).
class NextArrivalPolicy final : public EvictionPolicy {
 public:
  NextArrivalPolicy(std::vector<std::vector<absl::Time>> arrivals, std::vector<uint32_t> depth)
      : arrivals_(std::move(arrivals)), depth_(std::move(depth)), entry_(depth_.size()) {}

  std::string_view name() const override { return "optimal"; }
  bool reads_run_blocks() const override { return false; }

  absl::Status Add(const BlockKey& key, const BlockTraits&, absl::Time now) override {
    const uint32_t k = static_cast<uint32_t>(key.hi);
    if (k >= depth_.size() || entry_[k].has_value()) {
      return absl::InternalError(absl::StrCat("optimal: bad Add of ", key.ToHex()));
    }
    const std::vector<absl::Time>& u = arrivals_[k];
    auto it = std::lower_bound(u.begin(), u.end(), now);
    entry_[k] = Entry{it == u.end() ? absl::InfiniteFuture() : *it, depth_[k], k};
    order_.insert(*entry_[k]);
    return absl::OkStatus();
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    if (absl::Status s = Remove(key); !s.ok()) return s;
    return Add(key, traits, now);
  }
  absl::Status Remove(const BlockKey& key) override {
    const uint32_t k = static_cast<uint32_t>(key.hi);
    if (k >= depth_.size() || !entry_[k].has_value()) {
      return absl::InternalError(absl::StrCat("optimal: bad Remove of ", key.ToHex()));
    }
    order_.erase(*entry_[k]);
    entry_[k].reset();
    return absl::OkStatus();
  }
  std::optional<BlockKey> Victim(absl::Time) override {
    if (order_.empty()) return std::nullopt;
    return SimBlockKey(std::get<2>(*order_.rbegin()));
  }
  int64_t size() const override { return static_cast<int64_t>(order_.size()); }

 private:
  using Entry = std::tuple<absl::Time, uint32_t, uint32_t>;  // next arrival, depth, key
  std::vector<std::vector<absl::Time>> arrivals_;            // per key, ascending
  std::vector<uint32_t> depth_;
  std::vector<std::optional<Entry>> entry_;
  std::set<Entry> order_;
};

class ReleaseSimulator {
 public:
  ReleaseSimulator(EvictionPolicy& policy, const ReleaseModelOptions& options,
                   const BlockChains& chains, int block_tokens)
      : options_(options),
        chains_(chains),
        tier_(policy, options.bytes_per_token * block_tokens, chains.num_keys),
        held_(chains.num_keys, 0) {}

  // Request r arrives at `now`; returns its hit blocks.
  absl::StatusOr<int64_t> Arrive(size_t r, const TraceRequest& request, absl::Time now) {
    const uint32_t* chain = chains_.keys.data() + chains_.offset[r];
    const int64_t n = chains_.offset[r + 1] - chains_.offset[r];
    for (int64_t j = 1; j < n; ++j) {
      SimBlock& b = tier_.block(chain[j]);
      if (b.parent == kSimNoParent) b.parent = chain[j - 1];
    }
    int64_t hits = 0;
    while (hits < n && (held_[chain[hits]] > 0 || tier_.block(chain[hits]).cached)) ++hits;
    EvictionPolicy& policy = tier_.policy();
    if (policy.observes_requests()) {
      Name(chain, n);
      policy.ObserveRequest({.blocks = named_, .now = now, .session = request.session});
    }
    for (int64_t j = 0; j < n; ++j) {
      SimBlock& b = tier_.block(chain[j]);
      if (held_[chain[j]]++ == 0 && b.cached) {
        ++b.uses;
        b.last_use = now;
        b.pinned = true;
        ++pinned_;
        if (absl::Status s = tier_.Update(chain[j]); !s.ok()) return Failed(r, s);
      }
    }
    latest_[request.session] = r;
    return hits;
  }

  // Request r finishes at `now`.
  absl::Status Finish(size_t r, const TraceRequest& request, absl::Time now) {
    const uint32_t* chain = chains_.keys.data() + chains_.offset[r];
    const int64_t n = chains_.offset[r + 1] - chains_.offset[r];
    EvictionPolicy& policy = tier_.policy();
    if (policy.observes_requests()) {
      Name(chain, n);
      policy.ObserveRelease({.blocks = named_,
                             .now = now,
                             .session = request.session,
                             .stop_reason = options_.stop_reasons ? ToCacheStopReason(request.stop)
                                                                  : kvtier::StopReason::kUnknown,
                             .expected_idle = std::nullopt,
                             .superseded = latest_[request.session] != r,
                             .last_turn = options_.stop_reasons && request.last_turn});
    }
    released_.clear();
    for (int64_t j = n - 1; j >= 0; --j) {  // leaf -> root, as the script releases
      if (--held_[chain[j]] == 0) released_.push_back(chain[j]);
    }
    for (uint32_t key : released_) {
      SimBlock& b = tier_.block(key);
      b.last_use = now;
      if (b.cached) {
        b.pinned = false;
        --pinned_;
      } else {
        b.uses = 1;
        if (absl::Status s = tier_.Cache(key); !s.ok()) return Failed(r, s);
      }
    }
    for (uint32_t key : released_) {
      if (absl::Status s = tier_.Update(key); !s.ok()) return Failed(r, s);
    }
    while (tier_.cached() - pinned_ > options_.capacity_blocks) {
      if (absl::StatusOr<uint32_t> s = tier_.EvictOne(now); !s.ok()) return Failed(r, s.status());
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Failed(size_t r, const absl::Status& s) {
    return absl::InternalError(absl::StrCat("release model: request ", r, ": ", s.message()));
  }

  void Name(const uint32_t* chain, int64_t n) {
    named_.clear();
    for (int64_t j = 0; j < n; ++j) named_.push_back(SimBlockKey(chain[j]));
  }

  const ReleaseModelOptions& options_;
  const BlockChains& chains_;
  SimTier tier_;
  std::vector<uint32_t> held_;                    // per key: running requests holding it
  int64_t pinned_ = 0;                            // cached blocks a running request holds
  absl::flat_hash_map<uint64_t, size_t> latest_;  // session -> its latest arrival
  std::vector<BlockKey> named_;
  std::vector<uint32_t> released_;
};

absl::Status Validate(const ReleaseModelWorkload& w, const ReleaseModelOptions& options) {
  if (options.capacity_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity_blocks ", options.capacity_blocks, " is negative"));
  }
  if (options.bytes_per_token <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes_per_token ", options.bytes_per_token, " is not positive"));
  }
  if (w.finish_seconds.size() != w.trace.requests.size()) {
    return absl::InvalidArgumentError(absl::StrCat("finish_seconds has ", w.finish_seconds.size(),
                                                   " entries for ", w.trace.requests.size(),
                                                   " requests"));
  }
  for (size_t r = 0; r < w.finish_seconds.size(); ++r) {
    const double arrival = w.trace.requests[r].arrival_seconds;
    if (r > 0 && !(arrival >= w.trace.requests[r - 1].arrival_seconds)) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r, ": arrival ", arrival,
                                                     " s is before the request before's: requests "
                                                     "must be in arrival order"));
    }
    // A request holds its blocks from its arrival to its finish: a finish at (or, in absl::Time,
    // indistinguishable from) the arrival would come first in the event order.
    if (!(At(arrival) >= absl::UnixEpoch()) || !(At(w.finish_seconds[r]) > At(arrival)) ||
        At(w.finish_seconds[r]) == absl::InfiniteFuture()) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", r, ": finish ", w.finish_seconds[r], " s is not after arrival ",
                       arrival, " s (or a time out of range)"));
    }
  }
  return absl::OkStatus();
}

// The model over a validated workload and its chains (built once by the caller).
absl::StatusOr<BoundResult> Run(const ReleaseModelWorkload& workload, const BlockChains& chains,
                                EvictionPolicy& policy, const ReleaseModelOptions& options) {
  const Trace& trace = workload.trace;
  // (time, 0 = finish / 1 = arrival, request): the script's order.
  std::vector<std::tuple<absl::Time, int, size_t>> events;
  events.reserve(2 * trace.requests.size());
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    events.emplace_back(At(workload.finish_seconds[r]), 0, r);
    events.emplace_back(At(trace.requests[r].arrival_seconds), 1, r);
  }
  std::sort(events.begin(), events.end());

  BoundResult result = NewBoundResult(std::string(policy.name()), trace, trace.block_tokens);
  result.capacity_blocks = options.capacity_blocks;
  ReleaseSimulator sim(policy, options, chains, trace.block_tokens);
  for (const auto& [now, kind, r] : events) {
    const TraceRequest& request = trace.requests[r];
    if (kind == 0) {
      if (absl::Status s = sim.Finish(r, request, now); !s.ok()) return s;
      continue;
    }
    absl::StatusOr<int64_t> hits = sim.Arrive(r, request, now);
    if (!hits.ok()) return std::move(hits).status();
    RecordRequestHits(result, r, chains.offset[r + 1] - chains.offset[r], *hits);
  }
  FinishBoundResult(result);
  return result;
}

}  // namespace

absl::StatusOr<ReleaseModelWorkload> LoadReleaseModelWorkload(const std::string& path) {
  ReleaseModelWorkload w;
  w.trace.name = TraceNameOf(path);
  const absl::Status read =
      ForEachTraceLine(path, [&](int64_t line_number, absl::string_view line) -> absl::Status {
        if (IsBlank(line)) return absl::OkStatus();
        const std::string where = absl::StrCat(path, ":", line_number);
        if (w.trace.block_tokens == 0) {
          absl::StatusOr<nlohmann::json> header = ParseJson(line, where);
          if (!header.ok()) return header.status();
          if (absl::Status s = ExpectObject(*header, where); !s.ok()) return s;
          absl::StatusOr<int64_t> b = IntField(*header, where, "block_tokens", 1, kMaxBlockTokens);
          if (!b.ok()) return b.status();
          w.trace.block_tokens = static_cast<int>(*b);
          return absl::OkStatus();
        }
        return ParseRequest(line, where, w.trace.block_tokens, w);
      });
  if (!read.ok()) return read;
  if (w.trace.requests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no requests"));
  }
  if (absl::Status s = Validate(w, ReleaseModelOptions{}); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return w;
}

absl::StatusOr<BoundResult> SimulateReleaseModel(const ReleaseModelWorkload& workload,
                                                 EvictionPolicy& policy,
                                                 const ReleaseModelOptions& options) {
  if (absl::Status s = Validate(workload, options); !s.ok()) return s;
  absl::StatusOr<BlockChains> chains =
      BuildBlockChains(workload.trace, workload.trace.block_tokens);
  if (!chains.ok()) return std::move(chains).status();
  return Run(workload, *chains, policy, options);
}

absl::StatusOr<BoundResult> ReleaseModelOptimum(const ReleaseModelWorkload& workload,
                                                int64_t capacity_blocks) {
  const ReleaseModelOptions options{.capacity_blocks = capacity_blocks};
  if (absl::Status s = Validate(workload, options); !s.ok()) return s;
  const Trace& trace = workload.trace;
  absl::StatusOr<BlockChains> chains = BuildBlockChains(trace, trace.block_tokens);
  if (!chains.ok()) return std::move(chains).status();
  std::vector<std::vector<absl::Time>> arrivals(chains->num_keys);
  std::vector<uint32_t> depth(chains->num_keys, 0);
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const absl::Time at = At(trace.requests[r].arrival_seconds);
    for (int64_t i = chains->offset[r]; i < chains->offset[r + 1]; ++i) {
      arrivals[chains->keys[i]].push_back(at);  // ascending: requests are in arrival order
      depth[chains->keys[i]] = static_cast<uint32_t>(i - chains->offset[r]);
    }
  }
  NextArrivalPolicy optimal(std::move(arrivals), std::move(depth));
  return Run(workload, *chains, optimal, options);
}

}  // namespace kvtier::replay
