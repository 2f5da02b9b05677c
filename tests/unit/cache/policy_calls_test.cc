// What KvCache tells its eviction policy (kv_cache.h KvCacheOptions::make_eviction_policy,
// eviction_policy.h): a caller's policy, made per tier, sees each hint as the call the headers
// promise (Discard for an invalidation, Touch for a retention, the release's and the pause's
// observations, the session's return at a Resume).
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::Iota;
using ::kvtier::testing::IsError;
using ::kvtier::testing::KvCacheEnv;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr int kB = KvCacheEnv::kTokensPerBlock;

const char* StopName(StopReason r) {
  switch (r) {
    case StopReason::kToolUse:
      return "tool_use";
    case StopReason::kEndTurn:
      return "end_turn";
    case StopReason::kLength:
      return "length";
    case StopReason::kUnknown:
      return "unknown";
  }
  return "not_a_stop_reason";
}

// LRU that writes each call it gets into a log the test keeps: "Add", "Touch", "Remove",
// "Discard" (per key), "Request session=S blocks=N[ resumed]", "Release session=S stop=R
// idle=D[ superseded][ last_turn][ preempted]".
class RecordingPolicy final : public EvictionPolicy {
 public:
  explicit RecordingPolicy(std::shared_ptr<std::vector<std::string>> log)
      : lru_(MakeLruPolicy()), log_(std::move(log)) {}
  std::string_view name() const override { return "recording"; }
  bool reads_run_blocks() const override { return false; }
  bool observes_requests() const override { return true; }
  void ObserveRequest(const RequestObservation& r) override {
    log_->push_back(absl::StrCat("Request session=", r.session, " blocks=", r.blocks.size(),
                                 r.resumed ? " resumed" : ""));
  }
  void ObserveRelease(const ReleaseObservation& r) override {
    log_->push_back(absl::StrCat(
        "Release session=", r.session, " stop=", StopName(r.stop_reason),
        " idle=", r.expected_idle.has_value() ? absl::FormatDuration(*r.expected_idle) : "none",
        r.superseded ? " superseded" : "", r.last_turn ? " last_turn" : "",
        r.preempted ? " preempted" : ""));
  }
  absl::Status Add(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    log_->push_back("Add");
    return lru_->Add(key, traits, now);
  }
  absl::Status Touch(const BlockKey& key, const BlockTraits& traits, absl::Time now) override {
    log_->push_back("Touch");
    return lru_->Touch(key, traits, now);
  }
  absl::Status Remove(const BlockKey& key) override {
    log_->push_back("Remove");
    return lru_->Remove(key);
  }
  absl::Status Discard(const BlockKey& key) override {
    log_->push_back("Discard");
    return lru_->Remove(key);
  }
  std::optional<BlockKey> Victim(absl::Time now) override { return lru_->Victim(now); }
  int64_t size() const override { return lru_->size(); }

 private:
  std::unique_ptr<EvictionPolicy> lru_;
  std::shared_ptr<std::vector<std::string>> log_;
};

class PolicyCallsTest : public ::testing::Test {
 protected:
  // A cache of `hbm_blocks` HBM (and `dram_blocks` DRAM) blocks whose HBM policy logs to hbm_
  // and DRAM policy to dram_.
  void Make(int64_t hbm_blocks = 16, int64_t dram_blocks = 0,
            WritePolicy write_policy = WritePolicy::kWriteBack) {
    env_ = std::make_unique<KvCacheEnv>(
        testing::KvCacheTestConfig{.hbm_blocks = hbm_blocks, .dram_blocks = dram_blocks});
    auto cache = env_->NewCache([&](KvCacheOptions& o) {
      o.write_policy = write_policy;
      o.make_eviction_policy =
          [this](Tier tier,
                 int64_t stack_blocks) -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
        made_.push_back(absl::StrCat(std::string(TierName(tier)), ":", stack_blocks));
        auto log = tier == Tier::kHbm    ? hbm_
                   : tier == Tier::kDram ? dram_
                                         : std::make_shared<std::vector<std::string>>();
        return std::make_unique<RecordingPolicy>(std::move(log));
      };
    });
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
  }
  void TearDown() override {
    if (cache_ != nullptr) {
      KVTIER_EXPECT_OK(cache_->CheckInvariants());
    }
  }
  // A request of `session` with `tokens`, computed and written, not released.
  void RunWritten(uint64_t id, uint64_t session, const std::vector<int32_t>& tokens) {
    testing::RunWritten(*cache_, id, session, tokens);
  }
  // The HBM policy's calls since the last Take.
  std::vector<std::string> Take() { return std::exchange(*hbm_, {}); }
  // How many of `calls` are `name`.
  static int64_t Count(const std::vector<std::string>& calls, std::string_view name) {
    return std::count(calls.begin(), calls.end(), name);
  }

  std::shared_ptr<std::vector<std::string>> hbm_ = std::make_shared<std::vector<std::string>>();
  std::shared_ptr<std::vector<std::string>> dram_ = std::make_shared<std::vector<std::string>>();
  std::vector<std::string> made_;
  std::unique_ptr<KvCacheEnv> env_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(PolicyCallsTest, ThePolicyIsMadePerTierForTheBlocksDownToIt) {
  Make(/*hbm_blocks=*/16, /*dram_blocks=*/32);
  EXPECT_THAT(made_, ElementsAre("hbm:16", "dram:48"));
}

TEST_F(PolicyCallsTest, AFactoryThatGivesNoPolicyFailsCreate) {
  KvCacheEnv env(testing::KvCacheTestConfig{.hbm_blocks = 8});
  auto none = env.NewCache([](KvCacheOptions& o) {
    o.make_eviction_policy = [](Tier, int64_t) -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
      return nullptr;
    };
  });
  EXPECT_THAT(none, IsError(StatusCode::kInvalidArgument, "no policy for the hbm tier"));
  auto failed = env.NewCache([](KvCacheOptions& o) {
    o.eviction_policy = "no such policy";  // not read: the factory decides
    o.make_eviction_policy = [](Tier, int64_t) -> absl::StatusOr<std::unique_ptr<EvictionPolicy>> {
      return absl::UnavailableError("model file missing");
    };
  });
  EXPECT_THAT(failed, IsError(StatusCode::kInvalidArgument, "model file missing"));
}

// InvalidatePrefix drops the candidates it names through Discard (dropped unused on the caller's
// word), never Remove (which cost_aware would count as a reuse).
TEST_F(PolicyCallsTest, AnInvalidatedCandidateIsDiscarded) {
  Make();
  const std::vector<int32_t> context = Iota(3 * kB, 100);
  RunWritten(1, /*session=*/7, context);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  const std::vector<std::string> released = Take();
  EXPECT_EQ(Count(released, "Add"), 1);  // the leaf: its parents are not droppable yet
  auto o = cache_->InvalidatePrefix(context, 0);
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->blocks, 3);
  const std::vector<std::string> calls = Take();
  EXPECT_EQ(Count(calls, "Discard"), 3);
  EXPECT_EQ(Count(calls, "Remove"), 0);
}

// RetainPrefix re-ranks the registered copies by a Touch: no Remove and Add (a reuse to
// cost_aware), and nothing for unregistered blocks.
TEST_F(PolicyCallsTest, ARetainedCandidateIsTouchedNotRemoved) {
  Make();
  const std::vector<int32_t> context = Iota(3 * kB, 100);
  RunWritten(1, /*session=*/7, context);
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
  Take();
  auto o = cache_->RetainPrefix(context, /*priority=*/2, absl::Minutes(1));
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->blocks, 3);
  EXPECT_THAT(Take(), ElementsAre("Touch"));
}

// A release's hints reach the policy as taken: a preempted release with last_turn is preempted
// without it; a superseded release keeps its estimate, and its last_turn is not used.
TEST_F(PolicyCallsTest, AReleaseReachesThePolicyWithTheHintsTaken) {
  Make();
  RunWritten(1, /*session=*/7, Iota(2 * kB, 100));
  Take();
  auto o = cache_->Release(
      SequenceId(1), {.stop_reason = StopReason::kLength, .preempted = true, .last_turn = true});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kClipped);
  EXPECT_THAT(Take(), Contains("Release session=7 stop=length idle=none preempted"));
  RunWritten(2, /*session=*/8, Iota(2 * kB, 300));
  RunWritten(3, /*session=*/8, Iota(2 * kB, 500));  // a later request of session 8
  Take();
  o = cache_->Release(
      SequenceId(2),
      {.stop_reason = StopReason::kToolUse, .expected_idle = absl::Seconds(5), .last_turn = true});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kClipped);
  EXPECT_THAT(Take(), Contains("Release session=8 stop=tool_use idle=5s superseded"));
  // A stop reason past the enum reaches no policy as such (found by review: it was passed on
  // as given, and a policy may index a table by it): unknown, the estimate still taken.
  RunWritten(4, /*session=*/9, Iota(2 * kB, 700));
  Take();
  o = cache_->Release(SequenceId(4), {.stop_reason = static_cast<StopReason>(200),
                                      .expected_idle = absl::Seconds(2)});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kRejected);
  EXPECT_THAT(Take(), Contains("Release session=9 stop=unknown idle=2s"));
  // With a bad estimate too, the answer names both.
  RunWritten(5, /*session=*/10, Iota(2 * kB, 900));
  o = cache_->Release(SequenceId(5), {.stop_reason = static_cast<StopReason>(200),
                                      .expected_idle = absl::Seconds(-1)});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kRejected);
  EXPECT_THAT(o->reason, ::testing::AllOf(::testing::HasSubstr("stop_reason 200"),
                                          ::testing::HasSubstr("expected_idle")));
}

// Found by review: a request released after a later request of its session had let go (two
// parallel requests, released out of order) was not superseded, so the policy learned a "return"
// of milliseconds that never happened.
TEST_F(PolicyCallsTest, AnEarlierRequestReleasedAfterItsSuccessorIsSuperseded) {
  Make();
  RunWritten(1, /*session=*/8, Iota(2 * kB, 100));
  RunWritten(2, /*session=*/8, Iota(3 * kB, 300));
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(2)));
  Take();
  auto o = cache_->Release(SequenceId(1), {.stop_reason = StopReason::kToolUse});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_THAT(Take(), Contains("Release session=8 stop=tool_use idle=none superseded"));
}

// A tool wait: the pause is a tool-use release with its estimate, and the Resume the session's
// return. A swap preemption: a preempted release of unknown stop reason, counted, and a Resume
// the policy does not hear of (a readmission).
TEST_F(PolicyCallsTest, APauseAndItsResumeTellThePolicyWhatKindOfWaitItWas) {
  Make(/*hbm_blocks=*/16, /*dram_blocks=*/16);
  RunWritten(1, /*session=*/7, Iota(2 * kB, 100));
  Take();
  auto o = cache_->Pause(SequenceId(1), PauseHints{.expected_idle = absl::Seconds(3)});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kAccepted) << o->reason;
  EXPECT_EQ(o->blocks, 2);
  KVTIER_ASSERT_OK(cache_->WaitIdle());
  EXPECT_THAT(Take(), Contains("Release session=7 stop=tool_use idle=3s"));
  auto resumed = cache_->Resume(SequenceId(1));
  KVTIER_ASSERT_OK(resumed.status());
  KVTIER_ASSERT_OK(resumed->Wait());
  EXPECT_THAT(Take(), Contains("Request session=7 blocks=0 resumed"));
  EXPECT_EQ(cache_->stats().preemptions, 0);

  o = cache_->Pause(SequenceId(1), PauseHints{.preempted = true});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kAccepted) << o->reason;
  KVTIER_ASSERT_OK(cache_->WaitIdle());
  EXPECT_THAT(Take(), Contains("Release session=7 stop=unknown idle=none preempted"));
  EXPECT_EQ(cache_->stats().preemptions, 1);
  resumed = cache_->Resume(SequenceId(1));
  KVTIER_ASSERT_OK(resumed.status());
  KVTIER_ASSERT_OK(resumed->Wait());
  EXPECT_THAT(Take(), Not(Contains(::testing::StartsWith("Request"))));
  // A tool wait after a preemption is a tool wait again.
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(1), PauseHints{}).status());
  KVTIER_ASSERT_OK(cache_->WaitIdle());
  resumed = cache_->Resume(SequenceId(1));
  KVTIER_ASSERT_OK(resumed.status());
  KVTIER_ASSERT_OK(resumed->Wait());
  EXPECT_THAT(Take(), Contains("Request session=7 blocks=0 resumed"));
  // A failed Resume tells nothing.
  EXPECT_THAT(cache_->Resume(SequenceId(1)),
              IsError(StatusCode::kFailedPrecondition, "not paused"));
  EXPECT_THAT(Take(), IsEmpty());
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1)));
}

// A paused request whose session went on (a later request of it is live) resumes without
// announcing the session's return: the later request was it.
TEST_F(PolicyCallsTest, TheResumeOfASupersededPauseIsNoReturn) {
  Make(/*hbm_blocks=*/16, /*dram_blocks=*/16);
  RunWritten(1, /*session=*/7, Iota(2 * kB, 100));
  KVTIER_ASSERT_OK(cache_->Pause(SequenceId(1), absl::Seconds(3)));
  KVTIER_ASSERT_OK(cache_->WaitIdle());
  RunWritten(2, /*session=*/7, Iota(3 * kB, 100));
  Take();
  auto resumed = cache_->Resume(SequenceId(1));
  KVTIER_ASSERT_OK(resumed.status());
  KVTIER_ASSERT_OK(resumed->Wait());
  EXPECT_THAT(Take(), Not(Contains(::testing::StartsWith("Request"))));
  for (uint64_t id : {1, 2}) KVTIER_ASSERT_OK(cache_->Release(SequenceId(id)));
}

// Pause's outcomes: a sequence without a session is paused, the hint rejected; an estimate out
// of range is rejected and the pause happens without it; the errors are Pause's.
TEST_F(PolicyCallsTest, PauseAnswersItsHintsWithTheirOutcome) {
  Make(/*hbm_blocks=*/16, /*dram_blocks=*/16);
  RunWritten(1, /*session=*/0, Iota(kB, 100));
  auto o = cache_->Pause(SequenceId(1), PauseHints{.preempted = true});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kRejected);
  EXPECT_THAT(o->reason, HasSubstr("no session"));
  EXPECT_EQ(cache_->stats().preemptions, 1);  // counted whatever the outcome
  EXPECT_THAT(cache_->Pause(SequenceId(1), PauseHints{}),
              IsError(StatusCode::kFailedPrecondition, "is paused"));
  // Caching off: an error, and no preemption counted.
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(4), {.session = 7, .enable_caching = false}));
  KVTIER_ASSERT_OK(cache_->Append(SequenceId(4), Iota(kB, 700)).status());
  EXPECT_THAT(cache_->Pause(SequenceId(4), PauseHints{.preempted = true}),
              IsError(StatusCode::kFailedPrecondition, "caching off"));
  EXPECT_EQ(cache_->stats().preemptions, 1);
  RunWritten(2, /*session=*/7, Iota(kB, 300));
  Take();
  o = cache_->Pause(SequenceId(2), PauseHints{.expected_idle = -absl::Seconds(1)});
  KVTIER_ASSERT_OK(o.status());
  EXPECT_EQ(o->result, HintOutcome::Result::kRejected);
  EXPECT_THAT(o->reason, HasSubstr("expected_idle"));
  EXPECT_THAT(Take(), Contains("Release session=7 stop=tool_use idle=none"));
  EXPECT_THAT(cache_->Pause(SequenceId(9), PauseHints{}), IsError(StatusCode::kNotFound, ""));
  // The duration form keeps its error for a negative estimate.
  RunWritten(3, /*session=*/7, Iota(kB, 500));
  EXPECT_THAT(cache_->Pause(SequenceId(3), -absl::Seconds(1)),
              IsError(StatusCode::kInvalidArgument, "must not be negative"));
  for (uint64_t id : {1, 2, 3, 4}) KVTIER_ASSERT_OK(cache_->Release(SequenceId(id)));
}

// A readmission's attach is its own KV coming back: the DRAM policy hears no Touch of the
// blocks' lower copies (before, each was touched as a use). Another request's attach of the
// same blocks is a use, and touches them.
TEST_F(PolicyCallsTest, AReadmissionTouchesNoLowerCopy) {
  Make(/*hbm_blocks=*/16, /*dram_blocks=*/16, WritePolicy::kWriteThrough);
  const std::vector<int32_t> context = Iota(2 * kB, 100);
  RunWritten(1, /*session=*/7, context);
  KVTIER_ASSERT_OK(cache_->WaitIdle());  // the write-through copies are in DRAM
  KVTIER_ASSERT_OK(cache_->Release(SequenceId(1), {.preempted = true}).status());
  std::vector<int32_t> query = context;
  query.push_back(1);
  dram_->clear();
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(2), {.session = 7, .readmission = true}));
  KVTIER_ASSERT_OK_AND_ASSIGN(AttachResult r, cache_->AttachPrefix(SequenceId(2), query));
  EXPECT_EQ(r.attached_tokens, 2 * kB);
  EXPECT_EQ(Count(*dram_, "Touch"), 0);
  KVTIER_ASSERT_OK(cache_->CreateSequence(SequenceId(3), {.session = 8}));
  KVTIER_ASSERT_OK(cache_->AttachPrefix(SequenceId(3), query).status());
  EXPECT_EQ(Count(*dram_, "Touch"), 1);  // the leaf's copy: the only DRAM candidate
  for (uint64_t id : {2, 3}) KVTIER_ASSERT_OK(cache_->Release(SequenceId(id)));
}

}  // namespace
}  // namespace kvtier
