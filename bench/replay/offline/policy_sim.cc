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
#include "kvtier/eviction_candidacy.h"
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

// Per dense key: the state the model needs (its storage; the candidacy rule and the traits are
// the shipped ones, eviction_candidacy.h). The parent is fixed by the trace.
struct SimBlock {
  uint32_t parent = kNoParent;
  uint32_t cached_children = 0;
  uint32_t uses = 0;
  absl::Time last_use = absl::InfinitePast();
  bool cached = false;
  bool pinned = false;
  bool registered = false;  // a candidate with the policy
};

class Simulator {
 public:
  Simulator(EvictionPolicy& policy, const PolicySimOptions& options, uint32_t num_keys)
      : policy_(policy), options_(options), blocks_(num_keys) {}

  // Runs request r (its chain is chain[0, n)) at `now`; returns its hit blocks.
  absl::StatusOr<int64_t> Request(size_t r, const uint32_t* chain, int64_t n, absl::Time now) {
    for (int64_t j = 1; j < n; ++j) {
      SimBlock& b = blocks_[chain[j]];
      if (b.parent == kNoParent) b.parent = chain[j - 1];
    }
    if (policy_.observes_requests()) {
      named_.clear();
      for (int64_t j = 0; j < n; ++j) named_.push_back(SimBlockKey(chain[j]));
      policy_.ObserveRequest({.blocks = named_, .now = now});
    }
    int64_t hits = 0;
    while (hits < n && blocks_[chain[hits]].cached) ++hits;
    for (int64_t j = 0; j < hits; ++j) {
      SimBlock& b = blocks_[chain[j]];
      ++b.uses;
      b.last_use = now;
      b.pinned = true;
      if (absl::Status s = Update(chain[j]); !s.ok()) return Failed(r, s);
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
      if (b.parent != kNoParent) {
        ++blocks_[b.parent].cached_children;
        if (absl::Status s = Update(b.parent); !s.ok()) return Failed(r, s);
      }
    }
    for (int64_t j = 0; j < keep; ++j) blocks_[chain[j]].pinned = false;
    for (int64_t j = 0; j < keep; ++j) {
      if (absl::Status s = Update(chain[j]); !s.ok()) return Failed(r, s);
    }
    return hits;
  }

 private:
  static absl::Status Failed(size_t r, const absl::Status& s) {
    return absl::InternalError(absl::StrCat("policy sim: request ", r, ": ", s.message()));
  }

  // What KvCache knows of a block, as the model has it: no retention priority.
  static CandidateFacts FactsOf(const SimBlock& b) {
    return CandidateFacts{.uses = b.uses,
                          .parent = b.parent == kNoParent ? kRootBlockKey : SimBlockKey(b.parent),
                          .last_use = b.last_use};
  }

  // A fact of `key` changed: its candidacy follows the shipped rule. The model's one tier has no
  // demotions (nothing leaves) and a cached block is ready; a pinned one is held.
  absl::Status Update(uint32_t key) {
    SimBlock& b = blocks_[key];
    const CopyFacts copy{.ready = b.cached, .child_copies = b.cached_children};
    const bool candidate = IsEvictionCandidate(copy, [&b] { return b.pinned; });
    return SyncCandidacy(
        policy_, SimBlockKey(key), candidate, FactsOf(b),
        options_.bytes_per_token * options_.tokens_per_block,
        [this](const BlockKey& k) -> std::optional<CandidateFacts> {
          return FactsOf(blocks_[static_cast<uint32_t>(k.hi)]);
        },
        &b.registered);
  }

  absl::Status EvictOne(absl::Time now) {
    const std::optional<BlockKey> victim = policy_.Victim(now);
    if (!victim.has_value()) return absl::InternalError("no victim in a full cache");
    if (victim->hi >= blocks_.size() || *victim != SimBlockKey(static_cast<uint32_t>(victim->hi)) ||
        !blocks_[victim->hi].registered) {
      return absl::InternalError(absl::StrCat("victim ", victim->ToHex(), " is not a candidate"));
    }
    const uint32_t key = static_cast<uint32_t>(victim->hi);
    SimBlock& b = blocks_[key];
    b.cached = false;
    --size_;
    if (absl::Status s = Update(key); !s.ok()) return s;
    if (b.parent == kNoParent) return absl::OkStatus();
    --blocks_[b.parent].cached_children;
    return Update(b.parent);
  }

  EvictionPolicy& policy_;
  const PolicySimOptions& options_;
  std::vector<SimBlock> blocks_;
  int64_t size_ = 0;
  std::vector<BlockKey> named_;  // the request ObserveRequest is given, reused
};

}  // namespace

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
  if (options.bytes_per_token <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes_per_token ", options.bytes_per_token, " is not positive"));
  }
  absl::StatusOr<BlockChains> chains = BuildBlockChains(trace, options.tokens_per_block);
  if (!chains.ok()) return std::move(chains).status();

  BoundResult result;
  result.name = std::string(policy.name());
  result.tokens_per_block = options.tokens_per_block;
  result.capacity_blocks = options.capacity_blocks;
  result.requests = static_cast<int64_t>(trace.requests.size());
  result.hit_tokens_per_request.assign(trace.requests.size(), 0);

  Simulator sim(policy, options, chains->num_keys);
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
