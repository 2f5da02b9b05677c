#include "kvtier/completion.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::IsError;

TEST(CompletionTest, FiresOnceFirstOutcomeWins) {
  Completion c;
  EXPECT_FALSE(c.done());
  EXPECT_THAT(c.status(), IsError(StatusCode::kUnavailable, "pending"));
  EXPECT_TRUE(c.Complete(absl::NotFoundError("first")));
  EXPECT_FALSE(c.Complete(absl::OkStatus()));
  EXPECT_TRUE(c.done());
  EXPECT_THAT(c.Wait(), IsError(StatusCode::kNotFound, "first"));
  Completion copy = c;  // copies share the outcome
  EXPECT_THAT(copy.status(), IsError(StatusCode::kNotFound, "first"));
  KVTIER_EXPECT_OK(Completion::Done(absl::OkStatus()).Wait());
}

TEST(CompletionTest, WaitForTimesOutWithoutCancelling) {
  Completion c;
  EXPECT_THAT(c.WaitFor(absl::Milliseconds(5)), IsError(StatusCode::kDeadlineExceeded, "deadline"));
  EXPECT_THAT(c.WaitUntil(absl::Now() - absl::Seconds(1)),
              IsError(StatusCode::kDeadlineExceeded, "deadline"));
  c.Complete(absl::OkStatus());
  KVTIER_EXPECT_OK(c.WaitFor(absl::Milliseconds(5)));
}

TEST(CompletionTest, WakesEveryWaiterAcrossThreads) {
  Completion c;
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      if (c.Wait().ok()) ++woke;
    });
  }
  std::thread completer([&] { c.Complete(absl::OkStatus()); });
  completer.join();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 4);
}

TEST(CompletionTest, OnDoneRunsOnceBeforeOrAfter) {
  Completion c;
  int calls = 0;
  c.OnDone([&](const absl::Status& s) {
    EXPECT_THAT(s, IsError(StatusCode::kInternal, "x"));
    ++calls;
  });
  EXPECT_EQ(calls, 0);
  c.Complete(absl::InternalError("x"));
  EXPECT_EQ(calls, 1);
  c.OnDone([&](const absl::Status&) { ++calls; });  // already done: runs at once
  EXPECT_EQ(calls, 2);
}

TEST(CompletionTest, AllReportsFirstFailureInOrder) {
  KVTIER_EXPECT_OK(Completion::All({}).Wait());
  Completion a, b, c;
  Completion all = Completion::All({a, b, c});
  c.Complete(absl::UnavailableError("c failed"));
  a.Complete(absl::OkStatus());
  EXPECT_FALSE(all.done());
  b.Complete(absl::DataLossError("b failed"));
  EXPECT_THAT(all.Wait(), IsError(StatusCode::kDataLoss, "b failed"));
  Completion x, y;
  Completion both = Completion::All({x, y});
  x.Complete(absl::OkStatus());
  y.Complete(absl::OkStatus());
  KVTIER_EXPECT_OK(both.Wait());
}

}  // namespace
}  // namespace kvtier
