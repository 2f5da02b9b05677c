// The policy simulator (policy_sim.h): a trace through an EvictionPolicy, the bounds' model.
#include "bench/replay/offline/policy_sim.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/replay/offline/block_chains.h"
#include "kvtier/block_key.h"
#include "kvtier/cost_model.h"
#include "kvtier/kv_geometry.h"

namespace kvtier::replay {
namespace {

constexpr uint32_t kNoParent = std::numeric_limits<uint32_t>::max();
constexpr std::string_view kDefaultModel = "Llama-3.1-70B";

const KnownModel& DefaultModel() {
  for (const KnownModel& m : KnownModels()) {
    if (m.name == kDefaultModel) return m;
  }
  std::abort();  // the library's table lost its Llama-3.1-70B: a build of a broken table
}

// Per dense key: the state the model needs. Parent and depth are fixed by the trace.
struct SimBlock {
  uint32_t parent = kNoParent;
  uint32_t depth = 0;
  uint32_t cached_children = 0;
  uint32_t uses = 0;
  absl::Time last_use = absl::InfinitePast();
  bool cached = false;
  bool pinned = false;
  bool candidate = false;
};

class Simulator {
 public:
  Simulator(EvictionPolicy& policy, const PrefillCostModel& cost, const PolicySimOptions& options,
            uint32_t num_keys)
      : policy_(policy), cost_(cost), options_(options), blocks_(num_keys) {}

  // Runs request r (its chain is chain[0, n)) at `now`; returns its hit blocks.
  absl::StatusOr<int64_t> Request(size_t r, const uint32_t* chain, int64_t n, absl::Time now) {
    for (int64_t j = 0; j < n; ++j) {
      SimBlock& b = blocks_[chain[j]];
      if (j > 0 && b.parent == kNoParent) b.parent = chain[j - 1];
      b.depth = static_cast<uint32_t>(j);
    }
    int64_t hits = 0;
    while (hits < n && blocks_[chain[hits]].cached) ++hits;
    for (int64_t j = 0; j < hits; ++j) {
      SimBlock& b = blocks_[chain[j]];
      if (b.candidate) {
        if (absl::Status s = RemoveCandidate(chain[j]); !s.ok()) return Failed(r, s);
      }
      ++b.uses;
      b.last_use = now;
      b.pinned = true;
    }
    const int64_t keep = std::min(n, options_.capacity_blocks);
    for (int64_t j = hits; j < keep; ++j) {
      while (size_ >= options_.capacity_blocks) {
        if (absl::Status s = EvictOne(now); !s.ok()) return Failed(r, s);
      }
      SimBlock& b = blocks_[chain[j]];
      b.cached = true;
      b.pinned = true;
      b.uses = 1;
      b.last_use = now;
      ++size_;
      if (b.parent != kNoParent) ++blocks_[b.parent].cached_children;
    }
    for (int64_t j = 0; j < keep; ++j) blocks_[chain[j]].pinned = false;
    for (int64_t j = 0; j < keep; ++j) {
      if (blocks_[chain[j]].cached_children == 0) {
        if (absl::Status s = AddCandidate(chain[j]); !s.ok()) return Failed(r, s);
      }
    }
    return hits;
  }

 private:
  static absl::Status Failed(size_t r, const absl::Status& s) {
    return absl::InternalError(absl::StrCat("policy sim: request ", r, ": ", s.message()));
  }

  BlockTraits Traits(const SimBlock& b) const {
    const int64_t tpb = options_.tokens_per_block;
    const int64_t first = static_cast<int64_t>(b.depth) * tpb;
    BlockTraits t;
    t.expected_reuse = std::max<double>(1.0, b.uses);
    t.recompute_seconds = absl::ToDoubleSeconds(cost_.RecomputeTime(first, first + tpb));
    t.bytes = options_.bytes_per_token * tpb;
    if (b.parent != kNoParent) t.parent = SimBlockKey(b.parent);
    for (uint32_t p = b.parent; p != kNoParent && t.run_blocks < 32 && blocks_[p].uses == b.uses;
         p = blocks_[p].parent) {
      ++t.run_blocks;
    }
    return t;
  }

  absl::Status AddCandidate(uint32_t key) {
    SimBlock& b = blocks_[key];
    if (absl::Status s = policy_.Add(SimBlockKey(key), Traits(b), b.last_use); !s.ok()) return s;
    b.candidate = true;
    return absl::OkStatus();
  }

  absl::Status RemoveCandidate(uint32_t key) {
    if (absl::Status s = policy_.Remove(SimBlockKey(key)); !s.ok()) return s;
    blocks_[key].candidate = false;
    return absl::OkStatus();
  }

  absl::Status EvictOne(absl::Time now) {
    const std::optional<BlockKey> victim = policy_.Victim(now);
    if (!victim.has_value()) return absl::InternalError("no victim in a full cache");
    if (victim->hi >= blocks_.size() || *victim != SimBlockKey(static_cast<uint32_t>(victim->hi)) ||
        !blocks_[victim->hi].candidate) {
      return absl::InternalError(absl::StrCat("victim ", victim->ToHex(), " is not a candidate"));
    }
    const uint32_t key = static_cast<uint32_t>(victim->hi);
    if (absl::Status s = RemoveCandidate(key); !s.ok()) return s;
    SimBlock& b = blocks_[key];
    b.cached = false;
    --size_;
    if (b.parent == kNoParent) return absl::OkStatus();
    SimBlock& parent = blocks_[b.parent];
    if (--parent.cached_children == 0 && !parent.pinned) return AddCandidate(b.parent);
    return absl::OkStatus();
  }

  EvictionPolicy& policy_;
  const PrefillCostModel& cost_;
  const PolicySimOptions& options_;
  std::vector<SimBlock> blocks_;
  int64_t size_ = 0;
};

}  // namespace

PrefillCostOptions DefaultSimCost() {
  PrefillCostOptions cost = DefaultModel().cost;
  cost.flops_per_second = 400e12;
  return cost;
}

int64_t DefaultSimBytesPerToken() {
  absl::StatusOr<KvGeometry> g = KvGeometry::Create(DefaultModel().geometry);
  if (!g.ok()) std::abort();  // the table's geometries are checked by the cost model's test
  return g->bytes_per_token();
}

BlockKey SimBlockKey(uint32_t key) {
  uint64_t z = key + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return BlockKey{key, z ^ (z >> 31)};
}

absl::StatusOr<BoundResult> SimulatePolicy(const Trace& trace, EvictionPolicy& policy,
                                           const PolicySimOptions& options) {
  if (options.capacity_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity_blocks ", options.capacity_blocks, " is negative"));
  }
  absl::StatusOr<PrefillCostModel> cost = PrefillCostModel::Create(options.cost);
  if (!cost.ok()) return std::move(cost).status();
  absl::StatusOr<BlockChains> chains = BuildBlockChains(trace, options.tokens_per_block);
  if (!chains.ok()) return std::move(chains).status();

  BoundResult result;
  result.name = std::string(policy.name());
  result.tokens_per_block = options.tokens_per_block;
  result.capacity_blocks = options.capacity_blocks;
  result.requests = static_cast<int64_t>(trace.requests.size());
  result.hit_tokens_per_request.assign(trace.requests.size(), 0);

  Simulator sim(policy, *cost, options, chains->num_keys);
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    result.prompt_tokens += trace.requests[r].input_tokens;
    const int64_t first = chains->offset[r];
    const int64_t n = chains->offset[r + 1] - first;
    const absl::Time now = absl::UnixEpoch() + absl::Seconds(trace.requests[r].arrival_seconds);
    absl::StatusOr<int64_t> hits = sim.Request(r, chains->keys.data() + first, n, now);
    if (!hits.ok()) return std::move(hits).status();
    result.queried_blocks += n;
    result.hit_blocks += *hits;
    result.hit_tokens_per_request[r] = *hits * options.tokens_per_block;
  }
  result.hit_tokens = result.hit_blocks * options.tokens_per_block;
  result.hit_ratio = result.prompt_tokens > 0 ? static_cast<double>(result.hit_tokens) /
                                                    static_cast<double>(result.prompt_tokens)
                                              : 0.0;
  return result;
}

}  // namespace kvtier::replay
