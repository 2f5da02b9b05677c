// Offline bounds (bounds.h): unlimited-capacity hits and the furthest-next-use optimum.
#include "bench/replay/offline/bounds.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/replay/offline/block_chains.h"

namespace kvtier::replay {
namespace {

// Request index meaning "not used again"; larger than every real one, so evicted first.
constexpr int32_t kNever = std::numeric_limits<int32_t>::max();
// next_use of a block that is not cached.
constexpr int32_t kNotCached = -1;

// The optimal bound's cache: which blocks are cached, each one's next use (a request index or
// kNever), and the order in which they leave: largest (next use, depth) first.
//
// Blocks never used again leave first, from a plain stack: their order does not matter, since
// none of them can hit again (a never-used block may even outlive its never-used parent). Most
// blocks of a trace end that way, so the heap holds only blocks with a future use, where the
// order does matter. A heap entry is current while its block is cached and the entry's version
// is the block's; every change to a block bumps its version, so stale entries are skipped when
// popped (lazy deletion) and dropped in bulk when they fill half the heap.
class BeladyCache {
 public:
  explicit BeladyCache(uint32_t num_keys)
      : next_use_(num_keys, kNotCached), version_(num_keys, 0) {}

  bool cached(uint32_t key) const { return next_use_[key] != kNotCached; }
  int64_t size() const { return size_; }

  // Caches `key` (not cached) for request r. It has no entry, so it cannot be evicted until
  // Schedule gives it one.
  void Insert(uint32_t key, int32_t r) {
    next_use_[key] = r;
    ++version_[key];
    ++size_;
  }

  // After request r: cached `key`, at `depth` in r's chain, is next used at `next_use` (> r).
  void Schedule(uint32_t key, int32_t next_use, uint32_t depth) {
    next_use_[key] = next_use;
    const uint32_t version = ++version_[key];
    if (next_use == kNever) {
      unused_.push_back(key);
      return;
    }
    heap_.push_back(HeapEntry{next_use, depth, key, version});
    std::push_heap(heap_.begin(), heap_.end(), EvictsLater);
  }

  // Evicts the block of furthest next use, the deeper on a tie, during request r. Blocks
  // Inserted for r have no entry; r's hit blocks have entries with next use r, below every
  // other block's, and the caller guarantees another block is cached, so neither ever goes.
  absl::Status EvictFurthest(int32_t r) {
    // A block on the stack is cached until popped: nothing else evicts it or uses it again.
    if (!unused_.empty()) {
      Evict(unused_.back());
      unused_.pop_back();
      return absl::OkStatus();
    }
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), EvictsLater);
      const HeapEntry top = heap_.back();
      heap_.pop_back();
      if (!Current(top)) continue;
      if (top.next_use <= r) {
        return absl::InternalError(
            absl::StrCat("optimal bound: request ", r, " would evict a block of its own chain"));
      }
      Evict(top.key);
      return absl::OkStatus();
    }
    return absl::InternalError(absl::StrCat("optimal bound: request ", r, " found no victim"));
  }

  // Drops stale heap entries (each hit leaves one, with next use r: it sinks and is rarely
  // popped) once they are half the heap: the heap stays O(size) and the work amortized O(1).
  void Compact() {
    if (static_cast<int64_t>(heap_.size()) <= 2 * size_ + 1024) return;
    std::erase_if(heap_, [this](const HeapEntry& e) { return !Current(e); });
    std::make_heap(heap_.begin(), heap_.end(), EvictsLater);
  }

 private:
  struct HeapEntry {
    int32_t next_use;
    uint32_t depth;
    uint32_t key;
    uint32_t version;
  };

  // std heap order: the top is the largest (next_use, depth). The key makes the order total,
  // so results never depend on the standard library.
  static bool EvictsLater(const HeapEntry& a, const HeapEntry& b) {
    if (a.next_use != b.next_use) return a.next_use < b.next_use;
    if (a.depth != b.depth) return a.depth < b.depth;
    return a.key < b.key;
  }

  bool Current(const HeapEntry& e) const { return cached(e.key) && version_[e.key] == e.version; }

  void Evict(uint32_t key) {
    next_use_[key] = kNotCached;
    ++version_[key];
    --size_;
  }

  std::vector<int32_t> next_use_;  // per key
  std::vector<uint32_t> version_;  // per key
  std::vector<HeapEntry> heap_;
  std::vector<uint32_t> unused_;  // cached blocks with next use kNever
  int64_t size_ = 0;
};

}  // namespace

BoundResult NewBoundResult(std::string name, const Trace& trace, int tokens_per_block) {
  BoundResult result;
  result.name = std::move(name);
  result.tokens_per_block = tokens_per_block;
  result.requests = static_cast<int64_t>(trace.requests.size());
  result.hit_tokens_per_request.assign(trace.requests.size(), 0);
  for (const TraceRequest& request : trace.requests) result.prompt_tokens += request.input_tokens;
  return result;
}

void RecordRequestHits(BoundResult& result, size_t request, int64_t chain_blocks,
                       int64_t hit_blocks) {
  result.queried_blocks += chain_blocks;
  result.hit_blocks += hit_blocks;
  result.hit_tokens_per_request[request] = hit_blocks * result.tokens_per_block;
}

void FinishBoundResult(BoundResult& result) {
  result.hit_tokens = result.hit_blocks * result.tokens_per_block;
  result.hit_ratio = result.prompt_tokens > 0 ? static_cast<double>(result.hit_tokens) /
                                                    static_cast<double>(result.prompt_tokens)
                                              : 0.0;
}

absl::StatusOr<BoundResult> UnlimitedBound(const Trace& trace, int tokens_per_block) {
  absl::StatusOr<BlockChains> chains = BuildBlockChains(trace, tokens_per_block);
  if (!chains.ok()) return std::move(chains).status();
  BoundResult result = NewBoundResult("unlimited", trace, tokens_per_block);
  std::vector<uint8_t> seen(chains->num_keys, 0);
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const uint32_t* chain = chains->keys.data() + chains->offset[r];
    const int64_t n = chains->offset[r + 1] - chains->offset[r];
    int64_t hits = 0;
    while (hits < n && seen[chain[hits]] != 0) ++hits;
    for (int64_t j = hits; j < n; ++j) seen[chain[j]] = 1;
    RecordRequestHits(result, r, n, hits);
  }
  FinishBoundResult(result);
  return result;
}

absl::StatusOr<BoundResult> OptimalBound(const Trace& trace, int tokens_per_block,
                                         int64_t capacity_blocks) {
  if (capacity_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity_blocks ", capacity_blocks, " is negative"));
  }
  absl::StatusOr<BlockChains> chains = BuildBlockChains(trace, tokens_per_block);
  if (!chains.ok()) return std::move(chains).status();
  BoundResult result = NewBoundResult("optimal", trace, tokens_per_block);
  result.capacity_blocks = capacity_blocks;
  const std::vector<uint32_t>& keys = chains->keys;
  const std::vector<int64_t>& offset = chains->offset;
  const int32_t requests = static_cast<int32_t>(trace.requests.size());

  // next_use_after[q]: the next request after q's whose chain holds q's block (kNever if none),
  // for every chain position q; one backward pass. The second inner loop runs after the first
  // so that a block twice in one chain (impossible in a valid trace) still points past it.
  std::vector<int32_t> next_use_after(keys.size());
  {
    std::vector<int32_t> next_use(chains->num_keys, kNever);
    for (int32_t r = requests - 1; r >= 0; --r) {
      for (int64_t q = offset[r]; q < offset[r + 1]; ++q) next_use_after[q] = next_use[keys[q]];
      for (int64_t q = offset[r]; q < offset[r + 1]; ++q) next_use[keys[q]] = r;
    }
  }

  // The cache starts empty. Its blocks are always the kept prefixes of recent chains, so a
  // cached block's next use is the first request from now whose chain holds it, and a parent's
  // is never later than its child's (the parent is in every chain the child is in): with deeper
  // first on ties, a block with a future use never outlives its parent, the cache is prefix-
  // closed where it matters, and its cached leading blocks are exactly a chain's hits.
  BeladyCache cache(chains->num_keys);
  for (int32_t r = 0; r < requests; ++r) {
    const int64_t first = offset[r];
    const int64_t n = offset[r + 1] - first;
    int64_t hits = 0;
    while (hits < n && cache.cached(keys[first + hits])) ++hits;
    RecordRequestHits(result, static_cast<size_t>(r), n, hits);

    // The chain's first min(n, capacity) blocks go in; past the hits none is cached (prefix
    // closure). Fewer than `keep` chain blocks are cached before each insertion, so a full cache
    // always holds a block from outside the chain to evict.
    const int64_t keep = std::min(n, capacity_blocks);
    for (int64_t j = hits; j < keep; ++j) {
      const uint32_t key = keys[first + j];
      if (cache.cached(key)) {
        return absl::InternalError(absl::StrCat("optimal bound: request ", r, " has block ", j,
                                                " cached after a miss at block ", hits));
      }
      if (cache.size() == capacity_blocks) {
        if (absl::Status evicted = cache.EvictFurthest(r); !evicted.ok()) return evicted;
      }
      cache.Insert(key, r);
    }
    for (int64_t j = 0; j < keep; ++j) {
      cache.Schedule(keys[first + j], next_use_after[first + j], static_cast<uint32_t>(j));
    }
    cache.Compact();
  }
  FinishBoundResult(result);
  return result;
}

}  // namespace kvtier::replay
