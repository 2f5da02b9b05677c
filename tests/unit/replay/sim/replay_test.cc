// The replay driver end to end: small hand-computed traces through a real KvCache in both
// payload modes, byte verification (and that it catches a corrupt block), the unlimited bound,
// the model table and the capacity syntax.
#include "bench/replay/sim/replay.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/replay/offline/bounds.h"
#include "bench/replay/sim/model_table.h"
#include "bench/replay/sim/report.h"
#include "bench/replay/trace/agentic_workload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/cost_model.h"
#include "kvtier/device_block_table.h"
#include "kvtier/kv_geometry.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fault_injecting_tier.h"
#include "tests/testing/shared_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

using ::kvtier::testing::IsError;

namespace kvtier::replay {
namespace {

constexpr int kHbm = TierIndex(Tier::kHbm);
constexpr int kDram = TierIndex(Tier::kDram);

TraceRequest Req(double t, int64_t input, std::vector<uint64_t> ids, uint64_t session = 0,
                 StopReason stop = StopReason::kUnknown) {
  TraceRequest r;
  r.arrival_seconds = t;
  r.input_tokens = input;
  r.output_tokens = 1;
  r.block_ids = std::move(ids);
  r.session = session;
  r.stop = stop;
  return r;
}

// A 2-layer GQA model with 8-token cache blocks under 16-token trace blocks.
ReplayOptions SmallOptions(int64_t blocks_per_tier, PayloadMode payload) {
  ReplayOptions o(*KvGeometry::Create(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 16, .tokens_per_block = 8}));
  o.model_name = "test-model";
  o.prefill = {.params = 1e9, .num_layers = 2, .d_model = 256, .flops_per_second = 1e13};
  for (int t = 0; t < kNumTiers; ++t) {
    o.capacity[t] = TierCapacity::Blocks(blocks_per_tier);
    o.links[t] = {absl::Microseconds(10), 1e10};
  }
  o.payload = payload;
  return o;
}

// r1 shares trace ids 1, 2 (four cache blocks) with r0; r2 repeats r0 at 33 tokens: four full
// cache blocks, all cached.
Trace SmallTrace() {
  Trace t;
  t.name = "small";
  t.block_tokens = 16;
  t.requests = {Req(0, 40, {1, 2, 3}), Req(1, 40, {1, 2, 4}), Req(2, 33, {1, 2, 3})};
  return t;
}

TEST(ReplayTest, SmallTraceHitsAsComputedByHandInBothPayloadModes) {
  const Trace trace = SmallTrace();
  for (PayloadMode mode : {PayloadMode::kNone, PayloadMode::kScaled}) {
    KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, SmallOptions(64, mode)));
    EXPECT_EQ(r.requests, 3);
    EXPECT_EQ(r.prompt_tokens, 40 + 40 + 33);
    EXPECT_EQ(r.hit_tokens, 32 + 32);
    EXPECT_EQ(r.hit_tokens_by_tier[kHbm], 64);
    EXPECT_EQ(r.recomputed_tokens, 113 - 64);
    EXPECT_EQ(r.restore_vs_recompute.restored_blocks, 8);
    EXPECT_EQ(r.corrupt_blocks, 0);
    EXPECT_EQ(r.failed_loads, 0);
    EXPECT_EQ(r.failed_requests, 0);
    EXPECT_DOUBLE_EQ(r.hit_ratio, 64.0 / 113.0);
    EXPECT_EQ(r.payload, mode == PayloadMode::kScaled ? "scaled" : "none");
    // Hits save prefill: the two later requests restore 32 tokens each.
    EXPECT_GT(r.prefill_seconds_saved, 0);
  }
}

// HBM of 6 blocks: r1 evicts r0's deeper blocks into DRAM; r2 repeats r0 and gets them back from
// DRAM, and in payload scaled their bytes are checked after the round trip.
TEST(ReplayTest, BlocksComeBackFromDramIntact) {
  Trace trace;
  trace.name = "dram";
  trace.block_tokens = 16;
  trace.requests = {Req(0, 40, {1, 2, 3}), Req(1, 40, {5, 6, 7}), Req(2, 40, {1, 2, 3})};
  for (PayloadMode mode : {PayloadMode::kNone, PayloadMode::kScaled}) {
    ReplayOptions o = SmallOptions(64, mode);
    o.capacity[kHbm] = TierCapacity::Blocks(6);
    KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, o));
    EXPECT_EQ(r.hit_tokens, 40);  // r2 matches all five full blocks
    EXPECT_GT(r.hit_tokens_by_tier[kDram], 0);
    EXPECT_EQ(r.hit_tokens_by_tier[kHbm] + r.hit_tokens_by_tier[kDram], 40);
    // The last token is computed: one matched block is recomputed for it.
    EXPECT_EQ(r.restore_vs_recompute.last_token, 1);
    EXPECT_EQ(r.restore_vs_recompute.restored_blocks, 4);
    EXPECT_GT(r.restore_vs_recompute.restored_blocks_below_hbm, 0);
    EXPECT_GT(r.bytes_moved[kDram][kHbm], 0);
    EXPECT_GT(r.bytes_moved[kHbm][kDram], 0);
    EXPECT_EQ(r.corrupt_blocks, 0);
    EXPECT_GT(r.evictions, 0);
  }
}

// Forwards to an EmulatedHbm, flipping one byte of the first block the kernel reports written.
class CorruptFirstBlockHbm final : public TierBackend {
 public:
  explicit CorruptFirstBlockHbm(std::unique_ptr<TierBackend> inner) : inner_(std::move(inner)) {}
  const TierInfo& info() const override { return inner_->info(); }
  BlockAllocator& allocator() override { return inner_->allocator(); }
  Completion WriteBlock(SlotId slot, const BlockKey& key, absl::Span<const std::byte> src,
                        const BlockIoOptions& options = {}) override {
    return inner_->WriteBlock(slot, key, src, options);
  }
  Completion ReadBlock(SlotId slot, const BlockKey& key, absl::Span<std::byte> dst,
                       const BlockIoOptions& options = {}) override {
    return inner_->ReadBlock(slot, key, dst, options);
  }
  std::byte* HostAddress(SlotId slot) override { return inner_->HostAddress(slot); }
  void BeginHostWrite(SlotId slot) override { inner_->BeginHostWrite(slot); }
  void EndHostWrite(SlotId slot, const BlockKey& key) override { inner_->EndHostWrite(slot, key); }
  absl::Status CheckHolds(SlotId slot, const BlockKey& key) override {
    return inner_->CheckHolds(slot, key);
  }
  void BeginDeviceWrite(SlotId slot) override { inner_->BeginDeviceWrite(slot); }
  void EndDeviceWrite(SlotId slot, const BlockKey& key) override {
    if (!done_) {
      done_ = true;
      const DevicePoolView pool = *inner_->device_pool();
      std::byte* p = KvAddress(pool, static_cast<int64_t>(slot.value()), 0, KvPlane::kK);
      *p ^= std::byte{0x5a};
    }
    inner_->EndDeviceWrite(slot, key);
  }
  std::optional<DevicePoolView> device_pool() const override { return inner_->device_pool(); }

 private:
  std::unique_ptr<TierBackend> inner_;
  bool done_ = false;  // EndDeviceWrite runs under the cache's calls, one at a time here
};

TEST(ReplayTest, VerificationCountsACorruptBlock) {
  ReplayOptions o = SmallOptions(64, PayloadMode::kScaled);
  o.wrap_tier = [](Tier t, std::unique_ptr<TierBackend> b) -> std::unique_ptr<TierBackend> {
    if (t != Tier::kHbm) return b;
    return std::make_unique<CorruptFirstBlockHbm>(std::move(b));
  };
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(SmallTrace(), o));
  // r0's first block is damaged once; r1 and r2 both read it.
  EXPECT_EQ(r.corrupt_blocks, 2);
  EXPECT_EQ(r.hit_tokens, 64);
}

TEST(ReplayTest, UnlimitedCapacitiesGiveTheUnlimitedBound) {
  AgenticOptions a;
  a.sessions = 8;
  const Trace trace = GenerateAgenticWorkload(a);
  ReplayOptions o(*KvGeometry::Create(
      {.num_layers = 80, .num_kv_heads = 8, .head_dim = 128, .tokens_per_block = 64}));
  o.prefill = *KnownModelCost("Llama-3.1-70B");
  o.prefill.flops_per_second = 3.2e15;
  for (int t = 0; t < kNumTiers; ++t) {
    o.capacity[t] = TierCapacity::Unlimited();
    o.links[t] = {absl::Microseconds(10), 50e9};
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult bound, UnlimitedBound(trace, 64));
  ASSERT_GT(bound.hit_tokens, 0);
  for (const char* policy : {"lru", "cost_aware", "reuse_index"}) {
    o.policy = policy;
    KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, o));
    EXPECT_EQ(r.hit_tokens, bound.hit_tokens) << policy;
    EXPECT_DOUBLE_EQ(r.hit_ratio, bound.hit_ratio) << policy;
    EXPECT_EQ(r.evictions, 0) << policy;
  }
}

TEST(ReplayTest, NoPolicyBeatsTheOptimalBoundInHbmAlone) {
  AgenticOptions a;
  a.sessions = 8;
  const Trace trace = GenerateAgenticWorkload(a);
  for (int64_t blocks : {200, 600}) {
    ReplayOptions o = SmallOptions(blocks, PayloadMode::kNone);
    o.geometry = *KvGeometry::Create(
        {.num_layers = 2, .num_kv_heads = 2, .head_dim = 16, .tokens_per_block = 64});
    o.capacity = {TierCapacity::Blocks(blocks), TierCapacity::Absent(), TierCapacity::Absent(),
                  TierCapacity::Absent()};
    o.hints = HintMode::kNone;
    KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult optimal, OptimalBound(trace, 64, blocks));
    KVTIER_ASSERT_OK_AND_ASSIGN(BoundResult unlimited, UnlimitedBound(trace, 64));
    for (const char* policy : {"lru", "cost_aware", "reuse_index"}) {
      o.policy = policy;
      KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, o));
      EXPECT_LE(r.hit_tokens, optimal.hit_tokens) << policy << " at " << blocks;
      EXPECT_GT(r.hit_tokens, 0) << policy << " at " << blocks;
      EXPECT_LT(optimal.hit_tokens, unlimited.hit_tokens) << blocks;
    }
  }
}

// Every hint mode runs; the oracle's run says so in its name, never passing as a policy's.
TEST(ReplayTest, HintModesRunAndTheOracleIsLabelled) {
  AgenticOptions a;
  a.sessions = 6;
  const Trace trace = GenerateAgenticWorkload(a);
  ReplayOptions o = SmallOptions(600, PayloadMode::kNone);
  o.geometry = *KvGeometry::Create(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 16, .tokens_per_block = 64});
  o.capacity = {TierCapacity::Blocks(600), TierCapacity::Blocks(600), TierCapacity::Absent(),
                TierCapacity::Absent()};
  o.policy = "reuse_index";
  for (HintMode mode :
       {HintMode::kNone, HintMode::kPause, HintMode::kStopReason, HintMode::kOracleIdle}) {
    o.hints = mode;
    KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, o));
    EXPECT_EQ(r.hints, HintModeName(mode));
    EXPECT_GT(r.hit_tokens, 0) << r.hints;
    EXPECT_EQ(r.name, mode == HintMode::kOracleIdle ? "reuse_index+oracle" : "reuse_index");
  }
  EXPECT_STREQ(HintModeName(HintMode::kOracleIdle), "oracle-idle");
}

TEST(ReplayTest, PauseHintsKeepASessionAcrossItsToolCall) {
  // Session 1 pauses after a tool call and comes back; the paused sequence is released only
  // once the next request attached its prefix, so its blocks are hits even with other traffic.
  Trace trace;
  trace.name = "hints";
  trace.block_tokens = 16;
  trace.requests = {Req(0, 40, {1, 2, 3}, 1, StopReason::kToolUse),
                    Req(1, 40, {5, 6, 7}, 2, StopReason::kEndTurn),
                    Req(2, 56, {1, 2, 8, 9}, 1, StopReason::kEndTurn)};
  ReplayOptions o = SmallOptions(64, PayloadMode::kScaled);
  o.hints = HintMode::kPause;
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, o));
  EXPECT_EQ(r.hit_tokens, 32);
  EXPECT_EQ(r.corrupt_blocks, 0);
  EXPECT_EQ(r.failed_requests, 0);
  // The pause copied the session's five full blocks one tier down.
  EXPECT_EQ(r.bytes_moved[kHbm][kDram], 5 * o.geometry.bytes_per_block());
}

// Review finding: Resume ran before the lookup and its onboarding was never charged, so a
// resumed session's blocks counted as HBM hits with no restore time. HBM of 8 blocks: session 1
// (5 blocks) pauses on a tool call, its blocks copied to DRAM; session 2 (7 blocks) evicts four of
// its HBM copies, deepest first; when session 1 comes back, block 0 is an HBM hit and blocks 1-3
// DRAM hits, restored from DRAM.
TEST(ReplayTest, ResumedSessionsBlocksAreChargedFromWhereTheyWere) {
  Trace trace;
  trace.name = "resume";
  trace.block_tokens = 16;
  trace.requests = {Req(0, 40, {1, 2, 3}, 1, StopReason::kToolUse),
                    Req(1, 56, {5, 6, 7, 10}, 2, StopReason::kEndTurn),
                    Req(2, 56, {1, 2, 8, 9}, 1, StopReason::kEndTurn)};
  for (PayloadMode mode : {PayloadMode::kNone, PayloadMode::kScaled}) {
    ReplayOptions o = SmallOptions(64, mode);
    o.capacity[kHbm] = TierCapacity::Blocks(8);
    o.hints = HintMode::kPause;
    KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, o));
    EXPECT_EQ(r.failed_requests, 0);
    EXPECT_EQ(r.hit_tokens, 32);
    EXPECT_EQ(r.hit_tokens_by_tier[kHbm], 8);
    EXPECT_EQ(r.hit_tokens_by_tier[kDram], 24);
    EXPECT_EQ(r.restore_vs_recompute.restored_blocks, 4);
    EXPECT_EQ(r.restore_vs_recompute.restored_blocks_below_hbm, 3);
    EXPECT_EQ(r.corrupt_blocks, 0);
  }
}

// Three different prompts, then the first again, over 6 HBM blocks and a remote tier (a
// directory store under `dir`) only: r3 finds r0's blocks in the store.
Trace ThreePromptsAndTheFirstAgain(const std::string& name) {
  Trace trace;
  trace.name = name;
  trace.block_tokens = 16;
  trace.requests = {Req(0, 40, {1, 2, 3}), Req(1, 40, {5, 6, 7}), Req(2, 40, {8, 9, 10}),
                    Req(3, 40, {1, 2, 3})};
  return trace;
}
ReplayOptions HbmAndDirectoryStore(const testing::TempDir& dir) {
  ReplayOptions o = SmallOptions(64, PayloadMode::kScaled);
  o.capacity[kHbm] = TierCapacity::Blocks(6);
  o.capacity[kDram] = TierCapacity::Absent();
  o.capacity[TierIndex(Tier::kNvme)] = TierCapacity::Absent();
  o.work_dir = dir.path();
  return o;
}

// A disk that fills up mid-run (the directory store's writes fail with ENOSPC, kResourceExhausted)
// turns into misses and a warning, not a stalled or failed run: the same trace as above, with
// every write to the store refused from the start, finishes every request, counts the failed
// copies, finds none of them in the store again, and the table says so.
TEST(ReplayTest, AStoreThatRefusesWritesGivesMissesAndAWarning) {
  testing::TempDir dir;
  const Trace trace = ThreePromptsAndTheFirstAgain("full-disk");
  ReplayOptions o = HbmAndDirectoryStore(dir);
  o.wrap_tier = [](Tier t, std::unique_ptr<TierBackend> b) -> std::unique_ptr<TierBackend> {
    if (t != Tier::kRemote) return b;
    auto full = std::make_unique<testing::FaultInjectingTier>(std::move(b));
    full->FailNextWrites(1 << 20,
                         absl::ResourceExhaustedError("directory: No space left on device"));
    return full;
  };
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, o));
  EXPECT_EQ(r.requests, 4);
  EXPECT_EQ(r.failed_requests, 0);
  const int kRemote = TierIndex(Tier::kRemote);
  EXPECT_GT(r.failed_stores[kRemote], 0);
  EXPECT_EQ(r.hit_tokens_by_tier[kRemote], 0) << "nothing was stored, so nothing is found";
  const std::string table = ReportTable({r});
  EXPECT_THAT(table, ::testing::HasSubstr(absl::StrCat("warning (lru): ", r.failed_stores[kRemote],
                                                       " copies into the remote tier failed")));
  const nlohmann::json j = nlohmann::json::parse(ReportJson(r));
  EXPECT_EQ(j["failed_stores"]["remote"].get<int64_t>(), r.failed_stores[kRemote]);

  // The same run with a store that takes its writes: no failure, no warning.
  o.wrap_tier = nullptr;
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport ok, RunReplay(trace, o));
  EXPECT_EQ(ok.failed_stores[kRemote], 0);
  EXPECT_THAT(ReportTable({ok}), ::testing::Not(::testing::HasSubstr("warning")));
}

// A store restarted empty (every read of it misses) keeps the index's matches but serves none
// of them: the report gives the hits served apart from those matched, and says why.
TEST(ReplayTest, MatchedBlocksAStoreNoLongerHasAreReportedApartFromServedHits) {
  testing::TempDir dir;
  const Trace trace = ThreePromptsAndTheFirstAgain("emptied-store");
  ReplayOptions o = HbmAndDirectoryStore(dir);
  const int kRemote = TierIndex(Tier::kRemote);
  // First the healthy store: r3 restores r0's blocks from it.
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport healthy, RunReplay(trace, o));
  ASSERT_GT(healthy.hit_tokens_by_tier[kRemote], 0);
  nlohmann::json h = nlohmann::json::parse(ReportJson(healthy));
  EXPECT_EQ(h["served_hit_tokens"].get<int64_t>(), healthy.hit_tokens - 8)
      << "all matched but the last token's block served";
  EXPECT_THAT(ReportTable({healthy}), ::testing::Not(::testing::HasSubstr("were not served")));

  o.wrap_tier = [](Tier t, std::unique_ptr<TierBackend> b) -> std::unique_ptr<TierBackend> {
    if (t != Tier::kRemote) return b;
    auto emptied = std::make_unique<testing::FaultInjectingTier>(std::move(b));
    emptied->FailNextReads(1 << 20, absl::NotFoundError("the store was restarted empty"));
    return emptied;
  };
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, RunReplay(trace, o));
  EXPECT_EQ(r.hit_tokens, healthy.hit_tokens) << "the index still matches";
  EXPECT_GT(r.restore_vs_recompute.not_resident, 0);
  const nlohmann::json j = nlohmann::json::parse(ReportJson(r));
  const int64_t served = j["served_hit_tokens"].get<int64_t>();
  EXPECT_EQ(served, r.hit_tokens - 8 - r.restore_vs_recompute.not_resident * 8);
  EXPECT_LT(served, h["served_hit_tokens"].get<int64_t>());
  EXPECT_THAT(ReportTable({r}), ::testing::HasSubstr(absl::StrCat(
                                    "note (lru): ", r.restore_vs_recompute.not_resident * 8,
                                    " matched tokens were not served")));
}

// --keep-state: the NVMe file (and the directory store) outlive the run, so a second run of the
// same trace over the directory starts with the first one's blocks in NVMe (warm restart): its
// first request hits what the first run's requests computed.
TEST(ReplayTest, KeptStateGivesTheNextRunHitsFromTheFirst) {
  testing::TempDir dir;
  Trace trace;
  trace.name = "keep";
  trace.block_tokens = 16;
  // Three different prompts, then none repeats within a run.
  trace.requests = {Req(0, 40, {1, 2, 3}), Req(1, 40, {5, 6, 7}), Req(2, 40, {8, 9, 10})};
  ReplayOptions o = SmallOptions(64, PayloadMode::kScaled);
  // HBM then NVMe: the later prompts push the first one's whole chain down to NVMe (a DRAM tier
  // would keep its root blocks, and DRAM does not survive the run).
  o.capacity[kHbm] = TierCapacity::Blocks(6);
  o.capacity[kDram] = TierCapacity::Absent();
  o.capacity[TierIndex(Tier::kRemote)] = TierCapacity::Absent();
  o.keep_state_dir = dir.File("state");
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport first, RunReplay(trace, o));
  EXPECT_EQ(first.hit_tokens, 0);
  EXPECT_GT(first.bytes_moved[kHbm][TierIndex(Tier::kNvme)], 0) << "nothing reached NVMe";
  EXPECT_TRUE(std::filesystem::exists(dir.File("state") + "/nvme.bin"));
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport second, RunReplay(trace, o));
  EXPECT_GT(second.hit_tokens_by_tier[TierIndex(Tier::kNvme)], 0) << "nothing found again";
  EXPECT_GT(second.hit_tokens, 0);
  EXPECT_EQ(second.corrupt_blocks, 0);
  EXPECT_EQ(second.failed_requests, 0);
  // Without it each run starts empty.
  o.keep_state_dir.clear();
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport fresh, RunReplay(trace, o));
  EXPECT_EQ(fresh.hit_tokens, 0);
  // The same with the remote tier (a directory store) below HBM instead of NVMe: the second run
  // finds the first one's blocks in the store by discovery, reports its probes, and restores them.
  ReplayOptions remote = o;
  remote.capacity[TierIndex(Tier::kNvme)] = TierCapacity::Absent();
  remote.capacity[TierIndex(Tier::kRemote)] = TierCapacity::Blocks(64);
  remote.keep_state_dir = dir.File("remote-state");
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport before, RunReplay(trace, remote));
  EXPECT_EQ(before.hit_tokens, 0);
  EXPECT_EQ(before.remote_blocks_found, 0);
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport after, RunReplay(trace, remote));
  EXPECT_GT(after.remote_probes, 0);
  EXPECT_GT(after.remote_blocks_found, 0);
  EXPECT_GT(after.remote_blocks_indexed, 0);
  EXPECT_GT(after.hit_tokens_by_tier[TierIndex(Tier::kRemote)], 0);
  EXPECT_EQ(after.corrupt_blocks, 0);
  EXPECT_NE(ReportTable({after}).find("remote probes (lru)"), std::string::npos);
  // Payload none has no state to keep.
  ReplayOptions none = SmallOptions(64, PayloadMode::kNone);
  none.keep_state_dir = dir.File("none");
  EXPECT_THAT(RunReplay(trace, none), IsError(absl::StatusCode::kInvalidArgument, "scaled"));
}

TEST(ReplayTest, RejectsBadOptions) {
  ReplayOptions o = SmallOptions(8, PayloadMode::kNone);
  o.geometry = *KvGeometry::Create(
      {.num_layers = 2, .num_kv_heads = 2, .head_dim = 16, .tokens_per_block = 12});
  EXPECT_THAT(RunReplay(SmallTrace(), o), IsError(absl::StatusCode::kInvalidArgument, "divide"));
  o = SmallOptions(8, PayloadMode::kNone);
  o.capacity[kHbm] = TierCapacity::Absent();
  EXPECT_THAT(RunReplay(SmallTrace(), o), IsError(absl::StatusCode::kInvalidArgument, "HBM"));
  o = SmallOptions(8, PayloadMode::kScaled);
  o.payload_bytes_per_token = 6;
  EXPECT_THAT(RunReplay(SmallTrace(), o),
              IsError(absl::StatusCode::kInvalidArgument, "payload_bytes_per_token"));
  o = SmallOptions(8, PayloadMode::kNone);
  o.policy = "mru";
  EXPECT_THAT(RunReplay(SmallTrace(), o), IsError(absl::StatusCode::kInvalidArgument, "mru"));
  Trace bad = SmallTrace();
  bad.requests[1].block_ids = {1};  // 40 tokens need 3 ids
  EXPECT_THAT(RunReplay(bad, SmallOptions(8, PayloadMode::kNone)),
              IsError(absl::StatusCode::kInvalidArgument, "block_ids"));
}

TEST(ReplayTest, BoundReportModelsTtftOnOnePrefillInstance) {
  Trace trace;
  trace.name = "queue";
  trace.block_tokens = 16;
  // Two requests at once: the second waits for the first.
  trace.requests = {Req(0, 32, {1, 2}), Req(0, 32, {3, 4})};
  ReplayOptions o = SmallOptions(8, PayloadMode::kNone);
  // F(n) = 2 * 1e9 * n + 2 * 2 * 256 * n^2; at 1e13 FLOP/s, 32 tokens take 6.4001 ms (the cost
  // model rounds to whole nanoseconds).
  const double one = (2 * 1e9 * 32 + 2 * 2 * 256 * 32.0 * 32) / 1e13 * 1e3;
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r, BoundReport(trace, o, "recompute_all", {0, 0}));
  EXPECT_NEAR(r.ttft_p50_ms, one, 1e-6);
  EXPECT_NEAR(r.ttft_p99_ms, 2 * one, 1e-6);
  o.prefill_instances = 2;
  KVTIER_ASSERT_OK_AND_ASSIGN(r, BoundReport(trace, o, "recompute_all", {0, 0}));
  EXPECT_NEAR(r.ttft_p99_ms, one, 1e-6);
}

TEST(ReplayTest, JsonHasTheDocumentedKeys) {
  KVTIER_ASSERT_OK_AND_ASSIGN(ReplayReport r,
                              RunReplay(SmallTrace(), SmallOptions(64, PayloadMode::kNone)));
  const nlohmann::json j = nlohmann::json::parse(ReportJson(r));
  for (const char* key : {"trace", "requests", "prompt_tokens", "hit_tokens", "hit_tokens_by_tier",
                          "recomputed_tokens", "hit_ratio", "bytes_moved", "modeled_ttft_ms",
                          "modeled_prefill_seconds_saved", "restore_vs_recompute", "corrupt_blocks",
                          "failed_loads", "wall_seconds"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["hit_tokens"], 64);
  EXPECT_EQ(j["hit_tokens_by_tier"]["hbm"], 64);
  EXPECT_TRUE(j["modeled_ttft_ms"].contains("p99"));
  const nlohmann::json c = nlohmann::json::parse(CompareJson({r, r}));
  EXPECT_EQ(c["runs"].size(), 2u);
}

TEST(ReplayTest, ParsesTierSizes) {
  const int64_t mib = 1 << 20;
  KVTIER_ASSERT_OK_AND_ASSIGN(TierCapacity c, ParseTierSize("80GiB", mib));
  EXPECT_EQ(c.kind, TierCapacity::Kind::kBlocks);
  EXPECT_EQ(c.blocks, 80 * 1024);
  KVTIER_ASSERT_OK_AND_ASSIGN(c, ParseTierSize("1TB", mib));
  EXPECT_EQ(c.blocks, 953674);  // floor(1e12 / 2^20)
  KVTIER_ASSERT_OK_AND_ASSIGN(c, ParseTierSize("5000blocks", mib));
  EXPECT_EQ(c.blocks, 5000);
  KVTIER_ASSERT_OK_AND_ASSIGN(c, ParseTierSize("unlimited", mib));
  EXPECT_EQ(c.kind, TierCapacity::Kind::kUnlimited);
  KVTIER_ASSERT_OK_AND_ASSIGN(c, ParseTierSize("0", mib));
  EXPECT_EQ(c.kind, TierCapacity::Kind::kAbsent);
  for (const char* bad : {"", "GiB", "-1GiB", "80XB", "1KiB", "2.5blocks", "nan"}) {
    EXPECT_THAT(ParseTierSize(bad, mib), IsError(absl::StatusCode::kInvalidArgument, "size"))
        << bad;
  }
}

// The built-in models are the library's KnownModels (which the cost model's test checks against
// shared/models/kv_geometry.csv), and the CSV loader reads that file to the same geometries.
TEST(ModelTableTest, BuiltInModelsAreTheKnownModels) {
  const std::vector<ModelSpec> built_in = BuiltInModels();
  ASSERT_EQ(built_in.size(), KnownModels().size());
  for (size_t i = 0; i < built_in.size(); ++i) {
    const KnownModel& k = KnownModels()[i];
    const ModelSpec& m = built_in[i];
    EXPECT_EQ(m.name, k.name);
    KVTIER_ASSERT_OK_AND_ASSIGN(KvGeometry g, KvGeometry::Create(m.geometry));
    EXPECT_TRUE(g == *KvGeometry::Create(k.geometry)) << m.name;
    ASSERT_TRUE(m.cost.has_value()) << m.name;
    EXPECT_EQ(m.cost->params, k.cost.params) << m.name;
    EXPECT_EQ(m.cost->num_layers, k.cost.num_layers) << m.name;
    EXPECT_EQ(m.hidden_size, k.cost.d_model) << m.name;
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(ModelSpec llama, FindModel(built_in, "llama-3.1-70b"));
  EXPECT_EQ(KvGeometry::Create(llama.geometry)->bytes_per_token(), 327680);

  const auto path = testing::SharedFile("models/kv_geometry.csv");
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "shared/models/kv_geometry.csv not found under " << testing::SharedDir();
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(std::vector<ModelSpec> loaded, LoadGeometryCsv(path.string()));
  ASSERT_EQ(loaded.size(), built_in.size());
  for (const ModelSpec& row : loaded) {
    KVTIER_ASSERT_OK_AND_ASSIGN(ModelSpec m, FindModel(built_in, row.name));
    EXPECT_TRUE(*KvGeometry::Create(row.geometry) == *KvGeometry::Create(m.geometry)) << row.name;
    EXPECT_EQ(row.hidden_size, m.hidden_size) << row.name;
    EXPECT_TRUE(row.cost.has_value()) << row.name;
  }
  KVTIER_ASSERT_OK_AND_ASSIGN(ModelSpec ds, FindModel(loaded, "deepseek-v3"));
  EXPECT_EQ(KvGeometry::Create(ds.geometry)->bytes_per_token(), 70272);
}

TEST(ModelTableTest, CsvErrorsNameLineAndColumn) {
  testing::TempDir dir;
  const std::string path = dir.File("g.csv");
  {
    std::ofstream(path) << "model,attention,layers_growing_with_context,num_key_value_heads,"
                           "head_dim,kv_lora_rank,qk_rope_head_dim\n"
                        << "ok,GQA,2,2,64,,\n"
                        << "bad,GQA,2,-1,64,,\n";
  }
  auto r = LoadGeometryCsv(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr(":3:"));
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("num_key_value_heads"));
  { std::ofstream(path) << "model,attention\nx,GQA\n"; }
  EXPECT_THAT(LoadGeometryCsv(path), IsError(absl::StatusCode::kInvalidArgument, "missing column"));
  EXPECT_THAT(LoadGeometryCsv(dir.File("missing.csv")),
              IsError(absl::StatusCode::kNotFound, "cannot be read"));
  EXPECT_THAT(FindModel(BuiltInModels(), "GPT-9"),
              IsError(absl::StatusCode::kNotFound, "unknown model"));
}

}  // namespace
}  // namespace kvtier::replay
