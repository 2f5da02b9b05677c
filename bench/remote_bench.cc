// The remote tier over Redis beside a plain hiredis loop, and the block codecs, on KV-like data
// (STYLE rule 10: the comparison runs side by side in one binary).
//
// Redis benchmarks, 2 MiB values, 8 per iteration (one pipeline, one connection each):
//   BM_RawHiredis_Set / _Get: one blocking redisContext; redisAppendCommandArgv of 8 SET (GET)
//     commands, then 8 redisGetReply + freeReplyObject. No framing, no checksum, no copy out.
//   BM_RedisTransport_Put / _Get: RemoteTier (codec none, no HMAC: XXH3-128 frames) over
//     RedisTransport (connections = 1, max_pipeline default): WriteBlocks / ReadBlocks of 8
//     blocks, every Completion waited and checked. _Get reads blocks written before the loop.
//     _Get is the batched read of 8 blocks in one call: one ReadBlocks = one Transport::Get of
//     8 items = one pipeline of 8 GETs.
//
// Discovery benchmarks, <blocks> = 8, 32, 128 stored blocks (items = blocks):
//   BM_RemoteProbe/<blocks>: RemoteTier::ProbeBlocks of all <blocks> keys, deadline now + 1 s,
//     over RedisTransport (connections = 1); every block must be found. The blocks are written
//     through the tier before the loop, in a small geometry of its own (1 layer, 1 KV head,
//     head_dim 64, 16 tokens: 4 KiB blocks), since EXISTS does not read values.
//   BM_RawExistsPipeline/<blocks>: the same store keys (RemoteTier::StoreKey), stored the same
//     way; one blocking redisContext, redisAppendCommandArgv of <blocks> EXISTS, then <blocks>
//     redisGetReply, each reply checked to be integer 1.
// The server: by default this binary starts its own redis-server on a free loopback port
// (tests/testing/redis_server.h) on the first Redis benchmark and kills it at exit; with
// --redis=host:port it uses that server instead. Either way it only touches its own keys
// ("kvtier_bench_raw:<i>" and the remote tier's "kvtierbench:..." keys, deleted after each
// benchmark), never FLUSHALL. Without redis-server on PATH (and no --redis) the Redis benchmarks
// are not registered at all, with a line saying so, so the smoke test passes on such a machine.
//
// Codec benchmarks, one 2 MiB block: BM_Codec_Compress/<codec>, BM_Codec_Decompress/<codec> for
// every codec ParseCodec accepts among none, lz4, zstd, shuffle_lz4, shuffle_zstd, fp8_e4m3;
// bytes are raw bytes; the counter `ratio` is raw bytes / encoded bytes.
//
// KV-like data: Llama-3.1-8B's geometry (32 layers, 8 KV heads, head_dim 128, bf16), 16 tokens
// per block = 2097152 bytes, block-contiguous [layer][K/V][token][kv_head][head_dim] as
// tier_backend.h defines host buffers. Each channel (layer, K/V, head, dim) has a scale
// s = exp(N(0, 0.5)) (log-normal, sigma 0.5); in the K planes, dims 7 and 93 of every head are
// outlier channels with scale 10 s (KIVI and KVQuant report a few fixed outlier channels in K;
// V has none). Each value is x = N(0, 1) * s, rounded from float to bf16 with round-to-nearest-
// even. Generator: std::mt19937_64 seeded 0x6b76746965720000 + block index, with
// std::normal_distribution<float> (libstdc++), scales drawn first in channel order, then values
// in layout order.
//
// Allocator: main() fixes glibc's mmap and trim thresholds (see there), so that page faults from
// malloc heuristics do not decide the raw-versus-ours comparison.
//
// After the table, a ratios section: ours over raw throughput (target >= 0.9 x, informational;
// for the probe, blocks per second over raw pipelined EXISTS per block count),
// and per codec its size ratio r and its throughput over the raw SET throughput (on a link of
// throughput B, encoding pays only if the codec runs faster than B * r / (r - 1)).

#include <hiredis/hiredis.h>
#include <malloc.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/bench_report.h"
#include "benchmark/benchmark.h"
#include "kvtier/block_key.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/codec.h"
#include "kvtier/completion.h"
#include "kvtier/ids.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/redis_transport.h"
#include "kvtier/remote_tier.h"
#include "kvtier/tier_backend.h"
#include "kvtier/transport.h"
#include "tests/testing/redis_server.h"

namespace kvtier {
namespace {

using bench::Skip;

constexpr int kDepth = 8;                       // commands (blocks) per pipeline and iteration
constexpr int64_t kBlockBytes = 2097152;        // 2 MiB
constexpr uint64_t kSeed = 0x6b76746965720000;  // "kvtier\0\0"
constexpr int kOutlierDims[] = {7, 93};         // of head_dim 128, K planes only
constexpr float kOutlierScale = 10.0f;
constexpr char kRawKeyPrefix[] = "kvtier_bench_raw:";
constexpr char kTierKeyPrefix[] = "kvtierbench:";

// ---- KV-like data ----

absl::StatusOr<KvGeometry> BenchGeometry() {
  absl::StatusOr<KvGeometry> g = KvGeometry::Create(
      {.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .tokens_per_block = 16});
  if (g.ok() && g->bytes_per_block() != kBlockBytes) {
    return absl::InternalError(
        absl::StrCat("geometry gives ", g->bytes_per_block(), " bytes per block, not 2 MiB"));
  }
  return g;
}

// bf16 from float, round to nearest even (NaN kept quiet).
uint16_t ToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// One block as the header describes, little-endian bf16.
std::vector<std::byte> KvBlock(const KvGeometry& g, uint64_t index) {
  std::mt19937_64 rng(kSeed + index);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::normal_distribution<float> log_scale(0.0f, 0.5f);
  const int layers = g.num_layers(), heads = g.num_kv_heads(), dim = g.head_dim();
  const int tokens = g.tokens_per_block();
  // scale[((layer * 2 + plane) * heads + head) * dim + d]
  std::vector<float> scale(static_cast<size_t>(layers) * 2 * heads * dim);
  for (size_t c = 0; c < scale.size(); ++c) scale[c] = std::exp(log_scale(rng));
  for (int layer = 0; layer < layers; ++layer) {
    for (int head = 0; head < heads; ++head) {
      for (int d : kOutlierDims) {
        scale[((static_cast<size_t>(layer) * 2 + 0) * heads + head) * dim + d] *= kOutlierScale;
      }
    }
  }
  std::vector<std::byte> block(static_cast<size_t>(g.bytes_per_block()));
  size_t at = 0;
  for (int layer = 0; layer < layers; ++layer) {
    for (int plane = 0; plane < 2; ++plane) {
      const float* s = &scale[(static_cast<size_t>(layer) * 2 + plane) * heads * dim];
      for (int token = 0; token < tokens; ++token) {
        for (int c = 0; c < heads * dim; ++c) {
          const uint16_t v = ToBf16(unit(rng) * s[c]);
          block[at++] = static_cast<std::byte>(v & 0xff);
          block[at++] = static_cast<std::byte>(v >> 8);
        }
      }
    }
  }
  return block;
}

// kDepth distinct blocks, made once per process.
const std::vector<std::vector<std::byte>>& KvBlocks() {
  static const auto* blocks = [] {
    auto* out = new std::vector<std::vector<std::byte>>();
    absl::StatusOr<KvGeometry> g = BenchGeometry();
    if (!g.ok()) return out;  // callers check BenchGeometry first
    for (int i = 0; i < kDepth; ++i) out->push_back(KvBlock(*g, static_cast<uint64_t>(i)));
    return out;
  }();
  return *blocks;
}

// ---- the server ----

struct RedisSetup {
  std::optional<std::string> flag_address;  // --redis=host:port
  std::unique_ptr<testing::RedisServer> server;
  std::optional<absl::StatusOr<std::string>> address;  // decided on first use
};

RedisSetup& Setup() {
  static RedisSetup* setup = new RedisSetup();
  return *setup;
}

// The server's "host:port": the flag's, or that of a server started on the first call (from the
// main thread, which Google Benchmark runs single-threaded benchmarks on: the server's
// PR_SET_PDEATHSIG is tied to the thread that started it).
const absl::StatusOr<std::string>& RedisAddress() {
  RedisSetup& setup = Setup();
  if (!setup.address) {
    if (setup.flag_address) {
      setup.address = *setup.flag_address;
    } else {
      absl::StatusOr<std::unique_ptr<testing::RedisServer>> server = testing::RedisServer::Start();
      if (server.ok()) {
        setup.server = *std::move(server);
        setup.address = setup.server->address();
      } else {
        setup.address = server.status();
      }
    }
  }
  return *setup.address;
}

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

absl::StatusOr<Context> Connect(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis address \"", address, "\": not host:port"));
  }
  std::string host(address.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  Context c(redisConnectWithTimeout(host.c_str(), port, absl::ToTimeval(absl::Seconds(2))));
  if (c == nullptr) return absl::ResourceExhaustedError("redisConnectWithTimeout: out of memory");
  if (c->err != 0) {
    return absl::UnavailableError(absl::StrCat("connect ", address, ": ", c->errstr));
  }
  if (redisSetTimeout(c.get(), absl::ToTimeval(absl::Seconds(10))) != REDIS_OK) {
    return absl::UnavailableError(absl::StrCat("redisSetTimeout: ", c->errstr));
  }
  return c;
}

// Appends `argv` to the pipeline.
absl::Status Append(redisContext* c, const std::vector<std::string_view>& argv) {
  const char* ptrs[4];
  size_t lens[4];
  for (size_t i = 0; i < argv.size(); ++i) {
    ptrs[i] = argv[i].data();
    lens[i] = argv[i].size();
  }
  if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), ptrs, lens) != REDIS_OK) {
    return absl::ResourceExhaustedError("redisAppendCommandArgv failed");
  }
  return absl::OkStatus();
}

// Reads one reply; an error reply or a reply of another type than `want` is an error. With
// `integer`, an integer reply's value is stored there.
absl::Status ReadReply(redisContext* c, int want, long long* integer = nullptr) {
  void* raw = nullptr;
  if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
    return absl::UnavailableError(absl::StrCat("redisGetReply: ", c->errstr));
  }
  Reply r(static_cast<redisReply*>(raw));
  if (r->type != want) {
    return absl::UnavailableError(
        absl::StrCat("reply type ", r->type, " (want ", want, ")",
                     r->type == REDIS_REPLY_ERROR ? absl::StrCat(": ", r->str) : ""));
  }
  if (integer != nullptr) *integer = r->integer;
  return absl::OkStatus();
}

// DEL of `keys` (one command), so the next benchmark starts from what it writes itself.
absl::Status DeleteKeys(redisContext* c, const std::vector<std::string>& keys) {
  std::vector<const char*> ptrs = {"DEL"};
  std::vector<size_t> lens = {3};
  for (const std::string& k : keys) {
    ptrs.push_back(k.data());
    lens.push_back(k.size());
  }
  if (redisAppendCommandArgv(c, static_cast<int>(ptrs.size()), ptrs.data(), lens.data()) !=
      REDIS_OK) {
    return absl::ResourceExhaustedError("redisAppendCommandArgv failed");
  }
  return ReadReply(c, REDIS_REPLY_INTEGER);
}

std::vector<std::string> RawKeys() {
  std::vector<std::string> keys;
  for (int i = 0; i < kDepth; ++i) keys.push_back(absl::StrCat(kRawKeyPrefix, i));
  return keys;
}

// ---- raw hiredis ----

// One pipeline of kDepth SETs of the blocks.
absl::Status RawSetAll(redisContext* c, const std::vector<std::string>& keys) {
  const auto& blocks = KvBlocks();
  for (int i = 0; i < kDepth; ++i) {
    const std::string_view value(reinterpret_cast<const char*>(blocks[i].data()), blocks[i].size());
    if (absl::Status s = Append(c, {"SET", keys[i], value}); !s.ok()) return s;
  }
  for (int i = 0; i < kDepth; ++i) {
    if (absl::Status s = ReadReply(c, REDIS_REPLY_STATUS); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RawGetAll(redisContext* c, const std::vector<std::string>& keys) {
  for (int i = 0; i < kDepth; ++i) {
    if (absl::Status s = Append(c, {"GET", keys[i]}); !s.ok()) return s;
  }
  for (int i = 0; i < kDepth; ++i) {
    if (absl::Status s = ReadReply(c, REDIS_REPLY_STRING); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void BM_RawHiredis(benchmark::State& state, bool get) {
  if (state.range(0) != kBlockBytes) {
    return Skip(state, "argument", absl::InvalidArgumentError("only 2097152-byte values"));
  }
  if (absl::StatusOr<KvGeometry> g = BenchGeometry(); !g.ok()) {
    return Skip(state, "geometry", g.status());
  }
  const absl::StatusOr<std::string>& address = RedisAddress();
  if (!address.ok()) return Skip(state, "redis-server", address.status());
  absl::StatusOr<Context> c = Connect(*address);
  if (!c.ok()) return Skip(state, "connect", c.status());
  const std::vector<std::string> keys = RawKeys();
  if (get) {
    if (absl::Status s = RawSetAll(c->get(), keys); !s.ok()) return Skip(state, "setup SET", s);
  }
  for (auto _ : state) {
    absl::Status s = get ? RawGetAll(c->get(), keys) : RawSetAll(c->get(), keys);
    if (!s.ok()) return Skip(state, get ? "GET" : "SET", s);
  }
  state.SetBytesProcessed(state.iterations() * kDepth * kBlockBytes);
  if (absl::Status s = DeleteKeys(c->get(), keys); !s.ok()) Skip(state, "cleanup DEL", s);
}

void BM_RawHiredis_Set(benchmark::State& state) { BM_RawHiredis(state, /*get=*/false); }
void BM_RawHiredis_Get(benchmark::State& state) { BM_RawHiredis(state, /*get=*/true); }

// ---- RemoteTier over RedisTransport ----

absl::Status WaitAllOk(const std::vector<Completion>& done) {
  for (const Completion& c : done) {
    if (absl::Status s = c.Wait(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void BM_RedisTransport(benchmark::State& state, bool get) {
  if (state.range(0) != kBlockBytes) {
    return Skip(state, "argument", absl::InvalidArgumentError("only 2097152-byte blocks"));
  }
  absl::StatusOr<KvGeometry> g = BenchGeometry();
  if (!g.ok()) return Skip(state, "geometry", g.status());
  const absl::StatusOr<std::string>& address = RedisAddress();
  if (!address.ok()) return Skip(state, "redis-server", address.status());
  absl::StatusOr<CacheNamespace> ns = CacheNamespace::Create(
      *g, {.model_id = "kvtier-remote-bench", .weights_fingerprint = "synthetic"});
  if (!ns.ok()) return Skip(state, "CacheNamespace::Create", ns.status());
  absl::StatusOr<std::unique_ptr<RedisTransport>> made =
      RedisTransport::Create({.endpoints = {*address}, .connections = 1});
  if (!made.ok()) return Skip(state, "RedisTransport::Create", made.status());
  const std::shared_ptr<Transport> transport = *std::move(made);
  absl::StatusOr<std::unique_ptr<RemoteTier>> tier =
      RemoteTier::Create(*ns, {.transport = transport,
                               .capacity_blocks = kDepth,
                               .key_prefix = kTierKeyPrefix,
                               .codec = Codec::kNone});
  if (!tier.ok()) return Skip(state, "RemoteTier::Create", tier.status());

  const auto& blocks = KvBlocks();
  std::vector<std::vector<std::byte>> out(kDepth, std::vector<std::byte>(kBlockBytes));
  std::vector<BlockWrite> writes;
  std::vector<BlockRead> reads;
  std::vector<std::string> store_keys;
  for (int i = 0; i < kDepth; ++i) {
    const BlockKey key{.hi = kSeed, .lo = static_cast<uint64_t>(i) + 1};
    const SlotId slot(static_cast<uint32_t>(i));
    writes.push_back({slot, key, blocks[i]});
    reads.push_back({slot, key, absl::MakeSpan(out[i])});
    store_keys.push_back((*tier)->StoreKey(key));
  }
  if (get) {
    if (absl::Status s = WaitAllOk((*tier)->WriteBlocks(writes)); !s.ok()) {
      return Skip(state, "setup WriteBlocks", s);
    }
  }
  for (auto _ : state) {
    absl::Status s = WaitAllOk(get ? (*tier)->ReadBlocks(reads) : (*tier)->WriteBlocks(writes));
    if (!s.ok()) return Skip(state, get ? "ReadBlocks" : "WriteBlocks", s);
  }
  state.SetBytesProcessed(state.iterations() * kDepth * kBlockBytes);
  if (get && std::memcmp(out[kDepth - 1].data(), blocks[kDepth - 1].data(), kBlockBytes) != 0) {
    return Skip(state, "check", absl::DataLossError("a block read back differs"));
  }
  // Cleanup: the keys this benchmark wrote, so the next one starts from its own.
  for (const Completion& c : transport->Delete(store_keys, absl::InfiniteFuture())) {
    if (absl::Status s = c.Wait(); !s.ok() && !absl::IsNotFound(s)) {
      return Skip(state, "cleanup DEL", s);
    }
  }
}

void BM_RedisTransport_Put(benchmark::State& state) { BM_RedisTransport(state, /*get=*/false); }
void BM_RedisTransport_Get(benchmark::State& state) { BM_RedisTransport(state, /*get=*/true); }

// ---- discovery: RemoteTier::ProbeBlocks beside raw pipelined EXISTS ----

constexpr int kProbeBlockCounts[] = {8, 32, 128};

// The probe's own geometry: EXISTS never reads a value, so small blocks keep the setup (up to
// 128 writes) quick without changing what is measured.
absl::StatusOr<KvGeometry> ProbeGeometry() {
  return KvGeometry::Create(
      {.num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .tokens_per_block = 16});
}

// A RemoteTier over its own RedisTransport, with `blocks` blocks written through it.
struct ProbeStore {
  std::shared_ptr<Transport> transport;
  std::unique_ptr<RemoteTier> tier;
  std::vector<BlockKey> keys;
  std::vector<std::string> store_keys;  // tier->StoreKey(keys[i])
};

absl::StatusOr<ProbeStore> MakeProbeStore(const std::string& address, int blocks) {
  absl::StatusOr<KvGeometry> g = ProbeGeometry();
  if (!g.ok()) return g.status();
  absl::StatusOr<CacheNamespace> ns = CacheNamespace::Create(
      *g, {.model_id = "kvtier-remote-bench-probe", .weights_fingerprint = "synthetic"});
  if (!ns.ok()) return ns.status();
  absl::StatusOr<std::unique_ptr<RedisTransport>> made =
      RedisTransport::Create({.endpoints = {address}, .connections = 1});
  if (!made.ok()) return made.status();
  ProbeStore store;
  store.transport = *std::move(made);
  absl::StatusOr<std::unique_ptr<RemoteTier>> tier =
      RemoteTier::Create(*ns, {.transport = store.transport,
                               .capacity_blocks = blocks,
                               .key_prefix = kTierKeyPrefix,
                               .codec = Codec::kNone});
  if (!tier.ok()) return tier.status();
  store.tier = *std::move(tier);
  const std::vector<std::byte> value(static_cast<size_t>(g->bytes_per_block()), std::byte{0x5a});
  std::vector<BlockWrite> writes;
  for (int i = 0; i < blocks; ++i) {
    const BlockKey key{.hi = kSeed ^ 0x70726f6265, .lo = static_cast<uint64_t>(i) + 1};  // "probe"
    store.keys.push_back(key);
    store.store_keys.push_back(store.tier->StoreKey(key));
    writes.push_back({SlotId(static_cast<uint32_t>(i)), key, value});
  }
  if (absl::Status s = WaitAllOk(store.tier->WriteBlocks(writes)); !s.ok()) return s;
  return store;
}

// Deletes what MakeProbeStore wrote, so the next benchmark starts from its own keys.
absl::Status DeleteProbeStore(const ProbeStore& store) {
  for (const Completion& c : store.transport->Delete(store.store_keys, absl::InfiniteFuture())) {
    if (absl::Status s = c.Wait(); !s.ok() && !absl::IsNotFound(s)) return s;
  }
  return absl::OkStatus();
}

void BM_RemoteProbe(benchmark::State& state) {
  const int blocks = static_cast<int>(state.range(0));
  const absl::StatusOr<std::string>& address = RedisAddress();
  if (!address.ok()) return Skip(state, "redis-server", address.status());
  absl::StatusOr<ProbeStore> store = MakeProbeStore(*address, blocks);
  if (!store.ok()) return Skip(state, "setup", store.status());
  bool failed = false;
  for (auto _ : state) {
    absl::StatusOr<std::vector<bool>> found =
        store->tier->ProbeBlocks(store->keys, absl::Now() + absl::Seconds(1));
    if (!found.ok()) {
      Skip(state, "ProbeBlocks", found.status());
      failed = true;
      break;
    }
    if (const auto n = std::count(found->begin(), found->end(), true); n != blocks) {
      Skip(state, "ProbeBlocks",
           absl::NotFoundError(absl::StrCat(n, " of ", blocks, " stored blocks found")));
      failed = true;
      break;
    }
  }
  if (!failed) state.SetItemsProcessed(state.iterations() * blocks);
  if (absl::Status s = DeleteProbeStore(*store); !s.ok() && !failed) Skip(state, "cleanup DEL", s);
}

// One pipeline of an EXISTS per key; every key must exist.
absl::Status RawExistsAll(redisContext* c, const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (absl::Status s = Append(c, {"EXISTS", key}); !s.ok()) return s;
  }
  int64_t found = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    long long exists = 0;
    if (absl::Status s = ReadReply(c, REDIS_REPLY_INTEGER, &exists); !s.ok()) return s;
    found += exists;
  }
  if (found != static_cast<int64_t>(keys.size())) {
    return absl::NotFoundError(absl::StrCat(found, " of ", keys.size(), " stored keys exist"));
  }
  return absl::OkStatus();
}

void BM_RawExistsPipeline(benchmark::State& state) {
  const int blocks = static_cast<int>(state.range(0));
  const absl::StatusOr<std::string>& address = RedisAddress();
  if (!address.ok()) return Skip(state, "redis-server", address.status());
  absl::StatusOr<ProbeStore> store = MakeProbeStore(*address, blocks);
  if (!store.ok()) return Skip(state, "setup", store.status());
  absl::StatusOr<Context> c = Connect(*address);
  bool failed = !c.ok();
  if (failed) {
    Skip(state, "connect", c.status());
  } else {
    for (auto _ : state) {
      if (absl::Status s = RawExistsAll(c->get(), store->store_keys); !s.ok()) {
        Skip(state, "EXISTS", s);
        failed = true;
        break;
      }
    }
  }
  if (!failed) state.SetItemsProcessed(state.iterations() * blocks);
  if (absl::Status s = DeleteProbeStore(*store); !s.ok() && !failed) Skip(state, "cleanup DEL", s);
}

// ---- codecs ----

// Encoded size ratio of each codec that ran, for the ratios section (the reporter keeps no
// user counters). Written on the main thread only.
std::map<std::string, double>& SizeRatios() {
  static auto* ratios = new std::map<std::string, double>();
  return *ratios;
}

void BM_CodecCompress(benchmark::State& state, Codec codec) {
  if (absl::StatusOr<KvGeometry> g = BenchGeometry(); !g.ok()) {
    return Skip(state, "geometry", g.status());
  }
  const std::vector<std::byte>& raw = KvBlocks()[0];
  std::vector<std::byte> encoded;
  for (auto _ : state) {
    if (absl::Status s = Compress(codec, raw, &encoded); !s.ok()) return Skip(state, "Compress", s);
    benchmark::DoNotOptimize(encoded.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(raw.size()));
  const double ratio = static_cast<double>(raw.size()) / static_cast<double>(encoded.size());
  state.counters["ratio"] = benchmark::Counter(ratio);
  SizeRatios()[std::string(CodecName(codec))] = ratio;
}

void BM_CodecDecompress(benchmark::State& state, Codec codec) {
  if (absl::StatusOr<KvGeometry> g = BenchGeometry(); !g.ok()) {
    return Skip(state, "geometry", g.status());
  }
  const std::vector<std::byte>& raw = KvBlocks()[0];
  std::vector<std::byte> encoded;
  if (absl::Status s = Compress(codec, raw, &encoded); !s.ok()) return Skip(state, "Compress", s);
  std::vector<std::byte> decoded(raw.size());
  for (auto _ : state) {
    if (absl::Status s = Decompress(codec, encoded, absl::MakeSpan(decoded)); !s.ok()) {
      return Skip(state, "Decompress", s);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(raw.size()));
  state.counters["ratio"] =
      benchmark::Counter(static_cast<double>(raw.size()) / static_cast<double>(encoded.size()));
  if (!CodecIsLossy(codec) && decoded != raw) {
    return Skip(state, "check", absl::DataLossError("decoded block differs from the original"));
  }
}

// Every codec ParseCodec accepts among the known names, in this order.
std::vector<Codec> BenchCodecs() {
  std::vector<Codec> codecs;
  for (const char* name : {"none", "lz4", "zstd", "shuffle_lz4", "shuffle_zstd", "fp8_e4m3"}) {
    if (absl::StatusOr<Codec> c = ParseCodec(name); c.ok()) codecs.push_back(*c);
  }
  return codecs;
}

// Registers the benchmarks; the Redis ones only where a server can be had.
void Register(bool redis) {
  if (redis) {
    for (auto [name, fn] : {std::pair{"BM_RawHiredis_Set", &BM_RawHiredis_Set},
                            std::pair{"BM_RawHiredis_Get", &BM_RawHiredis_Get},
                            std::pair{"BM_RedisTransport_Put", &BM_RedisTransport_Put},
                            std::pair{"BM_RedisTransport_Get", &BM_RedisTransport_Get}}) {
      benchmark::RegisterBenchmark(name, fn)
          ->Arg(kBlockBytes)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (auto [name, fn] : {std::pair{"BM_RemoteProbe", &BM_RemoteProbe},
                            std::pair{"BM_RawExistsPipeline", &BM_RawExistsPipeline}}) {
      auto* b = benchmark::RegisterBenchmark(name, fn);
      for (int blocks : kProbeBlockCounts) b->Arg(blocks);
      b->Unit(benchmark::kMicrosecond)->UseRealTime();
    }
  }
  for (Codec codec : BenchCodecs()) {
    const std::string name(CodecName(codec));
    benchmark::RegisterBenchmark(absl::StrCat("BM_Codec_Compress/", name).c_str(),
                                 [codec](benchmark::State& s) { BM_CodecCompress(s, codec); })
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(absl::StrCat("BM_Codec_Decompress/", name).c_str(),
                                 [codec](benchmark::State& s) { BM_CodecDecompress(s, codec); })
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
}

// ---- ratios ----

std::optional<double> Throughput(const bench::Results& results, const std::string& name) {
  const bench::Result* r = bench::Find(results, name);
  if (r == nullptr || !r->bytes_per_second) return std::nullopt;
  return *r->bytes_per_second;
}

void PrintRatios(std::FILE* out, const bench::Results& results) {
  std::string ratios, checks;
  constexpr const char* kPairs[][3] = {
      {"RedisTransport_Put / RawHiredis_Set", "BM_RedisTransport_Put/2097152/real_time",
       "BM_RawHiredis_Set/2097152/real_time"},
      {"RedisTransport_Get / RawHiredis_Get", "BM_RedisTransport_Get/2097152/real_time",
       "BM_RawHiredis_Get/2097152/real_time"},
  };
  for (const auto& [label, ours, raw] : kPairs) {
    const std::optional<double> a = Throughput(results, ours), b = Throughput(results, raw);
    if (!a || !b) continue;
    ratios += bench::Ratio(label, *a / *b);
    checks += bench::Check(label, *a / *b, "x", 0.9, true);
  }
  for (int blocks : kProbeBlockCounts) {
    const bench::Result* ours =
        bench::Find(results, absl::StrCat("BM_RemoteProbe/", blocks, "/real_time"));
    const bench::Result* raw =
        bench::Find(results, absl::StrCat("BM_RawExistsPipeline/", blocks, "/real_time"));
    if (ours == nullptr || raw == nullptr || !ours->items_per_second || !raw->items_per_second) {
      continue;
    }
    const std::string label = absl::StrCat("probe / raw pipelined EXISTS, ", blocks, " blocks");
    const double ratio = *ours->items_per_second / *raw->items_per_second;
    ratios += bench::Ratio(label.c_str(), ratio);
    checks += bench::Check(label.c_str(), ratio, "x", 0.9, true);
  }
  const std::optional<double> wire = Throughput(results, "BM_RawHiredis_Set/2097152/real_time");
  for (Codec codec : BenchCodecs()) {
    const std::string name(CodecName(codec));
    if (auto it = SizeRatios().find(name); it != SizeRatios().end()) {
      ratios += bench::Ratio(absl::StrCat("size raw / encoded, ", name).c_str(), it->second);
    }
    if (!wire) continue;
    for (const char* op : {"Compress", "Decompress"}) {
      const std::optional<double> t =
          Throughput(results, absl::StrCat("BM_Codec_", op, "/", name, "/real_time"));
      if (!t) continue;
      ratios += bench::Ratio(absl::StrCat(op, "/", name, " / RawHiredis_Set").c_str(), *t / *wire);
    }
  }
  bench::PrintSections(out,
                       "throughput over throughput, 2 MiB KV-like bf16 blocks (probe: blocks/s); "
                       "1 = raw hiredis; size ratios raw / encoded",
                       ratios, checks);
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  // A server that goes away mid-write raises SIGPIPE on the raw loop's socket: make it EPIPE.
  signal(SIGPIPE, SIG_IGN);
  // Fixed glibc malloc thresholds, so the allocator's heuristics do not decide the comparison.
  // hiredis 0.14 frees its output buffer after every pipeline and grows it again; with the
  // default dynamic mmap threshold the raw loop's 16 MiB buffer (main arena) landed in fresh
  // pages every iteration (~4600 page faults, about 1.7x the time of BM_RawHiredis_Set), while
  // the transport's worker thread (another arena) paid almost none, so ours read as faster than
  // raw hiredis. With these, neither side faults in the steady state.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // --redis=host:port is ours: take it out before Google Benchmark sees the flags.
  kvtier::RedisSetup& setup = kvtier::Setup();
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg.starts_with("--redis=")) {
      setup.flag_address = std::string(arg.substr(8));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  argv[argc] = nullptr;

  const bool redis = setup.flag_address || kvtier::testing::RedisServerAvailable();
  if (!redis) {
    std::fprintf(
        stderr,
        "redis-server is not on PATH and no --redis=host:port was given: the BM_RawHiredis_*, "
        "BM_RedisTransport_*, BM_RemoteProbe and BM_RawExistsPipeline benchmarks are not "
        "registered (only the codec ones run)\n");
  }
  kvtier::Register(redis);
  const int rc = kvtier::bench::RunAndReport(argc, argv, kvtier::PrintRatios);
  setup.server.reset();  // kill the server we started (it dies with us anyway: PDEATHSIG)
  return rc;
}
