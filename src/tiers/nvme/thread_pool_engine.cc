// IoEngine with pread/pwrite on a few threads: the fallback where io_uring is unavailable.
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/mutex.h"
#include "tiers/nvme/io_engine.h"

namespace kvtier::internal {
namespace {

// One positional transfer to completion: resubmits the remainder of a short transfer, retries
// EINTR, and reports zero progress as -EIO.
int64_t TransferAll(int fd, const IoRequest& r) {
  auto* p = static_cast<char*>(r.buffer.iov_base);
  size_t left = r.buffer.iov_len;
  int64_t offset = r.offset;
  while (left > 0) {
    const ssize_t n = r.write ? pwrite(fd, p, left, offset) : pread(fd, p, left, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    p += n;
    left -= static_cast<size_t>(n);
    offset += n;
  }
  return static_cast<int64_t>(r.buffer.iov_len);
}

class ThreadPoolEngine final : public IoEngine {
 public:
  ThreadPoolEngine(int fd, int threads) : fd_(fd) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~ThreadPoolEngine() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      cv_.SignalAll();
    }
    for (std::thread& t : threads_) t.join();
  }
  const char* name() const override { return "thread_pool"; }

  void Submit(std::vector<IoRequest> batch) override {
    MutexLock lock(&mu_);
    for (IoRequest& r : batch) queue_.push_back(std::move(r));
    cv_.SignalAll();
  }

 private:
  void Run() {
    while (true) {
      IoRequest r;
      {
        MutexLock lock(&mu_);
        while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
        if (queue_.empty()) return;
        r = std::move(queue_.front());
        queue_.pop_front();
      }
      r.done(TransferAll(fd_, r));
    }
  }

  const int fd_;
  Mutex mu_;
  CondVar cv_;
  std::deque<IoRequest> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> CreateThreadPoolEngine(int fd, int threads) {
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("thread pool of ", threads, " threads"));
  }
  return std::unique_ptr<IoEngine>(new ThreadPoolEngine(fd, threads));
}

}  // namespace kvtier::internal
