// The reuse_index policy (eviction_policy.h): classes learned from ObserveRequest, the
// oldest-first cold start, the parent-follows rule and the interface's errors.
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/eviction_policy.h"
#include "tests/testing/policy_testing.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

using ::kvtier::testing::At;
using ::kvtier::testing::Key;
BlockTraits Child(BlockKey parent) { return {.parent = parent}; }

void Observe(EvictionPolicy& p, std::vector<BlockKey> blocks, absl::Time now,
             uint64_t session = 0) {
  p.ObserveRequest({.blocks = blocks, .now = now, .session = session});
}

// What an agent's turn shows the policy: `session` reads `blocks` at `read` and lets them go at
// `release` with `stop` and the given hints.
struct ReleaseHintsForTest {  // in ReleaseObservation's order
  bool superseded = false;
  bool last_turn = false;
  bool preempted = false;
};
void ReadAndRelease(EvictionPolicy& p, const std::vector<BlockKey>& blocks, uint64_t session,
                    double read, double release, StopReason stop = StopReason::kToolUse,
                    ReleaseHintsForTest hints = {}) {
  p.ObserveRequest({.blocks = blocks, .now = At(read), .session = session});
  p.ObserveRelease({.blocks = blocks,
                    .now = At(release),
                    .session = session,
                    .stop_reason = stop,
                    .superseded = hints.superseded,
                    .last_turn = hints.last_turn,
                    .preempted = hints.preempted});
}

std::unique_ptr<EvictionPolicy> Make(int sample_size = 0) {
  auto p = MakeReuseIndexPolicy({.sample_size = sample_size});
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

TEST(ReuseIndexPolicyTest, NamedAndObservesRequests) {
  auto p = Make();
  EXPECT_EQ(p->name(), "reuse_index");
  EXPECT_TRUE(p->observes_requests());
  EXPECT_FALSE(p->reads_run_blocks());
  auto by_name = MakeEvictionPolicy("reuse_index");
  KVTIER_ASSERT_OK(by_name.status());
  EXPECT_EQ((*by_name)->name(), "reuse_index");
}

TEST(ReuseIndexPolicyTest, ColdStartIsOldestFirst) {
  auto p = Make();
  EXPECT_FALSE(p->Victim(At(0)).has_value());
  for (uint64_t i = 0; i < 3; ++i) {
    Observe(*p, {Key(10 + i), Key(i)}, At(static_cast<double>(i)));
  }
  KVTIER_ASSERT_OK(p->Add(Key(2), Child(Key(12)), At(2)));
  KVTIER_ASSERT_OK(p->Add(Key(0), Child(Key(10)), At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(1), Child(Key(11)), At(1)));
  EXPECT_EQ(p->size(), 3);
  EXPECT_EQ(p->Victim(At(3)), Key(0));
  KVTIER_ASSERT_OK(p->Remove(Key(0)));
  EXPECT_EQ(p->Victim(At(4)), Key(1));
  // A request naming block 1 again makes it the youngest.
  Observe(*p, {Key(11), Key(1)}, At(5));
  EXPECT_EQ(p->Victim(At(6)), Key(2));
}

// Block 5 was last accessed at 5, after block 9 (at 1), but the victim's parent follows it when
// it ranks no higher: with no data every rank is 0.
TEST(ReuseIndexPolicyTest, TheVictimsParentFollowsIt) {
  auto p = Make();
  Observe(*p, {Key(5), Key(6)}, At(0));
  Observe(*p, {Key(9)}, At(1));
  Observe(*p, {Key(5)}, At(5));
  KVTIER_ASSERT_OK(p->Add(Key(6), Child(Key(5)), At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(9), {}, At(1)));
  ASSERT_EQ(p->Victim(At(10)), Key(6));
  KVTIER_ASSERT_OK(p->Remove(Key(6)));
  KVTIER_ASSERT_OK(p->Add(Key(5), {}, At(5)));  // its last child gone: a leaf
  EXPECT_EQ(p->Victim(At(10)), Key(5));         // not 9, the oldest
  // At a later time the rule no longer applies: oldest first again.
  EXPECT_EQ(p->Victim(At(11)), Key(9));
}

// Train: every 30 s a request names a root block R and a fresh child; R comes back each time,
// no child ever does. Once the tables know it, an old R outranks a young child, which
// oldest-first would keep.
TEST(ReuseIndexPolicyTest, LearnsWhichClassComesBack) {
  auto p = Make();
  const BlockKey root = Key(1);
  uint64_t next = 100;
  for (int s = 0; s <= 1200; s += 30) Observe(*p, {root, Key(next++)}, At(s));
  const BlockKey child = Key(next++);
  Observe(*p, {Key(7000), child}, At(1215));
  KVTIER_ASSERT_OK(p->Add(root, {}, At(1200)));
  KVTIER_ASSERT_OK(p->Add(child, Child(Key(7000)), At(1215)));
  EXPECT_EQ(p->Victim(At(1225)), child);  // R is 25 s old, the child 10 s
  // The same pair on a fresh policy, with no data: oldest first.
  auto cold = Make();
  KVTIER_ASSERT_OK(cold->Add(root, {}, At(1200)));
  KVTIER_ASSERT_OK(cold->Add(child, Child(Key(7000)), At(1215)));
  EXPECT_EQ(cold->Victim(At(1225)), root);
}

// A session that sent a request without a block it released has moved on (a compaction): the
// block goes first, before older blocks of sessions still away.
TEST(ReuseIndexPolicyTest, ABlockItsSessionMovedOnFromGoesFirst) {
  auto p = Make();
  ReadAndRelease(*p, {Key(1), Key(2)}, /*session=*/10, /*read=*/0, /*release=*/0);
  ReadAndRelease(*p, {Key(3)}, /*session=*/11, /*read=*/1, /*release=*/1);
  KVTIER_ASSERT_OK(p->Add(Key(2), Child(Key(1)), At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(3), {}, At(1)));
  EXPECT_EQ(p->Victim(At(2)), Key(2));  // no data: oldest first
  // Session 11 comes back with another prompt, without block 3.
  Observe(*p, {Key(4)}, At(3), /*session=*/11);
  EXPECT_EQ(p->Victim(At(4)), Key(3));
}

// A release on the session's last turn (ReleaseHints::last_turn): its block goes first, before
// an older one, with no chance of reuse; if the session comes back after all and releases
// again without the hint, its blocks rank as any.
TEST(ReuseIndexPolicyTest, ABlockReleasedOnTheLastTurnGoesFirst) {
  auto p = Make();
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/0, /*release=*/0);
  ReadAndRelease(*p, {Key(3)}, /*session=*/11, /*read=*/1, /*release=*/1, StopReason::kEndTurn,
                 {.last_turn = true});
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(3), {}, At(1)));
  EXPECT_EQ(p->Victim(At(2)), Key(3));  // oldest-first would take block 1
  EXPECT_EQ(p->ReuseChance(Key(3), absl::InfiniteDuration(), At(2)), 0.0);
  EXPECT_NE(p->ReuseChance(Key(1), absl::InfiniteDuration(), At(2)), 0.0);
  // Session 11 comes back with block 3 and lets it go again, without the hint.
  KVTIER_ASSERT_OK(p->Remove(Key(3)));
  ReadAndRelease(*p, {Key(3)}, /*session=*/11, /*read=*/5, /*release=*/6);
  KVTIER_ASSERT_OK(p->Add(Key(3), {}, At(5)));
  EXPECT_EQ(p->Victim(At(7)), Key(1));  // no data: oldest first again
}

// A retention outranks what the policy infers: a retained block of a session that moved on
// (here, a last_turn release) keeps its priority and is not first to go, and while the
// retention lasts the policy gives no reuse chance (the cache demotes it rather than drop it).
// When the retention ends it goes first again.
TEST(ReuseIndexPolicyTest, ARetainedBlockOfASessionThatMovedOnKeepsItsPriority) {
  auto p = Make();
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/0, /*release=*/0);
  ReadAndRelease(*p, {Key(3)}, /*session=*/11, /*read=*/1, /*release=*/1, StopReason::kEndTurn,
                 {.last_turn = true});
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(3), {}, At(1)));
  ASSERT_EQ(p->Victim(At(2)), Key(3));
  KVTIER_ASSERT_OK(p->Touch(Key(3), {.retention_priority = 2, .priority_until = At(100)}, At(1)));
  EXPECT_EQ(p->Victim(At(2)), Key(1));
  EXPECT_EQ(p->ReuseChance(Key(3), absl::InfiniteDuration(), At(2)), std::nullopt);
  EXPECT_EQ(p->Victim(At(101)), Key(3));
  EXPECT_EQ(p->ReuseChance(Key(3), absl::InfiniteDuration(), At(101)), 0.0);
}

// A block another session let go before (a shared prefix) keeps that session's rank when a
// sub-agent releases it on its last turn. Blocks 5 (session 12, accessed at 0) and 1 (session 10,
// then read by 11 at 1) are candidates; with no data both rank 0 and the older, 5, goes first.
// Were 1 ranked as session 11's last turn (-1), it would go first.
TEST(ReuseIndexPolicyTest, ALastTurnLeavesASharedBlockToTheOtherSession) {
  auto p = Make();
  ReadAndRelease(*p, {Key(5)}, /*session=*/12, /*read=*/0, /*release=*/0);
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/0.5, /*release=*/0.5);
  ReadAndRelease(*p, {Key(1), Key(2)}, /*session=*/11, /*read=*/1, /*release=*/2,
                 StopReason::kEndTurn, {.last_turn = true});
  KVTIER_ASSERT_OK(p->Add(Key(5), {}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(1)));
  EXPECT_EQ(p->Victim(At(3)), Key(5));
  EXPECT_EQ(p->ReuseChance(Key(2), absl::InfiniteDuration(), At(3)), 0.0);
}

// A block a request reads after a last_turn release (another session's prompt sharing it, or one
// with no session, which releases nothing the policy sees) is wanted again: it no longer goes
// first. Block 3 was released on session 11's last turn at 1, then read at 2; block 1 (session
// 10, accessed at 0) is older, so it goes first.
TEST(ReuseIndexPolicyTest, AReadAfterTheLastTurnKeepsTheBlock) {
  auto p = Make();
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/0, /*release=*/0);
  ReadAndRelease(*p, {Key(3)}, /*session=*/11, /*read=*/0.5, /*release=*/1, StopReason::kEndTurn,
                 {.last_turn = true});
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(3), {}, At(0.5)));
  EXPECT_EQ(p->Victim(At(1.5)), Key(3));
  Observe(*p, {Key(3)}, At(2));  // no session
  EXPECT_EQ(p->Victim(At(3)), Key(1));
  EXPECT_NE(p->ReuseChance(Key(3), absl::InfiniteDuration(), At(3)), std::optional<double>(0.0));
}

// Session 10 let block 1 go (tool_use); session 11 read it with block 2 and let both go, then
// read them again and let them go on its last turn. Block 2 was only 11's: it goes first (-1).
// Block 1 waits for session 10's return again, as if 11 had never claimed it: with no data it
// ranks 0, and block 5 (session 12, accessed at 0) is older, so it goes before block 1.
TEST(ReuseIndexPolicyTest, ASharedBlockGoesBackToTheEarlierSessionWhenTheLaterOneEnds) {
  auto p = Make();
  ReadAndRelease(*p, {Key(5)}, /*session=*/12, /*read=*/0, /*release=*/0);
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/0.5, /*release=*/0.5);
  ReadAndRelease(*p, {Key(1), Key(2)}, /*session=*/11, /*read=*/1, /*release=*/2);
  ReadAndRelease(*p, {Key(1), Key(2)}, /*session=*/11, /*read=*/3, /*release=*/4,
                 StopReason::kEndTurn, {.last_turn = true});
  KVTIER_ASSERT_OK(p->Add(Key(5), {}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(3)));
  EXPECT_EQ(p->ReuseChance(Key(2), absl::InfiniteDuration(), At(5)), 0.0);
  EXPECT_NE(p->ReuseChance(Key(1), absl::InfiniteDuration(), At(5)), std::optional<double>(0.0));
  EXPECT_EQ(p->Victim(At(5)), Key(5));
  // Once session 10 ends too, block 1 waits for nobody.
  KVTIER_ASSERT_OK(p->Remove(Key(1)));
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/6, /*release=*/7, StopReason::kEndTurn,
                 {.last_turn = true});
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(6)));
  EXPECT_EQ(p->ReuseChance(Key(1), absl::InfiniteDuration(), At(8)), 0.0);
  EXPECT_EQ(p->Victim(At(8)), Key(1));
}

// The earlier claim comes back only while its session may still return. Session 10 let block 1
// go on its last turn; session 20 let block 2 go and then sent a request without it. Sessions 11
// and 21 read those blocks, let them go, and end: both blocks wait for nobody.
TEST(ReuseIndexPolicyTest, AnEarlierClaimWhoseSessionEndedOrMovedOnDoesNotComeBack) {
  auto p = Make();
  const absl::Duration ever = absl::InfiniteDuration();
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/0, /*release=*/1, StopReason::kEndTurn,
                 {.last_turn = true});
  ReadAndRelease(*p, {Key(1)}, /*session=*/11, /*read=*/2, /*release=*/3);
  ReadAndRelease(*p, {Key(1)}, /*session=*/11, /*read=*/4, /*release=*/5, StopReason::kEndTurn,
                 {.last_turn = true});
  EXPECT_EQ(p->ReuseChance(Key(1), ever, At(6)), 0.0);
  ReadAndRelease(*p, {Key(2)}, /*session=*/20, /*read=*/6, /*release=*/6);
  Observe(*p, {Key(9)}, At(7), /*session=*/20);
  ReadAndRelease(*p, {Key(2)}, /*session=*/21, /*read=*/8, /*release=*/9);
  ReadAndRelease(*p, {Key(2)}, /*session=*/21, /*read=*/10, /*release=*/11, StopReason::kEndTurn,
                 {.last_turn = true});
  EXPECT_EQ(p->ReuseChance(Key(2), ever, At(12)), 0.0);
}

// A preempted request's release (it comes back as a readmission, which no ObserveRequest
// announces) claims its blocks for its session as any release does: block 1, let go by session
// 20 and read by session 21's request, waits for 21's return after 21 is preempted, although 20
// has moved on from it.
TEST(ReuseIndexPolicyTest, APreemptedReleaseClaimsItsBlocks) {
  auto p = Make();
  ReadAndRelease(*p, {Key(1)}, /*session=*/20, /*read=*/0, /*release=*/0);
  Observe(*p, {Key(1), Key(2)}, At(1), /*session=*/21);
  Observe(*p, {Key(5)}, At(2), /*session=*/20);  // 20 moved on from block 1
  std::vector<BlockKey> blocks = {Key(1), Key(2)};
  p->ObserveRelease({.blocks = blocks, .now = At(3), .session = 21, .preempted = true});
  EXPECT_NE(p->ReuseChance(Key(1), absl::InfiniteDuration(), At(4)), std::optional<double>(0.0));
}

// ... but it is no release of the session: nothing is learned of its return. 40 sessions each
// read a block and are preempted; the readmission lets it go 100 s later (tool_use), and no
// session comes back. Were the preemption a release, each would have "come back" at the
// readmission's release (released again, no request between), and tool_use releases would look
// likely to return within 200 s; as it is, every tool_use release is a life with no return.
TEST(ReuseIndexPolicyTest, APreemptedReleaseTeachesNothingOfItsSession) {
  auto p = Make();
  double t = 0;
  for (uint64_t s = 1; s <= 40; ++s, t += 300) {
    const std::vector<BlockKey> blocks = {Key(s)};
    p->ObserveRequest({.blocks = blocks, .now = At(t), .session = s});
    p->ObserveRelease({.blocks = blocks,
                       .now = At(t + 1),
                       .session = s,
                       .stop_reason = StopReason::kToolUse,
                       .preempted = true});
    p->ObserveRelease(
        {.blocks = blocks, .now = At(t + 101), .session = s, .stop_reason = StopReason::kToolUse});
  }
  // The last session's block, 1 s after its release.
  KVTIER_ASSERT_OK(p->Add(Key(40), {}, At(t - 300)));
  const std::optional<double> chance = p->ReuseChance(Key(40), absl::Seconds(200), At(t - 198));
  ASSERT_TRUE(chance.has_value());
  EXPECT_LT(*chance, 0.1);
}

// A session not heard of for `history` is forgotten (a return later than that counts as none):
// the block it let go counts as moved on from, as if the session had said so.
TEST(ReuseIndexPolicyTest, ABlockOfAForgottenSessionGoesFirst) {
  auto p = MakeReuseIndexPolicy({.history = absl::Seconds(10)});
  ASSERT_TRUE(p.ok()) << p.status();
  EvictionPolicy& policy = **p;
  Observe(policy, {Key(3)}, At(0));
  ReadAndRelease(policy, {Key(1)}, /*session=*/10, /*read=*/1, /*release=*/1);
  KVTIER_ASSERT_OK(policy.Add(Key(3), {}, At(0)));
  KVTIER_ASSERT_OK(policy.Add(Key(1), {}, At(1)));
  EXPECT_NE(policy.ReuseChance(Key(1), absl::InfiniteDuration(), At(5)),
            std::optional<double>(0.0));
  EXPECT_EQ(policy.Victim(At(5)), Key(3));  // no data: oldest first
  // At 12 session 10 was last heard of 11 s ago: forgotten. Block 3 (no session) is older, but
  // it waits for nobody's word.
  ReadAndRelease(policy, {Key(7)}, /*session=*/11, /*read=*/12, /*release=*/12);
  EXPECT_EQ(policy.ReuseChance(Key(1), absl::InfiniteDuration(), At(12)), 0.0);
  EXPECT_EQ(policy.Victim(At(12)), Key(1));
  // Heard of again under its id by a release alone (a readmission's, which no request
  // announces): a session new to the policy, which never let block 1 go.
  const std::vector<BlockKey> other = {Key(8)};
  policy.ObserveRelease({.blocks = other, .now = At(13), .session = 10});
  EXPECT_EQ(policy.ReuseChance(Key(1), absl::InfiniteDuration(), At(13)), 0.0);
}

// A session forgotten (not heard of for `history`) that comes back with a request naming its
// block: the block is read now, so it is not one the session moved on from.
TEST(ReuseIndexPolicyTest, AForgottenSessionBackWithARequestKeepsTheBlocksItReads) {
  auto p = MakeReuseIndexPolicy({.history = absl::Seconds(10)});
  ASSERT_TRUE(p.ok()) << p.status();
  EvictionPolicy& policy = **p;
  ReadAndRelease(policy, {Key(1), Key(2)}, /*session=*/10, /*read=*/0, /*release=*/0);
  // Both candidates (block 1's copy in a lower tier, say), so their records stay.
  KVTIER_ASSERT_OK(policy.Add(Key(1), {}, At(0)));
  KVTIER_ASSERT_OK(policy.Add(Key(2), Child(Key(1)), At(0)));
  Observe(policy, {Key(1)}, At(20), /*session=*/10);  // forgotten at 20, then back
  EXPECT_NE(policy.ReuseChance(Key(1), absl::InfiniteDuration(), At(20)),
            std::optional<double>(0.0));
  EXPECT_EQ(policy.ReuseChance(Key(2), absl::InfiniteDuration(), At(20)), 0.0);
}

// A session whose paused sequence resumed (RequestObservation::resumed, no blocks) is back, and
// has not moved on from the blocks it let go: they keep their claim. A request naming no block
// is a move away from them.
TEST(ReuseIndexPolicyTest, AResumedSessionHasNotMovedOnFromItsBlocks) {
  auto p = Make();
  Observe(*p, {Key(2)}, At(0));  // older, and waiting for nobody
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/1, /*release=*/2);
  KVTIER_ASSERT_OK(p->Add(Key(2), {}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(2)));
  p->ObserveRequest({.now = At(5), .session = 10, .resumed = true});
  EXPECT_EQ(p->Victim(At(6)), Key(2));  // no data: oldest first
  Observe(*p, {}, At(7), /*session=*/10);
  EXPECT_EQ(p->ReuseChance(Key(1), absl::InfiniteDuration(), At(8)), 0.0);
  EXPECT_EQ(p->Victim(At(8)), Key(1));
}

// A resume is the session's return: tool-use releases resumed 2 s later teach that the session
// comes back within seconds, as requests naming the blocks would.
TEST(ReuseIndexPolicyTest, AResumeTeachesTheSessionsReturn) {
  auto resumed = Make();
  auto silent = Make();
  for (int i = 0; i < 40; ++i) {
    const double t = 10.0 * i;
    const std::vector<BlockKey> blocks = {Key(static_cast<uint64_t>(100 + i))};
    for (EvictionPolicy* p : {resumed.get(), silent.get()}) {
      ReadAndRelease(*p, blocks, /*session=*/static_cast<uint64_t>(1 + i), t, t + 1);
    }
    resumed->ObserveRequest(
        {.now = At(t + 3), .session = static_cast<uint64_t>(1 + i), .resumed = true});
  }
  const std::vector<BlockKey> last = {Key(1000)};
  for (EvictionPolicy* p : {resumed.get(), silent.get()}) {
    ReadAndRelease(*p, last, /*session=*/99, 500, 501);
    KVTIER_ASSERT_OK(p->Add(Key(1000), {}, At(501)));
  }
  const std::optional<double> back = resumed->ReuseChance(Key(1000), absl::Seconds(5), At(501));
  ASSERT_TRUE(back.has_value());
  EXPECT_GT(*back, 0.9);
  const std::optional<double> unknown = silent->ReuseChance(Key(1000), absl::Seconds(5), At(501));
  EXPECT_TRUE(!unknown.has_value() || *unknown < 0.1) << *unknown;
}

// A claim of a session that has moved on does not push out a live earlier one: session 10 lets
// block 1 go and may come back; 11 lets it go and moves on; 12 lets it go and ends. Block 1
// waits for session 10 again.
TEST(ReuseIndexPolicyTest, ADeadClaimDoesNotPushOutALiveEarlierOne) {
  auto p = Make();
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/0, /*release=*/1);
  ReadAndRelease(*p, {Key(1)}, /*session=*/11, /*read=*/1.5, /*release=*/2);
  Observe(*p, {Key(5)}, At(2.5), /*session=*/11);
  ReadAndRelease(*p, {Key(1)}, /*session=*/12, /*read=*/3, /*release=*/3.5);
  ReadAndRelease(*p, {Key(1)}, /*session=*/12, /*read=*/4, /*release=*/5, StopReason::kEndTurn,
                 {.last_turn = true});
  EXPECT_NE(p->ReuseChance(Key(1), absl::InfiniteDuration(), At(6)), std::optional<double>(0.0));
}

// A candidate whose last access is older than `history` stays remembered while it is a
// candidate, and through a brief unregistering (Removed and Added again before the next Prune: a
// transfer reading its copy); the first Prune after its Remove forgets it (no record:
// ReuseChance nullopt). A block accessed within `history` is remembered after its Remove. Both
// were let go on their session's last turn, so a remembered one has reuse chance 0.
TEST(ReuseIndexPolicyTest, ACandidateOlderThanHistoryIsForgottenOnceRemoved) {
  auto p = MakeReuseIndexPolicy({.history = absl::Seconds(10)});
  ASSERT_TRUE(p.ok()) << p.status();
  EvictionPolicy& policy = **p;
  const absl::Duration ever = absl::InfiniteDuration();
  ReadAndRelease(policy, {Key(1)}, /*session=*/10, /*read=*/0, /*release=*/0, StopReason::kEndTurn,
                 {.last_turn = true});
  KVTIER_ASSERT_OK(policy.Add(Key(1), {}, At(0)));
  // At 20 what is older than 10 s and not a candidate is forgotten.
  ReadAndRelease(policy, {Key(3)}, /*session=*/11, /*read=*/20, /*release=*/20,
                 StopReason::kEndTurn, {.last_turn = true});
  KVTIER_ASSERT_OK(policy.Add(Key(3), {}, At(20)));
  EXPECT_EQ(policy.ReuseChance(Key(1), ever, At(20)), 0.0);
  KVTIER_ASSERT_OK(policy.Remove(Key(1)));
  KVTIER_ASSERT_OK(policy.Add(Key(1), {}, At(0)));
  Observe(policy, {Key(4)}, At(21));
  EXPECT_EQ(policy.ReuseChance(Key(1), ever, At(21)), 0.0);
  KVTIER_ASSERT_OK(policy.Remove(Key(1)));
  KVTIER_ASSERT_OK(policy.Remove(Key(3)));
  Observe(policy, {Key(4)}, At(22));
  EXPECT_EQ(policy.ReuseChance(Key(1), ever, At(22)), std::nullopt);
  EXPECT_EQ(policy.ReuseChance(Key(3), ever, At(22)), 0.0);
}

// What the policy keeps grows with the blocks and sessions it tracks, not with how often they
// are read: a hot prefix read by 100,000 requests holds one forgetting entry per block (it held
// one per access: 400,000 here, 2.5 GB for a 2,000-block prefix read 5 times a second for the
// default two hours). A block read again stays as long as its latest read says; the others go.
TEST(ReuseIndexPolicyTest, ForgettingKeepsOneEntryPerBlock) {
  auto p = MakeReuseIndexPolicy({.history = absl::Seconds(100)});
  ASSERT_TRUE(p.ok()) << p.status();
  EvictionPolicy& policy = **p;
  EXPECT_EQ(ReuseIndexStatsOf(policy).tracked_blocks, 0);
  const std::vector<BlockKey> prefix = {Key(1), Key(2), Key(3), Key(4)};
  for (int i = 0; i < 100'000; ++i) {
    Observe(policy, prefix, At(i * 0.0005), /*session=*/1 + i % 3);  // 50 s in all
  }
  ReuseIndexStats stats = ReuseIndexStatsOf(policy);
  EXPECT_EQ(stats.tracked_blocks, 4);
  EXPECT_EQ(stats.history_entries, 4);
  EXPECT_EQ(stats.tracked_sessions, 3);
  EXPECT_EQ(stats.births_kept, 400'000);  // the life table's samples: one per access
  // Block 1 is read again at 120 s by session 1; at 160 s the others, last read at 50 s, are
  // forgotten, and so are sessions 2 and 3.
  Observe(policy, {Key(1)}, At(120), /*session=*/1);
  Observe(policy, {Key(9)}, At(160), /*session=*/4);
  stats = ReuseIndexStatsOf(policy);
  EXPECT_EQ(stats.tracked_blocks, 2);  // 1 and 9
  EXPECT_EQ(stats.history_entries, 2);
  EXPECT_EQ(stats.tracked_sessions, 2);  // 1 and 4
  // At 230 block 1 (read at 120) and session 1 go too.
  Observe(policy, {Key(5)}, At(230), /*session=*/4);
  stats = ReuseIndexStatsOf(policy);
  EXPECT_EQ(stats.tracked_blocks, 2);  // 9 (read at 160) and 5
  EXPECT_EQ(stats.history_entries, 2);
  EXPECT_EQ(stats.tracked_sessions, 1);
  auto lru = MakeEvictionPolicy("lru");
  KVTIER_ASSERT_OK(lru.status());
  EXPECT_EQ(ReuseIndexStatsOf(**lru).tracked_blocks, 0);
}

// A request at an infinite time forgets nothing (it set the forgetting horizon to infinity: every
// block went at once, and each new one at the next request).
TEST(ReuseIndexPolicyTest, AnInfiniteTimeForgetsNothing) {
  auto p = MakeReuseIndexPolicy({.history = absl::Seconds(100)});
  ASSERT_TRUE(p.ok()) << p.status();
  EvictionPolicy& policy = **p;
  Observe(policy, {Key(1)}, At(0));
  Observe(policy, {Key(2)}, absl::InfiniteFuture());
  Observe(policy, {Key(3)}, At(1));
  Observe(policy, {Key(4)}, At(2));
  EXPECT_EQ(ReuseIndexStatsOf(policy).tracked_blocks, 4);
  // Taken as the latest finite time (0), block 2 is forgotten with the others: kept at +inf, it
  // stopped all forgetting behind it.
  Observe(policy, {Key(5)}, At(1000));
  EXPECT_EQ(ReuseIndexStatsOf(policy).tracked_blocks, 1);
  // A Victim at an infinite time ends no retention priority (it ended them all, for good: block
  // 6, older, then went first).
  KVTIER_ASSERT_OK(
      policy.Add(Key(6), {.retention_priority = 1, .priority_until = At(2000)}, At(1000)));
  KVTIER_ASSERT_OK(policy.Add(Key(7), {}, At(1000)));
  EXPECT_TRUE(policy.Victim(absl::InfiniteFuture()).has_value());
  EXPECT_EQ(policy.Victim(At(1001)), Key(7));
}

// last_turn on a superseded release (a later request of the session is live) is not taken: the
// session is not ending. Block 3 then ranks as any (0 with no data), and the older block 1 goes.
TEST(ReuseIndexPolicyTest, ASupersededLastTurnIsNotTaken) {
  auto p = Make();
  ReadAndRelease(*p, {Key(1)}, /*session=*/10, /*read=*/0, /*release=*/0);
  ReadAndRelease(*p, {Key(3)}, /*session=*/11, /*read=*/0.5, /*release=*/1, StopReason::kEndTurn,
                 {.superseded = true, .last_turn = true});
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(3), {}, At(0.5)));
  EXPECT_EQ(p->Victim(At(2)), Key(1));
}

// Equal ranks (no data yet: every index is 0): block 1 was accessed first (at 0) but released
// last (at 5, a long request); block 2 accessed at 1 and released at 2. By default the block
// accessed longest ago goes; with ties_by_release, the one released longest ago (hint-g's order).
TEST(ReuseIndexPolicyTest, TiesGoByAccessOrByRelease) {
  for (const bool by_release : {false, true}) {
    auto made = MakeReuseIndexPolicy({.sample_size = 0, .ties_by_release = by_release});
    KVTIER_ASSERT_OK(made.status());
    EvictionPolicy& p = **made;
    Observe(p, {Key(1)}, At(0), /*session=*/10);
    Observe(p, {Key(2)}, At(1), /*session=*/11);
    p.ObserveRelease({.blocks = std::vector<BlockKey>{Key(2)}, .now = At(2), .session = 11});
    p.ObserveRelease({.blocks = std::vector<BlockKey>{Key(1)}, .now = At(5), .session = 10});
    KVTIER_ASSERT_OK(p.Add(Key(1), {}, At(0)));
    KVTIER_ASSERT_OK(p.Add(Key(2), {}, At(1)));
    EXPECT_EQ(p.Victim(At(6)), by_release ? Key(2) : Key(1)) << "ties_by_release " << by_release;
  }
}

// Pause's and Release's expected_idle is used in ranking, for what it has shown it is worth.
// Block 1 is released with an estimate of 600 s, block 2 ten seconds later with 20 s; the victim
// is chosen 15 s after block 1's release. With no data the older goes (oldest first). Trained on
// exact estimates (20 s or 400 s, each session back on time), block 1, due in 585 s, goes before
// block 2, due in 15 s (the table in seconds alone would drop block 2: younger, of the same stop
// reason). Trained on worthless estimates (20 s or 400 s, every session back 30 s after its
// release whatever it said), the estimates are set aside: both are due 30 s after release, so
// the newer, block 2, is due later and goes; trusting the estimates would drop block 1.
TEST(ReuseIndexPolicyTest, AnIdleEstimateRanksByWhenTheSessionIsDue) {
  enum class Train { kNone, kExact, kWorthless };
  for (Train train : {Train::kNone, Train::kExact, Train::kWorthless}) {
    auto p = Make();
    auto release = [&](BlockKey block, uint64_t session, double t, double idle) {
      p->ObserveRelease({.blocks = std::vector<BlockKey>{block},
                         .now = At(t),
                         .session = session,
                         .stop_reason = StopReason::kToolUse,
                         .expected_idle = absl::Seconds(idle)});
    };
    if (train != Train::kNone) {
      // Session 100 + i: a request at 10 i s, released at once; back `back` s later.
      std::vector<std::pair<double, uint64_t>> returns;
      for (uint64_t i = 0; i < 80; ++i) {
        const double now = 10.0 * static_cast<double>(i);
        std::sort(returns.begin(), returns.end());
        while (!returns.empty() && returns.front().first <= now) {
          Observe(*p, {Key(50000 + returns.front().second)}, At(returns.front().first),
                  returns.front().second);
          returns.erase(returns.begin());
        }
        const double idle = i % 2 == 0 ? 20 : 400;
        const double back = train == Train::kExact ? idle : 30;
        Observe(*p, {Key(1000 + i)}, At(now), 100 + i);
        release(Key(1000 + i), 100 + i, now, idle);
        returns.emplace_back(now + back, 100 + i);
      }
      std::sort(returns.begin(), returns.end());
      for (const auto& [t, s] : returns) Observe(*p, {Key(50000 + s)}, At(t), s);
    }
    const double t0 = 20000;
    Observe(*p, {Key(1)}, At(t0), 1);
    release(Key(1), 1, t0, 600);
    Observe(*p, {Key(2)}, At(t0 + 10), 2);
    release(Key(2), 2, t0 + 10, 20);
    KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(t0)));
    KVTIER_ASSERT_OK(p->Add(Key(2), {}, At(t0 + 10)));
    EXPECT_EQ(p->Victim(At(t0 + 15)), train == Train::kWorthless ? Key(2) : Key(1))
        << static_cast<int>(train);
  }
}

TEST(ReuseIndexPolicyTest, ABlockNoRequestNamedIsRankedToo) {
  auto p = Make();
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(3)));
  KVTIER_ASSERT_OK(p->Add(Key(2), {}, At(1)));
  EXPECT_EQ(p->Victim(At(4)), Key(2));
  KVTIER_ASSERT_OK(p->Touch(Key(2), {}, At(5)));  // a use: now the younger
  EXPECT_EQ(p->Victim(At(6)), Key(1));
}

// A block requests name learns from the requests only: KvCache's Touch at a release (the request
// that read it is over) is not another access, so it neither refreshes the age nor adds a life.
TEST(ReuseIndexPolicyTest, ATouchIsNoAccessOfANamedBlock) {
  auto p = Make();
  Observe(*p, {Key(1)}, At(0));
  Observe(*p, {Key(2)}, At(1));
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(0)));
  KVTIER_ASSERT_OK(p->Add(Key(2), {}, At(1)));
  KVTIER_ASSERT_OK(p->Touch(Key(1), {}, At(5)));
  EXPECT_EQ(p->Victim(At(6)), Key(1));
}

TEST(ReuseIndexPolicyTest, SampledVictimsStayCandidates) {
  auto p = Make(/*sample_size=*/4);
  for (uint64_t i = 0; i < 100; ++i) KVTIER_ASSERT_OK(p->Add(Key(i), {}, At(i)));
  for (int n = 0; n < 100; ++n) {
    std::optional<BlockKey> v = p->Victim(At(200));
    ASSERT_TRUE(v.has_value());
    KVTIER_ASSERT_OK(p->Remove(*v));
  }
  EXPECT_EQ(p->size(), 0);
  EXPECT_FALSE(p->Victim(At(200)).has_value());
}

// A shared shadow (follow_best's miniature simulation) ranks candidates of its own by what the
// live policy learned, and learns nothing itself.
TEST(ReuseIndexPolicyTest, ASharedShadowRanksItsOwnCandidatesByTheLiveModel) {
  auto live = Make();
  std::unique_ptr<EvictionPolicy> shadow = live->MakeSharedShadow();
  ASSERT_NE(shadow, nullptr);
  EXPECT_EQ(MakeLruPolicy()->MakeSharedShadow(), nullptr);  // nothing to share
  EXPECT_FALSE(shadow->observes_requests());
  auto release = [&](std::vector<BlockKey> blocks, uint64_t session, double t) {
    live->ObserveRelease(
        {.blocks = blocks, .now = At(t), .session = session, .stop_reason = StopReason::kToolUse});
  };
  // Block 3 is the older; block 5's session then moves on without it.
  Observe(*live, {Key(3)}, At(0), /*session=*/11);
  release({Key(3)}, 11, 0);
  Observe(*live, {Key(5)}, At(1), /*session=*/10);
  release({Key(5)}, 10, 1);
  KVTIER_ASSERT_OK(shadow->Add(Key(3), {}, At(0)));
  KVTIER_ASSERT_OK(shadow->Add(Key(5), {}, At(1)));
  EXPECT_EQ(shadow->size(), 2);
  EXPECT_EQ(live->size(), 0);  // the candidates are the shadow's alone
  EXPECT_EQ(shadow->Victim(At(2)), Key(3));  // no data: oldest first
  // The shadow is told of a request; only the live policy's observation counts.
  shadow->ObserveRequest({.blocks = std::vector<BlockKey>{Key(7)}, .now = At(3), .session = 10});
  EXPECT_EQ(shadow->Victim(At(4)), Key(3));
  Observe(*live, {Key(7)}, At(5), /*session=*/10);
  EXPECT_EQ(shadow->Victim(At(6)), Key(5));  // the live model says session 10 moved on
  // At one time, one sample serves several victims, lowest first, each still a candidate.
  EXPECT_EQ(shadow->Victim(At(7)), Key(5));
  KVTIER_ASSERT_OK(shadow->Remove(Key(5)));
  EXPECT_EQ(shadow->Victim(At(7)), Key(3));
  EXPECT_THAT(shadow->Add(Key(3), {}, At(7)), IsError(StatusCode::kAlreadyExists, "candidate"));
  EXPECT_THAT(shadow->Remove(Key(5)), IsError(StatusCode::kNotFound, "not a candidate"));
  EXPECT_THAT(shadow->Touch(Key(5), {}, At(7)), IsError(StatusCode::kNotFound, "not a candidate"));
  KVTIER_EXPECT_OK(shadow->Touch(Key(3), {}, At(7)));
  KVTIER_ASSERT_OK(shadow->Remove(Key(3)));
  EXPECT_EQ(shadow->Victim(At(8)), std::nullopt);
}

TEST(ReuseIndexPolicyTest, Errors) {
  auto p = Make();
  KVTIER_ASSERT_OK(p->Add(Key(1), {}, At(0)));
  EXPECT_THAT(p->Add(Key(1), {}, At(0)), IsError(StatusCode::kAlreadyExists, "candidate"));
  EXPECT_THAT(p->Remove(Key(2)), IsError(StatusCode::kNotFound, "not a candidate"));
  EXPECT_THAT(p->Touch(Key(2), {}, At(0)), IsError(StatusCode::kNotFound, "not a candidate"));
  EXPECT_THAT(p->Add(Key(3), {.bytes = 0}, At(0)), IsError(StatusCode::kInvalidArgument, "bytes"));
  EXPECT_THAT(MakeReuseIndexPolicy({.sample_size = -1}).status(),
              IsError(StatusCode::kInvalidArgument, "sample_size"));
  EXPECT_THAT(MakeReuseIndexPolicy({.history = absl::ZeroDuration()}).status(),
              IsError(StatusCode::kInvalidArgument, "history"));
  ReuseIndexOptions bad;
  bad.table.prior = -1;
  EXPECT_THAT(MakeReuseIndexPolicy(bad).status(), IsError(StatusCode::kInvalidArgument, "prior"));
}

}  // namespace
}  // namespace kvtier
