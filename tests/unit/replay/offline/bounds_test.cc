// UnlimitedBound and OptimalBound: hand-computed small traces (every expected hit written out
// below), the argument checks, the optimum proved by an exhaustive search over every eviction
// choice on random small traces, the heap implementation checked against a naive furthest-
// next-use simulation on larger ones, and, when shared/ has it, the Mooncake trace.
#include "bench/replay/offline/bounds.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/shared_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::replay {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;
using ::testing::ElementsAre;

constexpr int64_t kUnlimitedCapacity = std::numeric_limits<int64_t>::max();

TraceRequest Request(std::vector<uint64_t> ids, int64_t input_tokens) {
  TraceRequest request;
  request.input_tokens = input_tokens;
  request.block_ids = std::move(ids);
  return request;
}

Trace MakeTrace(int block_tokens, std::vector<TraceRequest> requests) {
  Trace trace;
  trace.name = "test";
  trace.block_tokens = block_tokens;
  trace.requests = std::move(requests);
  return trace;
}

// Trace blocks of 4 tokens; ids name prefixes: 1 -> 2 -> 3, 1 -> 4, and 5.
Trace SmallTrace() {
  return MakeTrace(4, {
                          Request({1, 2}, 8),      // R0
                          Request({1, 2, 3}, 12),  // R1
                          Request({1, 4}, 7),      // R2: block 4 partial (3 tokens)
                          Request({1, 4}, 8),      // R3: block 4 full
                          Request({5}, 4),         // R4
                          Request({1, 2, 3}, 10),  // R5: block 3 partial (2 tokens)
                      });
}

TEST(UnlimitedBoundTest, SmallTraceAtTraceBlockSize) {
  // Cache blocks = trace blocks. Full blocks per request: 2, 3, 1, 2, 1, 2 (11).
  // R0 [1 2]: nothing seen -> 0.    R1 [1 2 3]: 1 2 seen, 3 not -> 2 blocks.
  // R2 [1] (4 is partial) -> 1.     R3 [1 4]: 4 was only ever partial, never inserted -> 1.
  // R4 [5] -> 0.                    R5 [1 2] (3 partial) -> 2.
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult result, UnlimitedBound(SmallTrace(), 4));
  EXPECT_EQ(result.name, "unlimited");
  EXPECT_EQ(result.tokens_per_block, 4);
  EXPECT_FALSE(result.capacity_blocks.has_value());
  EXPECT_EQ(result.requests, 6);
  EXPECT_EQ(result.prompt_tokens, 8 + 12 + 7 + 8 + 4 + 10);
  EXPECT_EQ(result.queried_blocks, 11);
  EXPECT_EQ(result.hit_blocks, 6);
  EXPECT_EQ(result.hit_tokens, 24);
  EXPECT_DOUBLE_EQ(result.hit_ratio, 24.0 / 49.0);
  EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 8, 4, 4, 0, 8));
}

TEST(UnlimitedBoundTest, SmallTraceAtHalfBlocks) {
  // Each trace block X splits into Xa, Xb of 2 tokens.
  // R0 8 tok [1a 1b 2a 2b] -> 0.               R1 12 tok [1a 1b 2a 2b 3a 3b] -> 4 blocks.
  // R2 7 tok [1a 1b 4a] -> 1a 1b = 2.          R3 8 tok [1a 1b 4a 4b]: 4a seen in R2 -> 3.
  // R4 4 tok [5a 5b] -> 0.                     R5 10 tok [1a 1b 2a 2b 3a] -> 5.
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult result, UnlimitedBound(SmallTrace(), 2));
  EXPECT_EQ(result.queried_blocks, 4 + 6 + 3 + 4 + 2 + 5);
  EXPECT_EQ(result.hit_blocks, 14);
  EXPECT_EQ(result.hit_tokens, 28);
  EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 8, 4, 6, 0, 10));
}

TEST(BoundsTest, PartialLastBlocksNeverHit) {
  const Trace trace = MakeTrace(4, {
                                       Request({1}, 3),  // R0: no full block
                                       Request({1}, 3),  // R1: still none
                                       Request({1}, 4),  // R2: 1 full, first time -> miss
                                       Request({1}, 4),  // R3: hit
                                   });
  for (bool optimal : {false, true}) {
    SCOPED_TRACE(optimal ? "optimal" : "unlimited");
    KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult result,
                                optimal ? OptimalBound(trace, 4, 1) : UnlimitedBound(trace, 4));
    EXPECT_EQ(result.queried_blocks, 2);
    EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 0, 0, 4));
  }
  // At 2 tokens per block, R0's 3 tokens hold one full block (1a), which R1 hits; R2 and R3
  // add 1b: R2 hits 1a, R3 hits 1a 1b.
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult half, UnlimitedBound(trace, 2));
  EXPECT_THAT(half.hit_tokens_per_request, ElementsAre(0, 2, 2, 4));
}

TEST(OptimalBoundTest, FurthestNextUseHitsWhereLruMisses) {
  // Capacity 2, one block per request. At R2 the cache is {1, 2} and 3 must go in.
  // LRU evicts 1 (least recent) and misses it at R3. Furthest next use evicts 2 (never used
  // again; 1 is next used at R3) and R3 hits 1.
  const Trace trace = MakeTrace(4, {
                                       Request({1}, 4),
                                       Request({2}, 4),
                                       Request({3}, 4),
                                       Request({1}, 4),
                                   });
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult result, OptimalBound(trace, 4, 2));
  EXPECT_EQ(result.name, "optimal");
  EXPECT_EQ(result.capacity_blocks, 2);
  EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 0, 0, 4));
  EXPECT_EQ(result.hit_blocks, 1);
}

TEST(OptimalBoundTest, DeeperBlockLeavesFirstOnTie) {
  // Capacity 2. R0 caches {1, 1->2}. R1 brings 3: both 1 and 2 are next used at R2, a tie.
  // Evicting the deeper 2 keeps {1, 3} and R2 hits 1; evicting the parent 1 would keep
  // {2, 3}, and R2's leading run would be empty (2 is useless without 1).
  // R2 then inserts 2 and evicts 3 (never used again), so R3 hits both.
  const Trace trace = MakeTrace(4, {
                                       Request({1, 2}, 8),
                                       Request({3}, 4),
                                       Request({1, 2}, 8),
                                       Request({1, 2}, 8),
                                   });
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult result, OptimalBound(trace, 4, 2));
  EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 0, 4, 8));
}

TEST(OptimalBoundTest, ChainLongerThanCapacityKeepsItsPrefix) {
  // 2 tokens per cache block, capacity 3.
  // R0 8 tok [1a 1b 2a 2b]: 4 blocks > 3, keeps 1a 1b 2a.
  // R1 7 tok [1a 1b 2a] (2b partial): hits all 3 -> 6 tokens.
  // R2 8 tok [1a 1b 2a 2b]: hits 1a 1b 2a (2b was never kept) -> 6; keeps 1a 1b 2a.
  // R3 4 tok [9a 9b]: needs 2 slots; 1a 1b 2a are all next used at R4, a tie, so the deeper
  //    go first: 2a, then 1b. Cache {1a 9a 9b}.
  // R4 8 tok: hits 1a -> 2. (Parent-first ties would have kept 1b 2a and hit nothing.)
  // The unlimited bound also hits 2b at R2 (R0 inserted it) and all four at R4.
  const Trace trace = MakeTrace(4, {
                                       Request({1, 2}, 8),
                                       Request({1, 2}, 7),
                                       Request({1, 2}, 8),
                                       Request({9}, 4),
                                       Request({1, 2}, 8),
                                   });
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult optimal, OptimalBound(trace, 2, 3));
  EXPECT_THAT(optimal.hit_tokens_per_request, ElementsAre(0, 6, 6, 0, 2));
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult unlimited, UnlimitedBound(trace, 2));
  EXPECT_THAT(unlimited.hit_tokens_per_request, ElementsAre(0, 6, 8, 0, 8));
}

TEST(OptimalBoundTest, CapacityZeroHitsNothing) {
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult result, OptimalBound(SmallTrace(), 4, 0));
  EXPECT_EQ(result.queried_blocks, 11);
  EXPECT_EQ(result.hit_blocks, 0);
  EXPECT_EQ(result.hit_tokens, 0);
  EXPECT_EQ(result.hit_ratio, 0.0);
  EXPECT_THAT(result.hit_tokens_per_request, ElementsAre(0, 0, 0, 0, 0, 0));
}

TEST(OptimalBoundTest, LargeCapacityEqualsUnlimited) {
  for (int tokens_per_block : {4, 2, 1}) {
    SCOPED_TRACE(tokens_per_block);
    KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult unlimited,
                                UnlimitedBound(SmallTrace(), tokens_per_block));
    // 5 ids x 4 tokens: at most 20 distinct cache blocks, so 48 never evicts.
    for (int64_t capacity : {int64_t{48}, kUnlimitedCapacity}) {
      KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult optimal,
                                  OptimalBound(SmallTrace(), tokens_per_block, capacity));
      EXPECT_EQ(optimal.hit_blocks, unlimited.hit_blocks);
      EXPECT_EQ(optimal.hit_tokens_per_request, unlimited.hit_tokens_per_request);
    }
  }
}

TEST(BoundsTest, EmptyTrace) {
  const Trace trace = MakeTrace(512, {});
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult result, OptimalBound(trace, 16, 10));
  EXPECT_EQ(result.requests, 0);
  EXPECT_EQ(result.prompt_tokens, 0);
  EXPECT_EQ(result.hit_ratio, 0.0);
  EXPECT_TRUE(result.hit_tokens_per_request.empty());
}

TEST(BoundsTest, RejectsBadArguments) {
  const Trace trace = SmallTrace();
  EXPECT_THAT(UnlimitedBound(trace, 3), IsError(StatusCode::kInvalidArgument, "tokens_per_block"));
  EXPECT_THAT(UnlimitedBound(trace, 8), IsError(StatusCode::kInvalidArgument, "tokens_per_block"));
  EXPECT_THAT(UnlimitedBound(trace, 0), IsError(StatusCode::kInvalidArgument, "tokens_per_block"));
  EXPECT_THAT(OptimalBound(trace, -4, 1),
              IsError(StatusCode::kInvalidArgument, "tokens_per_block"));
  EXPECT_THAT(OptimalBound(trace, 4, -1), IsError(StatusCode::kInvalidArgument, "capacity_blocks"));
  EXPECT_THAT(UnlimitedBound(MakeTrace(0, {}), 1),
              IsError(StatusCode::kInvalidArgument, "block_tokens"));
}

TEST(BoundsTest, RejectsMalformedRequests) {
  // ids inconsistent with the length: 9 tokens need 3 blocks of 4.
  EXPECT_THAT(UnlimitedBound(MakeTrace(4, {Request({1, 2}, 9)}), 4),
              IsError(StatusCode::kInvalidArgument, "request 0: 2 block_ids for 9 input_tokens"));
  EXPECT_THAT(OptimalBound(MakeTrace(4, {Request({1}, 4), Request({1, 2, 3}, 8)}), 4, 1),
              IsError(StatusCode::kInvalidArgument, "request 1: 3 block_ids"));
  EXPECT_THAT(UnlimitedBound(MakeTrace(4, {Request({}, -1)}), 4),
              IsError(StatusCode::kInvalidArgument, "input_tokens -1"));
  // An id names its prefix: the same id at another position, or after another id, is not one.
  EXPECT_THAT(
      UnlimitedBound(MakeTrace(4, {Request({1, 2}, 8), Request({2}, 4)}), 4),
      IsError(StatusCode::kInvalidArgument, "request 1: block_ids[0] = 2 was at position 1"));
  EXPECT_THAT(OptimalBound(MakeTrace(4, {Request({1, 3}, 8), Request({2, 3}, 8)}), 4, 2),
              IsError(StatusCode::kInvalidArgument, "request 1: block_ids[1] = 3 follows"));
  EXPECT_THAT(UnlimitedBound(MakeTrace(4, {Request({1, 1}, 8)}), 4),
              IsError(StatusCode::kInvalidArgument, "block_ids[1] = 1 was at position 0"));
}

// ---- Random traces, exhaustive search and a naive reference ----

// Chains of cache blocks as small ints, computed here independently of bounds.cc: a cache
// block is (trace id, index within the trace block).
std::vector<std::vector<int>> CacheChains(const Trace& trace, int tokens_per_block,
                                          std::vector<int>* depth_of_key = nullptr) {
  const int subs = trace.block_tokens / tokens_per_block;
  std::map<std::pair<uint64_t, int>, int> key_of;
  std::vector<std::vector<int>> chains;
  for (const TraceRequest& request : trace.requests) {
    std::vector<int>& chain = chains.emplace_back();
    for (int64_t j = 0; j < request.input_tokens / tokens_per_block; ++j) {
      auto [it, inserted] = key_of.try_emplace(
          {request.block_ids[j / subs], static_cast<int>(j % subs)}, key_of.size());
      chain.push_back(it->second);
      if (depth_of_key != nullptr && inserted) depth_of_key->push_back(static_cast<int>(j));
    }
  }
  return chains;
}

// The true optimum of total prefix-hit blocks: memoized search over every cache content the
// model allows after each request: any subset of (previous content + the request's chain) of at
// most `capacity` blocks holding at least min(chain, capacity) of the chain's blocks (any of
// them, not just its prefix; evicting more than needed is allowed too). This is a superset of
// the greedy's choices, so greedy == search means no schedule does better.
class ExhaustiveOptimum {
 public:
  ExhaustiveOptimum(std::vector<std::vector<int>> chains, int capacity)
      : chains_(std::move(chains)), capacity_(capacity) {}

  int Solve() { return Best(0, 0); }

 private:
  int Best(size_t r, uint32_t cached) {
    if (r == chains_.size()) return 0;
    const uint64_t memo_key = (static_cast<uint64_t>(r) << 32) | cached;
    if (auto it = memo_.find(memo_key); it != memo_.end()) return it->second;
    const std::vector<int>& chain = chains_[r];
    int hits = 0;
    while (hits < static_cast<int>(chain.size()) && (cached >> chain[hits] & 1) != 0) ++hits;
    uint32_t chain_mask = 0;
    for (int key : chain) chain_mask |= uint32_t{1} << key;
    const int must_hold = std::min(static_cast<int>(chain.size()), capacity_);
    const uint32_t candidates = cached | chain_mask;
    int best = -1;
    for (uint32_t next = candidates;; next = (next - 1) & candidates) {
      if (std::popcount(next) <= capacity_ && std::popcount(next & chain_mask) >= must_hold) {
        best = std::max(best, Best(r + 1, next));
      }
      if (next == 0) break;
    }
    return memo_[memo_key] = hits + best;
  }

  std::vector<std::vector<int>> chains_;
  int capacity_;
  std::unordered_map<uint64_t, int> memo_;
};

// Furthest next use written the obvious way: scan the cache for the victim at every eviction.
int64_t NaiveFurthestNextUse(const Trace& trace, int tokens_per_block, int64_t capacity) {
  std::vector<int> depth_of_key;
  const std::vector<std::vector<int>> chains = CacheChains(trace, tokens_per_block, &depth_of_key);
  std::vector<std::vector<int>> uses(depth_of_key.size());
  for (size_t r = 0; r < chains.size(); ++r) {
    for (int key : chains[r]) uses[key].push_back(static_cast<int>(r));
  }
  auto next_use = [&](int key, int r) {
    auto it = std::upper_bound(uses[key].begin(), uses[key].end(), r);
    return it == uses[key].end() ? std::numeric_limits<int>::max() : *it;
  };
  std::set<int> cache;
  int64_t hits_total = 0;
  for (size_t r = 0; r < chains.size(); ++r) {
    const std::vector<int>& chain = chains[r];
    size_t hits = 0;
    while (hits < chain.size() && cache.contains(chain[hits])) ++hits;
    hits_total += static_cast<int64_t>(hits);
    const size_t keep = static_cast<size_t>(std::min<int64_t>(chain.size(), capacity));
    const std::set<int> held(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(keep));
    for (size_t j = 0; j < keep; ++j) {
      if (cache.contains(chain[j])) continue;
      if (static_cast<int64_t>(cache.size()) == capacity) {
        int victim = -1;
        std::pair<int, int> victim_rank;
        for (int key : cache) {
          if (held.contains(key)) continue;
          const std::pair<int, int> rank(next_use(key, static_cast<int>(r)), depth_of_key[key]);
          if (victim < 0 || rank > victim_rank) victim = key, victim_rank = rank;
        }
        cache.erase(victim);
      }
      cache.insert(chain[j]);
    }
  }
  return hits_total;
}

// Requests over a random id tree: each extends a prefix of an earlier chain (often) with fresh
// ids, at most `max_blocks` trace blocks, the last one full or partial.
Trace RandomTrace(std::mt19937_64& rng, int requests, int max_blocks, int block_tokens,
                  uint64_t& next_id) {
  std::vector<std::vector<uint64_t>> chains;
  Trace trace = MakeTrace(block_tokens, {});
  for (int r = 0; r < requests; ++r) {
    std::vector<uint64_t> ids;
    if (!chains.empty() && rng() % 5 != 0) {
      const std::vector<uint64_t>& base = chains[rng() % chains.size()];
      ids.assign(base.begin(),
                 base.begin() + static_cast<std::ptrdiff_t>(rng() % (base.size() + 1)));
    }
    const int grow = static_cast<int>(rng() % 3);
    for (int i = 0; i < grow && static_cast<int>(ids.size()) < max_blocks; ++i) {
      ids.push_back(next_id++);
    }
    if (ids.empty()) ids.push_back(next_id++);
    const int64_t last = 1 + static_cast<int64_t>(rng() % block_tokens);
    const int64_t tokens = (static_cast<int64_t>(ids.size()) - 1) * block_tokens + last;
    chains.push_back(ids);
    trace.requests.push_back(Request(ids, tokens));
  }
  return trace;
}

// Conversations like Mooncake's: every chain starts with a shared two-block system prefix, and
// a session's next turn re-reads its previous chain (less the partial last block, whose id
// changes once it fills) and adds a few blocks. Many hits, so many stale heap entries.
Trace ConversationTrace(std::mt19937_64& rng, int requests, int block_tokens) {
  Trace trace = MakeTrace(block_tokens, {});
  std::vector<std::vector<uint64_t>> sessions;
  std::vector<bool> partial;  // the session's last block is partial
  uint64_t next_id = 2;
  for (int r = 0; r < requests; ++r) {
    const size_t s = sessions.empty() || rng() % 4 == 0 ? sessions.size() : rng() % sessions.size();
    if (s == sessions.size()) {
      sessions.push_back({0, 1});
      partial.push_back(false);
    }
    std::vector<uint64_t>& ids = sessions[s];
    if (partial[s]) ids.pop_back();
    const int grow = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < grow; ++i) ids.push_back(next_id++);
    const int64_t last = 1 + static_cast<int64_t>(rng() % block_tokens);
    partial[s] = last < block_tokens;
    trace.requests.push_back(
        Request(ids, (static_cast<int64_t>(ids.size()) - 1) * block_tokens + last));
  }
  return trace;
}

TEST(OptimalBoundTest, MatchesExhaustiveSearchOnRandomTraces) {
  std::mt19937_64 rng(20240611);
  uint64_t next_id = 100;
  int traces = 0;
  int with_gap_to_unlimited = 0;
  for (int trial = 0; trial < 150; ++trial) {
    for (int tokens_per_block : {4, 2}) {
      const int max_blocks = tokens_per_block == 4 ? 4 : 2;
      const Trace trace = RandomTrace(rng, 6, max_blocks, 4, next_id);
      const std::vector<std::vector<int>> chains = CacheChains(trace, tokens_per_block);
      int distinct = 0;
      for (const auto& chain : chains) {
        for (int key : chain) distinct = std::max(distinct, key + 1);
      }
      ASSERT_LE(distinct, 32);
      KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult unlimited, UnlimitedBound(trace, tokens_per_block));
      ++traces;
      for (int capacity = 0; capacity <= 5; ++capacity) {
        KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult optimal,
                                    OptimalBound(trace, tokens_per_block, capacity));
        const int exhaustive = ExhaustiveOptimum(chains, capacity).Solve();
        ASSERT_EQ(optimal.hit_blocks, exhaustive) << "trial " << trial << " tokens_per_block "
                                                  << tokens_per_block << " capacity " << capacity;
        EXPECT_LE(optimal.hit_blocks, unlimited.hit_blocks);
        if (optimal.hit_blocks < unlimited.hit_blocks) ++with_gap_to_unlimited;
      }
    }
  }
  // The search must have had something to decide: many cases where capacity cost hits.
  EXPECT_GT(with_gap_to_unlimited, traces);
}

TEST(OptimalBoundTest, MatchesNaiveFurthestNextUseOnConversations) {
  // Thousands of hits, so the heap's stale entries (one per hit) are compacted many times.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2; ++trial) {
    const Trace trace = ConversationTrace(rng, 1000, 8);
    for (int tokens_per_block : {8, 4}) {
      KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult unlimited, UnlimitedBound(trace, tokens_per_block));
      int64_t previous = -1;
      for (int64_t capacity : {10, 40, 160}) {
        KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult optimal,
                                    OptimalBound(trace, tokens_per_block, capacity));
        EXPECT_EQ(optimal.hit_blocks, NaiveFurthestNextUse(trace, tokens_per_block, capacity))
            << "trial " << trial << " tokens_per_block " << tokens_per_block << " capacity "
            << capacity;
        EXPECT_GT(optimal.hit_blocks, previous);
        EXPECT_LT(optimal.hit_blocks, unlimited.hit_blocks);
        previous = optimal.hit_blocks;
      }
    }
  }
}

TEST(OptimalBoundTest, MatchesNaiveFurthestNextUseOnRandomTrees) {
  std::mt19937_64 rng(7);
  uint64_t next_id = 1;
  for (int trial = 0; trial < 6; ++trial) {
    const Trace trace = RandomTrace(rng, 400, 24, 8, next_id);
    for (int tokens_per_block : {8, 2}) {
      KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult unlimited, UnlimitedBound(trace, tokens_per_block));
      int64_t previous = -1;
      for (int64_t capacity : {1, 7, 30, 100, 400, 2000}) {
        KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult optimal,
                                    OptimalBound(trace, tokens_per_block, capacity));
        EXPECT_EQ(optimal.hit_blocks, NaiveFurthestNextUse(trace, tokens_per_block, capacity))
            << "trial " << trial << " tokens_per_block " << tokens_per_block << " capacity "
            << capacity;
        EXPECT_GE(optimal.hit_blocks, previous);  // more room never hurts the optimum
        EXPECT_LE(optimal.hit_blocks, unlimited.hit_blocks);
        previous = optimal.hit_blocks;
      }
    }
  }
}

// ---- The Mooncake trace (informational; skipped when shared/ does not have it) ----

// Just enough JSON Lines for the test: the integer after "key": and the array after "hash_ids":.
int64_t IntAfter(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\"");
  if (at == std::string::npos) return -1;
  return std::stoll(line.substr(line.find(':', at) + 1));
}

Trace ReadMooncake(const std::string& path) {
  Trace trace = MakeTrace(512, {});
  trace.name = "mooncake/conversation_trace.jsonl";
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    TraceRequest request;
    request.arrival_seconds = static_cast<double>(IntAfter(line, "timestamp")) / 1000.0;
    request.input_tokens = IntAfter(line, "input_length");
    request.output_tokens = IntAfter(line, "output_length");
    size_t pos = line.find('[', line.find("\"hash_ids\""));
    const size_t end = line.find(']', pos);
    while (++pos < end) {
      if (line[pos] >= '0' && line[pos] <= '9') {
        size_t used = 0;
        request.block_ids.push_back(std::stoull(line.substr(pos, end - pos), &used));
        pos += used;
      }
    }
    trace.requests.push_back(std::move(request));
  }
  return trace;
}

TEST(BoundsMooncakeTest, ConversationTrace) {
  const std::filesystem::path path =
      kvtier::testing::SharedFile("traces/mooncake/conversation_trace.jsonl");
  if (path.empty()) GTEST_SKIP() << "shared/traces/mooncake/conversation_trace.jsonl not found";
  const Trace trace = ReadMooncake(path.string());
  ASSERT_EQ(trace.requests.size(), 12031u);

  using Clock = std::chrono::steady_clock;
  auto timed = [](auto&& run) {
    const Clock::time_point start = Clock::now();
    auto result = run();
    return std::make_pair(std::move(result),
                          std::chrono::duration<double>(Clock::now() - start).count());
  };

  // The trace README: about 37% of blocks hit with an unlimited cache.
  auto [unlimited, unlimited_s] = timed([&] { return UnlimitedBound(trace, 512); });
  KVTIER_ASSERT_OK(unlimited);
  EXPECT_EQ(unlimited->prompt_tokens, 144793823);
  EXPECT_EQ(unlimited->queried_blocks, 276491);
  EXPECT_EQ(unlimited->hit_tokens, 54063104);
  EXPECT_NEAR(unlimited->hit_ratio, 0.3734, 0.0001);
  std::cout << "unlimited at 512 tokens per block: hit ratio " << unlimited->hit_ratio << " ("
            << unlimited_s << " s)\n";

  int64_t previous = 0;
  for (int64_t capacity : {int64_t{2000}, int64_t{5000}, int64_t{10000}, int64_t{1} << 40}) {
    auto [optimal, optimal_s] = timed([&] { return OptimalBound(trace, 512, capacity); });
    KVTIER_ASSERT_OK(optimal);
    EXPECT_GE(optimal->hit_tokens, previous);
    EXPECT_LE(optimal->hit_tokens, unlimited->hit_tokens);
    previous = optimal->hit_tokens;
    std::cout << "optimal at " << capacity << " blocks of 512 tokens: hit ratio "
              << optimal->hit_ratio << " (" << optimal_s << " s)\n";
  }
  EXPECT_EQ(previous, unlimited->hit_tokens);

  // 16 tokens per block: 32 times the blocks.
  auto [fine_unlimited, fine_unlimited_s] = timed([&] { return UnlimitedBound(trace, 16); });
  KVTIER_ASSERT_OK(fine_unlimited);
  EXPECT_GE(fine_unlimited->hit_tokens, unlimited->hit_tokens);
  auto [fine, fine_s] = timed([&] { return OptimalBound(trace, 16, 5000 * 32); });
  KVTIER_ASSERT_OK(fine);
  EXPECT_LE(fine->hit_tokens, fine_unlimited->hit_tokens);
  std::cout << "at 16 tokens per block: unlimited " << fine_unlimited->hit_ratio << " ("
            << fine_unlimited_s << " s), optimal at " << 5000 * 32 << " blocks " << fine->hit_ratio
            << " (" << fine_s << " s)\n";
}

}  // namespace
}  // namespace kvtier::replay
