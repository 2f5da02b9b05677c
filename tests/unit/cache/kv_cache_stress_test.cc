// KvCacheStress: serving loops on several threads at once against one small cache (HBM, DRAM,
// NVMe), so attach, append, onboarding, eviction, demotion, pause and resume interleave with
// kernel completions that fire on another thread, while one more thread reads stats, events and
// lookups. Built to run under ThreadSanitizer: every call must be thread-safe, the stats'
// accounting must hold in every snapshot, the event numbering must stay contiguous, and at the
// end nothing may be held, locked or open.
//
// KVTIER_STRESS_ITERATIONS overrides the iterations per thread.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtier/kv_cache.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/kv_cache_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvtier {
namespace {

using ::absl::StatusCode;
using ::kvtier::testing::KvCacheEnv;
using ::kvtier::testing::StatsString;

constexpr int kB = KvCacheEnv::kTokensPerBlock;
constexpr int kThreads = 4;

int Iterations() {
  if (const char* env = std::getenv("KVTIER_STRESS_ITERATIONS"); env != nullptr) {
    return std::max(1, std::atoi(env));
  }
  return 1500;
}

// Fires Completions after a delay, on its own thread: the attention kernel finishing later.
class DelayedCompleter {
 public:
  DelayedCompleter() : thread_([this] { Run(); }) {}
  ~DelayedCompleter() { Stop(); }

  void CompleteAfter(const Completion& c, absl::Duration delay) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace(absl::Now() + delay, c);
    }
    cv_.notify_one();
  }

  // Fires everything still queued, then joins the thread.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (queue_.empty()) {
        if (stop_) return;
        cv_.wait(lock);
        continue;
      }
      const auto next = queue_.begin();
      const absl::Time now = absl::Now();
      if (next->first > now && !stop_) {
        cv_.wait_for(lock, absl::ToChronoNanoseconds(next->first - now));
        continue;
      }
      const Completion c = next->second;
      queue_.erase(next);
      lock.unlock();
      c.Complete(absl::OkStatus());  // the cache's callbacks run here, outside our lock
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<absl::Time, Completion> queue_;  // guarded by mu_
  bool stop_ = false;                            // guarded by mu_
  std::thread thread_;                           // last: Run reads the members above
};

struct StressConfig {
  const char* policy = "lru";
  WritePolicy write = WritePolicy::kWriteBack;
};

// Shared prompts, so requests on different threads hit each other's blocks.
std::vector<std::vector<int32_t>> SharedPrompts() {
  const std::vector<int32_t> system = testing::Iota(32, 10000);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t n : {8, 16, 24, 32}) prompts.emplace_back(system.begin(), system.begin() + n);
  prompts.push_back(testing::Iota(20, 20000));
  return prompts;
}

class Stress {
 public:
  Stress(KvCache* cache, DelayedCompleter* completer)
      : cache_(cache), completer_(completer), prompts_(SharedPrompts()) {}

  // One thread's serving loop.
  void Worker(int thread, int iterations) {
    std::mt19937_64 rng(static_cast<uint64_t>(thread) + 1);
    const auto uniform = [&](int64_t lo, int64_t hi) {
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    int32_t fresh = (thread + 1) << 24;
    for (int i = 0; i < iterations && !stop_.load(); ++i) {
      requests_.fetch_add(1);
      const uint64_t raw = (static_cast<uint64_t>(thread + 1) << 32) | static_cast<uint64_t>(i);
      const SequenceId id(raw);
      if (!Allow(cache_->CreateSequence(id), {}, "CreateSequence")) continue;

      std::vector<int32_t> prompt =
          prompts_[static_cast<size_t>(uniform(0, static_cast<int64_t>(prompts_.size()) - 1))];
      const int64_t suffix = uniform(1, 10);
      for (int64_t j = 0; j < suffix; ++j) prompt.push_back(fresh++);
      auto attached = cache_->AttachPrefix(id, prompt);
      if (!Allow(attached.status(), {}, "AttachPrefix")) {
        Allow(cache_->Release(id), {}, "Release");
        continue;
      }
      const int64_t from = attached->attached_tokens;
      auto appended =
          cache_->Append(id, absl::MakeConstSpan(prompt).subspan(static_cast<size_t>(from)));
      if (!Allow(appended.status(), {StatusCode::kResourceExhausted}, "Append prompt")) {
        exhausted_.fetch_add(1);
        Allow(cache_->Release(id), {}, "Release");
        continue;
      }
      int64_t n = static_cast<int64_t>(prompt.size());

      // Prefill: make the attached blocks resident, "compute" the rest, report it written.
      const bool async = uniform(0, 1) == 1;
      auto ticket =
          cache_->EnsureResident(id, 0, n,
                                 {.deadline = absl::Now() + absl::Seconds(20),
                                  .mode = async ? ResidencyMode::kAsync : ResidencyMode::kWait});
      if (Allow(ticket.status(), {StatusCode::kResourceExhausted}, "EnsureResident")) {
        if (async) {
          const absl::Status s = ticket->completion().WaitFor(absl::Seconds(20));
          if (s.code() == StatusCode::kDeadlineExceeded) Fail("async ticket never completed");
        }
      }
      Completion kernel;
      completer_->CompleteAfter(kernel, absl::Microseconds(uniform(0, 500)));
      Allow(cache_->ReportWritten(id, n, kernel), {}, "ReportWritten");
      if (ticket.ok()) Allow(cache_->ReleaseTicket(*ticket), {}, "ReleaseTicket");

      // Decode a few tokens.
      const int64_t steps = uniform(0, 3);
      for (int64_t d = 0; d < steps; ++d) {
        auto a = cache_->Append(id, {fresh++});
        if (!Allow(a.status(), {StatusCode::kResourceExhausted}, "Append decode")) break;
        ++n;
        auto t =
            cache_->EnsureResident(id, n - 1, n, {.deadline = absl::Now() + absl::Seconds(20)});
        Allow(t.status(), {StatusCode::kResourceExhausted}, "EnsureResident decode");
        Allow(cache_->ReportWritten(id, n), {}, "ReportWritten decode");
        if (t.ok()) Allow(cache_->ReleaseTicket(*t), {}, "ReleaseTicket decode");
      }

      // An agent waiting on a tool.
      if (uniform(0, 99) < 20) {
        if (Allow(cache_->Pause(id, absl::Seconds(uniform(0, 60))), {}, "Pause")) {
          auto resumed = cache_->Resume(id);
          if (Allow(resumed.status(), {}, "Resume")) {
            const absl::Status s = resumed->WaitFor(absl::Seconds(20));
            if (s.code() == StatusCode::kDeadlineExceeded) Fail("Resume never completed");
          }
        }
      }

      // A beam: fork, extend, drop.
      if (uniform(0, 99) < 10) {
        const SequenceId child(raw | (uint64_t{1} << 31));
        auto forked = cache_->Fork(id, child, uniform(0, n));
        if (Allow(forked.status(),
                  {StatusCode::kResourceExhausted, StatusCode::kFailedPrecondition}, "Fork")) {
          Allow(cache_->Append(child, {fresh++}).status(), {StatusCode::kResourceExhausted},
                "Append child");
          Allow(cache_->Release(child), {}, "Release child");
        }
      }

      // Sometimes the request ends before its kernel completion fired.
      if (uniform(0, 1) == 0) {
        if (kernel.WaitFor(absl::Seconds(20)).code() == StatusCode::kDeadlineExceeded) {
          Fail("kernel completion never fired");
        }
      }
      Allow(cache_->Release(id), {}, "Release");
    }
  }

  // Reads everything a dashboard and a router read, checking each snapshot.
  void Poller() {
    std::mt19937_64 rng(99);
    uint64_t last_event = 0;
    int64_t polls = 0;
    while (!workers_done_.load()) {
      const KvCacheStats s = cache_->stats();
      const std::string accounting = testing::TierAccountingError(s);
      if (!accounting.empty()) Fail(absl::StrCat("accounting: ", accounting, "\n", StatsString(s)));
      for (const CacheEvent& e : cache_->PollEvents(last_event)) {
        if (e.sequence != last_event + 1) {
          Fail(absl::StrCat("event ", e.sequence, " after ", last_event));
        }
        last_event = e.sequence;
      }
      const auto& prompt = prompts_[rng() % prompts_.size()];
      auto l = cache_->Lookup(prompt);
      if (!l.ok()) {
        Fail(absl::StrCat("Lookup: ", l.status().ToString()));
      } else if (l->matched_tokens % kB != 0 ||
                 l->matched_tokens > static_cast<int64_t>(prompt.size())) {
        Fail(absl::StrCat("Lookup matched ", l->matched_tokens));
      }
      if (++polls % 16 == 0) {
        const absl::Status inv = cache_->CheckInvariants();
        if (!inv.ok()) Fail(absl::StrCat("CheckInvariants: ", inv.ToString()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    polls_ = polls;
  }

  void WorkersDone() { workers_done_.store(true); }
  int64_t requests() const { return requests_.load(); }
  int64_t exhausted() const { return exhausted_.load(); }
  int64_t polls() const { return polls_; }

 private:
  // OK, or a code in `allowed`; anything else is a failure. True if OK.
  bool Allow(const absl::Status& s, std::initializer_list<StatusCode> allowed, const char* what) {
    if (s.ok()) return true;
    if (std::find(allowed.begin(), allowed.end(), s.code()) == allowed.end()) {
      Fail(absl::StrCat(what, ": undocumented error ", s.ToString()));
    }
    return false;
  }
  // Records a failure from any thread; stops the workers after the first few.
  void Fail(const std::string& message) {
    ADD_FAILURE() << message;
    if (failures_.fetch_add(1) >= 10) stop_.store(true);
  }

  KvCache* cache_;
  DelayedCompleter* completer_;
  const std::vector<std::vector<int32_t>> prompts_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> workers_done_{false};
  std::atomic<int> failures_{0};
  std::atomic<int64_t> requests_{0};   // started
  std::atomic<int64_t> exhausted_{0};  // whose prompt found no room in HBM
  int64_t polls_ = 0;  // written by the poller before it returns, read after the join
};

void RunStress(const StressConfig& config) {
  KvCacheEnv env({.hbm_blocks = 40, .dram_blocks = 48, .nvme_blocks = 96, .fake_clock = false});
  KVTIER_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvCache> cache, env.NewCache([&](KvCacheOptions& o) {
    o.eviction_policy = config.policy;
    o.write_policy = config.write;
    o.room_wait = absl::Milliseconds(50);
    o.event_buffer = int64_t{1} << 22;
  }));
  {
    DelayedCompleter completer;
    Stress stress(cache.get(), &completer);
    const int iterations = Iterations();
    const absl::Time start = absl::Now();
    std::thread poller([&] { stress.Poller(); });
    std::vector<std::thread> workers;
    for (int t = 0; t < kThreads; ++t) {
      workers.emplace_back([&stress, t, iterations] { stress.Worker(t, iterations); });
    }
    for (std::thread& w : workers) w.join();
    stress.WorkersDone();
    poller.join();
    completer.Stop();  // every kernel completion has fired
    std::cout << "[ summary  ] " << stress.requests() << " requests (" << stress.exhausted()
              << " found HBM full), " << stress.polls() << " polls in "
              << absl::FormatDuration(absl::Now() - start) << "\n";
    EXPECT_EQ(stress.requests(), int64_t{kThreads} * iterations);
  }
  KVTIER_ASSERT_OK(cache->WaitIdle(absl::Now() + absl::Seconds(60)));
  KVTIER_EXPECT_OK(cache->CheckInvariants());
  const KvCacheStats s = cache->stats();
  testing::ExpectAllReleased(s);
  std::cout << "[ summary  ] hbm evictions " << s.tiers[TierIndex(Tier::kHbm)].evictions
            << ", demotions " << s.tiers[TierIndex(Tier::kHbm)].demotions << "; dram stored "
            << s.tiers[TierIndex(Tier::kDram)].stored << ", hits "
            << s.tiers[TierIndex(Tier::kDram)].hits << "; nvme stored "
            << s.tiers[TierIndex(Tier::kNvme)].stored << ", hits "
            << s.tiers[TierIndex(Tier::kNvme)].hits << "\n";
  // The workload did reach the lower tiers.
  EXPECT_GT(s.tiers[TierIndex(Tier::kHbm)].evictions, 0) << StatsString(s);
  EXPECT_GT(s.tiers[TierIndex(Tier::kDram)].stored, 0) << StatsString(s);
  EXPECT_GT(s.attach_queries, 0);
}

TEST(KvCacheStress, ConcurrentRequestsLruWriteBack) { RunStress({}); }

TEST(KvCacheStress, ConcurrentRequestsCostAwareWriteThrough) {
  RunStress({.policy = "cost_aware", .write = WritePolicy::kWriteThrough});
}

TEST(KvCacheStress, ConcurrentRequestsReuseIndexWriteBack) { RunStress({.policy = "reuse_index"}); }

}  // namespace
}  // namespace kvtier
