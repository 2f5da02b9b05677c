// internal::DeadlineTimer: callbacks run at their deadlines, in deadline order, and a cancelled
// one never runs, whatever the thread was sleeping until when they were scheduled.
#include "internal/deadline_timer.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "internal/mutex.h"

namespace kvtier::internal {
namespace {

// A deadline earlier than the one the thread sleeps until must wake it: the near callback runs
// long before the far one would (the far one is cancelled unrun).
TEST(DeadlineTimerTest, EarlierDeadlineWakesASleepingThread) {
  DeadlineTimer timer;
  std::atomic<bool> far_ran{false};
  const absl::Time far = absl::Now() + absl::Seconds(30);
  const uint64_t far_id = timer.Schedule(far, [&] { far_ran = true; });
  absl::SleepFor(absl::Milliseconds(20));  // the thread now sleeps until `far`
  absl::Notification near;
  const absl::Time start = absl::Now();
  timer.Schedule(start + absl::Milliseconds(10), [&] { near.Notify(); });
  ASSERT_TRUE(near.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  timer.Cancel(far, far_id);
  EXPECT_FALSE(far_ran.load());
}

// Scheduled while the thread sleeps until an earlier deadline that is then cancelled: the later
// callback still runs (the thread re-arms for it when it wakes), and runs once.
TEST(DeadlineTimerTest, LaterDeadlineRunsAfterTheEarlierOneIsCancelled) {
  DeadlineTimer timer;
  const absl::Time first = absl::Now() + absl::Milliseconds(30);
  const uint64_t first_id = timer.Schedule(first, [] { FAIL() << "cancelled callback ran"; });
  std::atomic<int> runs{0};
  absl::Notification later;
  timer.Schedule(first + absl::Milliseconds(30), [&] {
    ++runs;
    later.Notify();
  });
  timer.Cancel(first, first_id);
  ASSERT_TRUE(later.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(runs.load(), 1);
}

// Callbacks run in deadline order, not scheduling order.
TEST(DeadlineTimerTest, RunsInDeadlineOrder) {
  DeadlineTimer timer;
  Mutex mu;
  std::vector<int> order;
  absl::Notification last;
  const absl::Time base = absl::Now() + absl::Milliseconds(20);
  for (int i : {3, 1, 2, 0}) {
    timer.Schedule(base + absl::Milliseconds(5 * i), [&, i] {
      MutexLock lock(&mu);
      order.push_back(i);
      if (order.size() == 4) last.Notify();
    });
  }
  ASSERT_TRUE(last.WaitForNotificationWithTimeout(absl::Seconds(10)));
  MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace kvtier::internal
