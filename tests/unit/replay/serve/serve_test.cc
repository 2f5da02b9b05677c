// The serving simulation (bench/replay/serve/serve.h): step times, TTFT and ITL by arithmetic,
// conservation, the onboarding deadline, preemption, the routers and determinism.
#include "bench/replay/serve/serve.h"

#include <cmath>
#include <string>
#include <vector>

#include "bench/replay/serve/serve_report.h"
#include "bench/replay/trace/agentic_workload.h"
#include "gtest/gtest.h"
#include "kvtier/kv_geometry.h"
#include "tests/testing/status_matchers.h"

namespace kvtier::replay {
namespace {

constexpr int kBlock = 64;
// 1 layer, 1 KV head of 64: 256 bytes a token (K and V, bf16).
constexpr double kKvBytesPerToken = 256;
constexpr double kParams = 1e9;
constexpr int64_t kDModel = 64;

TraceRequest Req(double t, int64_t input, int64_t output, std::vector<uint64_t> ids,
                 uint64_t session = 0, double think = 0) {
  TraceRequest r;
  r.arrival_seconds = t;
  r.input_tokens = input;
  r.output_tokens = output;
  r.block_ids = std::move(ids);
  r.session = session;
  r.think_seconds = think;
  return r;
}

Trace MakeTrace(std::vector<TraceRequest> requests) {
  Trace t;
  t.name = "hand";
  t.block_tokens = kBlock;
  t.requests = std::move(requests);
  return t;
}

// A GPU with round numbers: 1 TFLOP/s, 1 TB/s, every efficiency 1, no overheads.
ServeOptions HandOptions(ServeProfile profile, int64_t hbm_blocks, int64_t dram_blocks = 0) {
  auto g = KvGeometry::Create({.num_layers = 1,
                               .num_kv_heads = 1,
                               .head_dim = 64,
                               .dtype = KvDtype::kBf16,
                               .tokens_per_block = kBlock});
  EXPECT_TRUE(g.ok());
  ServeOptions o(*g);
  o.model_name = "hand";
  o.cost = {.params = kParams, .num_layers = 1, .d_model = kDModel};
  o.roofline.gpu = {"hand", 1e12, 1e12, 1e12, "test"};
  o.roofline.mfu = 1;
  o.roofline.mbu = 1;
  o.roofline.step_overhead_seconds = 0;
  o.profile = profile;
  o.capacity_blocks = {hbm_blocks, dram_blocks, 0, 0};
  o.closed_loop = false;
  return o;
}

// F(n) of cost_model.h for the hand model.
double F(double n) { return 2 * kParams * n + 2.0 * kDModel * n * n; }
double PrefillStep(double context, double chunk) {
  const double compute = (F(context + chunk) - F(context)) / 1e12;
  const double memory = (2 * kParams + (context + chunk) * kKvBytesPerToken) / 1e12;
  return std::max(compute, memory);
}
double DecodeStep(double context) {
  const double compute = (2 * kParams + 4.0 * kDModel * context) / 1e12;
  const double memory = (2 * kParams + (context + 1) * kKvBytesPerToken) / 1e12;
  return std::max(compute, memory);
}

TEST(ServeTest, OneRequestsStepTimesGiveItsTtftAndInterTokenLatency) {
  const Trace trace = MakeTrace({Req(0, 128, 3, {1, 2})});
  auto r = RunServe(trace, HandOptions(ServeProfile::kHbmLru, 100));
  KVTIER_ASSERT_OK(r.status());
  const double ttft = PrefillStep(0, 128);
  const double itl1 = DecodeStep(128);
  const double itl2 = DecodeStep(129);
  EXPECT_NEAR(r->ttft_p50_ms, ttft * 1e3, 1e-9);
  EXPECT_NEAR(r->itl_p50_ms, std::min(itl1, itl2) * 1e3, 1e-9);
  EXPECT_NEAR(r->itl_p99_ms, std::max(itl1, itl2) * 1e3, 1e-9);
  EXPECT_NEAR(r->e2e_p50_s, ttft + itl1 + itl2, 1e-12);
  EXPECT_EQ(r->steps, 3);
  EXPECT_EQ(r->finished, 1);
  EXPECT_EQ(r->output_tokens, 3);
  EXPECT_EQ(r->prompt_tokens, 128);
  EXPECT_EQ(r->prefilled_tokens, 128);
  EXPECT_EQ(r->served_hit_tokens, 0);
}

TEST(ServeTest, ASecondRequestWithTheSamePrefixPrefillsOnlyItsLastBlock) {
  // The prompt's last token must be computed, so of two cached blocks one is restored.
  const Trace trace = MakeTrace({Req(0, 128, 1, {1, 2}), Req(10, 128, 1, {1, 2})});
  auto r = RunServe(trace, HandOptions(ServeProfile::kHbmLru, 100));
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->matched_tokens, 128);
  EXPECT_EQ(r->served_hit_tokens, 64);
  EXPECT_EQ(r->served_hit_tokens_by_tier[0], 64);
  EXPECT_EQ(r->prompt_tokens, r->served_hit_tokens + r->prefilled_tokens);
  // TTFTs: the whole prompt, then 64 tokens after 64 cached.
  EXPECT_NEAR(r->ttft_p99_ms, PrefillStep(0, 128) * 1e3, 1e-9);
  EXPECT_NEAR(r->ttft_p50_ms, PrefillStep(64, 64) * 1e3, 1e-9);
  // The TTFT CDF's points: of two requests, percentiles 0 to 50 are the faster one, 51 to 100
  // the slower (the ceil(k n / 100)-th fastest).
  ASSERT_EQ(r->ttft_percentiles_ms.size(), 101u);
  for (int k = 0; k <= 100; ++k) {
    EXPECT_NEAR(r->ttft_percentiles_ms[k],
                (k <= 50 ? PrefillStep(64, 64) : PrefillStep(0, 128)) * 1e3, 1e-9)
        << k;
  }

  // recompute: no prefix cache at all.
  auto none = RunServe(trace, HandOptions(ServeProfile::kRecompute, 100));
  KVTIER_ASSERT_OK(none.status());
  EXPECT_EQ(none->served_hit_tokens, 0);
  EXPECT_EQ(none->prefilled_tokens, 256);
}

// Request 1's blocks are written through to DRAM; request 2 (another prompt) evicts them from a
// small HBM; request 3 repeats request 1 and restores them from DRAM over PCIe.
Trace EvictAndComeBack() {
  return MakeTrace({Req(0, 256, 1, {1, 2, 3, 4}), Req(5, 256, 1, {11, 12, 13, 14}),
                    Req(10, 256, 1, {1, 2, 3, 4})});
}

TEST(ServeTest, BlocksRestoredFromDramWaitForThePcieTransfer) {
  ServeOptions o = HandOptions(ServeProfile::kDramLru, 6, 64);
  o.links.pcie_bytes_per_second = 1e6;  // a block (16 KiB) in 16.4 ms
  o.links.pcie_latency_seconds = 0;
  auto r = RunServe(EvictAndComeBack(), o);
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->finished, 3);
  EXPECT_GT(r->served_hit_tokens_by_tier[1], 0);
  EXPECT_EQ(r->late_tokens, 0);
  EXPECT_EQ(r->prompt_tokens, r->served_hit_tokens + r->prefilled_tokens);
  // Request 3's TTFT includes the restore: its DRAM blocks over 1 MB/s.
  const double restore =
      static_cast<double>(r->served_hit_tokens_by_tier[1]) * kKvBytesPerToken / 1e6;
  EXPECT_GE(r->ttft_p99_ms, restore * 1e3);
}

// Layer-wise onboarding: with 8 layers, request 3 starts computing while its DRAM blocks land,
// so its TTFT is max(compute, restore + compute / 8) instead of restore + compute; the hits and
// the token identity are the same.
TEST(ServeTest, LayerwiseOnboardingOverlapsTheRestoreWithCompute) {
  auto run = [](bool layerwise) {
    ServeOptions o = HandOptions(ServeProfile::kDramLru, 6, 64);
    auto g = KvGeometry::Create({.num_layers = 8,
                                 .num_kv_heads = 1,
                                 .head_dim = 64,
                                 .dtype = KvDtype::kBf16,
                                 .tokens_per_block = kBlock});
    EXPECT_TRUE(g.ok());
    o.geometry = *g;
    o.links.pcie_bytes_per_second = 1e7;
    o.links.pcie_latency_seconds = 0;
    o.layerwise_onboard = layerwise;
    auto r = RunServe(EvictAndComeBack(), o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ServeReport{};
  };
  const ServeReport wait = run(false);
  const ServeReport overlap = run(true);
  EXPECT_EQ(wait.finished, 3);
  EXPECT_EQ(overlap.finished, 3);
  ASSERT_GT(wait.served_hit_tokens_by_tier[1], 0);
  EXPECT_EQ(overlap.served_hit_tokens, wait.served_hit_tokens);
  EXPECT_EQ(overlap.prompt_tokens, overlap.served_hit_tokens + overlap.prefilled_tokens);
  EXPECT_EQ(overlap.late_tokens, 0);
  // Request 3 restores its DRAM blocks (8 layers x 256 bytes a token at 10 MB/s) and prefills
  // the rest: overlapped, it finishes sooner, but never before its last byte landed.
  // Request 3 is the fastest of the three (the others prefill 256 tokens each).
  const double restore = static_cast<double>(wait.served_hit_tokens_by_tier[1]) * 8 * 256 / 1e7;
  ASSERT_FALSE(wait.ttft_percentiles_ms.empty());
  ASSERT_FALSE(overlap.ttft_percentiles_ms.empty());
  const double waited = wait.ttft_percentiles_ms.front();
  const double overlapped = overlap.ttft_percentiles_ms.front();
  EXPECT_LT(overlapped, waited);
  EXPECT_GE(overlapped, restore * 1e3);
  EXPECT_GE(waited, restore * 1e3);
  // Waiting: the restore, then the step; overlapped: that step, stretched to the landing plus an
  // eighth of it when the restore is the longer.
  const double step = waited - restore * 1e3;
  EXPECT_NEAR(overlapped, std::max(step, restore * 1e3 + step / 8), 1e-6);
}

TEST(ServeTest, BlocksNotLandedByTheDeadlineAreRecomputedAndCountedLate) {
  ServeOptions o = HandOptions(ServeProfile::kDramLru, 6, 64);
  o.links.pcie_bytes_per_second = 1;  // never in time
  o.onboard_deadline_seconds = 0.5;
  auto r = RunServe(EvictAndComeBack(), o);
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->finished, 3);
  EXPECT_EQ(r->served_hit_tokens_by_tier[1], 0);
  EXPECT_GT(r->late_tokens, 0);
  EXPECT_EQ(r->prompt_tokens, r->served_hit_tokens + r->prefilled_tokens);
  // The request waited for the deadline, no longer: then it prefilled what had not landed.
  EXPECT_GE(r->ttft_p99_ms, 500);
  EXPECT_LT(r->ttft_p99_ms, 500 + 1e3 * PrefillStep(0, 256) + 1);
}

// With a small token budget the recomputation after a missed deadline ends its first chunks
// below the attached tokens: the run goes on and the token identity holds.
TEST(ServeTest, RecomputingLateBlocksInSmallChunksNeverReportsBelowTheAttachedTokens) {
  ServeOptions o = HandOptions(ServeProfile::kDramLru, 6, 64);
  o.links.pcie_bytes_per_second = 1;
  o.onboard_deadline_seconds = 0.5;
  o.scheduler.max_batched_tokens = 64;
  auto r = RunServe(EvictAndComeBack(), o);
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->finished, 3);
  EXPECT_GT(r->late_tokens, 0);
  EXPECT_EQ(r->prompt_tokens, r->served_hit_tokens + r->prefilled_tokens);
}

TEST(ServeTest, APromptOfExactlyTheHbmFitsAlone) {
  // 4 blocks of HBM, a 4-block prompt and one output token (no decode slot needed).
  const Trace trace = MakeTrace({Req(0, 256, 1, {1, 2, 3, 4})});
  auto r = RunServe(trace, HandOptions(ServeProfile::kHbmLru, 4));
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->finished, 1);
  EXPECT_EQ(r->failed, 0);
}

TEST(ServeTest, AFailedRequestStillGivesANonNegativeSpan) {
  const Trace trace = MakeTrace({Req(5, 640, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10})});
  auto r = RunServe(trace, HandOptions(ServeProfile::kHbmLru, 4));
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->failed, 1);
  EXPECT_EQ(r->simulated_seconds, 0);
  EXPECT_EQ(r->output_tokens_per_second, 0);
}

// A request whose prefix comes from DRAM and NVMe at once waits for both links (each link
// numbers its own transfers: completions are matched by link and id).
TEST(ServeTest, OnboardingFromTwoTiersWaitsForBothLinks) {
  // HBM 6, DRAM 4, NVMe 64: request 1's 4 blocks go down to DRAM and on to NVMe as requests 2
  // and 3 push through; request 4 repeats request 1.
  const Trace trace = MakeTrace({Req(0, 256, 1, {1, 2, 3, 4}), Req(5, 256, 1, {11, 12, 13, 14}),
                                 Req(10, 256, 1, {21, 22, 23, 24}), Req(15, 256, 1, {1, 2, 3, 4})});
  ServeOptions o = HandOptions(ServeProfile::kKvtier, 6, 4);
  o.capacity_blocks[2] = 64;
  o.links.pcie_bytes_per_second = 1e6;
  o.links.nvme_bytes_per_second = 1e5;  // 16 KiB blocks: 164 ms each
  o.links.pcie_latency_seconds = 0;
  o.links.nvme_latency_seconds = 0;
  o.onboard_deadline_seconds = 100;
  auto r = RunServe(trace, o);
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->finished, 4);
  EXPECT_EQ(r->late_tokens, 0);
  EXPECT_EQ(r->prompt_tokens, r->served_hit_tokens + r->prefilled_tokens);
  const int64_t nvme = r->served_hit_tokens_by_tier[2];
  if (nvme > 0) {
    // Request 4 could not start before its NVMe blocks crossed at 100 kB/s.
    EXPECT_GE(r->ttft_p99_ms, 1e3 * static_cast<double>(nvme) * kKvBytesPerToken / 1e5);
  }
}

// HBM occupancy over time: one point a simulated second from the first arrival, each the state
// just before that instant's changes. A request of 4 blocks arrives at 10 s and produces 600
// tokens (about 1.7 s of steps); a second arrives at 13.5 s, so the clock runs past 13 s.
TEST(ServeTest, OccupancyOverTimeIsSampledEverySecond) {
  const Trace trace = MakeTrace({Req(10, 256, 600, {1, 2, 3, 4}), Req(13.5, 64, 1, {9})});
  auto r = RunServe(trace, HandOptions(ServeProfile::kHbmLru, 100));
  KVTIER_ASSERT_OK(r.status());
  ASSERT_GE(r->hbm_occupancy.size(), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(r->hbm_occupancy[k].seconds, double(k));
  // 10 s: just before its admission, nothing. 11 s: running, its prompt and decode blocks held.
  EXPECT_EQ(r->hbm_occupancy[0].running, 0);
  EXPECT_EQ(r->hbm_occupancy[0].cached, 0);
  EXPECT_GE(r->hbm_occupancy[1].running, 4);
  EXPECT_EQ(r->hbm_occupancy[1].cached, 0);
  // 13 s: done; its 856 tokens' 13 full blocks cached, the partial one freed.
  EXPECT_EQ(r->hbm_occupancy[3].running, 0);
  EXPECT_EQ(r->hbm_occupancy[3].cached, 13);
}

TEST(ServeTest, DecodesThatOutgrowHbmPreemptTheLatestAdmittedAndBothFinish) {
  // 8 blocks of HBM; two requests of one block each produce 200 tokens (4 blocks each): they
  // cannot both hold 5 blocks, so one is preempted and re-admitted.
  const Trace trace = MakeTrace({Req(0, 60, 200, {1}), Req(0, 60, 200, {2})});
  auto r = RunServe(trace, HandOptions(ServeProfile::kHbmLru, 8));
  KVTIER_ASSERT_OK(r.status());
  EXPECT_GE(r->preemptions, 1);
  EXPECT_EQ(r->finished, 2);
  EXPECT_EQ(r->failed, 0);
  EXPECT_EQ(r->output_tokens, 400);
  EXPECT_GT(r->recomputed_after_preemption_tokens, 0);
  EXPECT_LE(r->hbm_running_blocks_max, 8);
}

// The same two requests with swap preemption: the victim's KV goes to DRAM over the d2h link
// and comes back, so nothing is recomputed and both finish every token; where the profile has
// no tier below HBM, preemption stays recompute.
TEST(ServeTest, SwapPreemptionMovesTheVictimsKvDownAndBackWithoutRecomputing) {
  const Trace trace = MakeTrace({Req(0, 60, 200, {1}), Req(0, 60, 200, {2})});
  ServeOptions o = HandOptions(ServeProfile::kDramLru, 8, 64);
  o.scheduler.swap = true;
  auto r = RunServe(trace, o);
  KVTIER_ASSERT_OK(r.status());
  EXPECT_GE(r->swap_preemptions, 1);
  EXPECT_EQ(r->swap_preemptions, r->preemptions);
  EXPECT_EQ(r->finished, 2);
  EXPECT_EQ(r->failed, 0);
  EXPECT_EQ(r->output_tokens, 400);
  EXPECT_EQ(r->recomputed_after_preemption_tokens, 0);
  EXPECT_EQ(r->prefilled_tokens, 120);
  EXPECT_LE(r->hbm_running_blocks_max, 8);
  double d2h = 0, h2d = 0;
  for (const LinkReport& l : r->links) {
    if (l.name == "i0.pcie_d2h") d2h = l.bytes;
    if (l.name == "i0.pcie_h2d") h2d = l.bytes;
  }
  EXPECT_GT(h2d, 0) << "the swapped-in blocks crossed PCIe";
  EXPECT_GT(d2h, 0);

  ServeOptions hbm_only = HandOptions(ServeProfile::kHbmLru, 8);
  hbm_only.scheduler.swap = true;
  auto h = RunServe(trace, hbm_only);
  KVTIER_ASSERT_OK(h.status());
  EXPECT_GE(h->preemptions, 1);
  EXPECT_EQ(h->swap_preemptions, 0);
  EXPECT_GT(h->recomputed_after_preemption_tokens, 0);
  EXPECT_EQ(h->output_tokens, 400);
}

TEST(ServeTest, APromptLargerThanHbmFailsWithItsReasonAndOthersGoOn) {
  const Trace trace =
      MakeTrace({Req(0, 640, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), Req(1, 64, 1, {20})});
  auto r = RunServe(trace, HandOptions(ServeProfile::kHbmLru, 4));
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->failed, 1);
  EXPECT_EQ(r->failed_prompt_exceeds_hbm, 1);
  EXPECT_EQ(r->finished, 1);
  EXPECT_EQ(r->requests, 2);
}

// A, B on different prefixes; then B' and A' extend them. Routed where their prefix is, both
// hit; in turn (or to the idle instance), both miss.
TEST(ServeTest, KvAwareAndSessionRoutersSendARequestWhereItsPrefixIs) {
  const Trace trace =
      MakeTrace({Req(0, 128, 1, {1, 2}, 1), Req(0.001, 128, 1, {11, 12}, 2),
                 Req(10, 192, 1, {11, 12, 13}, 2), Req(10.001, 192, 1, {1, 2, 3}, 1)});
  auto run = [&](RouterKind router) {
    ServeOptions o = HandOptions(ServeProfile::kHbmLru, 100);
    o.instances = 2;
    o.router = router;
    auto r = RunServe(trace, o);
    KVTIER_EXPECT_OK(r.status());
    return r.ok() ? r->served_hit_tokens : -1;
  };
  EXPECT_EQ(run(RouterKind::kKvAware), 2 * 128);
  EXPECT_EQ(run(RouterKind::kSession), 2 * 128);
  EXPECT_EQ(run(RouterKind::kRoundRobin), 0);
  EXPECT_EQ(run(RouterKind::kLeastLoaded), 0);
}

// The same four requests in turn over two instances, with a remote tier written through: with
// one store for the fleet, B' (on instance 0) and A' (on instance 1) find the other instance's
// blocks there by discovery and restore them over the network; with a store each, nothing.
TEST(ServeTest, AFleetSharingOneRemoteStoreServesPrefixesAcrossInstances) {
  const Trace trace =
      MakeTrace({Req(0, 128, 1, {1, 2}, 1), Req(0.001, 128, 1, {11, 12}, 2),
                 Req(10, 192, 1, {11, 12, 13}, 2), Req(10.001, 192, 1, {1, 2, 3}, 1)});
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared" : "one store each");
    ServeOptions o = HandOptions(ServeProfile::kHicache, 100);
    o.capacity_blocks[3] = 1000;
    o.instances = 2;
    o.router = RouterKind::kRoundRobin;
    o.shared_remote = shared;
    auto r = RunServe(trace, o);
    KVTIER_ASSERT_OK(r.status());
    EXPECT_EQ(r->finished, 4);
    EXPECT_EQ(r->shared_remote, shared);
    EXPECT_EQ(r->served_hit_tokens, shared ? 2 * 128 : 0);
    EXPECT_EQ(r->served_hit_tokens_by_tier[3], shared ? 2 * 128 : 0);
    EXPECT_EQ(r->remote_discovered_blocks, shared ? 4 : 0);
    EXPECT_EQ(r->prompt_tokens, r->served_hit_tokens + r->prefilled_tokens);
    const std::string json = ServeJson({{*r}}, /*deterministic=*/true);
    EXPECT_NE(json.find(shared ? "\"shared_remote\": true" : "\"shared_remote\": false"),
              std::string::npos);
  }
}

TEST(ServeTest, ClosedLoopSessionsWaitForTheirPreviousRequest) {
  // The session's second request comes 1 s after the first finished, not at its trace time 0.
  const Trace trace = MakeTrace({Req(0, 128, 2, {1, 2}, 1), Req(0, 192, 1, {1, 2, 3}, 1, 1.0)});
  ServeOptions o = HandOptions(ServeProfile::kHbmLru, 100);
  o.closed_loop = true;
  auto r = RunServe(trace, o);
  KVTIER_ASSERT_OK(r.status());
  const double first = PrefillStep(0, 128) + DecodeStep(128);
  const double second = PrefillStep(128, 64);
  EXPECT_NEAR(r->simulated_seconds, first + 1.0 + second, 1e-9);
  EXPECT_EQ(r->served_hit_tokens, 128);
}

// The oracle's idle time is the session's next arrival, open loop as closed: each of the
// session's first two releases is told it (before, the open loop told none, under the oracle's
// name).
TEST(ServeTest, TheOracleTellsTheIdleTimeInEitherLoop) {
  const Trace trace = MakeTrace({Req(0, 128, 2, {1, 2}, 1), Req(5, 192, 1, {1, 2, 3}, 1, 1.0),
                                 Req(9, 256, 1, {1, 2, 3, 4}, 1, 1.0)});
  for (bool closed : {true, false}) {
    SCOPED_TRACE(closed ? "closed loop" : "open loop");
    ServeOptions o = HandOptions(ServeProfile::kKvtier, 100, 100);
    o.kvtier_hints = ServeHints::kOracleIdle;
    o.closed_loop = closed;
    auto r = RunServe(trace, o);
    KVTIER_ASSERT_OK(r.status());
    EXPECT_EQ(r->finished, 3);
    EXPECT_EQ(r->oracle_idle_releases, 2);  // the last request has no next one
  }
}

// Two requests at once on two instances: the most HBM blocks running requests held, summed
// over the fleet as serve.h says (before, the largest single instance's).
TEST(ServeTest, TheRunningMaximumIsSummedOverTheFleet) {
  const Trace trace = MakeTrace({Req(0, 256, 2, {1, 2, 3, 4}), Req(0, 256, 2, {5, 6, 7, 8})});
  ServeOptions o = HandOptions(ServeProfile::kHbmLru, 100);
  o.instances = 2;
  o.router = RouterKind::kRoundRobin;
  auto r = RunServe(trace, o);
  KVTIER_ASSERT_OK(r.status());
  EXPECT_EQ(r->finished, 2);
  EXPECT_GE(r->hbm_running_blocks_max, 2 * 4);
}

TEST(ServeTest, TheAgenticWorkloadKeepsTheTokenIdentityAndHbmBoundsAndRunsAlike) {
  AgenticOptions a;
  a.sessions = 12;
  const Trace trace = GenerateAgenticWorkload(a);
  auto g = KvGeometry::Create({.num_layers = 32,
                               .num_kv_heads = 8,
                               .head_dim = 128,
                               .dtype = KvDtype::kBf16,
                               .tokens_per_block = 64});
  KVTIER_ASSERT_OK(g.status());
  for (ServeProfile p : kAllServeProfiles) {
    ServeOptions o(*g);
    o.model_name = "Llama-3.1-8B";
    o.cost = {.params = 8.03e9, .num_layers = 32, .d_model = 4096};
    o.roofline.gpu = *FindGpu("H100");
    o.profile = p;
    o.capacity_blocks = {2000, 4000, 8000, 0};
    o.max_requests = 150;
    auto r = RunServe(trace, o);
    KVTIER_ASSERT_OK(r.status());
    SCOPED_TRACE(r->profile);
    EXPECT_EQ(r->finished + r->failed, r->requests);
    EXPECT_EQ(r->requests, 150);
    EXPECT_LE(r->hbm_running_blocks_max, 2000);
    if (r->preemptions == 0) {
      EXPECT_EQ(r->prompt_tokens, r->served_hit_tokens + r->prefilled_tokens);
    }
    EXPECT_LE(r->served_hit_tokens, r->matched_tokens);
    auto again = RunServe(trace, o);
    KVTIER_ASSERT_OK(again.status());
    EXPECT_EQ(ServeJson({{*r}}, true), ServeJson({{*again}}, true));
  }
}

TEST(ServeTest, BadOptionsAreRefusedNamingTheOption) {
  const Trace trace = MakeTrace({Req(0, 128, 1, {1, 2})});
  ServeOptions o = HandOptions(ServeProfile::kHbmLru, 100);
  o.instances = 0;
  EXPECT_EQ(RunServe(trace, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = HandOptions(ServeProfile::kHbmLru, 100);
  o.onboard_deadline_seconds = 0;
  EXPECT_EQ(RunServe(trace, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = HandOptions(ServeProfile::kHbmLru, 100);
  o.scheduler.max_batched_tokens = 0;
  EXPECT_EQ(RunServe(trace, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = HandOptions(ServeProfile::kHbmLru, 100);
  o.roofline.mfu = 1.5;
  EXPECT_EQ(RunServe(trace, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = HandOptions(ServeProfile::kHbmLru, 0);
  o.roofline.gpu.hbm_bytes = 1e9;  // less than the weights
  EXPECT_EQ(RunServe(trace, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseServeProfile("vllm").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseRouter("nearest").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FindGpu("Z80").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(FindGpu("h200").ok());
}

// A lone request whose decode outgrows HBM (4 blocks of HBM, a 1-block prompt, 400 output
// tokens) preempts itself. Whatever the preemption mode, it must end finished or failed: the
// step that preempted it admits nothing, and with nothing else running no later step was ever
// scheduled, so it stayed queued (or swapped) for good and the run ended without it.
TEST(ServeTest, ALoneRequestThatOutgrowsHbmEndsFinishedOrFailed) {
  const Trace trace = MakeTrace({Req(0, 60, 400, {1})});
  for (bool swap : {false, true}) {
    SCOPED_TRACE(swap ? "swap" : "recompute");
    ServeOptions o = HandOptions(ServeProfile::kDramLru, 4, 64);
    o.scheduler.swap = swap;
    auto r = RunServe(trace, o);
    KVTIER_ASSERT_OK(r.status());
    EXPECT_EQ(r->requests, 1);
    EXPECT_EQ(r->finished + r->failed, r->requests)
        << "finished " << r->finished << ", failed " << r->failed;
  }
}

}  // namespace
}  // namespace kvtier::replay
