// kvtier quickstart: two turns of one conversation on Llama-3.1-8B, using only the public API.
//
// Turn 1 prefills a system prompt and a question, decodes an answer and releases the sequence:
// its full blocks stay cached in HBM. Turn 2 sends the whole conversation again plus a new
// question: kvtier finds the cached prefix by its chained block keys, the new sequence adopts
// those blocks, and only the rest needs prefill. A fork then shows copy-on-write.
//
// Exit code 0 when every number printed is the expected one, 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "kvtier/block_allocator.h"
#include "kvtier/block_index.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/page_table.h"
#include "kvtier/prefix_hasher.h"

namespace {

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

// Publishes every full (sealed) block of `table` in the index as a ready HBM copy.
void Publish(const kvtier::PrefixHasher& hasher, kvtier::BlockIndex& index,
             const kvtier::PageTable& table) {
  std::vector<kvtier::BlockKey> keys = OrDie(hasher.BlockKeys(table.tokens()));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (index.Lookup(keys[i]).has_value()) continue;  // already cached (it was a hit)
    OrDie(index.AddCopy(keys[i], kvtier::Tier::kHbm, table.block_table()[i],
                        kvtier::CopyState::kReady, /*now_ns=*/0));
  }
}

}  // namespace

int main() {
  using namespace kvtier;
  const KvGeometry geometry = OrDie(KvGeometry::Create(
      {.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .tokens_per_block = 16}));
  const CacheNamespace ns = OrDie(CacheNamespace::Create(
      geometry, {.model_id = "meta-llama/Llama-3.1-8B-Instruct", .weights_fingerprint = "demo"}));
  const PrefixHasher hasher = OrDie(PrefixHasher::Create(ns));

  // An 8 GiB HBM budget for KV, in whole blocks.
  const int64_t hbm_bytes = int64_t{8} << 30;
  auto hbm = OrDie(BlockAllocator::Create(Tier::kHbm, hbm_bytes / geometry.bytes_per_block()));
  auto index = OrDie(BlockIndex::Create(geometry.tokens_per_block()));
  std::printf("model: %s\n  %lld bytes per token, %lld bytes per %d-token block\n",
              geometry.ToString().c_str(), static_cast<long long>(geometry.bytes_per_token()),
              static_cast<long long>(geometry.bytes_per_block()), geometry.tokens_per_block());
  std::printf("  HBM tier: %lld blocks (%lld GiB); namespace %s\n",
              static_cast<long long>(hbm->capacity_blocks()), static_cast<long long>(hbm_bytes >> 30),
              ns.DigestHex().c_str());

  std::mt19937 rng(7);
  std::vector<int32_t> conversation = RandomTokens(rng, 1000);  // system prompt
  for (int32_t t : RandomTokens(rng, 205)) conversation.push_back(t);  // first question

  // Turn 1: nothing cached yet.
  auto turn1 = OrDie(PageTable::Create(SequenceId(1), hbm.get(), geometry.tokens_per_block()));
  const PrefixMatch miss = OrDie(index->Match(OrDie(hasher.BlockKeys(conversation)),
                                              static_cast<int64_t>(conversation.size())));
  OrDie(turn1->Append(conversation).status());
  const std::vector<int32_t> answer = RandomTokens(rng, 90);
  for (int32_t t : answer) OrDie(turn1->Append({t}).status());  // decode, one token at a time
  Publish(hasher, *index, *turn1);
  std::printf("turn 1: %lld prompt tokens, %lld cached, %lld decoded; %lld blocks in HBM\n",
              static_cast<long long>(conversation.size()),
              static_cast<long long>(miss.matched_tokens), static_cast<long long>(answer.size()),
              static_cast<long long>(turn1->num_blocks()));
  conversation = std::vector<int32_t>(turn1->tokens().begin(), turn1->tokens().end());
  OrDie(turn1->Release());
  std::printf("        released: %lld blocks cached, %lld held\n",
              static_cast<long long>(hbm->counts().cached),
              static_cast<long long>(hbm->counts().held()));

  // Turn 2: the whole conversation again plus a new question.
  for (int32_t t : RandomTokens(rng, 300)) conversation.push_back(t);
  const std::vector<BlockKey> keys = OrDie(hasher.BlockKeys(conversation));
  std::vector<BlockLocation> where;
  const PrefixMatch hit =
      OrDie(index->Match(keys, static_cast<int64_t>(conversation.size()), &where));
  auto turn2 = OrDie(PageTable::Create(SequenceId(2), hbm.get(), geometry.tokens_per_block()));
  const absl::Span<const int32_t> all(conversation);
  // Pin every hit first, then allocate the rest. Only HBM copies can be adopted as they are;
  // with a single tier every hit is in HBM (lower tiers onboard first, once they exist).
  size_t adopted = 0;
  while (adopted < where.size() && where[adopted].tier == Tier::kHbm) {
    OrDie(turn2->AppendCachedBlock(Tier::kHbm, where[adopted].slot, all.subspan(adopted * 16, 16)));
    ++adopted;
  }
  OrDie(turn2->Append(all.subspan(adopted * 16)).status());
  Publish(hasher, *index, *turn2);
  const int64_t prefill = static_cast<int64_t>(conversation.size()) - static_cast<int64_t>(adopted) * 16;
  std::printf("turn 2: %lld prompt tokens, %lld cached in HBM (%.1f MiB of KV reused), "
              "%lld to prefill\n",
              static_cast<long long>(conversation.size()),
              static_cast<long long>(hit.matched_tokens),
              static_cast<double>(hit.matched_tokens * geometry.bytes_per_token()) / (1 << 20),
              static_cast<long long>(prefill));

  // Parallel sampling: fork inside the last block; the partial block is copied, not shared.
  ForkResult fork = OrDie(turn2->Fork(SequenceId(3), turn2->num_tokens()));
  std::printf("fork:   %lld tokens shared; partial block copied: %s (%d tokens)\n",
              static_cast<long long>(fork.child->num_tokens()), fork.copy ? "yes" : "no",
              fork.copy ? fork.copy->num_tokens : 0);
  OrDie(fork.child->Release());
  OrDie(turn2->Release());
  const SlotCounts c = hbm->counts();
  std::printf("end:    held %lld, cached %lld, free %lld, capacity %lld\n",
              static_cast<long long>(c.held()), static_cast<long long>(c.cached),
              static_cast<long long>(c.free), static_cast<long long>(hbm->capacity_blocks()));

  // 1205 + 90 = 1295 tokens after turn 1: 80 full blocks = 1280 tokens can hit in turn 2.
  const bool ok = miss.matched_tokens == 0 && hit.matched_tokens == 1280 && prefill == 315 &&
                  fork.copy.has_value() && c.held() == 0 &&
                  c.free + c.cached == hbm->capacity_blocks();
  std::printf("%s\n", ok ? "quickstart: OK" : "quickstart: UNEXPECTED NUMBERS");
  return ok ? 0 : 1;
}
