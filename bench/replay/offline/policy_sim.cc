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
#include "bench/replay/offline/sim_tier.h"
#include "kvtier/block_key.h"
#include "kvtier/cost_model.h"
#include "kvtier/kv_geometry.h"

namespace kvtier::replay {
namespace {

constexpr std::string_view kDefaultModel = "Llama-3.1-70B";

const KnownModel& DefaultModel() {
  for (const KnownModel& m : KnownModels()) {
    if (m.name == kDefaultModel) return m;
  }
  std::abort();  // the library's table lost its Llama-3.1-70B: a build of a broken table
}

class Simulator {
 public:
  Simulator(EvictionPolicy& policy, const PolicySimOptions& options, uint32_t num_keys)
      : options_(options),
        tier_(policy, options.bytes_per_token * options.tokens_per_block, num_keys) {}

  // Runs request r (its chain is chain[0, n)) at `now`; returns its hit blocks.
  absl::StatusOr<int64_t> Request(size_t r, const uint32_t* chain, int64_t n, absl::Time now) {
    for (int64_t j = 1; j < n; ++j) {
      SimBlock& b = tier_.block(chain[j]);
      if (b.parent == kSimNoParent) b.parent = chain[j - 1];
    }
    EvictionPolicy& policy = tier_.policy();
    if (policy.observes_requests()) {
      named_.clear();
      for (int64_t j = 0; j < n; ++j) named_.push_back(SimBlockKey(chain[j]));
      policy.ObserveRequest({.blocks = named_, .now = now});
    }
    int64_t hits = 0;
    while (hits < n && tier_.block(chain[hits]).cached) ++hits;
    for (int64_t j = 0; j < hits; ++j) {
      SimBlock& b = tier_.block(chain[j]);
      ++b.uses;
      b.last_use = now;
      b.pinned = true;
      if (absl::Status s = tier_.Update(chain[j]); !s.ok()) return Failed(r, s);
    }
    const int64_t keep = std::min(n, options_.capacity_blocks);
    for (int64_t j = hits; j < keep; ++j) {
      while (tier_.cached() >= options_.capacity_blocks) {
        if (absl::StatusOr<uint32_t> s = tier_.EvictOne(now); !s.ok()) return Failed(r, s.status());
      }
      SimBlock& b = tier_.block(chain[j]);
      b.pinned = true;
      b.uses = 1;
      b.last_use = now;
      if (absl::Status s = tier_.Cache(chain[j]); !s.ok()) return Failed(r, s);
    }
    for (int64_t j = 0; j < keep; ++j) tier_.block(chain[j]).pinned = false;
    for (int64_t j = 0; j < keep; ++j) {
      if (absl::Status s = tier_.Update(chain[j]); !s.ok()) return Failed(r, s);
    }
    return hits;
  }

 private:
  static absl::Status Failed(size_t r, const absl::Status& s) {
    return absl::InternalError(absl::StrCat("policy sim: request ", r, ": ", s.message()));
  }

  const PolicySimOptions& options_;
  SimTier tier_;
  std::vector<BlockKey> named_;  // the request ObserveRequest is given, reused
};

}  // namespace

int64_t DefaultSimBytesPerToken() {
  absl::StatusOr<KvGeometry> g = KvGeometry::Create(DefaultModel().geometry);
  if (!g.ok()) std::abort();  // the table's geometries are checked by the cost model's test
  return g->bytes_per_token();
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

  BoundResult result = NewBoundResult(std::string(policy.name()), trace, options.tokens_per_block);
  result.capacity_blocks = options.capacity_blocks;
  Simulator sim(policy, options, chains->num_keys);
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const int64_t first = chains->offset[r];
    const int64_t n = chains->offset[r + 1] - first;
    const absl::Time now = absl::UnixEpoch() + absl::Seconds(trace.requests[r].arrival_seconds);
    absl::StatusOr<int64_t> hits = sim.Request(r, chains->keys.data() + first, n, now);
    if (!hits.ok()) return std::move(hits).status();
    RecordRequestHits(result, r, n, *hits);
  }
  FinishBoundResult(result);
  return result;
}

}  // namespace kvtier::replay
