// kvtier quickstart: two requests of one conversation on Llama-3.1-8B, served by a KvCache over
// an emulated HBM and a DRAM tier (built by BuildTierStack, kvtier/tier_stack.h), using only the
// public API.
//
// Request 1 finds nothing cached: it prefills its prompt, decodes an answer and is released; its
// full blocks stay cached. Request 2 sends the conversation again plus a new question:
// AttachPrefix finds the cached prefix by its chained block keys, and only the rest is prefilled.
// No model runs here: where a server would launch its attention kernel on the ticket's device
// block table, this program only prints what the kernel would be given.
//
// Exit code 0 when the numbers printed are the expected ones, 1 on any error.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/tier_stack.h"

namespace {

using namespace kvtier;

template <typename T>
T OrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    std::fprintf(stderr, "error: %s\n", v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

void OrDie(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 128000);
  return t;
}

// One forward pass over the sequence's first `num_tokens` tokens: pin their blocks in HBM, run
// the kernel (a real server launches attention on ticket.block_table() here and writes the new
// tokens' KV), report the tokens written (their full blocks become shareable), unpin.
int64_t ForwardPass(KvCache& cache, SequenceId id, int64_t num_tokens) {
  const ResidencyTicket ticket = OrDie(cache.EnsureResident(id, 0, num_tokens));
  OrDie(ticket.completion().Wait());  // every block resident
  const int64_t blocks = static_cast<int64_t>(ticket.block_table().slots.size());
  OrDie(cache.ReportWritten(id, num_tokens));
  OrDie(cache.ReleaseTicket(ticket));
  return blocks;
}

// One request: reuse the cached prefix of `tokens`, prefill the rest, decode `decode` tokens,
// release. Returns the sequence's tokens (prompt and answer) and the matched prefix length.
std::pair<std::vector<int32_t>, int64_t> Serve(KvCache& cache, SequenceId id,
                                               std::vector<int32_t> tokens, int decode,
                                               std::mt19937& rng) {
  OrDie(cache.CreateSequence(id));
  const AttachResult hit = OrDie(cache.AttachPrefix(id, tokens));
  OrDie(cache.Append(id, absl::MakeConstSpan(tokens).subspan(hit.attached_tokens)).status());
  const int64_t blocks = ForwardPass(cache, id, static_cast<int64_t>(tokens.size()));
  std::printf(
      "request %llu: %zu prompt tokens, %lld matched in the cache, %lld to prefill; "
      "the kernel reads %lld HBM blocks\n",
      static_cast<unsigned long long>(id.value()), tokens.size(),
      static_cast<long long>(hit.matched_tokens),
      static_cast<long long>(static_cast<int64_t>(tokens.size()) - hit.attached_tokens),
      static_cast<long long>(blocks));
  for (int32_t token : RandomTokens(rng, decode)) {  // decode, one token per step
    OrDie(cache.Append(id, {token}).status());
    tokens.push_back(token);
    ForwardPass(cache, id, static_cast<int64_t>(tokens.size()));
  }
  OrDie(cache.Release(id));  // its full blocks stay cached for the next request
  return {std::move(tokens), hit.matched_tokens};
}

}  // namespace

int main() {
  const KvGeometry geometry = OrDie(KvGeometry::Create(
      {.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .tokens_per_block = 16}));
  const CacheNamespace ns = OrDie(CacheNamespace::Create(
      geometry, {.model_id = "meta-llama/Llama-3.1-8B-Instruct", .weights_fingerprint = "demo"}));

  // 64 blocks (1024 tokens, 128 MiB) of HBM emulated in host memory, and 64 blocks (128 MiB) of
  // DRAM below. The tiers left out (NVMe, remote) are absent.
  TierStackOptions stack;
  stack.tiers[TierIndex(Tier::kHbm)].capacity_blocks = 64;
  stack.tiers[TierIndex(Tier::kDram)].capacity_blocks = 64;
  KvCacheOptions options;
  options.tiers = OrDie(BuildTierStack(ns, stack));
  std::unique_ptr<KvCache> cache = OrDie(KvCache::Create(ns, std::move(options)));
  std::printf("model: %s, %lld bytes per %d-token block\n", geometry.ToString().c_str(),
              static_cast<long long>(geometry.bytes_per_block()), geometry.tokens_per_block());

  std::mt19937 rng(7);
  std::vector<int32_t> prompt = RandomTokens(rng, 600);          // system prompt
  for (int32_t t : RandomTokens(rng, 100)) prompt.push_back(t);  // first question
  auto [conversation, miss] = Serve(*cache, SequenceId(1), prompt, /*decode=*/20, rng);

  for (int32_t t : RandomTokens(rng, 80)) conversation.push_back(t);  // the next question
  const int64_t hit = Serve(*cache, SequenceId(2), conversation, /*decode=*/20, rng).second;

  const KvTierStats hbm = cache->stats().tiers[TierIndex(Tier::kHbm)];
  std::printf("end: HBM %lld blocks cached, %lld free, %lld held by sequences\n",
              static_cast<long long>(hbm.droppable_blocks), static_cast<long long>(hbm.free_blocks),
              static_cast<long long>(hbm.held_blocks));

  // Request 1 leaves 700 + 20 = 720 tokens: 45 full blocks, all of which request 2 finds.
  const bool ok = miss == 0 && hit == 720 && hbm.held_blocks == 0;
  std::printf("%s\n", ok ? "quickstart: OK" : "quickstart: UNEXPECTED NUMBERS");
  return ok ? 0 : 1;
}
