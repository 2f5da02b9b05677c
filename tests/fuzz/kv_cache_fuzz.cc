// libFuzzer target for KvCache: the input bytes are decoded into a small cache configuration and
// then a sequence of API calls (sequences, prefixes, appends, writes, forks, residency tickets,
// pauses, prefetches, lookups, stats, events, injected tier faults, a warm restart, and the
// hints: releases with a stop reason, idle estimate and last turn, retain and invalidate of a
// prefix or a session). After every call the harness checks:
//   * the result is OK or one of the codes kv_cache.h documents for that call, and the exact
//     code where the model knows which documented error applies (an unknown sequence, a range
//     past the end, a second release, ...);
//   * on error nothing changed (GetSequence still shows the old state);
//   * CheckInvariants() is OK, stats() gauges add up, tickets and block tables are well formed;
//   * a hint's HintOutcome is the one kv_cache.h documents for its arguments (kRejected,
//     kClipped, kAccepted, and the blocks it names), and a prefix invalidated whole is no longer
//     found;
//   * the KV bytes of every resident block read through a ticket are the bytes the "kernel"
//     wrote for those tokens, whichever tiers the block travelled through. The harness plays the
//     kernel: before reporting tokens written it writes a pattern derived from the tokens (and
//     the sequence's adapter and salt) into the emulated HBM pool, so shared and restored blocks
//     must carry exactly that pattern.
// At the end it releases every ticket and sequence, waits for the cache to go idle, and checks
// that no tier still has held, locked or in-flight blocks.
//
// A violation aborts with a message naming the call (libFuzzer then saves the input).
// KVTIER_FUZZ_VERBOSE=1 in the environment prints every call, for replaying a saved input:
//   KVTIER_FUZZ_VERBOSE=1 ./kvtier_kv_cache_fuzz crash-<sha1>
//
// Geometry: 2 layers x 1 KV head x head_dim 8, bf16, 4-token blocks (256-byte blocks). Tiers:
// emulated HBM of 6..13 blocks, DRAM of 8 blocks, an NVMe file of 16 slots and an in-process
// remote store of 16 blocks, each optional below HBM and each behind a FaultInjectingTier, built
// by the tier stack builder (kvtier/tier_stack.h) as the tests and the replay build theirs.

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/cache_namespace.h"
#include "kvtier/completion.h"
#include "kvtier/device_block_table.h"
#include "kvtier/emulated_hbm.h"
#include "kvtier/hbm_layout.h"
#include "kvtier/ids.h"
#include "kvtier/in_process_transport.h"
#include "kvtier/kv_cache.h"
#include "kvtier/kv_cache_stats.h"
#include "kvtier/kv_geometry.h"
#include "kvtier/nvme_tier.h"
#include "kvtier/prefix_hasher.h"
#include "kvtier/session_hints.h"
#include "kvtier/tier_backend.h"
#include "kvtier/tier_stack.h"
#include "tests/testing/fault_injecting_tier.h"

namespace kvtier {
namespace {

using absl::StatusCode;

constexpr int kTokensPerBlock = 4;
constexpr int kNumSequenceIds = 8;  // ids 0..7, so duplicates and reuse are frequent
constexpr int kMaxOps = 256;
constexpr size_t kMaxTickets = 48;
constexpr size_t kMaxPendingReadies = 4;
constexpr int kMaxRestarts = 2;
constexpr int kMaxPromptTokens = 64;
constexpr int kAlphabet = 4;  // token ids 0..3: prefixes repeat
// The fake clock starts in 2000, so "now minus a second" is in the past on both the fake and
// the real clock, whichever one the cache compares deadlines with.
const absl::Time kClockBase = absl::FromUnixSeconds(946684800);
// Bounded real-time waits: a call that should finish quickly but does not is reported by name,
// before libFuzzer's -timeout kills the process without saying which call hung.
constexpr absl::Duration kHangLimit = absl::Seconds(8);

bool Verbose() {
  static const bool verbose = std::getenv("KVTIER_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "kv_cache_fuzz: FAILED: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

void Log(const std::string& line) {
  if (Verbose()) std::fprintf(stderr, "kv_cache_fuzz: %s\n", line.c_str());
}

std::string CodeName(StatusCode code) { return absl::StatusCodeToString(code); }

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int64_t BlocksFor(int64_t tokens) { return (tokens + kTokensPerBlock - 1) / kTokensPerBlock; }

// ---- Input decoding

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  int Below(int n) { return Byte() % n; }                          // [0, n), n <= 256
  int InRange(int lo, int hi) { return lo + Below(hi - lo + 1); }  // [lo, hi]
  bool Bool() { return (Byte() & 1) != 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// ---- Expected outcomes

// Which outcomes a call may have. Must(c): the model knows a documented error applies, so the call
// must fail, with c or another Must/May code (several errors may apply; precedence is not part of
// the contract). May(c): a documented error the model cannot predict (HBM full, a wrong state).
class Rules {
 public:
  void Must(StatusCode code) {
    must_fail_ = true;
    codes_.insert(code);
  }
  void May(StatusCode code) { codes_.insert(code); }
  bool must_fail() const { return must_fail_; }

  void Check(const std::string& call, const absl::Status& status) const {
    if (status.ok()) {
      if (must_fail_) Fail(absl::StrCat(call, " returned OK; expected one of ", Codes()));
      return;
    }
    if (!codes_.contains(status.code())) {
      Fail(absl::StrCat(call, " returned ", status.ToString(),
                        "; allowed: ", must_fail_ ? "" : "OK, ", Codes()));
    }
  }

 private:
  std::string Codes() const {
    std::string out;
    for (StatusCode code : codes_) absl::StrAppend(&out, out.empty() ? "" : ", ", CodeName(code));
    return out.empty() ? "(none)" : out;
  }
  bool must_fail_ = false;
  std::set<StatusCode> codes_;
};

// ---- The "kernel": KV bytes derived from the tokens

// Identity of the KV a sequence computes besides its tokens: what PrefixHasher keys on, except
// multimodal items (blocks that differ only in items get different keys, so equal bytes for them
// can never be mistaken for each other).
uint64_t IdentityHash(const SequenceOptions& options) {
  uint64_t h = 0x6b76746965720001ULL;
  if (options.adapter.has_value()) {
    h = Mix(h ^ 1);
    for (char c : options.adapter->id) h = Mix(h ^ static_cast<uint8_t>(c));
    h = Mix(h ^ options.adapter->load_generation);
  }
  h = Mix(h ^ 2);
  if (options.tenant_salt.has_value()) {
    h = Mix(h ^ 3);
    for (char c : *options.tenant_salt) h = Mix(h ^ static_cast<uint8_t>(c));
    h = Mix(h ^ options.tenant_salt->size());
  }
  return h;
}

// hashes[p] depends on the identity and tokens[0..p]: the KV of token p.
std::vector<uint64_t> TokenHashes(uint64_t identity, absl::Span<const int32_t> tokens) {
  std::vector<uint64_t> hashes(tokens.size());
  uint64_t h = identity;
  for (size_t p = 0; p < tokens.size(); ++p) {
    h = Mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[p])) << 8) ^ p);
    hashes[p] = h;
  }
  return hashes;
}

// Calls fn(address, bytes, expected pattern word) for every piece of token `token_in_block`'s KV
// in HBM slot `slot`, all layers, K and V, every head.
template <typename Fn>
void ForEachKvPiece(const DevicePoolView& pool, const KvGeometry& geometry, int32_t slot,
                    int token_in_block, uint64_t token_hash, Fn fn) {
  const int64_t head_bytes = int64_t{geometry.head_dim()} * KvDtypeBytes(geometry.dtype());
  for (int layer = 0; layer < geometry.num_layers(); ++layer) {
    for (int plane = 0; plane < 2; ++plane) {
      for (int head = 0; head < geometry.num_kv_heads(); ++head) {
        std::byte* at =
            KvAddress(pool, slot, layer, static_cast<KvPlane>(plane), token_in_block, head);
        for (int64_t offset = 0; offset < head_bytes; offset += 8) {
          const uint64_t word =
              Mix(token_hash ^ (static_cast<uint64_t>(layer) << 40) ^
                  (static_cast<uint64_t>(plane) << 48) ^ (static_cast<uint64_t>(head) << 20) ^
                  static_cast<uint64_t>(offset));
          fn(at + offset, static_cast<size_t>(std::min<int64_t>(8, head_bytes - offset)), word);
        }
      }
    }
  }
}

void WriteTokenKv(const DevicePoolView& pool, const KvGeometry& geometry, int32_t slot,
                  int token_in_block, uint64_t token_hash) {
  ForEachKvPiece(pool, geometry, slot, token_in_block, token_hash,
                 [](std::byte* at, size_t bytes, uint64_t word) { std::memcpy(at, &word, bytes); });
}

bool TokenKvMatches(const DevicePoolView& pool, const KvGeometry& geometry, int32_t slot,
                    int token_in_block, uint64_t token_hash) {
  bool same = true;
  ForEachKvPiece(pool, geometry, slot, token_in_block, token_hash,
                 [&same](std::byte* at, size_t bytes, uint64_t word) {
                   same = same && std::memcmp(at, &word, bytes) == 0;
                 });
  return same;
}

// Copies the first `num_tokens` tokens' KV of slot `src` to slot `dst` (a Fork's BlockCopy).
void CopyBlockKv(const DevicePoolView& pool, const KvGeometry& geometry, int32_t src, int32_t dst,
                 int num_tokens) {
  const int64_t head_bytes = int64_t{geometry.head_dim()} * KvDtypeBytes(geometry.dtype());
  for (int layer = 0; layer < geometry.num_layers(); ++layer) {
    for (KvPlane plane : {KvPlane::kK, KvPlane::kV}) {
      for (int t = 0; t < num_tokens; ++t) {
        for (int head = 0; head < geometry.num_kv_heads(); ++head) {
          std::memmove(KvAddress(pool, dst, layer, plane, t, head),
                       KvAddress(pool, src, layer, plane, t, head),
                       static_cast<size_t>(head_bytes));
        }
      }
    }
  }
}

// ---- Process-wide setup

const KvGeometry& Geometry() {
  static const KvGeometry geometry = [] {
    KvGeometryOptions options;
    options.num_layers = 2;
    options.num_kv_heads = 1;
    options.head_dim = 8;
    options.dtype = KvDtype::kBf16;
    options.tokens_per_block = kTokensPerBlock;
    absl::StatusOr<KvGeometry> g = KvGeometry::Create(options);
    if (!g.ok()) Fail(absl::StrCat("KvGeometry::Create: ", g.status().ToString()));
    return *g;
  }();
  return geometry;
}

const CacheNamespace& Namespace(HbmLayout layout) {
  auto make = [](HbmLayout l) {
    CacheNamespaceOptions options;
    options.model_id = "kvtier/fuzz-tiny";  // unknown to KnownModelCost
    options.weights_fingerprint = "kv-cache-fuzz";
    options.hbm_layout = l;
    absl::StatusOr<CacheNamespace> ns = CacheNamespace::Create(Geometry(), options);
    if (!ns.ok()) Fail(absl::StrCat("CacheNamespace::Create: ", ns.status().ToString()));
    return *ns;
  };
  static const CacheNamespace layer_first = make(HbmLayout::kLayerFirst);
  static const CacheNamespace block_first = make(HbmLayout::kBlockFirst);
  static const CacheNamespace kv_split = make(HbmLayout::kLayerKvSplit);
  switch (layout) {
    case HbmLayout::kBlockFirst:
      return block_first;
    case HbmLayout::kLayerKvSplit:
      return kv_split;
    case HbmLayout::kLayerFirst:
      break;
  }
  return layer_first;
}

// One temporary directory per process for the NVMe file (O_DIRECT is checked there, unlike on
// tmpfs), removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    char pattern[] = "/tmp/kvtier_fuzz_XXXXXX";
    const char* made = mkdtemp(pattern);
    if (made == nullptr) Fail("mkdtemp failed");
    path_ = made;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const char* name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

const ScratchDir& Scratch() {
  static const ScratchDir dir;
  return dir;
}

// A ticket of another cache, for ReleaseTicket's kNotFound. The cache lives for the whole process
// (never destroyed: its ticket stays open, and static destruction order is not worth the risk).
struct Foreign {
  KvCache* cache = nullptr;
  ResidencyTicket ticket;
};

const Foreign& ForeignTicket() {
  static const Foreign foreign = [] {
    Foreign f;
    EmulatedHbmOptions hbm_options;
    hbm_options.capacity_blocks = 4;
    hbm_options.check_available_memory = false;
    absl::StatusOr<std::unique_ptr<EmulatedHbm>> hbm = EmulatedHbm::Create(Geometry(), hbm_options);
    if (!hbm.ok()) Fail(absl::StrCat("foreign EmulatedHbm::Create: ", hbm.status().ToString()));
    KvCacheOptions options;
    options.tiers[TierIndex(Tier::kHbm)] = std::move(*hbm);
    absl::StatusOr<std::unique_ptr<KvCache>> cache =
        KvCache::Create(Namespace(HbmLayout::kLayerFirst), std::move(options));
    if (!cache.ok()) Fail(absl::StrCat("foreign KvCache::Create: ", cache.status().ToString()));
    f.cache = cache->release();
    const SequenceId id(1);
    const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
    absl::Status s = f.cache->CreateSequence(id);
    if (s.ok()) s = f.cache->Append(id, tokens).status();
    if (!s.ok()) Fail(absl::StrCat("foreign cache setup: ", s.ToString()));
    absl::StatusOr<ResidencyTicket> ticket = f.cache->EnsureResident(id, 0, 5);
    if (!ticket.ok()) Fail(absl::StrCat("foreign EnsureResident: ", ticket.status().ToString()));
    f.ticket = *ticket;
    return f;
  }();
  return foreign;
}

// ---- Configuration (the first bytes of the input)

struct Config {
  HbmLayout layout = HbmLayout::kLayerFirst;
  int hbm_blocks = 12;
  std::array<bool, kNumTiers> present = {true, true, true, false};
  NvmeEngine nvme_engine = NvmeEngine::kAuto;
  WritePolicy write_policy = WritePolicy::kWriteBack;
  TierInclusion inclusion = TierInclusion::kInclusive;
  std::string eviction_policy = "lru";
  std::array<int, kNumTiers> admit_after_uses = {1, 1, 1, 1};
  bool demote_on_evict = true;
  bool demote_by_value = true;
  int prefill_cost = 0;  // 0 unset, 1 cheap recompute, 2 expensive recompute
  HashAlgorithm hash = HashAlgorithm::kXxh3_128;
  int64_t event_buffer = 65536;
  absl::Duration room_wait = absl::ZeroDuration();
  int bounce_buffers = 4;
  bool measure_bandwidth = true;
  int invalid = 0;  // 0: a valid configuration; else which option is made invalid
};

constexpr int kNumInvalidConfigs = 9;

Config DecodeConfig(Input& in) {
  Config c;
  const uint8_t a = in.Byte();
  const uint8_t b = in.Byte();
  const uint8_t d = in.Byte();
  // The kv-split layout takes the inputs whose prefill-cost bits are 3 (read as 0 there).
  c.layout = (a & 1) != 0    ? HbmLayout::kBlockFirst
             : (d & 3) == 3 ? HbmLayout::kLayerKvSplit
                            : HbmLayout::kLayerFirst;
  c.present[TierIndex(Tier::kDram)] = (a & 2) == 0;
  c.present[TierIndex(Tier::kNvme)] = (a & 4) == 0;
  c.present[TierIndex(Tier::kRemote)] = (a & 8) != 0;
  c.write_policy = (a & 16) != 0 ? WritePolicy::kWriteThrough : WritePolicy::kWriteBack;
  c.demote_on_evict = (a & 64) == 0;
  c.nvme_engine = (a & 128) != 0 ? NvmeEngine::kThreadPool : NvmeEngine::kAuto;
  c.hbm_blocks = 6 + (b & 7);
  c.admit_after_uses[TierIndex(Tier::kDram)] = 1 + ((b >> 3) & 1);
  c.admit_after_uses[TierIndex(Tier::kNvme)] = 1 + ((b >> 4) & 1);
  c.admit_after_uses[TierIndex(Tier::kRemote)] = 1 + ((b >> 5) & 1);
  c.hash = (b & 64) != 0 ? HashAlgorithm::kSha256 : HashAlgorithm::kXxh3_128;
  c.measure_bandwidth = (b & 128) == 0;
  c.prefill_cost = (d & 3) % 3;
  c.event_buffer = (d & 4) != 0 ? 4 : 65536;
  c.room_wait = (d & 8) != 0 ? absl::Milliseconds(1) : absl::ZeroDuration();
  c.bounce_buffers = (d & 16) != 0 ? 1 : 4;
  c.inclusion = (d & 32) != 0 ? TierInclusion::kExclusive : TierInclusion::kInclusive;
  // kExclusive with kWriteThrough is an invalid configuration (documented): keep it for one in
  // four such inputs, so most inputs get to run.
  if (c.inclusion == TierInclusion::kExclusive && c.write_policy == WritePolicy::kWriteThrough &&
      (d >> 6) != 2) {
    c.inclusion = TierInclusion::kInclusive;
  }
  // About one input in sixteen tries one invalid option.
  const uint8_t e = in.Byte();
  c.eviction_policy = (a & 32) == 0    ? "lru"
                      : (d & 128) == 0 ? "cost_aware"
                      : (e & 16) != 0  ? "learned"
                                       : "reuse_index";
  c.demote_by_value = (e & 32) == 0;
  c.invalid = (d >> 6) == 3 && (e & 3) == 0 ? 1 + (e >> 2) % kNumInvalidConfigs : 0;
  return c;
}

std::string DescribeConfig(const Config& c) {
  return absl::StrCat("hbm=", c.hbm_blocks, " ", HbmLayoutName(c.layout), " dram=", c.present[1],
                      " nvme=", c.present[2], " remote=", c.present[3],
                      " write_through=", c.write_policy == WritePolicy::kWriteThrough,
                      " exclusive=", c.inclusion == TierInclusion::kExclusive,
                      " policy=", c.eviction_policy, " admit=", c.admit_after_uses[1],
                      c.admit_after_uses[2], c.admit_after_uses[3], " demote=", c.demote_on_evict,
                      " by_value=", c.demote_by_value, " prefill_cost=", c.prefill_cost,
                      " event_buffer=", c.event_buffer,
                      " room_wait=", absl::FormatDuration(c.room_wait),
                      " bounce=", c.bounce_buffers, " invalid=", c.invalid);
}

// ---- The harness

struct SeqModel {
  uint64_t generation = 0;
  bool live = true;  // false once released
  bool paused = false;
  SequenceOptions options;
  uint64_t identity = 0;
  bool has_multimodal = false;
  std::vector<int32_t> tokens;
  int64_t written = 0;       // the cache's written_tokens, as last read
  int64_t write_cursor = 0;  // tokens whose KV the kernel wrote (or will, at a pending ready)
  bool tainted = false;      // a write could not be done: never again report tokens as ready
};

struct PendingReady {
  Completion ready;
  uint64_t seq = 0;
  uint64_t generation = 0;
  int64_t begin = 0;  // the kernel writes tokens [begin, end) just before `ready` fires
  int64_t end = 0;
  std::vector<int32_t> tokens;
  uint64_t identity = 0;
  ResidencyTicket ticket;  // pins the blocks written; invalid when nothing is written
  bool fail = false;       // fire with an error instead of OK
};

struct TicketModel {
  ResidencyTicket ticket;
  bool released = false;
  bool final_checked = false;
  ResidencyMode mode = ResidencyMode::kWait;
  uint64_t seq = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t num_tokens = 0;  // of the sequence when the ticket was made
  // Tokens [0, verified) had known KV when the ticket was made, and their identity.
  std::shared_ptr<const std::vector<int32_t>> verified_tokens;
  uint64_t identity = 0;
};

// One input byte (modulo kCount) picks each operation. tests/fuzz/make_corpus.py encodes the
// seeds with these numbers: add new operations just before kCount and regenerate the seeds.
enum class Op : uint8_t {
  kCreateSequence,
  kAttachPrefix,
  kAppend,
  kReportWritten,
  kFork,
  kEnsureResident,
  kReleaseTicket,
  kWaitTicket,
  kPause,
  kResume,
  kRelease,
  kPrefetch,
  kLookup,
  kGetSequence,
  kStats,
  kPollEvents,
  kAdvanceClock,
  kCompleteReady,
  kWaitIdle,
  kInjectFault,
  kRemoteFailure,
  kRestart,
  kForeignTicket,
  kReleaseHinted,
  kRetainPrefix,
  kInvalidatePrefix,
  kRetainSession,
  kInvalidateSession,
  kCount,
};

const char* OpName(Op op) {
  static constexpr const char* kNames[] = {
      "CreateSequence",   "AttachPrefix",  "Append",           "ReportWritten", "Fork",
      "EnsureResident",   "ReleaseTicket", "WaitTicket",       "Pause",         "Resume",
      "Release",          "Prefetch",      "Lookup",           "GetSequence",   "stats",
      "PollEvents",       "AdvanceClock",  "CompleteReady",    "WaitIdle",      "InjectFault",
      "RemoteFailure",    "Restart",       "ForeignTicket",    "ReleaseHinted", "RetainPrefix",
      "InvalidatePrefix", "RetainSession", "InvalidateSession"};
  static_assert(std::size(kNames) == static_cast<size_t>(Op::kCount));
  return kNames[static_cast<size_t>(op)];
}

class Harness {
 public:
  Harness(Input& in, const Config& config) : in_(in), config_(config) {}

  // Returns false if the configuration was (rightly) refused.
  bool Start() {
    std::error_code ec;
    std::filesystem::remove(nvme_path_, ec);  // every input starts from an empty NVMe file
    transport_ = std::make_shared<InProcessTransport>();
    return MakeCache(/*first=*/true);
  }

  void Run() {
    for (int i = 0; i < kMaxOps && !in_.done(); ++i) {
      const Op op = static_cast<Op>(in_.Below(static_cast<int>(Op::kCount)));
      Step(op);
      CheckInvariants(op);
    }
    Teardown();
  }

 private:
  // ---- Setup and teardown

  bool MakeCache(bool first) {
    const CacheNamespace& ns = Namespace(config_.layout);
    TierStackOptions stack;
    stack.tiers[TierIndex(Tier::kHbm)].capacity_blocks = config_.hbm_blocks;
    stack.hbm.layout = config_.layout;
    stack.hbm.check_available_memory = false;
    if (config_.present[TierIndex(Tier::kDram)]) {
      stack.tiers[TierIndex(Tier::kDram)].capacity_blocks = 8;
    }
    stack.dram.try_huge_pages = false;
    stack.dram.pin_for_cuda = false;
    stack.dram.check_available_memory = false;
    stack.dram.prefault = false;
    if (config_.present[TierIndex(Tier::kNvme)]) {
      stack.tiers[TierIndex(Tier::kNvme)].capacity_blocks = 16;
    }
    stack.nvme.path = nvme_path_;
    stack.nvme.queue_depth = 4;
    stack.nvme.engine = config_.nvme_engine;
    stack.nvme.thread_pool_threads = 2;
    if (config_.present[TierIndex(Tier::kRemote)]) {
      stack.tiers[TierIndex(Tier::kRemote)].capacity_blocks = 16;
    }
    stack.remote.transport = transport_;
    stack.remote.key_prefix = "fuzz:";
    stack.remote.breaker_failures = 2;
    stack.remote.breaker_backoff_min = absl::Milliseconds(1);
    stack.remote.breaker_backoff_max = absl::Milliseconds(5);
    faults_ = {};
    capacity_ = {};
    // Every tier behind a FaultInjectingTier, so any of them can be made to fail.
    stack.wrap = [this](Tier t, std::unique_ptr<TierBackend> backend) {
      capacity_[static_cast<size_t>(TierIndex(t))] = backend->info().capacity_blocks;
      auto wrapped = std::make_unique<testing::FaultInjectingTier>(std::move(backend));
      faults_[static_cast<size_t>(TierIndex(t))] = wrapped.get();
      return std::unique_ptr<TierBackend>(std::move(wrapped));
    };
    absl::StatusOr<TierBackends> tiers = BuildTierStack(ns, stack);
    if (!tiers.ok()) Fail(absl::StrCat("BuildTierStack: ", tiers.status().ToString()));

    KvCacheOptions options;
    options.tiers = *std::move(tiers);
    options.hash = config_.hash;
    options.eviction_policy = config_.eviction_policy;
    options.write_policy = config_.write_policy;
    options.inclusion = config_.inclusion;
    options.admit_after_uses = config_.admit_after_uses;
    options.demote_on_evict = config_.demote_on_evict;
    options.demote_by_value = config_.demote_by_value;
    if (config_.prefill_cost != 0) {
      PrefillCostOptions cost;
      cost.params = 1e6;
      cost.num_layers = 2;
      cost.d_model = 16;
      cost.flops_per_second = config_.prefill_cost == 1 ? 1e18 : 1e3;
      options.prefill_cost = cost;
    }
    options.clock = [this] { return kClockBase + absl::Nanoseconds(clock_ns_.load()); };
    options.event_buffer = config_.event_buffer;
    options.room_wait = config_.room_wait;
    options.bounce_buffers = config_.bounce_buffers;
    options.measure_bandwidth = config_.measure_bandwidth;

    bool expect_invalid = config_.inclusion == TierInclusion::kExclusive &&
                          config_.write_policy == WritePolicy::kWriteThrough;
    bool maybe_invalid = false;
    if (first && config_.invalid != 0) {
      expect_invalid = true;
      switch (config_.invalid) {
        case 1:
          options.tiers[TierIndex(Tier::kHbm)].reset();  // no HBM tier
          break;
        case 2:
          options.eviction_policy = "most_recently_used";
          break;
        case 3:
          options.admit_after_uses[TierIndex(Tier::kHbm)] = 2;
          break;
        case 4:
          // Below 1: invalid at least where the tier is configured.
          options.admit_after_uses[TierIndex(Tier::kDram)] = 0;
          expect_invalid = config_.present[TierIndex(Tier::kDram)];
          maybe_invalid = true;
          break;
        case 5:
          options.event_buffer = 0;
          break;
        case 6:
          options.room_wait = absl::Milliseconds(-1);
          break;
        case 7:
          options.bounce_buffers = 0;
          break;
        case 8: {
          PrefillCostOptions cost;  // all zero: not positive
          options.prefill_cost = cost;
          break;
        }
        default: {
          // The HBM tier at the DRAM index (a tier at the wrong index), nothing at HBM's.
          options.tiers[TierIndex(Tier::kDram)] = std::move(options.tiers[TierIndex(Tier::kHbm)]);
          break;
        }
      }
    }

    Log(absl::StrCat("KvCache::Create ", DescribeConfig(config_)));
    absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(ns, std::move(options));
    Rules rules;
    if (expect_invalid) rules.Must(StatusCode::kInvalidArgument);
    if (maybe_invalid) rules.May(StatusCode::kInvalidArgument);
    rules.May(StatusCode::kResourceExhausted);  // the bounce buffers
    rules.Check("KvCache::Create", cache.status());
    if (!cache.ok()) return false;
    cache_ = std::move(*cache);

    std::optional<DevicePoolView> pool = faults_[TierIndex(Tier::kHbm)]->device_pool();
    if (!pool.has_value() || !pool->host_accessible ||
        pool->k_base.size() != static_cast<size_t>(Geometry().num_layers()) ||
        pool->v_base.size() != static_cast<size_t>(Geometry().num_layers())) {
      Fail("the emulated HBM tier has no host-accessible K/V pool view");
    }
    pool_ = *pool;
    if (cache_->hasher().tokens_per_block() != kTokensPerBlock) {
      Fail("KvCache::hasher() has the wrong block size");
    }
    if (!(cache_->cache_namespace().geometry() == Geometry())) {
      Fail("KvCache::cache_namespace() has the wrong geometry");
    }
    return true;
  }

  // Fires every pending ready (writing its KV first) and releases their tickets.
  void DrainPendingReadies() {
    while (!pending_.empty()) FireOldestReady(/*force_ok=*/false);
  }

  // Everything a live cache must let go of: tickets, sequences. Then it must be idle and empty.
  void Teardown() {
    DrainPendingReadies();
    for (TicketModel& t : tickets_) {
      if (t.released) continue;
      const absl::Status s = cache_->ReleaseTicket(t.ticket);
      if (!s.ok()) Fail(absl::StrCat("teardown ReleaseTicket: ", s.ToString()));
      t.released = true;
    }
    for (auto& [id, seq] : seqs_) {
      if (!seq.live) continue;
      const absl::Status s = cache_->Release(SequenceId(id));
      if (!s.ok()) Fail(absl::StrCat("teardown Release(", id, "): ", s.ToString()));
      seq.live = false;
    }
    const absl::Status idle = cache_->WaitIdle(absl::Now() + kHangLimit);
    if (!idle.ok()) Fail(absl::StrCat("teardown WaitIdle: ", idle.ToString()));
    for (const Completion& c : resume_completions_) {
      if (c.WaitFor(kHangLimit).code() == StatusCode::kDeadlineExceeded && !c.done()) {
        Fail("a Resume completion never fired");
      }
    }
    for (const TicketModel& t : tickets_) {
      const Completion c = t.ticket.completion();
      if (c.WaitFor(kHangLimit).code() == StatusCode::kDeadlineExceeded && !c.done()) {
        Fail(absl::StrCat("the completion of ticket ", t.ticket.id(), " never fired"));
      }
    }
    absl::Status inv = cache_->CheckInvariants();
    if (!inv.ok()) Fail(absl::StrCat("CheckInvariants at teardown: ", inv.ToString()));
    const KvCacheStats stats = cache_->stats();
    CheckStats(stats, "teardown");
    for (int t = 0; t < kNumTiers; ++t) {
      const KvTierStats& ts = stats.tiers[static_cast<size_t>(t)];
      if (ts.held_blocks != 0 || ts.locked_blocks != 0 || ts.in_flight_blocks != 0) {
        Fail(absl::StrCat("teardown: tier ", std::string(TierName(static_cast<Tier>(t))),
                          " still has held=", ts.held_blocks, " locked=", ts.locked_blocks,
                          " in_flight=", ts.in_flight_blocks,
                          " after every ticket and sequence was released and WaitIdle"));
      }
    }
    if (stats.live_sequences != 0 || stats.open_tickets != 0) {
      Fail(absl::StrCat("teardown: live_sequences=", stats.live_sequences,
                        " open_tickets=", stats.open_tickets));
    }
    tickets_.clear();
    resume_completions_.clear();
    cache_.reset();
  }

  // ---- Model helpers

  enum class Known { kUnknown, kLive, kReleased };

  Known StateOf(SequenceId id) const {
    if (!id.valid()) return Known::kUnknown;
    auto it = seqs_.find(id.value());
    if (it == seqs_.end()) return Known::kUnknown;
    return it->second.live ? Known::kLive : Known::kReleased;
  }
  SeqModel* Live(SequenceId id) {
    if (StateOf(id) != Known::kLive) return nullptr;
    return &seqs_.at(id.value());
  }

  // The documented errors of a call naming sequence `id`.
  void SequenceRules(Rules& rules, SequenceId id, bool paused_is_wrong_state = true) const {
    switch (StateOf(id)) {
      case Known::kUnknown:
        rules.Must(StatusCode::kNotFound);
        if (!id.valid()) rules.May(StatusCode::kInvalidArgument);
        break;
      case Known::kReleased:
        rules.Must(StatusCode::kFailedPrecondition);
        break;
      case Known::kLive:
        if (paused_is_wrong_state && seqs_.at(id.value()).paused) {
          rules.May(StatusCode::kFailedPrecondition);  // "a call in the wrong state"
        }
        break;
    }
  }

  // Tokens of `seq` whose KV bytes are known: written before any still-pending ready.
  int64_t Verified(uint64_t id, const SeqModel& seq) const {
    int64_t verified = seq.write_cursor;
    for (const PendingReady& p : pending_) {
      if (p.seq == id && p.generation == seq.generation) verified = std::min(verified, p.begin);
    }
    return std::min<int64_t>(verified, static_cast<int64_t>(seq.tokens.size()));
  }

  bool HasPending(uint64_t id, const SeqModel& seq) const {
    for (const PendingReady& p : pending_) {
      if (p.seq == id && p.generation == seq.generation) return true;
    }
    return false;
  }

  // Compares the cache's view of a sequence with the model (after every call naming it: on
  // success the model was updated, on error nothing may have changed).
  void SyncSequence(SequenceId id, const std::string& call) {
    absl::StatusOr<SequenceInfo> info = cache_->GetSequence(id);
    Rules rules;
    SequenceRules(rules, id, /*paused_is_wrong_state=*/false);
    rules.Check(absl::StrCat("GetSequence(", id.value(), ") after ", call), info.status());
    if (!info.ok()) return;
    SeqModel& seq = seqs_.at(id.value());
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    if (info->num_tokens != n || info->num_blocks != BlocksFor(n) || info->paused != seq.paused ||
        info->written_tokens < 0 || info->written_tokens > n) {
      Fail(absl::StrCat("after ", call, ": GetSequence(", id.value(), ") = {num_tokens ",
                        info->num_tokens, ", num_blocks ", info->num_blocks, ", written ",
                        info->written_tokens, ", paused ", info->paused, "}; model: ", n,
                        " tokens, paused ", seq.paused));
    }
    int64_t sum = 0;
    for (int t = 0; t < kNumTiers; ++t) {
      const int64_t b = info->blocks_by_tier[static_cast<size_t>(t)];
      if (b < 0 || (b > 0 && !config_.present[static_cast<size_t>(t)])) {
        Fail(absl::StrCat("after ", call, ": GetSequence(", id.value(), ") has ", b,
                          " blocks in tier ", t));
      }
      sum += b;
    }
    if (sum != info->num_blocks) {
      Fail(absl::StrCat("after ", call, ": GetSequence(", id.value(), ") blocks_by_tier sum to ",
                        sum, ", num_blocks ", info->num_blocks));
    }
    seq.written = info->written_tokens;
  }

  // Checks, after an error, that the sequence is exactly as before (the model was not updated).
  void SyncIfKnown(SequenceId id, const std::string& call) {
    if (StateOf(id) == Known::kLive) SyncSequence(id, call);
  }

  // ---- Token and option generation

  static int32_t StemToken(int stem, int64_t position) {
    return static_cast<int32_t>(
        Mix((static_cast<uint64_t>(stem) << 40) ^ static_cast<uint64_t>(position)) % kAlphabet);
  }

  // Token lists seen so far (live and released sequences, and those before a restart).
  std::vector<const std::vector<int32_t>*> KnownTokenLists() const {
    std::vector<const std::vector<int32_t>*> lists;
    for (const auto& [id, seq] : seqs_) lists.push_back(&seq.tokens);
    for (const auto& h : history_) lists.push_back(&h);
    return lists;
  }

  // A prompt: a stem's prefix, a known sequence's prefix or all of it plus a few tokens (the next
  // turn), or random tokens.
  std::vector<int32_t> GenPrompt() {
    std::vector<int32_t> prompt;
    const int kind = in_.Below(4);
    const int len = in_.InRange(0, 40);
    const auto lists = KnownTokenLists();
    if ((kind == 1 || kind == 3) && !lists.empty()) {
      const std::vector<int32_t>& from = *lists[static_cast<size_t>(
          in_.Below(static_cast<int>(std::min<size_t>(lists.size(), 256))))];
      const size_t take =
          kind == 1 ? std::min<size_t>(from.size(), static_cast<size_t>(len)) : from.size();
      prompt.assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(take));
      const int extra = kind == 3 ? in_.InRange(1, 3) : in_.Below(2);
      for (int i = 0; i < extra; ++i) prompt.push_back(in_.Below(kAlphabet));
    } else if (kind == 2) {
      for (int i = 0; i < len; ++i) prompt.push_back(in_.Below(kAlphabet));
    } else {
      const int stem = in_.Below(3);
      for (int i = 0; i < len; ++i) prompt.push_back(StemToken(stem, i));
    }
    if (prompt.size() > static_cast<size_t>(kMaxPromptTokens)) prompt.resize(kMaxPromptTokens);
    return prompt;
  }

  // Tokens to append to a sequence of `n` tokens: a stem's continuation, a known sequence's
  // continuation, random, or one decode token.
  std::vector<int32_t> GenAppend(int64_t n) {
    std::vector<int32_t> tokens;
    const int kind = in_.Below(4);
    const int len = in_.InRange(0, 12);  // 0: an empty span (kInvalidArgument)
    if (kind == 0) {
      const int stem = in_.Below(3);
      for (int i = 0; i < len; ++i) tokens.push_back(StemToken(stem, n + i));
    } else if (kind == 1) {
      const auto lists = KnownTokenLists();
      if (!lists.empty()) {
        const std::vector<int32_t>& from = *lists[static_cast<size_t>(
            in_.Below(static_cast<int>(std::min<size_t>(lists.size(), 256))))];
        for (int64_t p = n; p < n + len && p < static_cast<int64_t>(from.size()); ++p) {
          tokens.push_back(from[static_cast<size_t>(p)]);
        }
      }
      if (tokens.empty() && len > 0) tokens.push_back(in_.Below(kAlphabet));
    } else if (kind == 2) {
      for (int i = 0; i < len; ++i) tokens.push_back(in_.Below(kAlphabet));
    } else {
      tokens.push_back(in_.Below(kAlphabet));
    }
    return tokens;
  }

  SequenceId GenId() {
    const int v = in_.Below(kNumSequenceIds + 2);
    if (v == kNumSequenceIds) return SequenceId();  // the invalid id
    if (v == kNumSequenceIds + 1) return SequenceId(1000 + in_.Below(2));
    return SequenceId(static_cast<uint64_t>(v));
  }

  // Options; *bad is set when their extras are invalid (adapter, salt, multimodal items), and
  // *bad_retention when the retention fields are (CreateSequence refuses both).
  SequenceOptions GenOptions(bool* bad, bool* bad_retention) {
    SequenceOptions o;
    *bad = false;
    *bad_retention = false;
    const uint8_t a = in_.Byte();
    switch (a & 3) {
      case 1:
        o.tenant_salt = "";
        break;
      case 2:
        o.tenant_salt = "tenant-1";
        break;
      case 3:
        if ((a & 0x80) != 0) {
          o.tenant_salt = std::string(PrefixHasher::kMaxExtraBytes + 1, 's');
          *bad = true;
        } else {
          o.tenant_salt = "tenant-2";
        }
        break;
      default:
        break;
    }
    switch ((a >> 2) & 3) {
      case 1:
        o.adapter = AdapterIdentity{"lora-a", 0};
        break;
      case 2:
        o.adapter = AdapterIdentity{"lora-a", 1};
        break;
      case 3:
        if ((a & 0x80) != 0) {
          o.adapter = AdapterIdentity{"", 0};
          *bad = true;
        } else {
          o.adapter = AdapterIdentity{"lora-b", 7};
        }
        break;
      default:
        break;
    }
    if ((a & 0x10) != 0) {
      const uint8_t m = in_.Byte();
      switch (m % 6) {
        case 0:
          o.multimodal.push_back({2, 3, "img-1"});
          break;
        case 1:
          o.multimodal.push_back({5, 2, "img-2"});
          o.multimodal.push_back({9, 4, "img-3"});
          break;
        case 2:
          o.multimodal.push_back({40, 8, "img-far"});
          break;
        case 3:
          o.multimodal.push_back({1, 0, "empty"});  // num_tokens < 1
          *bad = true;
          break;
        case 4:
          o.multimodal.push_back({8, 2, "b"});  // unsorted
          o.multimodal.push_back({1, 2, "a"});
          *bad = true;
          break;
        default:
          o.multimodal.push_back({3, 2, ""});  // empty digest
          *bad = true;
          break;
      }
    }
    if ((a & 0x20) != 0) {
      const uint8_t r = in_.Byte();
      o.retention_priority = (r & 1) != 0 ? 2.5 : 0.5;
      o.retention = (r & 2) != 0 ? absl::Minutes(5) : absl::Seconds(30);
      if ((r & 0xc) == 0xc) {
        o.retention_priority = -1;
        *bad_retention = true;
      } else if ((r & 0xc) == 0x8) {
        o.retention = absl::Seconds(-1);
        *bad_retention = true;
      }
    }
    return o;
  }

  // The identity of an existing sequence (so lookups hit), or fresh options. Lookups and
  // prefetches document kInvalidArgument for bad extras only; bad retention fields are
  // irrelevant to them (refusing them too is tolerated).
  SequenceOptions GenIdentity(bool* bad, bool* bad_retention) {
    *bad = false;
    *bad_retention = false;
    if (in_.Bool() && !seqs_.empty()) {
      auto it = seqs_.begin();
      std::advance(it, in_.Below(static_cast<int>(std::min<size_t>(seqs_.size(), 256))));
      return it->second.options;
    }
    return GenOptions(bad, bad_retention);
  }

  absl::Time GenDeadline() {
    switch (in_.Below(5)) {
      case 1:
        return absl::InfinitePast();
      case 2:
        return absl::UnixEpoch();
      case 3:
        return kClockBase + absl::Nanoseconds(clock_ns_.load()) - absl::Seconds(1);
      default:
        // Infinite, unless a ready is pending: a wait could then depend on an event only this
        // thread fires, so bound it (in real time; it is in the future on either clock).
        return pending_.empty() ? absl::InfiniteFuture() : absl::Now() + absl::Seconds(2);
    }
  }
  static bool IsPast(absl::Time deadline) {
    return deadline != absl::InfiniteFuture() && deadline < absl::Now();
  }

  // ---- Tickets

  TicketModel MakeTicketModel(const ResidencyTicket& ticket, ResidencyMode mode, uint64_t id,
                              int64_t begin, int64_t end) {
    const SeqModel& seq = seqs_.at(id);
    TicketModel t;
    t.ticket = ticket;
    t.mode = mode;
    t.seq = id;
    t.begin = begin;
    t.end = end;
    t.num_tokens = static_cast<int64_t>(seq.tokens.size());
    const int64_t verified = Verified(id, seq);
    t.verified_tokens = std::make_shared<const std::vector<int32_t>>(
        seq.tokens.begin(), seq.tokens.begin() + static_cast<std::ptrdiff_t>(verified));
    t.identity = seq.identity;
    return t;
  }

  // Checks the ticket's shape; once `final`, also its statuses, completion and KV bytes.
  void CheckTicket(const TicketModel& t, const std::string& call) {
    const ResidencyTicket& k = t.ticket;
    if (!k.valid() || k.sequence() != SequenceId(t.seq) || k.begin_token() != t.begin ||
        k.end_token() != t.end) {
      Fail(absl::StrCat(call, ": the ticket does not describe its request (valid ", k.valid(),
                        ", range [", k.begin_token(), ", ", k.end_token(), "))"));
    }
    // Read done() first: once it is true, everything read after is final.
    const bool final = k.completion().done();
    if (t.mode != ResidencyMode::kAsync && !final) {
      Fail(absl::StrCat(call, ": a kWait/kBestEffort ticket's completion has not fired"));
    }
    const DeviceBlockTable& table = k.block_table();
    const std::vector<BlockResidency> status = k.block_status();
    const int64_t first = t.begin / kTokensPerBlock;
    const int64_t count = std::max<int64_t>(0, BlocksFor(t.end) - first);
    const bool empty_range = t.begin == t.end;
    if (!(table.slots.size() == static_cast<size_t>(count) ||
          (empty_range && table.slots.empty()))) {
      Fail(absl::StrCat(call, ": block table of [", t.begin, ", ", t.end, ") has ",
                        table.slots.size(), " slots, expected ", count));
    }
    if (status.size() != table.slots.size()) {
      Fail(absl::StrCat(call, ": ", status.size(), " statuses for ", table.slots.size(), " slots"));
    }
    if (table.tokens_per_block != kTokensPerBlock) Fail(call + ": wrong tokens_per_block");
    if (!table.slots.empty()) {
      if (table.first_block != first) {
        Fail(absl::StrCat(call, ": first_block ", table.first_block, ", expected ", first));
      }
      const int64_t last = table.first_block + static_cast<int64_t>(table.slots.size()) - 1;
      const int64_t in_last =
          std::clamp<int64_t>(t.num_tokens - last * kTokensPerBlock, 0, kTokensPerBlock);
      if (table.tokens_in_last_block != in_last) {
        Fail(absl::StrCat(call, ": tokens_in_last_block ", table.tokens_in_last_block,
                          ", expected ", in_last));
      }
    }
    if (table.pool.k_base != pool_.k_base || table.pool.v_base != pool_.v_base ||
        table.pool.block_stride_bytes != pool_.block_stride_bytes ||
        table.pool.token_stride_bytes != pool_.token_stride_bytes ||
        table.pool.head_stride_bytes != pool_.head_stride_bytes || !table.pool.host_accessible) {
      Fail(call + ": the ticket's pool view differs from the HBM tier's");
    }
    const int64_t resident_tokens = k.resident_tokens();
    if (resident_tokens < 0 || resident_tokens > t.end - t.begin) {
      Fail(absl::StrCat(call, ": resident_tokens ", resident_tokens, " outside [0, ",
                        t.end - t.begin, "]"));
    }
    if (!final) return;

    std::set<int32_t> seen;
    bool all_resident = true;
    int64_t leading = 0;
    bool in_leading = true;
    for (size_t i = 0; i < status.size(); ++i) {
      const int32_t slot = table.slots[i];
      const absl::Status error = k.block_error(static_cast<int64_t>(i));
      switch (status[i]) {
        case BlockResidency::kResident:
          if (slot < 0 || slot >= capacity_[TierIndex(Tier::kHbm)] || !seen.insert(slot).second ||
              !error.ok()) {
            Fail(absl::StrCat(call, ": resident block ", i, " has slot ", slot, " (HBM capacity ",
                              capacity_[TierIndex(Tier::kHbm)],
                              ", duplicate or out of range) or error ", error.ToString()));
          }
          if (in_leading) ++leading;
          break;
        case BlockResidency::kNotResident:
          if (slot != -1 || error.ok()) {
            Fail(absl::StrCat(call, ": block ", i, " not resident but slot ", slot, " error ",
                              error.ToString()));
          }
          all_resident = false;
          in_leading = false;
          break;
        case BlockResidency::kPending:
          Fail(absl::StrCat(call, ": block ", i, " still pending after the completion fired"));
        default:
          Fail(absl::StrCat(call, ": block ", i, " has an unknown residency"));
      }
    }
    const int64_t covered =
        std::clamp<int64_t>((first + leading) * kTokensPerBlock, t.begin, t.end) - t.begin;
    if (!table.slots.empty() && resident_tokens != covered) {
      Fail(absl::StrCat(call, ": resident_tokens ", resident_tokens, ", but the leading ", leading,
                        " resident blocks cover ", covered));
    }
    const absl::Status done = k.completion().status();
    if (done.ok() != all_resident || (!done.ok() && done.code() != StatusCode::kUnavailable)) {
      Fail(
          absl::StrCat(call, ": completion ", done.ToString(), " but all_resident=", all_resident));
    }
    VerifyTicketKv(t, call);
  }

  // The KV bytes of every resident block are what the kernel wrote for those tokens.
  void VerifyTicketKv(const TicketModel& t, const std::string& call) {
    const DeviceBlockTable& table = t.ticket.block_table();
    const std::vector<BlockResidency> status = t.ticket.block_status();
    const std::vector<int32_t>& tokens = *t.verified_tokens;
    const std::vector<uint64_t> hashes = TokenHashes(t.identity, tokens);
    const int64_t verified = static_cast<int64_t>(tokens.size());
    for (size_t i = 0; i < status.size() && i < table.slots.size(); ++i) {
      if (status[i] != BlockResidency::kResident) continue;
      const int64_t block = table.first_block + static_cast<int64_t>(i);
      for (int64_t p = block * kTokensPerBlock;
           p < std::min<int64_t>((block + 1) * kTokensPerBlock, verified); ++p) {
        if (!TokenKvMatches(pool_, Geometry(), table.slots[i],
                            static_cast<int>(p % kTokensPerBlock),
                            hashes[static_cast<size_t>(p)])) {
          Fail(absl::StrCat(call, ": wrong KV bytes for token ", p, " (block ", block,
                            ", HBM slot ", table.slots[i], ") of sequence ", t.seq,
                            ": not what the kernel wrote for these tokens"));
        }
      }
    }
  }

  // ---- Writing KV as the kernel does, and reporting it

  // Writes the KV of tokens [begin, end) through a ticket that must hold them all resident.
  static void WriteKv(const DevicePoolView& pool, const ResidencyTicket& ticket,
                      const std::vector<int32_t>& tokens, uint64_t identity, int64_t begin,
                      int64_t end) {
    const DeviceBlockTable& table = ticket.block_table();
    const std::vector<uint64_t> hashes =
        TokenHashes(identity, absl::MakeConstSpan(tokens.data(), static_cast<size_t>(end)));
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i = p / kTokensPerBlock - table.first_block;
      WriteTokenKv(pool, Geometry(), table.slots[static_cast<size_t>(i)],
                   static_cast<int>(p % kTokensPerBlock), hashes[static_cast<size_t>(p)]);
    }
  }

  // A kWait ticket for [begin, end) with every block resident, or nullopt (the sequence is then
  // tainted by the caller).
  std::optional<ResidencyTicket> WriteTicket(SequenceId id, int64_t begin, int64_t end) {
    EnsureResidentOptions options;
    options.mode = ResidencyMode::kWait;
    options.deadline = pending_.empty() ? absl::InfiniteFuture() : absl::Now() + absl::Seconds(2);
    absl::StatusOr<ResidencyTicket> ticket = cache_->EnsureResident(id, begin, end, options);
    Rules rules;
    SequenceRules(rules, id);
    rules.Check(absl::StrCat("EnsureResident(", id.value(), ", ", begin, ", ", end,
                             ") for the kernel's write"),
                ticket.status());
    if (!ticket.ok()) return std::nullopt;
    TicketModel t = MakeTicketModel(*ticket, ResidencyMode::kWait, id.value(), begin, end);
    CheckTicket(t, "EnsureResident for the kernel's write");
    for (BlockResidency r : ticket->block_status()) {
      if (r != BlockResidency::kResident) {
        const absl::Status s = cache_->ReleaseTicket(*ticket);
        if (!s.ok()) Fail(absl::StrCat("ReleaseTicket of the kernel's ticket: ", s.ToString()));
        return std::nullopt;
      }
    }
    return *ticket;
  }

  void FireOldestReady(bool force_ok) {
    PendingReady p = std::move(pending_.front());
    pending_.pop_front();
    if (p.ticket.valid()) {
      WriteKv(pool_, p.ticket, p.tokens, p.identity, p.begin, p.end);
    }
    const bool fail = p.fail && !force_ok;
    Log(absl::StrCat("  fire ready of sequence ", p.seq, " [", p.begin, ", ", p.end, ") ",
                     fail ? "with an error" : "OK"));
    p.ready.Complete(fail ? absl::InternalError("fuzz: the kernel failed") : absl::OkStatus());
    if (p.ticket.valid()) {
      const absl::Status s = cache_->ReleaseTicket(p.ticket);
      if (!s.ok()) Fail(absl::StrCat("ReleaseTicket of a written range: ", s.ToString()));
    }
  }

  // ---- Operations

  void Step(Op op) {
    switch (op) {
      case Op::kCreateSequence:
        return DoCreateSequence();
      case Op::kAttachPrefix:
        return DoAttachPrefix();
      case Op::kAppend:
        return DoAppend();
      case Op::kReportWritten:
        return DoReportWritten();
      case Op::kFork:
        return DoFork();
      case Op::kEnsureResident:
        return DoEnsureResident();
      case Op::kReleaseTicket:
        return DoReleaseTicket();
      case Op::kWaitTicket:
        return DoWaitTicket();
      case Op::kPause:
        return DoPause();
      case Op::kResume:
        return DoResume();
      case Op::kRelease:
        return DoRelease();
      case Op::kPrefetch:
        return DoPrefetch();
      case Op::kLookup:
        return DoLookup();
      case Op::kGetSequence:
        return DoGetSequence();
      case Op::kStats:
        return DoStats();
      case Op::kPollEvents:
        return DoPollEvents();
      case Op::kAdvanceClock:
        return DoAdvanceClock();
      case Op::kCompleteReady:
        return DoCompleteReady();
      case Op::kWaitIdle:
        return DoWaitIdle();
      case Op::kInjectFault:
        return DoInjectFault();
      case Op::kRemoteFailure:
        return DoRemoteFailure();
      case Op::kRestart:
        return DoRestart();
      case Op::kForeignTicket:
        return DoForeignTicket();
      case Op::kReleaseHinted:
        return DoReleaseHinted();
      case Op::kRetainPrefix:
        return DoRetainPrefix();
      case Op::kInvalidatePrefix:
        return DoInvalidatePrefix();
      case Op::kRetainSession:
        return DoRetainSession();
      case Op::kInvalidateSession:
        return DoInvalidateSession();
      case Op::kCount:
        break;
    }
  }

  void DoCreateSequence() {
    const SequenceId id = GenId();
    bool bad_extras = false;
    bool bad_retention = false;
    SequenceOptions options = GenOptions(&bad_extras, &bad_retention);
    // Sessions 1..3 (0: none), varying with the id and over time, so several sequences share one
    // and the session hints find something remembered.
    options.session = (id.value() + generation_) % 4;
    const bool bad = bad_extras || bad_retention;
    const std::string call = absl::StrCat("CreateSequence(", id.value(), ")");
    Log(absl::StrCat(call, bad ? " with invalid options" : ""));
    const Known before = StateOf(id);
    const absl::Status s = cache_->CreateSequence(id, options);
    Rules rules;
    if (!id.valid() || bad) rules.Must(StatusCode::kInvalidArgument);
    if (before == Known::kLive) rules.Must(StatusCode::kAlreadyExists);
    if (before == Known::kReleased) rules.May(StatusCode::kAlreadyExists);
    rules.Check(call, s);
    if (s.ok()) {
      if (before == Known::kReleased) history_.push_back(seqs_.at(id.value()).tokens);
      SeqModel seq;
      seq.generation = ++generation_;
      seq.options = options;
      seq.identity = IdentityHash(options);
      seq.has_multimodal = !options.multimodal.empty();
      seqs_[id.value()] = std::move(seq);
    }
    if (id.valid()) SyncIfKnown(id, call);
  }

  void DoAttachPrefix() {
    const SequenceId id = GenId();
    const std::vector<int32_t> prompt = GenPrompt();
    const std::string call =
        absl::StrCat("AttachPrefix(", id.value(), ", ", prompt.size(), " tokens)");
    Log(call);
    absl::StatusOr<AttachResult> r = cache_->AttachPrefix(id, prompt);
    Rules rules;
    SequenceRules(rules, id);
    SeqModel* seq = Live(id);
    if (seq != nullptr && !seq->tokens.empty()) rules.Must(StatusCode::kFailedPrecondition);
    if (prompt.empty()) rules.Must(StatusCode::kInvalidArgument);
    if (seq != nullptr && seq->has_multimodal) rules.May(StatusCode::kInvalidArgument);
    rules.Check(call, r.status());
    if (!r.ok()) return SyncIfKnown(id, call);

    const int64_t n = static_cast<int64_t>(prompt.size());
    int64_t by_tier = 0;
    for (int t = 0; t < kNumTiers; ++t) {
      const int64_t b = r->attached_blocks_by_tier[static_cast<size_t>(t)];
      if (b < 0 || (b > 0 && !config_.present[static_cast<size_t>(t)])) {
        Fail(absl::StrCat(call, ": ", b, " attached blocks from tier ", t));
      }
      by_tier += b;
    }
    if (r->matched_tokens < 0 || r->matched_tokens > n ||
        r->matched_tokens % kTokensPerBlock != 0 || r->attached_tokens < 0 ||
        r->attached_tokens > r->matched_tokens || r->attached_tokens % kTokensPerBlock != 0 ||
        r->attached_tokens >= n || by_tier * kTokensPerBlock != r->attached_tokens ||
        r->plan.restore_blocks * kTokensPerBlock != r->attached_tokens) {
      Fail(absl::StrCat(call, ": matched ", r->matched_tokens, ", attached ", r->attached_tokens,
                        ", attached blocks by tier sum ", by_tier, ", plan.restore_blocks ",
                        r->plan.restore_blocks, " for a prompt of ", n,
                        " tokens (whole blocks, attached <= matched, last token left)"));
    }
    seq->tokens.assign(prompt.begin(), prompt.begin() + r->attached_tokens);
    seq->write_cursor = r->attached_tokens;  // restored blocks carry the KV their writer wrote
    attach_.queries += 1;
    attach_.query_tokens += n;
    attach_.matched_tokens += r->matched_tokens;
    attach_.attached_tokens += r->attached_tokens;
    attach_.recomputed_blocks += r->plan.cached_but_recomputed;
    for (int t = 0; t < kNumTiers; ++t) {
      attach_.hits[static_cast<size_t>(t)] += r->attached_blocks_by_tier[static_cast<size_t>(t)];
    }
    SyncSequence(id, call);
    if (seq->written != r->attached_tokens) {
      Fail(absl::StrCat(call, ": written_tokens ", seq->written, " after attaching ",
                        r->attached_tokens));
    }
  }

  void DoAppend() {
    const SequenceId id = GenId();
    SeqModel* seq = Live(id);
    const int64_t n = seq != nullptr ? static_cast<int64_t>(seq->tokens.size()) : 0;
    const std::vector<int32_t> tokens = GenAppend(n);
    const std::string call = absl::StrCat("Append(", id.value(), ", ", tokens.size(), " tokens)");
    Log(call);
    absl::StatusOr<KvAppendResult> r = cache_->Append(id, tokens);
    Rules rules;
    SequenceRules(rules, id);
    if (tokens.empty()) rules.Must(StatusCode::kInvalidArgument);
    if (seq != nullptr && seq->has_multimodal) rules.May(StatusCode::kInvalidArgument);
    rules.May(StatusCode::kResourceExhausted);
    rules.Check(call, r.status());
    if (!r.ok()) return SyncIfKnown(id, call);
    const int64_t m = n + static_cast<int64_t>(tokens.size());
    const int64_t sealed = m / kTokensPerBlock - n / kTokensPerBlock;
    if (r->num_sealed_blocks != sealed ||
        (sealed > 0 && r->first_sealed_block != n / kTokensPerBlock) ||
        r->num_new_slots != BlocksFor(m) - BlocksFor(n)) {
      Fail(absl::StrCat(call, " on ", n, " tokens: sealed ", r->num_sealed_blocks, " from ",
                        r->first_sealed_block, ", new slots ", r->num_new_slots, "; expected ",
                        sealed, " from ", n / kTokensPerBlock, ", ", BlocksFor(m) - BlocksFor(n)));
    }
    seq->tokens.insert(seq->tokens.end(), tokens.begin(), tokens.end());
    SyncSequence(id, call);
  }

  void DoReportWritten() {
    const SequenceId id = GenId();
    SeqModel* seq = Live(id);
    const int64_t n = seq != nullptr ? static_cast<int64_t>(seq->tokens.size()) : 0;
    const int64_t written = seq != nullptr ? seq->written : 0;
    int64_t upto = 0;
    switch (in_.Below(6)) {
      case 0:
      case 1:
        upto = n;
        break;
      case 2:
        upto = written + in_.Below(static_cast<int>(std::min<int64_t>(n - written, 254)) + 1);
        break;
      case 3:
        upto = n + in_.InRange(1, 3);  // kOutOfRange
        break;
      case 4:
        upto = written - in_.InRange(1, 3);  // kInvalidArgument (below what was reported)
        break;
      default:
        upto = written;  // nothing new
        break;
    }
    const int ready_kind = in_.Below(8);  // 0..4 OK now, 5 error now, 6..7 pending
    const std::string call = absl::StrCat("ReportWritten(", id.value(), ", ", upto, ")");
    Log(absl::StrCat(call, " on ", n, " tokens, ", written, " written; ready kind ", ready_kind));

    Rules rules;
    SequenceRules(rules, id);
    if (seq != nullptr && upto > n) rules.Must(StatusCode::kOutOfRange);
    if (seq != nullptr && upto < written) rules.Must(StatusCode::kInvalidArgument);
    if (rules.must_fail() || seq == nullptr || seq->paused) {
      // An error is documented (or likely, for a paused sequence): the kernel writes nothing, so
      // a ready that would claim unwritten tokens fails instead.
      const bool unwritten = seq != nullptr && upto > Verified(id.value(), *seq);
      const absl::Status s = cache_->ReportWritten(
          id, upto,
          Completion::Done(unwritten ? absl::InternalError("fuzz: no KV") : absl::OkStatus()));
      rules.Check(call, s);
      if (s.ok() && unwritten) seq->tainted = true;
      return SyncIfKnown(id, call);
    }

    // The kernel writes tokens [cursor, upto) into the sequence's blocks, then reports.
    const int64_t cursor = seq->write_cursor;
    std::optional<ResidencyTicket> ticket;
    bool can_write = !seq->tainted;
    if (can_write && upto > cursor) {
      ticket = WriteTicket(id, cursor, upto);
      seq = Live(id);  // the map is unchanged, but keep the pointer honest
      if (!ticket.has_value()) can_write = false;
    }
    if (!can_write) {
      seq->tainted = true;  // those tokens never get KV: never report them ready
      const absl::Status s =
          cache_->ReportWritten(id, upto, Completion::Done(absl::InternalError("fuzz: no KV")));
      rules.Check(call + " (failed ready)", s);
      if (ticket.has_value()) ReleaseTicketOrFail(*ticket);
      return SyncIfKnown(id, call);
    }

    const bool pending = ready_kind >= 6 || HasPending(id.value(), *seq);
    if (pending && pending_.size() < kMaxPendingReadies) {
      // The kernel is still running: its KV lands just before `ready` fires (LT-3: nothing may
      // read those blocks before).
      PendingReady p;
      p.seq = id.value();
      p.generation = seq->generation;
      p.begin = std::max(cursor, int64_t{0});
      p.end = std::max(upto, cursor);
      p.tokens = seq->tokens;
      p.identity = seq->identity;
      if (ticket.has_value()) p.ticket = *ticket;
      p.fail = ready_kind == 7 && in_.Bool();
      const absl::Status s = cache_->ReportWritten(id, upto, p.ready);
      rules.Check(call + " (pending ready)", s);
      if (!s.ok()) {
        if (ticket.has_value()) ReleaseTicketOrFail(*ticket);
        return SyncIfKnown(id, call);
      }
      seq->write_cursor = std::max(cursor, upto);
      pending_.push_back(std::move(p));
      return SyncSequence(id, call);
    }
    if (pending) {
      // Too many pending: fire them all first (they may include this sequence's).
      DrainPendingReadies();
    }
    if (ticket.has_value()) {
      WriteKv(pool_, *ticket, seq->tokens, seq->identity, cursor, upto);
    }
    const absl::Status ready =
        ready_kind == 5 ? absl::InternalError("fuzz: kernel failed") : absl::OkStatus();
    const absl::Status s = cache_->ReportWritten(id, upto, Completion::Done(ready));
    rules.Check(call, s);
    if (ticket.has_value()) ReleaseTicketOrFail(*ticket);
    if (s.ok()) seq->write_cursor = std::max(cursor, upto);
    SyncSequence(id, call);
  }

  void ReleaseTicketOrFail(const ResidencyTicket& ticket) {
    const absl::Status s = cache_->ReleaseTicket(ticket);
    if (!s.ok()) Fail(absl::StrCat("ReleaseTicket of the kernel's ticket: ", s.ToString()));
  }

  void DoFork() {
    const SequenceId parent = GenId();
    const SequenceId child = GenId();
    SeqModel* p = Live(parent);
    const int64_t n = p != nullptr ? static_cast<int64_t>(p->tokens.size()) : 0;
    int64_t upto = 0;
    switch (in_.Below(5)) {
      case 0:
        upto = n;
        break;
      case 1:
        upto = -in_.InRange(1, 2);
        break;
      case 2:
        upto = n + in_.InRange(1, 2);
        break;
      default:
        upto = in_.Below(static_cast<int>(std::min<int64_t>(n, 254)) + 1);
        break;
    }
    const std::string call =
        absl::StrCat("Fork(", parent.value(), " -> ", child.value(), ", ", upto, ")");
    Log(call);
    const Known child_before = StateOf(child);
    absl::StatusOr<std::optional<BlockCopy>> r = cache_->Fork(parent, child, upto);
    Rules rules;
    SequenceRules(rules, parent);
    if (child_before == Known::kLive) rules.Must(StatusCode::kAlreadyExists);
    if (child_before == Known::kReleased) rules.May(StatusCode::kAlreadyExists);
    if (!child.valid()) rules.Must(StatusCode::kInvalidArgument);
    if (p != nullptr && (upto < 0 || upto > n)) rules.Must(StatusCode::kOutOfRange);
    if (upto % kTokensPerBlock != 0) {
      rules.May(StatusCode::kFailedPrecondition);  // the block to copy is not in HBM
      rules.May(StatusCode::kResourceExhausted);   // no HBM slot for the copy
    }
    rules.Check(call, r.status());
    if (!r.ok()) {
      SyncIfKnown(parent, call);
      if (child.valid() && child != parent) SyncIfKnown(child, call);
      return;
    }
    const int partial = static_cast<int>(upto % kTokensPerBlock);
    if (partial == 0 ? r->has_value()
                     : (!r->has_value() || (*r)->num_tokens != partial || (*r)->src == (*r)->dst ||
                        !(*r)->src.valid() || !(*r)->dst.valid() ||
                        (*r)->src.value() >= static_cast<uint32_t>(capacity_[0]) ||
                        (*r)->dst.value() >= static_cast<uint32_t>(capacity_[0]))) {
      Fail(absl::StrCat(call, ": a copy was ", r->has_value() ? "" : "not ",
                        "returned for a last block of ", partial, " tokens",
                        r->has_value()
                            ? absl::StrCat(" (", (*r)->num_tokens, " tokens, slot ",
                                           (*r)->src.value(), " -> ", (*r)->dst.value(), ")")
                            : ""));
    }
    if (r->has_value()) {
      // The caller's copy-on-write, before anything reads the child's last block.
      CopyBlockKv(pool_, Geometry(), static_cast<int32_t>((*r)->src.value()),
                  static_cast<int32_t>((*r)->dst.value()), (*r)->num_tokens);
    }
    if (child_before == Known::kReleased) history_.push_back(seqs_.at(child.value()).tokens);
    const SeqModel& from = seqs_.at(parent.value());
    SeqModel c;
    c.generation = ++generation_;
    c.paused = false;
    c.options = from.options;
    c.identity = from.identity;
    c.has_multimodal = from.has_multimodal;
    c.tokens.assign(from.tokens.begin(), from.tokens.begin() + upto);
    c.write_cursor = std::min(Verified(parent.value(), from), upto);
    c.tainted = false;
    seqs_[child.value()] = std::move(c);
    SyncSequence(parent, call);
    SyncSequence(child, call);
  }

  void DoEnsureResident() {
    const SequenceId id = GenId();
    SeqModel* seq = Live(id);
    const int64_t n = seq != nullptr ? static_cast<int64_t>(seq->tokens.size()) : 0;
    const int bound = static_cast<int>(std::min<int64_t>(n, 250));
    int64_t begin = 0;
    int64_t end = n;
    switch (in_.Below(8)) {
      case 0:
        break;
      case 1:
        begin = in_.Below(bound + 1);
        end = begin + in_.Below(static_cast<int>(n - begin) + 1);
        break;
      case 2:
        begin = n;
        break;
      case 3:
        begin = in_.InRange(1, 4) + in_.Below(bound + 1);  // reversed
        end = begin - in_.InRange(1, 4);
        break;
      case 4:
        begin = -in_.InRange(1, 3);
        break;
      case 5:
        end = n + in_.InRange(1, 4);
        break;
      case 6:
        begin = std::max<int64_t>(0, n - 1);
        break;
      default:
        begin = in_.InRange(-2, bound + 3);
        end = in_.InRange(-2, bound + 3);
        break;
    }
    EnsureResidentOptions options;
    options.mode = static_cast<ResidencyMode>(in_.Below(3));
    options.deadline = GenDeadline();
    const std::string call = absl::StrCat("EnsureResident(", id.value(), ", ", begin, ", ", end,
                                          ", mode ", static_cast<int>(options.mode), ", deadline ",
                                          absl::FormatTime(options.deadline), ")");
    Log(call);
    const bool past = IsPast(options.deadline);
    absl::StatusOr<ResidencyTicket> r = cache_->EnsureResident(id, begin, end, options);
    Rules rules;
    SequenceRules(rules, id);
    if (begin > end || begin < 0) rules.Must(StatusCode::kInvalidArgument);
    if (seq != nullptr && end > n) rules.Must(StatusCode::kOutOfRange);
    if (past) rules.Must(StatusCode::kDeadlineExceeded);
    rules.Check(call, r.status());
    if (!r.ok()) return SyncIfKnown(id, call);
    TicketModel t = MakeTicketModel(*r, options.mode, id.value(), begin, end);
    CheckTicket(t, call);
    t.final_checked = t.ticket.completion().done();
    if (tickets_.size() < kMaxTickets) {
      tickets_.push_back(std::move(t));
    } else {
      ReleaseTicketOrFail(t.ticket);
    }
    SyncSequence(id, call);
  }

  void DoReleaseTicket() {
    const int which = in_.Below(static_cast<int>(tickets_.size()) + 1);
    if (static_cast<size_t>(which) == tickets_.size()) {
      Log("ReleaseTicket(invalid ticket)");
      Rules rules;
      rules.Must(StatusCode::kInvalidArgument);
      rules.Check("ReleaseTicket(an invalid ticket)", cache_->ReleaseTicket(ResidencyTicket()));
      return;
    }
    TicketModel& t = tickets_[static_cast<size_t>(which)];
    const std::string call = absl::StrCat("ReleaseTicket(", t.ticket.id(), " of sequence ", t.seq,
                                          t.released ? ", again)" : ")");
    Log(call);
    const absl::Status s = cache_->ReleaseTicket(t.ticket);
    Rules rules;
    if (t.released) rules.Must(StatusCode::kFailedPrecondition);
    rules.Check(call, s);
    t.released = true;
  }

  // Waits for a kAsync ticket's completion, then checks it as final.
  void DoWaitTicket() {
    if (tickets_.empty()) return;
    TicketModel& t = tickets_[static_cast<size_t>(in_.Below(static_cast<int>(tickets_.size())))];
    const std::string call = absl::StrCat("wait for ticket ", t.ticket.id());
    Log(call);
    const Completion c = t.ticket.completion();
    if (!pending_.empty()) {
      // Onboarding may wait for a ready this thread fires; do not wait.
      if (!c.done()) return;
    } else if (c.WaitFor(kHangLimit).code() == StatusCode::kDeadlineExceeded && !c.done()) {
      Fail(absl::StrCat(call, ": the completion did not fire within ",
                        absl::FormatDuration(kHangLimit)));
    }
    if (!t.final_checked) {
      // Released tickets keep their (final) outcome; the KV of a released ticket's blocks may
      // since have been evicted and the slots reused, so check the bytes only while it is held.
      if (t.released) {
        t.final_checked = true;
        return;
      }
      CheckTicket(t, call);
      t.final_checked = true;
    }
  }

  void DoPause() {
    const SequenceId id = GenId();
    const int k = in_.Below(8);
    const absl::Duration idle = k == 0   ? absl::Seconds(-1)
                                : k == 7 ? absl::InfiniteDuration()
                                         : absl::Seconds(in_.InRange(0, 255));
    const std::string call =
        absl::StrCat("Pause(", id.value(), ", ", absl::FormatDuration(idle), ")");
    Log(call);
    const absl::Status s = cache_->Pause(id, idle);
    Rules rules;
    SequenceRules(rules, id, /*paused_is_wrong_state=*/false);
    SeqModel* seq = Live(id);
    if (idle < absl::ZeroDuration()) rules.Must(StatusCode::kInvalidArgument);
    if (seq != nullptr && seq->paused) rules.Must(StatusCode::kFailedPrecondition);
    rules.Check(call, s);
    if (s.ok()) {
      seq->paused = true;
      LetGo(*seq);
    }
    SyncIfKnown(id, call);
  }

  void DoResume() {
    const SequenceId id = GenId();
    const std::string call = absl::StrCat("Resume(", id.value(), ")");
    Log(call);
    absl::StatusOr<Completion> r = cache_->Resume(id);
    Rules rules;
    SequenceRules(rules, id, /*paused_is_wrong_state=*/false);
    SeqModel* seq = Live(id);
    if (seq != nullptr && !seq->paused) rules.Must(StatusCode::kFailedPrecondition);
    rules.Check(call, r.status());
    if (r.ok()) {
      seq->paused = false;
      resume_completions_.push_back(*r);
      if (resume_completions_.size() > 32) resume_completions_.pop_front();
    }
    SyncIfKnown(id, call);
  }

  void DoRelease() {
    const SequenceId id = GenId();
    const std::string call = absl::StrCat("Release(", id.value(), ")");
    Log(call);
    AfterRelease(id, call, cache_->Release(id));
  }

  // Checks a Release's status (with hints or not) and updates the model.
  void AfterRelease(SequenceId id, const std::string& call, const absl::Status& s) {
    Rules rules;
    SequenceRules(rules, id, /*paused_is_wrong_state=*/false);
    rules.Check(call, s);
    if (s.ok()) {
      seqs_.at(id.value()).live = false;
      LetGo(seqs_.at(id.value()));
    }
    if (id.valid() && StateOf(id) != Known::kUnknown) {
      // Released now (or before): GetSequence must say so.
      absl::StatusOr<SequenceInfo> info = cache_->GetSequence(id);
      Rules after;
      SequenceRules(after, id, false);
      after.Check(absl::StrCat("GetSequence after ", call), info.status());
    }
  }

  void DoPrefetch() {
    bool bad = false;
    bool bad_retention = false;
    const SequenceOptions identity = GenIdentity(&bad, &bad_retention);
    const std::vector<int32_t> tokens = GenPrompt();
    const std::string call = absl::StrCat("Prefetch(", tokens.size(), " tokens)");
    Log(call);
    absl::StatusOr<int64_t> r = cache_->Prefetch(tokens, identity);
    Rules rules;
    if (bad) rules.Must(StatusCode::kInvalidArgument);
    if (!identity.multimodal.empty() || tokens.empty() || bad_retention) {
      rules.May(StatusCode::kInvalidArgument);
    }
    rules.Check(call, r.status());
    if (r.ok() && (*r < 0 || *r > static_cast<int64_t>(tokens.size()) / kTokensPerBlock)) {
      Fail(absl::StrCat(call, ": started onboarding ", *r, " blocks"));
    }
  }

  void DoLookup() {
    bool bad = false;
    bool bad_retention = false;
    const SequenceOptions identity = GenIdentity(&bad, &bad_retention);
    const std::vector<int32_t> tokens = GenPrompt();
    const std::string call = absl::StrCat("Lookup(", tokens.size(), " tokens)");
    Log(call);
    absl::StatusOr<PrefixLookup> r = cache_->Lookup(tokens, identity);
    Rules rules;
    if (bad) rules.Must(StatusCode::kInvalidArgument);
    if (!identity.multimodal.empty() || tokens.empty() || bad_retention) {
      rules.May(StatusCode::kInvalidArgument);
    }
    rules.Check(call, r.status());
    if (!r.ok()) return;
    int64_t blocks = 0;
    for (int t = 0; t < kNumTiers; ++t) {
      const int64_t b = r->blocks_by_tier[static_cast<size_t>(t)];
      if (b < 0 || (b > 0 && !config_.present[static_cast<size_t>(t)])) {
        Fail(absl::StrCat(call, ": ", b, " blocks in tier ", t));
      }
      blocks += b;
    }
    if (r->matched_tokens < 0 || r->matched_tokens > static_cast<int64_t>(tokens.size()) ||
        r->matched_tokens % kTokensPerBlock != 0 || blocks * kTokensPerBlock != r->matched_tokens) {
      Fail(absl::StrCat(call, ": matched ", r->matched_tokens, " tokens, ", blocks,
                        " blocks by tier"));
    }
  }

  void DoGetSequence() {
    const SequenceId id = GenId();
    const std::string call = absl::StrCat("GetSequence(", id.value(), ")");
    Log(call);
    if (StateOf(id) == Known::kLive) return SyncSequence(id, call);
    Rules rules;
    SequenceRules(rules, id, false);
    rules.Check(call, cache_->GetSequence(id).status());
  }

  void CheckStats(const KvCacheStats& s, const std::string& call) {
    for (int t = 0; t < kNumTiers; ++t) {
      const KvTierStats& ts = s.tiers[static_cast<size_t>(t)];
      const std::string tier = std::string(TierName(static_cast<Tier>(t)));
      if (ts.present != config_.present[static_cast<size_t>(t)]) {
        Fail(absl::StrCat(call, ": tier ", tier, " present=", ts.present));
      }
      const int64_t gauges[] = {ts.free_blocks,      ts.locked_blocks,    ts.held_blocks,
                                ts.droppable_blocks, ts.in_flight_blocks, ts.quarantined_blocks};
      const int64_t counters[] = {ts.hits,      ts.misses,       ts.bytes_in,
                                  ts.bytes_out, ts.stored,       ts.evictions,
                                  ts.demotions, ts.failed_loads, ts.corrupt_reads};
      int64_t sum = 0;
      for (int64_t g : gauges) {
        if (g < 0) Fail(absl::StrCat(call, ": tier ", tier, " has a negative gauge"));
        sum += g;
      }
      for (int64_t c : counters) {
        if (c < 0) Fail(absl::StrCat(call, ": tier ", tier, " has a negative counter"));
      }
      if (!ts.present) {
        if (ts.capacity_blocks != 0 || sum != 0) {
          Fail(absl::StrCat(call, ": absent tier ", tier, " has nonzero fields"));
        }
        continue;
      }
      if (ts.capacity_blocks != capacity_[static_cast<size_t>(t)] || sum != ts.capacity_blocks) {
        Fail(absl::StrCat(call, ": tier ", tier, " capacity ", ts.capacity_blocks, " (expected ",
                          capacity_[static_cast<size_t>(t)],
                          "), free+locked+held+droppable+"
                          "in_flight+quarantined = ",
                          sum));
      }
      if (ts.hits != attach_.hits[static_cast<size_t>(t)]) {
        Fail(absl::StrCat(call, ": tier ", tier, " hits ", ts.hits,
                          " but attached blocks from it sum to ",
                          attach_.hits[static_cast<size_t>(t)]));
      }
      if (ts.demotions > ts.evictions || ts.corrupt_reads > ts.failed_loads) {
        Fail(absl::StrCat(call, ": tier ", tier, " demotions ", ts.demotions, " > evictions ",
                          ts.evictions, " or corrupt_reads ", ts.corrupt_reads, " > failed_loads ",
                          ts.failed_loads));
      }
    }
    int64_t live = 0;
    for (const auto& [id, seq] : seqs_) live += seq.live ? 1 : 0;
    int64_t open = 0;
    for (const TicketModel& t : tickets_) open += t.released ? 0 : 1;
    for (const PendingReady& p : pending_) open += p.ticket.valid() ? 1 : 0;
    if (s.live_sequences != live || s.open_tickets != open) {
      Fail(absl::StrCat(call, ": live_sequences ", s.live_sequences, " open_tickets ",
                        s.open_tickets, "; model: ", live, " and ", open));
    }
    if (s.attach_queries != attach_.queries || s.query_tokens != attach_.query_tokens ||
        s.matched_tokens != attach_.matched_tokens ||
        s.attached_tokens != attach_.attached_tokens ||
        s.cached_but_recomputed_blocks != attach_.recomputed_blocks) {
      Fail(absl::StrCat(
          call, ": attach counters (queries ", s.attach_queries, ", query tokens ", s.query_tokens,
          ", matched ", s.matched_tokens, ", attached ", s.attached_tokens, ", recomputed blocks ",
          s.cached_but_recomputed_blocks, ") differ from the sum of the ", attach_.queries,
          " successful AttachPrefix results (", attach_.query_tokens, ", ", attach_.matched_tokens,
          ", ", attach_.attached_tokens, ", ", attach_.recomputed_blocks, ")"));
    }
    if (s.indexed_blocks < 0 || s.last_event_sequence < event_cursor_) {
      Fail(absl::StrCat(call, ": indexed_blocks ", s.indexed_blocks, " last_event_sequence ",
                        s.last_event_sequence, " below an event already polled (", event_cursor_,
                        ")"));
    }
  }

  void DoStats() {
    Log("stats");
    const KvCacheStats s = cache_->stats();
    CheckStats(s, "stats()");
    // Every resident slot of an open, final ticket is locked.
    std::set<int32_t> pinned;
    for (const TicketModel& t : tickets_) {
      if (t.released || !t.ticket.completion().done()) continue;
      const std::vector<BlockResidency> status = t.ticket.block_status();
      const DeviceBlockTable& table = t.ticket.block_table();
      for (size_t i = 0; i < status.size() && i < table.slots.size(); ++i) {
        if (status[i] == BlockResidency::kResident) pinned.insert(table.slots[i]);
      }
    }
    const KvCacheStats again = cache_->stats();  // tickets pin: a later snapshot still has them
    if (again.tiers[0].locked_blocks < static_cast<int64_t>(pinned.size())) {
      Fail(absl::StrCat("stats(): HBM locked_blocks ", again.tiers[0].locked_blocks, " but ",
                        pinned.size(), " distinct slots are pinned by open tickets"));
    }
    const std::string text = RenderPrometheus(s);
    if (text.find("kvtier_") == std::string::npos) Fail("RenderPrometheus: no kvtier_ metric");
  }

  void DoPollEvents() {
    uint64_t after = event_cursor_;
    const int kind = in_.Below(4);
    if (kind == 1) after = 0;
    if (kind == 2) after = event_cursor_ + static_cast<uint64_t>(in_.InRange(1, 5));
    const size_t max_events = in_.Bool() ? 4096 : static_cast<size_t>(in_.InRange(0, 3));
    Log(absl::StrCat("PollEvents(", after, ", ", max_events, ")"));
    const std::vector<CacheEvent> events = cache_->PollEvents(after, max_events);
    if (events.size() > max_events) {
      Fail(absl::StrCat("PollEvents: ", events.size(), " events, max ", max_events));
    }
    for (size_t i = 0; i < events.size(); ++i) {
      const CacheEvent& e = events[i];
      if (e.sequence <= after || (i > 0 && e.sequence != events[i - 1].sequence + 1)) {
        Fail(absl::StrCat("PollEvents(", after, "): event ", i, " has sequence ", e.sequence));
      }
      const int tier = static_cast<int>(e.tier);
      if (tier < 0 || tier >= kNumTiers || !config_.present[static_cast<size_t>(tier)] ||
          (e.kind != CacheEventKind::kStored && e.kind != CacheEventKind::kRemoved)) {
        Fail(absl::StrCat("PollEvents: event ", e.sequence, " has tier ", tier, " kind ",
                          static_cast<int>(e.kind)));
      }
    }
    if (!events.empty() && events.size() > static_cast<size_t>(config_.event_buffer)) {
      Fail("PollEvents: more events than the buffer keeps");
    }
    if (!events.empty()) event_cursor_ = std::max(event_cursor_, events.back().sequence);
  }

  void DoAdvanceClock() {
    static constexpr int64_t kSteps[] = {0,           1000000,      1000000000,
                                         60000000000, 600000000000, 3600000000000};
    const int64_t step = kSteps[in_.Below(6)];
    Log(absl::StrCat("advance clock by ", step, " ns"));
    clock_ns_.fetch_add(step);
  }

  void DoCompleteReady() {
    if (pending_.empty()) return;
    FireOldestReady(/*force_ok=*/false);
  }

  void DoWaitIdle() {
    const bool past = in_.Below(4) == 0;
    const absl::Time deadline = past               ? absl::InfinitePast()
                                : pending_.empty() ? absl::Now() + kHangLimit
                                                   : absl::Now() + absl::Milliseconds(20);
    Log(absl::StrCat("WaitIdle(", past ? "past" : "future", ")"));
    const absl::Status s = cache_->WaitIdle(deadline);
    Rules rules;
    if (past || !pending_.empty()) rules.May(StatusCode::kDeadlineExceeded);
    rules.Check(pending_.empty() && !past ? "WaitIdle (nothing pending; a hang?)" : "WaitIdle", s);
  }

  void DoInjectFault() {
    const int t = in_.Below(kNumTiers);
    const bool reads = in_.Bool();
    const int n = in_.InRange(1, 3);
    static constexpr StatusCode kCodes[] = {StatusCode::kUnavailable, StatusCode::kDataLoss,
                                            StatusCode::kDeadlineExceeded,
                                            StatusCode::kResourceExhausted};
    const StatusCode code = kCodes[in_.Below(4)];
    testing::FaultInjectingTier* tier = faults_[static_cast<size_t>(t)];
    if (tier == nullptr) return;
    Log(absl::StrCat("inject: next ", n, reads ? " reads" : " writes", " of tier ", t, " fail ",
                     CodeName(code)));
    const absl::Status status(code, "fuzz: injected fault");
    if (reads) {
      tier->FailNextReads(n, status);
    } else {
      tier->FailNextWrites(n, status);
    }
  }

  void DoRemoteFailure() {
    const bool fail = in_.Bool();
    Log(absl::StrCat("remote store ", fail ? "down" : "up"));
    transport_->SetFailure(fail ? absl::UnavailableError("fuzz: store down") : absl::OkStatus());
  }

  // A process restart: the cache goes (with open tickets and live sequences), the NVMe file and
  // the remote store stay, a new cache comes up over them.
  void DoRestart() {
    if (restarts_ >= kMaxRestarts) return;
    ++restarts_;
    Log("restart");
    DrainPendingReadies();
    // Drop the handles first: a ticket is not meant to outlive its cache.
    tickets_.clear();
    resume_completions_.clear();
    cache_.reset();
    for (auto& [id, seq] : seqs_) history_.push_back(seq.tokens);
    if (history_.size() > 32) history_.erase(history_.begin(), history_.end() - 32);
    seqs_.clear();
    sessions_let_go_.clear();  // the new cache remembers no session
    attach_ = AttachTotals{};
    event_cursor_ = 0;
    if (!MakeCache(/*first=*/false)) Fail("KvCache::Create failed on restart");
  }

  // ---- Hints (kv_cache.h "Hints", session_hints.h)

  void LetGo(const SeqModel& seq) {
    if (seq.options.session == 0) return;
    // The cache remembers the request (its generation) unless it was superseded; a session
    // let go only by superseded requests is kept with generation 0 (a hint naming it may pass).
    const bool superseded = Superseded(seq);
    auto [it, fresh] = sessions_let_go_.try_emplace(seq.options.session, 0);
    if (!superseded && seq.options.enable_caching) it->second = seq.generation;
  }

  // ReleaseObservation::superseded: a later sequence of the session (created or forked after
  // it) is live, or was remembered at its own release or pause.
  bool Superseded(const SeqModel& seq) const {
    if (seq.options.session == 0) return false;
    auto r = sessions_let_go_.find(seq.options.session);
    if (r != sessions_let_go_.end() && r->second > seq.generation) return true;
    for (const auto& [other_id, other] : seqs_) {
      if (other.live && other.options.session == seq.options.session &&
          other.generation > seq.generation) {
        return true;
      }
    }
    return false;
  }

  static const char* ResultName(HintOutcome::Result r) {
    switch (r) {
      case HintOutcome::Result::kAccepted:
        return "kAccepted";
      case HintOutcome::Result::kClipped:
        return "kClipped";
      case HintOutcome::Result::kRejected:
        return "kRejected";
    }
    return "?";
  }

  // An outcome is well formed: a reason exactly when it is not kAccepted, blocks in [0, most].
  static void CheckOutcome(const std::string& call, const HintOutcome& out, int64_t most) {
    Log(absl::StrCat("  -> ", ResultName(out.result), ", ", out.blocks, " blocks ", out.reason));
    const bool accepted = out.result == HintOutcome::Result::kAccepted;
    if (accepted != out.reason.empty() || out.blocks < 0 || out.blocks > most) {
      Fail(absl::StrCat(call, ": outcome ", ResultName(out.result), " with reason '", out.reason,
                        "' and ", out.blocks, " blocks (at most ", most, ")"));
    }
  }

  static void ExpectResult(const std::string& call, const HintOutcome& out,
                           HintOutcome::Result want) {
    if (out.result != want) {
      Fail(absl::StrCat(call, ": outcome ", ResultName(out.result), " (", out.reason,
                        "); kv_cache.h says ", ResultName(want)));
    }
  }

  // A retention priority and a time to live, valid or not (*valid says which).
  std::pair<double, absl::Duration> GenRetention(bool* valid) {
    static constexpr double kPriorities[] = {0,
                                             0.5,
                                             3,
                                             -1,
                                             std::numeric_limits<double>::quiet_NaN(),
                                             std::numeric_limits<double>::infinity()};
    static constexpr int64_t kTtlSeconds[] = {1, 300, 0, -1};
    const double priority = kPriorities[in_.Below(6)];
    const int t = in_.Below(5);
    const absl::Duration ttl = t == 4 ? absl::InfiniteDuration() : absl::Seconds(kTtlSeconds[t]);
    *valid = priority >= 0 && std::isfinite(priority) && ttl > absl::ZeroDuration();
    return {priority, ttl};
  }

  void DoReleaseHinted() {
    const SequenceId id = GenId();
    const uint8_t h = in_.Byte();
    ReleaseHints hints;
    hints.stop_reason = static_cast<StopReason>(h % kNumStopReasons);
    switch ((h >> 2) & 3) {
      case 1:
        hints.expected_idle = absl::Seconds(in_.InRange(0, 255));
        break;
      case 2:
        hints.expected_idle = absl::Seconds(-1);
        break;
      case 3:
        hints.expected_idle = absl::InfiniteDuration();
        break;
      default:
        break;
    }
    hints.last_turn = (h & 16) != 0;
    hints.preempted = (h & 32) != 0;
    const std::string call = absl::StrCat(
        "Release(", id.value(), ", stop ", static_cast<int>(hints.stop_reason), ", idle ",
        hints.expected_idle.has_value() ? absl::FormatDuration(*hints.expected_idle) : "none",
        ", last_turn ", hints.last_turn, ", preempted ", hints.preempted, ")");
    Log(call);
    SeqModel* seq = Live(id);
    // A later sequence of the session is live or let go first: last_turn is not used.
    const bool superseded = seq != nullptr && Superseded(*seq);
    const int64_t preemptions = cache_->stats().preemptions;
    absl::StatusOr<HintOutcome> r = cache_->Release(id, hints);
    AfterRelease(id, call, r.status());
    // Counted whatever the outcome (ReleaseHints::preempted).
    const int64_t counted = cache_->stats().preemptions - preemptions;
    if (counted != (r.ok() && hints.preempted ? 1 : 0)) {
      Fail(absl::StrCat(call, ": KvCacheStats::preemptions went up by ", counted));
    }
    if (!r.ok()) return;
    const int64_t full = seq->written / kTokensPerBlock;
    CheckOutcome(call, *r, full);
    if (r->blocks != full) {
      Fail(absl::StrCat(call, ": outcome names ", r->blocks, " blocks; ", full,
                        " full blocks were written"));
    }
    const bool bad_idle =
        hints.expected_idle.has_value() && (*hints.expected_idle < absl::ZeroDuration() ||
                                            *hints.expected_idle == absl::InfiniteDuration());
    HintOutcome::Result want = HintOutcome::Result::kAccepted;
    if (seq->options.session == 0 || bad_idle) {
      want = HintOutcome::Result::kRejected;
    } else if (hints.last_turn &&
               (hints.expected_idle.has_value() || hints.preempted || superseded)) {
      want = HintOutcome::Result::kClipped;
    }
    ExpectResult(call, *r, want);
  }

  // The documented errors of a hint naming a prompt: kInvalidArgument for bad extras
  // (HashPrompt's); multimodal items may be refused for a prompt they do not fit.
  static void PromptHintRules(Rules& rules, const SequenceOptions& identity, bool bad) {
    if (bad) rules.Must(StatusCode::kInvalidArgument);
    if (!identity.multimodal.empty()) rules.May(StatusCode::kInvalidArgument);
  }

  // The tokens a lookup of `tokens` matches now; nullopt with a remote tier (its store's writes,
  // deletes and probes run on their own time) or when the lookup is refused.
  std::optional<int64_t> LocalMatch(absl::Span<const int32_t> tokens,
                                    const SequenceOptions& identity) {
    if (config_.present[TierIndex(Tier::kRemote)]) return std::nullopt;
    absl::StatusOr<PrefixLookup> l = cache_->Lookup(tokens, identity);
    if (!l.ok()) return std::nullopt;
    return l->matched_tokens;
  }

  void DoRetainPrefix() {
    bool bad = false;
    bool bad_retention = false;  // irrelevant here: a hint's identity gives only extras
    const SequenceOptions identity = GenIdentity(&bad, &bad_retention);
    const std::vector<int32_t> tokens = GenPrompt();
    bool valid = false;
    const auto [priority, ttl] = GenRetention(&valid);
    const std::string call = absl::StrCat("RetainPrefix(", tokens.size(), " tokens, ", priority,
                                          ", ", absl::FormatDuration(ttl), ")");
    Log(call);
    const std::optional<int64_t> before = LocalMatch(tokens, identity);
    absl::StatusOr<HintOutcome> r = cache_->RetainPrefix(tokens, priority, ttl, identity);
    Rules rules;
    PromptHintRules(rules, identity, bad);
    rules.Check(call, r.status());
    if (!r.ok()) return;
    const int64_t full = static_cast<int64_t>(tokens.size()) / kTokensPerBlock;
    CheckOutcome(call, *r, full);
    if (!valid) return ExpectResult(call, *r, HintOutcome::Result::kRejected);
    ExpectResult(
        call, *r,
        r->blocks == full ? HintOutcome::Result::kAccepted : HintOutcome::Result::kClipped);
    if (!before.has_value()) return;
    // Every block a lookup finds is cached, so retained; and retention drops nothing.
    const std::optional<int64_t> after = LocalMatch(tokens, identity);
    if (r->blocks * kTokensPerBlock < *before || !after.has_value() || *after < *before) {
      Fail(absl::StrCat(call, ": retained ", r->blocks, " blocks; a lookup matched ", *before,
                        " tokens before and ", after.value_or(-1), " after"));
    }
  }

  void DoInvalidatePrefix() {
    bool bad = false;
    bool bad_retention = false;  // irrelevant here: a hint's identity gives only extras
    const SequenceOptions identity = GenIdentity(&bad, &bad_retention);
    const std::vector<int32_t> tokens = GenPrompt();
    const int64_t n = static_cast<int64_t>(tokens.size());
    int64_t from = 0;
    switch (in_.Below(5)) {
      case 1:
        from = kTokensPerBlock;
        break;
      case 2:
        from = in_.Below(static_cast<int>(n) + 1);
        break;
      case 3:
        from = -1;
        break;
      case 4:  // the last full block alone
        from = std::max<int64_t>(0, n / kTokensPerBlock - 1) * kTokensPerBlock;
        break;
      default:
        break;
    }
    const std::string call = absl::StrCat("InvalidatePrefix(", n, " tokens, from ", from, ")");
    Log(call);
    const std::optional<int64_t> before = LocalMatch(tokens, identity);
    absl::StatusOr<HintOutcome> r = cache_->InvalidatePrefix(tokens, from, identity);
    Rules rules;
    PromptHintRules(rules, identity, bad);
    rules.Check(call, r.status());
    if (!r.ok()) return;
    const int64_t full = n / kTokensPerBlock;
    const int64_t first = std::min(full, std::max<int64_t>(from, 0) / kTokensPerBlock);
    CheckOutcome(call, *r, full - first);
    if (from < 0) return ExpectResult(call, *r, HintOutcome::Result::kRejected);
    if (r->result == HintOutcome::Result::kRejected) {
      Fail(absl::StrCat(call, ": kRejected (", r->reason,
                        "); kv_cache.h rejects only from_token < 0"));
    }
    if (!before.has_value()) return;
    // An invalidation never adds a block. One that dropped its range whole (kAccepted) dropped
    // every block of it a lookup found, and leaves no tier a block of it: a lookup stops before.
    const std::optional<int64_t> after = LocalMatch(tokens, identity);
    const bool accepted = r->result == HintOutcome::Result::kAccepted;
    const int64_t found_in_range = std::max<int64_t>(0, *before / kTokensPerBlock - first);
    const int64_t most = accepted ? std::min(*before, first * kTokensPerBlock) : *before;
    if (!after.has_value() || *after > most || (accepted && r->blocks < found_in_range)) {
      Fail(absl::StrCat(call, " was ", ResultName(r->result), " naming ", r->blocks,
                        " blocks, but a lookup matches ", after.value_or(-1), " tokens after it, ",
                        *before, " before (the range starts at block ", first, ")"));
    }
  }

  uint64_t GenSession() { return static_cast<uint64_t>(in_.Below(5)); }  // 4: never used

  void DoRetainSession() {
    const uint64_t session = GenSession();
    bool valid = false;
    const auto [priority, ttl] = GenRetention(&valid);
    const std::string call = absl::StrCat("RetainSession(", session, ", ", priority, ", ",
                                          absl::FormatDuration(ttl), ")");
    Log(call);
    absl::StatusOr<HintOutcome> r = cache_->RetainSession(session, priority, ttl);
    Rules().Check(call, r.status());  // no documented error
    CheckOutcome(call, *r, std::numeric_limits<int64_t>::max());
    if (!valid || !sessions_let_go_.contains(session)) {
      ExpectResult(call, *r, HintOutcome::Result::kRejected);
    }
  }

  void DoInvalidateSession() {
    const uint64_t session = GenSession();
    const std::string call = absl::StrCat("InvalidateSession(", session, ")");
    Log(call);
    absl::StatusOr<HintOutcome> r = cache_->InvalidateSession(session);
    Rules().Check(call, r.status());  // no documented error
    CheckOutcome(call, *r, std::numeric_limits<int64_t>::max());
    if (!sessions_let_go_.contains(session)) {
      ExpectResult(call, *r, HintOutcome::Result::kRejected);
    }
    // The session is forgotten either way: until one of its sequences is let go again, a
    // session hint naming it is kRejected.
    sessions_let_go_.erase(session);
  }

  void DoForeignTicket() {
    Log("ReleaseTicket(a ticket of another cache)");
    Rules rules;
    rules.Must(StatusCode::kNotFound);
    rules.Check("ReleaseTicket(a ticket of another cache)",
                cache_->ReleaseTicket(ForeignTicket().ticket));
  }

  void CheckInvariants(Op op) {
    const absl::Status s = cache_->CheckInvariants();
    if (!s.ok()) {
      Fail(absl::StrCat("CheckInvariants after ", OpName(op), ": ", s.ToString()));
    }
  }

  struct AttachTotals {
    int64_t queries = 0;
    int64_t query_tokens = 0;
    int64_t matched_tokens = 0;
    int64_t attached_tokens = 0;
    int64_t recomputed_blocks = 0;
    std::array<int64_t, kNumTiers> hits{};
  };

  Input& in_;
  const Config config_;
  const std::string nvme_path_ = Scratch().File("nvme.bin");
  std::shared_ptr<InProcessTransport> transport_;
  std::atomic<int64_t> clock_ns_{0};
  std::array<testing::FaultInjectingTier*, kNumTiers> faults_{};  // owned by the cache
  std::array<int64_t, kNumTiers> capacity_{};
  DevicePoolView pool_;
  std::unique_ptr<KvCache> cache_;

  std::map<uint64_t, SeqModel> seqs_;  // by id: live or released
  uint64_t generation_ = 0;
  // Sessions a sequence of which was released or paused since the last InvalidateSession of it:
  // the only ones the cache may remember (a session hint naming another is kRejected).
  // Sessions let go, with the generation of the request the cache remembers (0: none known).
  std::map<uint64_t, uint64_t> sessions_let_go_;
  std::vector<std::vector<int32_t>> history_;
  std::vector<TicketModel> tickets_;
  std::deque<PendingReady> pending_;
  std::deque<Completion> resume_completions_;
  AttachTotals attach_;
  uint64_t event_cursor_ = 0;
  int restarts_ = 0;
};

}  // namespace
}  // namespace kvtier

// Process-wide state first, so no input pays for it (or allocates it, which LeakSanitizer's
// per-input check would notice).
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  kvtier::Geometry();
  kvtier::Namespace(kvtier::HbmLayout::kLayerFirst);
  kvtier::Namespace(kvtier::HbmLayout::kBlockFirst);
  kvtier::Namespace(kvtier::HbmLayout::kLayerKvSplit);
  kvtier::Scratch();
  kvtier::ForeignTicket();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvtier::Input in(data, size);
  const kvtier::Config config = kvtier::DecodeConfig(in);
  kvtier::Harness harness(in, config);
  if (!harness.Start()) return 0;
  harness.Run();
  return 0;
}
